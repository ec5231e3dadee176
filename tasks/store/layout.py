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

import collections
import contextlib
import errno
import functools
import hashlib
import itertools
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
from zarr.codecs import Crc32cCodec, ZstdCodec

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
#: what each grid point records of the code that computed it (``numerics`` variable): the version
#: of the numerics, a hash of the abstract syntax trees (docstrings and comments left out) of
#: lvmcore's modules and of the tasks that call them and compute the metrics (tasks/fit.py,
#: tasks/evaluate.py, tasks/registry.py). Two versions that differ there may give other numbers for
#: the same grid point; a store is grown or resumed only by the version of its finished points.
NUMERICS_CHARS = 16


def _strip_docstrings(tree):
    import ast

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(getattr(body[0], "value", None), ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


@functools.lru_cache(maxsize=1)
def numerics_version() -> str:
    """The version of the numerics this code computes with (see ``NUMERICS_CHARS``): the first 16
    hex digits of a SHA-256 over each source file's path and docstring-free syntax tree."""
    import ast

    import lvmcore

    here = Path(__file__).resolve().parent
    pkg = Path(lvmcore.__file__).resolve().parent
    files = sorted(pkg.rglob("*.py")) + [here / "fit.py", here / "evaluate.py", here / "registry.py"]
    h = hashlib.sha256()
    for f in files:
        rel = f.relative_to(pkg.parent).as_posix()
        h.update(rel.encode() + b"\0")
        h.update(ast.dump(_strip_docstrings(ast.parse(f.read_text(), filename=rel))).encode() + b"\0")
    return h.hexdigest()[:NUMERICS_CHARS]


#: rows per chunk along ``point`` (embeddings, variances, generations): a grid point's cell of a
#: 10^6-point sweep is then 16 chunks of 1 MiB (latent_dim 2), not one chunk of 16 MiB that every
#: reader of a few rows must read and decompress whole
POINT_CHUNK = 65536

#: the bytes-to-bytes codecs of every array of a store this version writes: zarr's default zstd,
#: then zarr v3's crc32c codec, which appends a CRC-32C of each compressed chunk and refuses a
#: chunk whose bytes changed when it is read, so a damaged chunk is named instead of read as
#: numbers (issue 36 item 3). Stores written without it still open; ``verify`` says that their
#: chunks carry no checksum.
CHECKSUMMED = (ZstdCodec(level=0), Crc32cCodec())


@dataclass
class Layout:
    """Sizes of the non-sweep dimensions of every group of one sweep."""

    n_points: int
    q_max: int
    n_views: int = 1
    n_generations: int = 0
    trace_len: dict = field(default_factory=dict)  # key -> iterations kept
    #: the version of the numerics the points record (``numerics_version()`` of the process that
    #: planned the sweep, so every worker records the one its run is checked against)
    numerics: str = ""


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


def holder_alive(have: dict) -> bool:
    """Whether the lock record ``have`` ({"pid", "start", "host"}) names a live process: one on
    another host (it cannot be checked from here), or here with that pid and the same process start
    time (a reused pid is not the holder)."""
    if have.get("host") != socket.gethostname():
        return True
    started = _proc_start(int(have.get("pid", -1)))
    return started is not None and (have.get("start") is None or abs(started - have["start"]) < 1e-3)


class StoreLockedError(ValueError):
    """Another live process is writing the store."""


@contextlib.contextmanager
def store_lock(store):
    """Hold ``<store>.lock`` while a sweep writes the store.

    The lock file holds the holder's pid, process start time and host. A second sweep on the same
    store is refused with them; a lock left by a process that no longer runs (same host, pid gone or
    reused) is stale and taken over. Re-entrant within one process (the CLI takes it before the
    server starts, the flow again). Yields the stale holders it took over (their lock contents,
    with the flow runs they recorded, for the caller to mark crashed once an API is up)."""
    path = lock_path(store)
    stale: list[dict] = []
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
                yield []  # this process holds it already
                return
            if holder_alive(have):
                raise StoreLockedError(
                    f"{store_path(store)} is being written by another sweep (pid {have.get('pid')} on host "
                    f"{have.get('host')}, since {have.get('since', '?')}); wait for it to finish, or if "
                    f"that process is gone, delete {path}"
                ) from None
            aside = path.with_name(f"{path.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:6]}")
            try:  # only one of several processes taking over a stale lock wins this rename
                path.rename(aside)
                aside.unlink()
                stale.append(have)
                print(
                    f"{store_path(store)}: removed a stale lock of pid {have.get('pid')} (no longer running)"
                )
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({**me, "since": time.strftime("%Y-%m-%d %H:%M:%S")}, f)
        try:
            yield stale
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
        "numerics": lazy((), (), fill="", dtype=f"<U{NUMERICS_CHARS}"),
    }
    if spec.has_variance:
        v["embedding_var"] = lazy(("point", "component"), (n, q))
    for name in SCALARS:
        v[name] = lazy((), ())
    for name, dims in _stored_extras(spec, layout).items():
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


def _same_file_source(a, b) -> bool:
    """Two ``[source, options]`` of files (not named data sets) with the same options: one data
    set whatever the path's spelling (relative, absolute, another copy), as its content is compared
    by ``data_fingerprint``."""
    from lvmcore.data import list_datasets

    if not (isinstance(a, list) and isinstance(b, list) and len(a) == len(b) == 2):
        return False
    names = set(list_datasets())
    return a[0] not in names and b[0] not in names and a[1] == b[1]


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
    want = {k: json.loads(json.dumps(identity.get(k), default=str)) for k in MEANING_KEYS}
    differ = [
        k for k in MEANING_KEYS
        if have.get(k) != want[k] and not (k == "dataset" and _same_file_source(have.get(k), want[k]))
    ]  # fmt: skip
    if differ:
        why = ""
        if "data_fingerprint" in differ:
            why = ": the data changed since the store was made (the file's content or the data set's options)"
        raise ValueError(f"{where} ({', '.join(differ)} differ){why}{fix}")
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


def _stored_extras(spec: ModelSpec, layout: Layout) -> dict:
    """A model's extras as its group template holds them (no generation arrays without generations)."""
    skip = ("generations", "scale_study") if layout.n_generations == 0 else ()
    return {name: dims for name, dims in spec.extras.items() if name not in skip}


def _refuse_missing_extras(path: Path, specs, layout: Layout) -> None:
    """ValueError, before anything is written, for a store written by an earlier version whose group
    lacks an extra output with dimensions of its own (only per-point values can be added to it:
    :func:`_add_missing_scalars`)."""
    root = zarr.open_group(str(path), mode="r")
    for spec in specs:
        lacking = [n for n, dims in _stored_extras(spec, layout).items() if dims and n not in root[spec.key]]
        if lacking:
            raise ValueError(
                f"{path} was written by an earlier embed-sweep: its {spec.key} group lacks {lacking}; "
                "choose another store path, or pass --replace to move it aside"
            )


def _add_missing_scalars(path: Path, specs, layout: Layout) -> None:
    """Give the groups of a store written by an earlier version the per-point values it lacks
    (the scalars ``converged``, ``numerics``, and a model's per-point extras such as
    ``hgplvm_sparse``'s ``minibatch``), every cell NaN or "" (not recorded), so that resuming or
    growing the store can write its new points."""
    root = zarr.open_group(str(path), mode="r+")
    for spec in specs:
        g = root[spec.key]
        st = g["status"]
        dims = _array_dims(st)
        per_point = [name for name, extra_dims in _stored_extras(spec, layout).items() if not extra_dims]
        for name in [*SCALARS, *per_point]:
            if name not in g:
                g.create_array(
                    name, shape=st.shape, chunks=st.chunks, dtype="float64", fill_value=np.nan,
                    dimension_names=dims, compressors=CHECKSUMMED,
                )  # fmt: skip
        if "numerics" not in g:
            g.create_array(
                "numerics", shape=st.shape, chunks=st.chunks, dtype=f"<U{NUMERICS_CHARS}", fill_value="",
                dimension_names=dims, compressors=CHECKSUMMED,
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
        damaged = check_metadata(path, rebuild=True)  # what the caller's check_store let through
        if damaged:
            _rebuild_metadata(path, damaged, specs, layout)
        root = _open_root(path)
        have = root.attrs.get("sweep_id")
        if have is None:
            raise ValueError(
                f"{path} is not an embed-sweep result store; choose another --store path, or pass "
                "--replace to move it aside"
            )
        grown = growth(path, identity, specs, grid)  # refuses a store this sweep cannot extend
        held = [s for s in specs if s.key in root]
        _refuse_missing_extras(path, held, layout)
        for key, new in (grown or {"groups": {}})["groups"].items():
            _grow_group(path, key, new)
        _add_missing_scalars(path, held, layout)
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
            _write_template(group_template(s, grid, layout), target, s.key)
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


def _write_template(ds: xr.Dataset, target, key: str) -> None:
    """Write a group's lazy template (metadata and coordinates), every array with ``CHECKSUMMED``."""
    ds.to_zarr(
        str(target), group=key, compute=False, mode="a", consolidated=False, zarr_format=3,
        encoding={name: {"compressors": CHECKSUMMED} for name in ds.variables},
    )  # fmt: skip


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
        for name, dims in _stored_extras(spec, layout).items():
            if name in res.extras:
                data[name] = var(dims, _pad(res.extras[name], _extra_shape(dims, layout)))
    code = STATUS_DONE if res.status == "done" else STATUS_FAILED
    data["error"] = var((), np.array(res.error[:ERROR_CHARS], dtype=f"<U{ERROR_CHARS}"))
    version = layout.numerics or numerics_version()
    data["numerics"] = var((), np.array(version, dtype=f"<U{NUMERICS_CHARS}"))
    data["status"] = var((), np.int8(code))
    # direct zarr writes of whole chunks (a cell is a whole number of chunks of every variable,
    # shared with no other cell): the same bytes as xarray's region write at a fraction of its
    # per-call cost; status goes last
    group = zarr.open_group(str(path), mode="r+")[spec.key]
    sel = tuple(region[d] for d in sdims)
    for name, (_, arr) in data.items():
        z = group[name]
        z[sel + (slice(None),) * (z.ndim - len(sdims))] = arr.astype(z.dtype, copy=False)


def check_numerics(path, skip=()) -> None:
    """Refuse to resume or grow a store whose finished points were computed by another version of
    the numerics (``numerics`` per point, see ``NUMERICS_CHARS``): their numbers and this code's
    would not be one study. ValueError with the fix (--replace, or another store). Groups in
    ``skip`` (metadata this run rebuilds: :func:`metadata_to_rebuild`) and cells whose chunks cannot
    be read (damaged points, run again: :func:`verify_points`) are left out."""
    root = zarr.open_group(str(path), mode="r")
    mine, other, unknown = numerics_version(), collections.Counter(), 0
    for key in json.loads(root.attrs.get("groups", "[]")):
        if key in skip or key not in root:
            continue
        g = root[key]
        status, _ = _read_status(g["status"])
        done = status == STATUS_DONE
        if not done.any():
            continue
        if "numerics" not in g:
            unknown += int(done.sum())
            continue
        values, damaged = _read_cells(g["numerics"], "")  # damaged cells are left out
        versions = [values[idx] for idx in map(tuple, np.argwhere(done)) if idx not in damaged]
        for v in versions:
            if v == "":
                unknown += 1
            elif v != mine:
                other[str(v)] += 1
    if other or unknown:
        parts = [f"{n} by numerics {v}" for v, n in other.most_common()]
        if unknown:
            parts.append(f"{unknown} by a version before numerics were recorded")
        raise ValueError(
            f"{Path(path)} holds finished grid points computed by another version of the numerics "
            f"({', '.join(parts)}; this code is {mine}), so its results and this run's would not be one "
            "study; pass --replace to move the store aside (nothing is deleted) and start afresh, or "
            "choose a new --store"
        )


class StoreWriteError(OSError):
    """The store (or its inputs) cannot be written: a full disk, a read-only or unwritable chunk.
    Its message is the one line a user needs: what, where, the free space, and that a re-run resumes."""

    def __reduce__(self):  # one argument (the message) through pickling between processes
        return (type(self), (str(self),))


def write_error(where, e: OSError) -> StoreWriteError:
    """The one-line StoreWriteError for an OSError ``e`` raised writing under ``where``."""
    if isinstance(e, StoreWriteError):
        return e
    p = Path(where)
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = f"{shutil.disk_usage(probe).free / 2**20:.1f} MiB free there"
    except OSError:
        free = "free space unknown"
    what = e.strerror or type(e).__name__
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space (or choose another --out)"
    else:
        fix = "make it writable (or choose another --out)"
    target = e.filename or p
    return StoreWriteError(
        f"cannot write {target}: {what} ({free}); the finished grid points are kept: {fix} and run the "
        "same command again to resume"
    )


def failure_summary(store, limit: int = 5) -> list[str]:
    """The distinct errors of a store's failed grid points, most frequent first, one line each:
    ``  key: n point(s): reason``."""
    import re

    root = zarr.open_group(str(store), mode="r")
    seen = collections.Counter()
    for key in root.group_keys():
        g = root[key]
        status = g["status"][...]
        errors = g["error"][...]
        for msg in errors[status == STATUS_FAILED].ravel():
            seen[(key, re.sub(r" \[[^\]]*\]$", "", str(msg)))] += 1
    return [f"  {key}: {n} point(s): {msg}" for (key, msg), n in seen.most_common(limit)]


class StoreDamagedError(ValueError):
    """A result store whose metadata or finished points cannot be trusted (names what and the fix)."""


#: the fix for damaged metadata that defines the sweep (the root's zarr.json: its identity) or what
#: each cell means (a coordinate array's): nothing of the sweep can be trusted without it
METADATA_FIX = (
    "restore that file from a backup, or run the sweep again with --replace, which moves the store "
    "aside (nothing is deleted) and starts afresh"
)
#: the fix for the damaged or missing metadata of a model group or of one of its per-point arrays:
#: both follow from the sweep's definition, so a re-run of the same sweep writes them again
REBUILD_FIX = (
    "run the same `embed-sweep run` command again: it rebuilds that file from the sweep's definition "
    "and recomputes the grid points whose values it described"
)
#: the fix for damaged finished points
POINTS_FIX = "run the same `embed-sweep run` command again: it recomputes them"
#: the arrays every model group has had from the first store version (others may be missing from an
#: older store: ``_add_missing_scalars`` adds them)
REQUIRED_ARRAYS = ("status", "error", "embedding", "elbo_trace")


def _read_meta(f: Path) -> tuple[dict | None, str]:
    """A ``zarr.json``'s content, or None and what is wrong with it."""
    try:
        meta = json.loads(f.read_bytes())
        if not isinstance(meta, dict) or "node_type" not in meta:
            raise ValueError("not zarr v3 metadata (no node_type)")
        return meta, ""
    except FileNotFoundError:
        return None, "is missing (damaged metadata)"
    except (ValueError, UnicodeDecodeError) as e:
        return None, f"is damaged ({type(e).__name__}: {e})"


def check_metadata(path, rebuild: bool = False) -> list[dict]:
    """Every ``zarr.json`` of the store (root, model groups, their arrays) present and parsing, and
    each model group holding its coordinates and ``REQUIRED_ARRAYS``; else :class:`StoreDamagedError`
    naming the file and the fix, before anything else reads the store.

    The root's metadata (the sweep's identity) and a coordinate array's (what each cell means)
    are refused with ``METADATA_FIX``. A model group's own metadata and its per-point arrays'
    follow from the sweep's definition: refused with ``REBUILD_FIX``, or with ``rebuild`` returned
    as ``[{"key", "name" (None: the group's own), "file", "what"}]`` for :func:`prepare_store` to
    rebuild (:func:`_rebuild_metadata`)."""
    from tasks.registry import MODELS, SWEEP_DIMS

    path = Path(path)
    root, what = _read_meta(path / "zarr.json")
    if root is None:
        raise StoreDamagedError(f"{path / 'zarr.json'} {what}; {METADATA_FIX}")
    try:
        listed = set(json.loads(root.get("attributes", {}).get("groups", "[]")))
    except (TypeError, ValueError):
        listed = set()
    found, dirs = [], []
    with contextlib.suppress(OSError):
        dirs = sorted((e for e in os.scandir(path) if e.is_dir()), key=lambda e: e.name)
        for group in dirs:
            key, gdir = group.name, Path(group.path)
            meta, what = _read_meta(gdir / "zarr.json")
            if meta is None:
                if key not in listed:
                    raise StoreDamagedError(f"{gdir / 'zarr.json'} {what}; {METADATA_FIX}")
                found.append({"key": key, "name": None, "file": gdir / "zarr.json", "what": what})
            sdims = (meta or {}).get("attributes", {}).get("sweep_dims") or (
                MODELS[key].dims if key in MODELS else SWEEP_DIMS
            )
            coords = {*sdims, "cov_scale"}
            present = set()
            for a in sorted((e for e in os.scandir(gdir) if e.is_dir()), key=lambda e: e.name):
                present.add(a.name)
                f = Path(a.path) / "zarr.json"
                _, what = _read_meta(f)
                if not what:
                    continue
                if key not in listed or a.name in coords:
                    raise StoreDamagedError(f"{f} {what}; {METADATA_FIX}")
                found.append({"key": key, "name": a.name, "file": f, "what": what})
            if key not in listed:
                continue
            for d in sdims:
                if d not in present:
                    raise StoreDamagedError(f"{gdir / d} is missing (a coordinate array); {METADATA_FIX}")
            for name in REQUIRED_ARRAYS:
                if name not in present:
                    found.append(
                        {"key": key, "name": name, "file": gdir / name / "zarr.json", "what": "is missing"}
                    )
    for key in sorted(listed - {d.name for d in dirs}):
        found.append({"key": key, "name": None, "file": path / key, "what": "is missing (the whole group)"})
    if found and not rebuild:
        more = f" (and {len(found) - 1} more damaged metadata files)" if len(found) > 1 else ""
        raise StoreDamagedError(f"{found[0]['file']} {found[0]['what']}{more}; {REBUILD_FIX}")
    return found


def metadata_to_rebuild(path, sweep: str) -> set[str]:
    """Before a run of the sweep ``sweep`` (its id) on the store ``path``: the model groups whose
    damaged metadata the run will rebuild (:func:`check_metadata` with ``rebuild``), each said here.
    Only the sweep that made the store rebuilds it; any other (a grown grid) is refused."""
    found = check_metadata(path, rebuild=True)
    if not found:
        return set()
    have = zarr.open_group(str(path), mode="r").attrs.get("sweep_id")
    if have != sweep:
        raise StoreDamagedError(
            f"{found[0]['file']} {found[0]['what']}; only the sweep that made {Path(path)} rebuilds it: run "
            "that sweep again unchanged first (then grow it), or pass --replace to move the store aside"
        )
    for d in found:
        again = " and recomputes the grid points whose values it described" if d["name"] else ""
        print(f"{d['file']} {d['what']}: this run rebuilds it from the sweep's definition{again}")
    return {d["key"] for d in found}


def _rebuild_metadata(path: Path, found: list[dict], specs, layout: Layout) -> None:
    """Write the damaged metadata :func:`check_metadata` found again from the sweep's definition
    (its group template, over the store's own coordinates): a group's own ``zarr.json`` as is (its
    arrays keep their values); a per-point array afresh, without its chunks (what they hold cannot be
    read without the metadata that was lost), and its group's finished points set pending."""
    by_key = {s.key: s for s in specs}
    side = path.with_name(f".{path.name}.rebuild-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        for key in dict.fromkeys(d["key"] for d in found):
            spec, gdir = by_key.get(key), path / key
            if not gdir.exists():  # a whole group: prepare_store writes its template afresh
                continue
            if spec is None:
                raise StoreDamagedError(f"{found[0]['file']} {found[0]['what']}; {METADATA_FIX}")
            own = {d["name"] for d in found if d["key"] == key}
            coords = {d: [v.item() for v in np.asarray(zarr.open_array(str(gdir / d), mode="r")[...])]
                      for d in spec.dims}  # fmt: skip
            tmpl = group_template(spec, coords, layout)
            _write_template(tmpl, side, key)
            if None in own:
                shutil.copyfile(side / key / "zarr.json", gdir / "zarr.json")
            arrays = sorted(n for n in own if n is not None)
            for name in arrays:
                if name not in tmpl.variables:
                    raise StoreDamagedError(f"{gdir / name / 'zarr.json'} is damaged; {METADATA_FIX}")
                shutil.rmtree(gdir / name, ignore_errors=True)
                (gdir / name).mkdir()
                shutil.copyfile(side / key / name / "zarr.json", gdir / name / "zarr.json")
            n = 0
            if arrays and "status" not in arrays:  # a rebuilt status holds no point: all pending
                st = zarr.open_group(str(path), mode="r+")[key]["status"]
                status, bad = _read_status(st)
                cells = [tuple(int(i) for i in ix) for ix in np.argwhere(status != STATUS_PENDING)]
                cells += list(bad)
                mark_pending(path, [{"key": key, "index": ix} for ix in cells])
                n = len(cells)
            for name in sorted(own, key=str):
                f = gdir / "zarr.json" if name is None else gdir / name / "zarr.json"
                again = f"; {n} grid point(s) of {key} run again" if name is not None else ""
                print(f"{f}: rebuilt from the sweep's definition{again}")
    finally:
        shutil.rmtree(side, ignore_errors=True)


def _chunk_files(arr_dir: Path) -> set[str]:
    """Relative paths of the chunk files an array's folder holds (one listing)."""
    out = set()
    for dirpath, _, names in os.walk(arr_dir / "c"):
        rel = os.path.relpath(dirpath, arr_dir)
        out.update(f"{rel}/{n}".replace(os.sep, "/") for n in names)
    return out


def point_name(key: str, point: dict) -> str:
    return f"{key} " + " ".join(f"{d}={v}" for d, v in point.items())


def has_checksum(arr) -> bool:
    """Whether an array's chunks carry a crc32c checksum (``CHECKSUMMED``; not in older stores)."""
    return any(isinstance(c, Crc32cCodec) for c in arr.metadata.codecs)


def _unreadable(e: Exception) -> str:
    if "checksum" in str(e):
        return "fails its crc32c checksum (its bytes changed after it was written)"
    return f"cannot be read ({type(e).__name__}: {str(e)[:120]})"


def _read_cell(arr, cell: tuple):
    """The values of a grid point's cell ``arr[cell]`` (whole chunks: every sweep dimension has chunk
    size 1), or None and ``(chunk key, why)`` of its first chunk that cannot be read (a checksum
    that fails, bytes that do not decode)."""
    try:
        return np.asarray(arr[cell]), None
    except Exception as e:
        first = e
    nd, enc = len(cell), arr.metadata.chunk_key_encoding
    for rest in itertools.product(*(range(-(-n // c)) for n, c in zip(arr.shape[nd:], arr.chunks[nd:]))):
        sel = cell + tuple(slice(r * c, (r + 1) * c) for r, c in zip(rest, arr.chunks[nd:]))
        try:
            arr[sel]
        except Exception as e:
            return None, (enc.encode_chunk_key(cell + rest), _unreadable(e))
    return None, (enc.encode_chunk_key(cell + (0,) * (arr.ndim - nd)), _unreadable(first))


def _read_cells(arr, fill) -> tuple[np.ndarray, dict]:
    """A one-value-per-grid-point array (``status``, ``numerics``) whole, and ``{index: (chunk key,
    why)}`` of the cells whose chunk cannot be read, which hold ``fill`` here (a status read as
    pending, so the point runs again; a version left out by the caller)."""
    try:
        return np.asarray(arr[...]), {}
    except Exception:  # a damaged chunk: read cell by cell, naming the damaged ones
        pass
    values, bad = np.full(arr.shape, fill, dtype=arr.dtype), {}
    for idx in np.ndindex(arr.shape):
        val, why = _read_cell(arr, idx)
        if why is None:
            values[idx] = val
        else:
            bad[idx] = why
    return values, bad


def _read_status(st) -> tuple[np.ndarray, dict]:
    """A group's status array, and the cells whose chunk cannot be read (:func:`_read_cells`: their
    status is unknown, read as pending)."""
    return _read_cells(st, STATUS_PENDING)


#: arrays up to this size are read whole when a store is verified (zarr reads their chunks at once);
#: larger ones (embeddings, generations) one grid point's cell at a time
WHOLE_READ_BYTES = 64 * 2**20


def verify_points(path, finite: bool = True) -> list[dict]:
    """The grid points of a store that cannot be trusted, each as ``{"key", "index", "point",
    "what", "chunk"}`` (``chunk``: the damaged chunk file under the group, if one is):

    - a finished (done) point with a chunk file of its ``embedding`` or ``elbo_trace`` missing (a
      listing of the files, which every done point writes: they always hold values);
    - a chunk of any of its arrays that cannot be read: a crc32c checksum that fails
      (``CHECKSUMMED``) or bytes that do not decode; for failed points, their ``error`` and
      ``numerics`` (what the summaries read); a ``status`` chunk (the point's state is unknown);
    - with ``finite``, a done point's embedding value that is NaN or infinite within its latent
      dimensions (every model promises a finite embedding).

    Arrays whose sweep dimensions disagree with ``status`` are damaged metadata
    (:class:`StoreDamagedError`)."""
    path = Path(path)
    root = zarr.open_group(str(path), mode="r")
    keys = json.loads(root.attrs.get("groups", "[]"))
    bad = []
    for key in keys:
        if key not in root:
            continue
        g = root[key]
        st = g["status"]
        sdims = _array_dims(st)
        status, unknown = _read_status(st)
        coords = {d: np.asarray(g[d][...]) for d in sdims}
        cells = {}  # per-point arrays: name -> array
        for name in g.array_keys():
            arr = g[name]
            dims = _array_dims(arr)
            for d in sdims:
                if d in dims and arr.shape[dims.index(d)] != status.shape[sdims.index(d)] and name != d:
                    raise StoreDamagedError(
                        f"{path / key / name / 'zarr.json'} says {name} has {arr.shape[dims.index(d)]} "
                        f"values along {d}, the group has {status.shape[sdims.index(d)]}; {METADATA_FIX}"
                    )
            if name != "status" and tuple(dims[: len(sdims)]) == tuple(sdims) and name not in sdims:
                cells[name] = arr
        why = {idx: (f"chunk file status/{ck} {w}", f"status/{ck}") for idx, (ck, w) in unknown.items()}
        done = [tuple(int(i) for i in idx) for idx in np.argwhere(status == STATUS_DONE)]
        failed = [tuple(int(i) for i in idx) for idx in np.argwhere(status == STATUS_FAILED)]
        for name in ("embedding", "elbo_trace"):
            if name not in cells or not done:
                continue
            arr = cells[name]
            have = _chunk_files(path / key / name)
            extra = [range(-(-n // c)) for n, c in zip(arr.shape[len(sdims) :], arr.chunks[len(sdims) :])]
            enc = arr.metadata.chunk_key_encoding
            for idx in done:
                for rest in itertools.product(*extra):
                    ckey = enc.encode_chunk_key(idx + rest)
                    if ckey not in have:
                        why.setdefault(idx, (f"chunk file {name}/{ckey} is missing", None))
                        break
        q_of = coords.get("latent_dim")
        for name, arr in sorted(cells.items()):
            todo = [i for i in done + (failed if name in ("error", "numerics") else []) if i not in why]
            if not todo:
                continue
            if name != "embedding" and arr.nbytes <= WHOLE_READ_BYTES:
                try:  # the usual case: every chunk reads (and its checksum holds)
                    arr[...]
                    continue
                except Exception:
                    pass
            for idx in todo:
                val, problem = _read_cell(arr, idx)
                if problem is not None:
                    ck, w = problem
                    why[idx] = (f"chunk file {name}/{ck} {w}", f"{name}/{ck}")
                elif finite and name == "embedding":
                    q = int(q_of[idx[sdims.index("latent_dim")]]) if q_of is not None else arr.shape[-1]
                    cell = val[..., :q]
                    if not np.all(np.isfinite(cell)):
                        r = np.argwhere(~np.isfinite(cell))[0]
                        why[idx] = (
                            f"embedding holds {cell[tuple(r)]} at point {r[0]}, component {r[-1]}",
                            None,
                        )
        for idx, (what, chunk) in sorted(why.items()):
            point = {d: coords[d][i].item() for d, i in zip(sdims, idx)}
            bad.append({"key": key, "index": idx, "point": point, "what": what, "chunk": chunk})
    return bad


def checksum_coverage(path) -> tuple[int, int]:
    """How many of the per-point arrays of a store's model groups carry crc32c checksums, of how many."""
    root = zarr.open_group(str(path), mode="r")
    n = have = 0
    for key in json.loads(root.attrs.get("groups", "[]")):
        if key in root:
            for _, arr in root[key].arrays():
                n += 1
                have += has_checksum(arr)
    return have, n


def describe_damage(path, bad: list[dict], limit: int = 5) -> str:
    names = "; ".join(f"{point_name(b['key'], b['point'])} ({b['what']})" for b in bad[:limit])
    more = f"; and {len(bad) - limit} more" if len(bad) > limit else ""
    return f"{Path(path)}: {len(bad)} finished grid point(s) are damaged: {names}{more}"


def mark_pending(path, bad: list[dict]) -> None:
    """Set damaged points back to pending (their data is rewritten when they run again); a damaged
    chunk file is removed first, so its bytes are never read again (the cell reads as fill values)."""
    root = zarr.open_group(str(path), mode="r+")
    for b in bad:
        if b.get("chunk"):
            with contextlib.suppress(FileNotFoundError):
                (Path(path) / b["key"] / b["chunk"]).unlink()
        g = root[b["key"]]
        g["error"][b["index"]] = ""
        g["status"][b["index"]] = STATUS_PENDING


def open_results(path, check: bool = True) -> xr.DataTree:
    """The result store as an xarray DataTree (one group per model key), checked first: its
    metadata (:func:`check_metadata`) and, with ``check``, its finished points
    (:func:`verify_points`); a damaged store is refused naming what and the fix (StoreDamagedError)."""
    path = Path(path)
    if not path.exists() and store_path(path).exists():  # `x` names `x.zarr`
        path = store_path(path)
    if not path.exists():
        raise ValueError(f"result store {str(path)!r} does not exist")
    check_metadata(path)
    root = _open_root(path)
    if "sweep_id" not in root.attrs:
        raise ValueError(f"{path} is not an embed-sweep result store")
    if check:
        bad = verify_points(path)
        if bad:
            raise StoreDamagedError(f"{describe_damage(path, bad)}; {POINTS_FIX}")
    return xr.open_datatree(str(path), engine="zarr", consolidated=False)


def remove_store(path) -> None:
    shutil.rmtree(path, ignore_errors=True)
