"""Read-side helpers shared by the fit and evaluate tasks: the ingested data and the kNN graph,
cached per worker process (each is read once per process, not once per grid point).

Both are read without Dask (numpy-backed variables): computing a Dask array inside a task on a
Dask worker goes through the worker's client, which secedes the task from the worker's thread
pool, and the worker then starts its next queued task beside it. With one thread per worker,
every queued batch of grid points ran at once on the worker's core (8 at a time in a 48-point
sweep), each fit 8x slower and the memory 8x larger."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import xarray as xr

from lvmcore.data import open_dataset


def data_fingerprint(path) -> str | None:
    """The content fingerprint recorded in an ingested data store's attributes (None if none):
    ``content_fingerprint``, else (a store written before it was recorded) ``fingerprint``. A named
    data set's ``fingerprint`` is its recipe's (lvmcore.data.recipe_fingerprint); what is derived
    from the data (the kNN graph, cached reads and evaluation references) is tied to the content."""
    import json

    try:
        meta = json.loads((Path(path) / "zarr.json").read_text())
    except (OSError, ValueError):
        return None
    attrs = meta.get("attributes", {})
    return attrs.get("content_fingerprint") or attrs.get("fingerprint")


@functools.lru_cache(maxsize=4)
def _load_data(path: str, stamp):
    ds = open_dataset(path, dask=False).load()
    out = {"Y": ds["Y"].values, "views": [ds[v].values for v in ds.attrs.get("views", [])]}
    for name in ("label", "color", "truth"):
        out[name] = ds[name].values if name in ds else None
    out["truth_metric"] = ds.attrs.get("truth_metric", "euclidean")
    out["fingerprint"] = ds.attrs.get("content_fingerprint") or ds.attrs.get("fingerprint")
    #: the store's fingerprint attributes as read: chunked work reading the store checks them
    out["stamps"] = {k: ds.attrs[k] for k in ("fingerprint", "content_fingerprint") if k in ds.attrs}
    return out


def load_data(path) -> dict:
    """Y, views, label, color, truth, truth_metric, fingerprint (the content's) and stamps (the
    store's fingerprint attributes) of an ingested data store.

    Cached per process by path and content fingerprint (plus the metadata file's mtime for stores
    without one): a store rewritten with other data is read again, never served from the cache."""
    p = Path(path)
    meta = p / "zarr.json"
    return _load_data(str(p.resolve()), (data_fingerprint(p), meta.stat().st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _load_graph(path: str, stamp, distances: bool):
    g = xr.open_zarr(path, consolidated=False, chunks=None)
    idx = np.asarray(g["indices"].values, dtype=np.int64)
    return idx, (g["distances"].values if distances else None)


def load_graph(path, distances: bool = False):
    """(indices, distances) of the kNN graph store, computed at the sweep's largest k. The fits
    need only the indices: the distances (as large again) are read only if asked for, else None."""
    if path is None:
        return None, None
    p = Path(path)
    return _load_graph(str(p.resolve()), (p / "zarr.json").stat().st_mtime_ns, bool(distances))
