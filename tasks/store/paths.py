"""The names a store means on disk: the store folder, its ingested inputs, its report and its lock."""

from __future__ import annotations

from pathlib import Path


def store_path(store) -> Path:
    """The one path a store name means: ``x`` and ``x.zarr`` both name ``x.zarr`` (absolute), so
    no two store names can share a store's inputs, report or lock."""
    p = Path(store).expanduser()
    if p.suffix != ".zarr":
        p = p.with_name(p.name + ".zarr")
    return p.absolute()


def inputs_dir(store) -> Path:
    """Where a store's ingested data and kNN graph live: ``x.zarr`` -> ``x.inputs/``."""
    p = store_path(store)
    return p.with_name(p.name.removesuffix(".zarr") + ".inputs")


def report_dir(store) -> Path:
    """Where a store's report goes by default: ``x.zarr`` -> ``x.report/``."""
    p = store_path(store)
    return p.with_name(p.name.removesuffix(".zarr") + ".report")


def lock_path(store) -> Path:
    p = store_path(store)
    return p.with_name(p.name + ".lock")
