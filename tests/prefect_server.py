"""A real Prefect API server on 127.0.0.1 for the pipeline tests: one per test run
(``prefect_api`` in tests/conftest.py), each module pointed at it in turn."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from flows.server import flush_prefect_logs, free_port, start_child, wait_healthy

PREFECT = str(Path(sys.executable).with_name("prefect"))


@contextlib.contextmanager
def prefect_server(home: Path, extra_env: dict | None = None):
    """Start `prefect server start` on a free loopback port; yield the environment to use."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = dict(
        os.environ,
        PREFECT_HOME=str(home),
        PREFECT_API_URL=url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        **(extra_env or {}),
    )
    log = open(home / "server.log", "w")  # noqa: SIM115
    proc = start_child(  # ends with the test process, even if that is killed
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_healthy(url, proc)
        yield env
    finally:
        flush_prefect_logs()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextlib.contextmanager
def pointed_at(env: dict, keys=("PREFECT_API_URL", "PREFECT_HOME")):
    """This process pointed at a running server (``env`` from :func:`prefect_server`): the
    variables in ``keys`` set in ``os.environ`` (restored afterwards) and Prefect's settings
    switched to its API; buffered run logs are sent before switching back."""
    from flows.server import use_api

    old = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: env[k] for k in keys})
    try:
        with use_api(env["PREFECT_API_URL"]):
            yield env
            flush_prefect_logs()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
