"""What a sweep leaves in the Prefect UI: a progress artifact updated as grid points finish, a table
artifact with the per-model summary, and a markdown artifact linking the store and the report.

Keys are derived from the store's path (its name and a short hash of the absolute path), so every
rerun of a deployment on the same store adds a new version of the same three artifacts and two
different stores never share a key. Called from inside the sweep's flow run, which they attach to.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from tasks.results.selection import summary_rows


def artifact_key(store, kind: str) -> str:
    """``embed-sweep-<store name>-<6 hex of its absolute path>-<kind>`` (Prefect keys: lowercase
    letters, digits and dashes)."""
    p = Path(store).resolve()
    name = re.sub(r"[^a-z0-9]+", "-", p.name.removesuffix(".zarr").lower()).strip("-") or "store"
    digest = hashlib.sha256(str(p).encode()).hexdigest()[:6]
    return f"embed-sweep-{name}-{digest}-{kind}"


def start_progress(store, total: int, already: int):
    """A progress artifact at 0 % of the points this run has to do; returns its id."""
    return create_progress_artifact(
        0.0 if total else 100.0,
        key=artifact_key(store, "progress"),
        description=f"grid points of {store} finished in this run ({already} were already done)",
    )


def update_progress(artifact_id, fraction: float) -> None:
    update_progress_artifact(artifact_id, round(100.0 * min(max(fraction, 0.0), 1.0), 2))


def _cell(v):
    if isinstance(v, float):
        return None if not math.isfinite(v) else round(v, 6)
    return v


def publish_results(store, report: str | None, failures=(), notes=()) -> dict:
    """The summary table and the links artifact; returns {kind: artifact id}. ``failures``: the
    distinct reasons of failed grid points (tasks.store.failure_summary), ``notes``: what the
    evaluation left out or could not compute; both are listed in the links artifact."""
    rows = [{k: _cell(v) for k, v in row.items()} for row in summary_rows(store)]
    ids = {
        "summary": create_table_artifact(
            rows,
            key=artifact_key(store, "summary"),
            description=f"per-model summary of {store}: the chosen setting, the criterion that chose it, "
            "its bound and metrics" + "".join(f"\n\nfailed: {line.strip()}" for line in failures),
        )
    }
    store_abs = Path(store).resolve()
    lines = [
        f"# embed-sweep results: `{store_abs.name}`",
        "",
        f"- result store: [{store_abs}]({store_abs.as_uri()})",
    ]
    if report:
        rep = Path(report).resolve()
        lines.append(f"- report: [{rep}]({rep.as_uri()})")
    lines += [
        "",
        "| model | setting | chosen by |",
        "|---|---|---|",
        *(f"| {r['model']} | {r.get('best', '')} | {r.get('chosen by', '')} |" for r in rows),
        "",
        *(["## Failed grid points", "", *(f"- {line.strip()}" for line in failures), ""] if failures else []),
        *(["## Notes", "", *(f"- {n}" for n in notes), ""] if notes else []),
        f"Open in Python: `embed_sweep.open_store({str(store_abs)!r})`; to scanpy: "
        f"`embed-sweep export {store_abs} --to {store_abs.with_suffix('.h5ad')}`.",
    ]
    ids["links"] = create_markdown_artifact(
        "\n".join(lines), key=artifact_key(store, "links"), description=f"where the results of {store} are"
    )
    return ids
