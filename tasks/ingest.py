"""Ingest a data set into the sweep's data store (once per sweep)."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from lvmcore.data import ingest, load, open_dataset


def dataset_spec(dataset) -> tuple[str, dict]:
    """(name or path, options) from a flow parameter: a string, or a dict with ``name`` / ``path``."""
    if isinstance(dataset, str):
        return dataset, {}
    if isinstance(dataset, dict):
        d = dict(dataset)
        src = d.pop("name", None) or d.pop("path", None)
        if not src:
            raise ValueError(f"dataset {dataset!r} needs a 'name' or a 'path'")
        return str(src), d
    raise ValueError(f"dataset must be a name, a path or a dict, got {type(dataset).__name__}")


def ingest_dataset(dataset, data_path: str) -> str:
    """Write the data set to ``data_path`` unless an identical one is already there."""
    src, opts = dataset_spec(dataset)
    p = Path(data_path)
    if p.exists():
        have = open_dataset(p)
        want = load(src, **opts)
        if have.attrs.get("source") == want.attrs.get("source") and have.attrs.get(
            "params"
        ) == want.attrs.get("params"):
            return str(p)
        ingest(want, p, overwrite=True)
        return str(p)
    ingest(load(src, **opts), p)
    return str(p)


@task(name="ingest", retries=2, retry_delay_seconds=2)
def ingest_task(dataset: str | dict, data_path: str) -> str:
    return ingest_dataset(dataset, data_path)
