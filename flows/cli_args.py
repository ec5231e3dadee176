"""The command line's argument readers that several commands share: a JSON argument (or a .json
file), --models, --cluster with --connect-timeout, and Prefect's environment defaults."""

from __future__ import annotations

import json
import os
from pathlib import Path

from flows.cluster import normalise_cluster


def env_defaults():
    """Prefect's settings for a command that runs flows (set where the user has not set them)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL", "INFO")


def json_arg(text, what):
    """``text`` as JSON, or the JSON in the .json file it names; None stays None."""
    if text is None:
        return None
    p = Path(text)
    try:
        return json.loads(p.read_text() if p.suffix == ".json" and p.exists() else text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--{what}: not valid JSON ({e}): {text!r}") from e


def models_arg(text: str) -> list[str]:
    """--models: comma-separated families or keys; an empty list is refused, never read as all."""
    models = [m.strip() for m in text.split(",") if m.strip()]
    if not models:
        raise ValueError(
            f"no models given (--models {text!r}); name families or keys, e.g. --models ppca,glle, or "
            "leave --models out for every model"
        )
    return models


def cluster_arg(text: str | None, connect_timeout: float):
    """--cluster: a worker count, a scheduler's address or a JSON spec, as a normalised spec; an
    address gets ``connect_timeout`` (--connect-timeout) unless its spec sets one."""
    cluster = text
    if text is not None and text.startswith("{"):
        cluster = json_arg(text, "cluster")
    elif text is not None:
        try:
            n = int(text)
        except ValueError:
            pass
        else:
            if n < 1:
                raise ValueError(f"--cluster: the worker count must be positive, got {n}")
            cluster = {"type": "local", "n_workers": n}
    spec = normalise_cluster(cluster)
    if spec["type"] == "address":
        spec.setdefault("connect_timeout", connect_timeout)
        spec = normalise_cluster(spec)  # the timeout checked
    return spec
