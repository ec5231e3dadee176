"""Read-side helpers shared by the fit and evaluate tasks: the ingested data and the kNN graph,
cached per worker process (each is read once per process, not once per grid point)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import xarray as xr

from lvmcore.data import open_dataset


@functools.lru_cache(maxsize=4)
def _load_data(path: str, stamp: float):
    ds = open_dataset(path).load()
    out = {"Y": ds["Y"].values, "views": [ds[v].values for v in ds.attrs.get("views", [])]}
    for name in ("label", "color", "truth"):
        out[name] = ds[name].values if name in ds else None
    out["truth_metric"] = ds.attrs.get("truth_metric", "euclidean")
    return out


def load_data(path) -> dict:
    """Y, views, label, color, truth and truth_metric of an ingested data store."""
    p = Path(path)
    return _load_data(str(p.resolve()), (p / "zarr.json").stat().st_mtime)


@functools.lru_cache(maxsize=4)
def _load_graph(path: str, stamp: float):
    g = xr.open_zarr(path, consolidated=False).load()
    return g["indices"].values.astype(np.int64), g["distances"].values


def load_graph(path):
    """(indices, distances) of the kNN graph store, computed at the sweep's largest k."""
    if path is None:
        return None, None
    p = Path(path)
    return _load_graph(str(p.resolve()), (p / "zarr.json").stat().st_mtime)
