"""The sweep's kNN graph: computed once at the largest k, stored, sliced per grid point."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import xarray as xr
from distributed import get_client, get_worker

from lvmcore.graph import available_memory, choose_knn_method, knn
from tasks.inputs import data_fingerprint, load_data


def graph_matches(graph_path, data_path, k_max: int, method: str) -> bool:
    """Whether the graph store at ``graph_path`` was built from exactly this data (content
    fingerprint), at this k and with this method."""
    p = Path(graph_path)
    if not p.exists():
        return False
    try:
        a = xr.open_zarr(p, consolidated=False).attrs
    except Exception:  # a torn or foreign store: rebuilt
        return False
    fp = data_fingerprint(data_path)
    return (
        fp is not None
        and a.get("data_fingerprint") == fp
        and a.get("k") == k_max
        and a.get("method") == method
    )


def knn_client():
    """The Dask client a kNN search runs on: the worker's own inside a Dask task (a sweep's kNN
    task), else a client registered in this process, else None (Dask's local threads)."""
    try:
        return get_client()
    except ValueError:
        return None


def memory_budget() -> int:
    """Bytes work in this process may use (a kNN search, an LL-LVM fit's level blocks): the
    smaller of the available memory and the Dask worker's memory limit inside a worker, else the
    available memory."""
    avail = available_memory()
    try:
        limit = get_worker().memory_manager.memory_limit
    except (ValueError, AttributeError):  # not inside a Dask worker
        return avail
    return min(avail, int(limit)) if limit else avail


def build_graph(data_path: str, k_max: int, graph_path: str, method: str = "auto") -> str:
    """kNN indices and distances at ``k_max`` written to ``graph_path`` (aside, then renamed).

    A graph already there is reused only if it records this data's content fingerprint, this k and
    this method; any other is rebuilt (a graph of other data must never be fitted on)."""
    p = Path(graph_path)
    if graph_matches(p, data_path, k_max, method):
        return str(p)
    if p.exists():
        shutil.rmtree(p)
    Y = load_data(data_path)["Y"]
    budget = memory_budget()
    used = choose_knn_method(*Y.shape, k_max, budget) if method == "auto" else method  # recorded below
    idx, dist = knn(Y, k_max, method=used, client=knn_client())
    ds = xr.Dataset(
        {"indices": (("point", "neighbor"), idx), "distances": (("point", "neighbor"), dist)},
        attrs={
            "k": int(k_max),
            "method": method,
            "method_used": used,
            "data": str(data_path),
            "data_fingerprint": data_fingerprint(data_path),
        },
    )
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    ds.to_zarr(tmp, mode="w", consolidated=False)
    tmp.rename(p)
    return str(p)
