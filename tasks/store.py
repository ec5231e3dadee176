"""The sweep's result store: one zarr store, one group per model key, each group rectangular
over the sweep dimensions that apply to it. Plain functions, no Prefect.

Write protocol (see shared/STACK.md): a lazy template is written once per group
(metadata only, chunk size 1 along every sweep dimension and ``POINT_CHUNK`` rows along
``point``, no shards); each grid point then writes its own cell with a region write, a whole
number of chunks that no other grid point shares. The data variables go first and ``status`` last, so a
cell marked done is complete; a crash loses at most the cells in flight. Root attributes hold
the sweep's identity (a hash of dataset, models, options and grid) so a store can only be
resumed by the same sweep.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import time
import uuid
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
#: ``converged``: 1 where the fit ended by its own stopping rule (or is a closed form), 0 where it
#: ran out of iterations or its optimiser gave up (the model's ``converged_``)
SCALARS = ("elbo", "fit_seconds", "n_iter", "converged") + METRICS
MAX_TRACE = 2000
#: rows per chunk along ``point`` (embeddings, variances, generations): a grid point's cell of a
#: 10^6-point sweep is then 16 chunks of 1 MiB (latent_dim 2), not one chunk of 16 MiB that every
#: reader of a few rows must read and decompress whole
POINT_CHUNK = 65536


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
    converged: float = float("nan")
    fit_seconds: float = float("nan")
    extras: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)


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


def _proc_start(pid: int) -> float | None:
    """Start time of process ``pid`` (None if there is none): tells a live holder from a reused pid."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


#: holders of stale locks this process took over (their flow runs are marked crashed once an API is up)
STALE_HOLDERS: list[dict] = []


def record_flow_run(store, flow_run_id: str) -> None:
    """Add a flow run to the lock this process holds, so that if this process dies without a word
    (SIGKILL), the run that takes the stale lock over can mark that flow run crashed."""
    path = lock_path(store)
    try:
        have = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if have.get("pid") != os.getpid():
        return
    have["flow_runs"] = [*have.get("flow_runs", []), str(flow_run_id)]
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(have))
    os.replace(tmp, path)


class StoreLockedError(ValueError):
    """Another live process is writing the store."""


@contextlib.contextmanager
def store_lock(store):
    """Hold ``<store>.lock`` while a sweep writes the store.

    The lock file holds the holder's pid, process start time and host. A second sweep on the same
    store is refused with them; a lock left by a process that no longer runs (same host, pid gone or
    reused) is stale and taken over. Re-entrant within one process (the CLI takes it before the
    server starts, the flow again)."""
    path = lock_path(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = {"pid": os.getpid(), "start": _proc_start(os.getpid()), "host": socket.gethostname()}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                have = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                have = {}
            if not have:  # being written by its holder this instant, or a torn write: look again
                time.sleep(0.2)
                try:
                    have = json.loads(path.read_text() or "{}")
                except (OSError, ValueError):
                    have = {"pid": -1, "host": me["host"], "start": None}
            if have.get("pid") == me["pid"] and have.get("host") == me["host"]:
                yield  # this process holds it already
                return
            alive = have.get("host") != me["host"] or (
                _proc_start(int(have.get("pid", -1))) is not None
                and (have.get("start") is None or abs(_proc_start(int(have["pid"])) - have["start"]) < 1e-3)
            )
            if alive:
                raise StoreLockedError(
                    f"{store_path(store)} is being written by another sweep (pid {have.get('pid')} on host "
                    f"{have.get('host')}, since {have.get('since', '?')}); wait for it to finish, or if "
                    f"that process is gone, delete {path}"
                ) from None
            aside = path.with_name(f"{path.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:6]}")
            try:  # only one of several processes taking over a stale lock wins this rename
                path.rename(aside)
                aside.unlink()
                STALE_HOLDERS.append(have)
                print(
                    f"{store_path(store)}: removed a stale lock of pid {have.get('pid')} (no longer running)"
                )
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({**me, "since": time.strftime("%Y-%m-%d %H:%M:%S")}, f)
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return
    raise StoreLockedError(f"could not take the lock {path}; another sweep is starting on this store")


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
        chunks = tuple(min(s, POINT_CHUNK) if d == "point" else s for d, s in zip(extra_dims, extra_shape))
        return (
            sdims + tuple(extra_dims),
            da.full(sshape + tuple(extra_shape), fill, dtype=dtype, chunks=ones + chunks),
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


#: what gives a finished grid point its meaning: a store grows only among sweeps that share these
MEANING_KEYS = ("dataset", "data_fingerprint", "n_generations", "knn_method")


def growth(path, identity: dict, specs, grid) -> dict | None:
    """How the sweep ``identity`` extends the store at ``path``: None if the store holds exactly
    this sweep, else ``{"groups": {key: {dim: [new values]}}, "new_models": [keys]}``.

    A sweep grows a store when it has the same data (content), generation count, kNN method and
    options for every model the store holds, the store's models, and every grid value of the store
    (more seeds, k, latent_dim or kappa values, more models). Anything else would change what a
    finished point means, and is refused (ValueError)."""
    root = _open_root(Path(path))
    if root.attrs.get("sweep_id") == sweep_id(identity):
        return None
    try:
        have = json.loads(root.attrs.get("identity", "{}"))
    except ValueError:
        have = {}
    where = f"{Path(path)} holds a different sweep"
    fix = "; choose another store path, or pass --replace to move it aside"
    differ = [k for k in MEANING_KEYS if have.get(k) != json.loads(json.dumps(identity.get(k), default=str))]
    if differ:
        raise ValueError(f"{where} ({', '.join(differ)} differ){fix}")
    held = json.loads(root.attrs.get("groups", "[]"))
    keys = [s.key for s in specs]
    dropped = [k for k in held if k not in keys]
    if dropped:
        raise ValueError(f"{where}: it also holds models {dropped}; include them in --models{fix}")
    opts_have, opts_want = have.get("per_model", {}), identity.get("per_model", {})
    changed = [k for k in held if opts_have.get(k) != opts_want.get(k)]
    if changed:
        raise ValueError(f"{where}: the options of {changed} differ{fix}")
    out = {"groups": {}, "new_models": [k for k in keys if k not in held]}
    for spec in specs:
        if spec.key not in held:
            continue
        g = root[spec.key]
        want = model_grid(spec, grid)
        new = {}
        for d in spec.dims:
            stored = [v.item() for v in np.asarray(g[d][...])]
            missing = [v for v in stored if v not in want[d]]
            if missing:
                raise ValueError(
                    f"{where}: its {spec.key} grid has {d} = {missing}, which this sweep lacks; a sweep "
                    f"can only add values to a store (its {d} values: {stored}){fix}"
                )
            added = [v for v in want[d] if v not in stored]
            if added:
                new[d] = added
        if "latent_dim" in new and max(new["latent_dim"]) > g["embedding"].shape[-1]:
            raise ValueError(
                f"{where}: latent_dim {max(new['latent_dim'])} is above the store's largest "
                f"({g['embedding'].shape[-1]}), so its embeddings do not fit; use a new store"
            )
        if new:
            out["groups"][spec.key] = new
    return out


def _array_dims(arr) -> list:
    """A zarr array's dimension names: xarray's ``_ARRAY_DIMENSIONS`` attribute, else the zarr v3
    metadata's ``dimension_names``."""
    return arr.attrs.get("_ARRAY_DIMENSIONS") or list(getattr(arr.metadata, "dimension_names", None) or [])


def _grow_group(path: Path, key: str, new: dict) -> None:
    """Append new values along sweep dimensions of one group: every array with that dimension is
    resized (new cells read as pending / NaN: the arrays' fill values), then the coordinate gets
    its values. Resizing to the same target again is harmless, so an interrupted growth is
    finished by the next run."""
    g = zarr.open_group(str(path), mode="r+")[key]
    for d, added in new.items():
        coord = g[d]
        stored = list(np.asarray(coord[...]))
        target = len(stored) + len([v for v in added if v not in stored])
        for name in g.array_keys():
            arr = g[name]
            dims = _array_dims(arr)
            if d in dims and name != d:
                shape = list(arr.shape)
                shape[dims.index(d)] = target
                if tuple(shape) != arr.shape:
                    arr.resize(tuple(shape))
        todo = [v for v in added if v not in stored]
        if todo:
            coord.resize((target,))
            coord[len(stored) :] = np.asarray(todo, dtype=coord.dtype)


def _add_missing_scalars(path: Path, keys) -> None:
    """Give the groups of a store written by an earlier version the per-point scalars it lacks
    (``converged``), every cell NaN (not recorded), so that resuming or growing the store can
    write its new points."""
    root = zarr.open_group(str(path), mode="r+")
    for key in keys:
        g = root[key]
        st = g["status"]
        dims = _array_dims(st)
        for name in SCALARS:
            if name not in g:
                g.create_array(
                    name, shape=st.shape, chunks=st.chunks, dtype="float64", fill_value=np.nan,
                    dimension_names=dims,
                )  # fmt: skip


def store_grid(path, spec) -> dict:
    """A group's sweep coordinates in store order (a grown store appends new values at the end)."""
    g = zarr.open_group(str(path), mode="r")[spec.key]
    return {d: [v.item() for v in np.asarray(g[d][...])] for d in spec.dims}


def prepare_store(path, identity: dict, specs, grid, layout: Layout, attrs: dict) -> str:
    """Create the store and its group templates, or check that an existing one is this sweep's.

    Raises ValueError, before anything is written, if ``path`` holds a different sweep or
    something that is not a sweep store. A new store is set up under a temporary name beside it
    and renamed into place when complete, so an interrupted set-up leaves no half-made store under
    the final name (the leftover is removed by the next set-up). Call it holding
    :func:`store_lock`. Returns the sweep id.
    """
    path = Path(path)
    sid = sweep_id(identity)
    for old in path.parent.glob(f".{path.name}.setup-*"):  # an earlier set-up that was interrupted
        shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        root = _open_root(path)
        have = root.attrs.get("sweep_id")
        if have is None:
            raise ValueError(
                f"{path} is not an embed-sweep result store; choose another --store path, or pass "
                "--replace to move it aside"
            )
        grown = growth(path, identity, specs, grid)  # refuses a store this sweep cannot extend
        for key, new in (grown or {"groups": {}})["groups"].items():
            _grow_group(path, key, new)
        _add_missing_scalars(path, [s.key for s in specs if s.key in root])
        missing = [s.key for s in specs if s.key not in root]
        if not missing and grown is None:
            return sid
        target = path
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        missing = [s.key for s in specs]
        target = path.with_name(f".{path.name}.setup-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    zarr.open_group(str(target), mode="a", zarr_format=3)
    for s in specs:
        if s.key in missing:
            group_template(s, grid, layout).to_zarr(
                str(target), group=s.key, compute=False, mode="a", consolidated=False, zarr_format=3
            )
    root = zarr.open_group(str(target), mode="a")
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
    if target != path:
        target.rename(path)
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
    # direct zarr writes of whole chunks (a cell is a whole number of chunks of every variable,
    # shared with no other cell): the same bytes as xarray's region write at a fraction of its
    # per-call cost; status goes last
    group = zarr.open_group(str(path), mode="r+")[spec.key]
    sel = tuple(region[d] for d in sdims)
    for name, (_, arr) in data.items():
        z = group[name]
        z[sel + (slice(None),) * (z.ndim - len(sdims))] = arr.astype(z.dtype, copy=False)


def open_results(path) -> xr.DataTree:
    """The result store as an xarray DataTree (one group per model key)."""
    path = Path(path)
    if not path.exists() and store_path(path).exists():  # `x` names `x.zarr`
        path = store_path(path)
    if not path.exists():
        raise ValueError(f"result store {str(path)!r} does not exist")
    root = _open_root(path)
    if "sweep_id" not in root.attrs:
        raise ValueError(f"{path} is not an embed-sweep result store")
    return xr.open_datatree(str(path), engine="zarr", consolidated=False)


def remove_store(path) -> None:
    shutil.rmtree(path, ignore_errors=True)
