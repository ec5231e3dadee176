"""The sweep's result store: one zarr store, one group per model key, each group rectangular
over the sweep dimensions that apply to it. Plain functions, no Prefect.

Write protocol (see shared/STACK.md): a lazy template is written once per group
(metadata only, chunk size 1 along every sweep dimension, no shards); each grid point then
writes its own cell with a region write. The data variables go first and ``status`` last, so a
cell marked done is complete; a crash loses at most the cells in flight. Root attributes hold
the sweep's identity (a hash of dataset, models, options and grid) so a store can only be
resumed by the same sweep.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import dask.array as da
import numpy as np
import xarray as xr
import zarr

from lvmcore import __version__
from tasks.registry import COV_SCALES, ModelSpec, model_grid

STATUS_PENDING, STATUS_DONE, STATUS_FAILED = 0, 1, 2
STATUS_NAMES = {STATUS_PENDING: "pending", STATUS_DONE: "done", STATUS_FAILED: "failed"}
ERROR_CHARS = 400
METRICS = (
    "trustworthiness",
    "continuity",
    "knn_accuracy",
    "distance_correlation",
    "pearson_distance_correlation",
    "shepard_goodness",
    "procrustes_disparity",
    "qlocal",
    "qglobal",
)
SCALARS = ("elbo", "fit_seconds", "n_iter") + METRICS
MAX_TRACE = 2000


@dataclass
class Layout:
    """Sizes of the non-sweep dimensions of every group of one sweep."""

    n_points: int
    q_max: int
    n_views: int = 1
    n_generations: int = 0
    trace_len: dict = field(default_factory=dict)  # key -> iterations kept


@dataclass
class PointResult:
    """Everything one grid point produces; ``status`` is ``done`` or ``failed``."""

    key: str
    index: tuple
    point: dict
    status: str
    error: str = ""
    embedding: np.ndarray | None = None
    embedding_var: np.ndarray | None = None
    elbo: float = float("nan")
    elbo_trace: np.ndarray | None = None
    n_iter: float = float("nan")
    fit_seconds: float = float("nan")
    extras: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)


def sweep_id(identity: dict) -> str:
    """Stable hash of what defines a sweep (dataset, models, options, grid)."""
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _extra_shape(dims, layout: Layout):
    size = {
        "point": layout.n_points,
        "component": layout.q_max,
        "view": layout.n_views,
        "generation": layout.n_generations,
        "cov_scale": len(COV_SCALES),
    }
    return tuple(size[d] for d in dims)


def group_template(spec: ModelSpec, grid: dict, layout: Layout) -> xr.Dataset:
    """Lazy template of one model's group (nothing is computed or held in memory)."""
    g = model_grid(spec, grid)
    sdims = tuple(g)
    sshape = tuple(len(g[d]) for d in sdims)
    ones = (1,) * len(sdims)

    def lazy(extra_dims, extra_shape, fill=np.nan, dtype=np.float64):
        return (
            sdims + tuple(extra_dims),
            da.full(sshape + tuple(extra_shape), fill, dtype=dtype, chunks=ones + tuple(extra_shape)),
        )

    n, q = layout.n_points, layout.q_max
    v = {
        "embedding": lazy(("point", "component"), (n, q)),
        "elbo_trace": lazy(("iteration",), (layout.trace_len.get(spec.key, 1),)),
        "status": lazy((), (), fill=STATUS_PENDING, dtype=np.int8),
        "error": lazy((), (), fill="", dtype=f"<U{ERROR_CHARS}"),
    }
    if spec.has_variance:
        v["embedding_var"] = lazy(("point", "component"), (n, q))
    for name in SCALARS:
        v[name] = lazy((), ())
    for name, dims in spec.extras.items():
        if name in ("generations", "scale_study") and layout.n_generations == 0:
            continue
        v[name] = lazy(dims, _extra_shape(dims, layout))
    coords = {d: g[d] for d in sdims}
    if any("cov_scale" in dims for name, dims in spec.extras.items() if name in v):
        coords["cov_scale"] = np.asarray(COV_SCALES)
    ds = xr.Dataset(v, coords=coords)
    ds["status"].attrs = {"flag_values": [0, 1, 2], "flag_meanings": "pending done failed"}
    ds.attrs = {
        "model": spec.family,
        "key": spec.key,
        "description": spec.description,
        "estimator": spec.target,
        "fixed_options": json.dumps(spec.fixed),
        "sweep_dims": list(sdims),
        "hyperbolic_embedding": int(spec.hyperbolic),
    }
    return ds


def _open_root(path: Path):
    try:
        return zarr.open_group(str(path), mode="r")
    except Exception as e:
        raise ValueError(
            f"{path} exists but is not a readable zarr store ({type(e).__name__}: {e}); "
            "choose another --store path or delete it"
        ) from e


def prepare_store(path, identity: dict, specs, grid, layout: Layout, attrs: dict) -> str:
    """Create the store and its group templates, or check that an existing one is this sweep's.

    Raises ValueError, before anything is written, if ``path`` holds a different sweep or
    something that is not a sweep store. Returns the sweep id.
    """
    path = Path(path)
    sid = sweep_id(identity)
    if path.exists():
        root = _open_root(path)
        have = root.attrs.get("sweep_id")
        if have is None:
            raise ValueError(f"{path} is not an embed-sweep result store; choose another --store path")
        if have != sid:
            raise ValueError(
                f"{path} holds a different sweep (id {have}, this one is {sid}: dataset, models, "
                "options or grid differ); choose another --store path, or delete it to start over"
            )
        missing = [s.key for s in specs if s.key not in root]
        if not missing:
            return sid
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        missing = [s.key for s in specs]
    root = zarr.open_group(str(path), mode="a", zarr_format=3)
    for s in specs:
        if s.key in missing:
            group_template(s, grid, layout).to_zarr(
                str(path), group=s.key, compute=False, mode="a", consolidated=False, zarr_format=3
            )
    root = zarr.open_group(str(path), mode="a")
    clean = {
        k: (json.dumps(v, default=str) if isinstance(v, (dict, list, tuple)) else v) for k, v in attrs.items()
    }
    root.attrs.update(
        {
            **clean,
            "sweep_id": sid,
            "code_version": __version__,
            "identity": json.dumps(identity, sort_keys=True, default=str),
            "groups": json.dumps([s.key for s in specs]),
        }
    )
    return sid


def read_status(path, key: str) -> np.ndarray:
    """Status array of one group (STATUS_PENDING / DONE / FAILED), sweep dims in store order."""
    return np.asarray(zarr.open_group(str(path), mode="r")[key]["status"][...])


def _pad(a, shape):
    out = np.full(shape, np.nan)
    a = np.asarray(a, dtype=np.float64)
    out[tuple(slice(0, s) for s in a.shape)] = a
    return out


def write_point(path, spec: ModelSpec, res: PointResult, layout: Layout) -> None:
    """Write one grid point's cell: data variables first, then status and error."""
    sdims = spec.dims
    region = {d: slice(i, i + 1) for d, i in zip(sdims, res.index)}
    lead = (1,) * len(sdims)
    n, q = layout.n_points, layout.q_max

    def var(extra_dims, arr):
        return (sdims + tuple(extra_dims), np.asarray(arr).reshape(lead + np.shape(arr)))

    data = {}
    if res.status == "done":
        data["embedding"] = var(("point", "component"), _pad(res.embedding, (n, q)))
        if spec.has_variance and res.embedding_var is not None:
            data["embedding_var"] = var(("point", "component"), _pad(res.embedding_var, (n, q)))
        L = layout.trace_len.get(spec.key, 1)
        trace = np.asarray(res.elbo_trace if res.elbo_trace is not None else [res.elbo], dtype=np.float64)
        if trace.size > L:  # keep the start and the final value
            trace = np.concatenate([trace[: L - 1], trace[-1:]])
        data["elbo_trace"] = var(("iteration",), _pad(trace, (L,)))
        for name in SCALARS:
            val = res.metrics.get(name, getattr(res, name, np.nan)) if name in METRICS else getattr(res, name)
            data[name] = var((), np.float64(np.nan if val is None else val))
        for name, dims in spec.extras.items():
            if name in res.extras and not (
                name in ("generations", "scale_study") and layout.n_generations == 0
            ):
                data[name] = var(dims, _pad(res.extras[name], _extra_shape(dims, layout)))
    code = STATUS_DONE if res.status == "done" else STATUS_FAILED
    data["error"] = var((), np.array(res.error[:ERROR_CHARS], dtype=f"<U{ERROR_CHARS}"))
    data["status"] = var((), np.int8(code))
    # direct zarr writes of whole chunks (a cell is exactly one chunk of every variable): the
    # same bytes as xarray's region write at a fraction of its per-call cost; status goes last
    group = zarr.open_group(str(path), mode="r+")[spec.key]
    sel = tuple(region[d] for d in sdims)
    for name, (_, arr) in data.items():
        z = group[name]
        z[sel + (slice(None),) * (z.ndim - len(sdims))] = arr.astype(z.dtype, copy=False)


def open_results(path) -> xr.DataTree:
    """The result store as an xarray DataTree (one group per model key)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"result store {str(path)!r} does not exist")
    root = _open_root(path)
    if "sweep_id" not in root.attrs:
        raise ValueError(f"{path} is not an embed-sweep result store")
    return xr.open_datatree(str(path), engine="zarr", consolidated=False)


def remove_store(path) -> None:
    shutil.rmtree(path, ignore_errors=True)
