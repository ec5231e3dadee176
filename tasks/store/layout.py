"""Writing the result store: set-up (or the check that an existing store is this sweep's), growth by
new grid values or models, one grid point's region write, and the one-line write errors.

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
import errno
import json
import os
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import zarr

from lvmcore import __version__
from lvmcore.data import list_datasets
from tasks.registry import EXTRAS_FLAG, ModelSpec, model_grid
from tasks.store.fingerprint import NUMERICS_CHARS, numerics_version, sweep_id
from tasks.store.integrity import check_metadata, rebuild_metadata
from tasks.store.models import write_model, write_model_note
from tasks.store.schema import (
    CHECKSUMMED,
    ERROR_CHARS,
    METRICS,
    MODEL_BYTES,
    SCALARS,
    SCHEMA_VERSION,
    STATUS_DONE,
    STATUS_FAILED,
    Layout,
    PointResult,
    array_dims,
    extra_shape,
    group_template,
    open_root,
    stored_extras,
    write_template,
)

#: what gives a finished grid point its meaning: a store grows only among sweeps that share these
MEANING_KEYS = ("dataset", "data_fingerprint", "n_generations", "knn_method")


def _same_file_source(a, b) -> bool:
    """Two ``[source, options]`` of files (not named data sets) with the same options: one data
    set whatever the path's spelling (relative, absolute, another copy), as its content is compared
    by ``data_fingerprint``."""
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
    root = open_root(Path(path))
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
        both = "; ".join(f"{k}: {opts_have.get(k)} in the store, {opts_want.get(k)} now" for k in changed)
        raise ValueError(f"{where}: the options of {changed} differ ({both}){fix}")
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
            dims = array_dims(arr)
            if d in dims and name != d:
                shape = list(arr.shape)
                shape[dims.index(d)] = target
                if tuple(shape) != arr.shape:
                    arr.resize(tuple(shape))
        todo = [v for v in added if v not in stored]
        if todo:
            coord.resize((target,))
            coord[len(stored) :] = np.asarray(todo, dtype=coord.dtype)


def _refuse_missing_extras(path: Path, specs, layout: Layout) -> None:
    """ValueError, before anything is written, for a store written by an earlier version whose group
    lacks an extra output with dimensions of its own (only per-point values can be added to it:
    :func:`_add_missing_scalars`)."""
    root = zarr.open_group(str(path), mode="r")
    for spec in specs:
        lacking = [n for n, dims in stored_extras(spec, layout).items() if dims and n not in root[spec.key]]
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
        dims = array_dims(st)
        per_point = [name for name, extra_dims in stored_extras(spec, layout).items() if not extra_dims]
        for name in [*SCALARS, MODEL_BYTES, *per_point]:
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
    :func:`tasks.store.lock.store_lock`. Returns the sweep id.
    """
    path = Path(path)
    sid = sweep_id(identity)
    for old in path.parent.glob(f".{path.name}.setup-*"):  # an earlier set-up that was interrupted
        shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        damaged = check_metadata(path, rebuild=True)  # what the caller's check_store let through
        if damaged:
            rebuild_metadata(path, damaged, specs, layout)
        root = open_root(path)
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
        if root.attrs.get("schema_version", 1) < SCHEMA_VERSION:
            # a store of an earlier version, resumed or grown: its new points keep their models
            write_store_attrs(path, {"schema_version": SCHEMA_VERSION})
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
            write_template(group_template(s, grid, layout), target, s.key)
    root = zarr.open_group(str(target), mode="a")
    root.attrs.update(
        {
            **encode_attrs(attrs),
            "sweep_id": sid,
            "schema_version": SCHEMA_VERSION,
            "code_version": __version__,
            "identity": json.dumps(identity, sort_keys=True, default=str),
            "groups": json.dumps([s.key for s in specs]),
        }
    )
    if target != path:
        target.rename(path)
    return sid


def encode_attrs(attrs: dict) -> dict:
    """Root attributes as the store holds them: a mapping, list or tuple as its JSON text, any other
    value as it is."""
    return {
        k: (json.dumps(v, default=str) if isinstance(v, (dict, list, tuple)) else v) for k, v in attrs.items()
    }


def write_store_attrs(path, attrs: dict) -> None:
    """Add (or replace) root attributes of the store at ``path`` (encoded by :func:`encode_attrs`),
    e.g. ``{"evaluation_notes": [...]}``, which ``show`` reads back."""
    zarr.open_group(str(path), mode="r+").attrs.update(encode_attrs(attrs))


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
        for name, dims in stored_extras(spec, layout).items():
            if name in res.extras:
                data[name] = var(dims, _pad(res.extras[name], extra_shape(dims, layout)))
        # the fitted model goes before the point's status: a point marked done has its model
        if res.model is not None:
            size = write_model(path, spec.key, res.point, *res.model)
        else:
            write_model_note(path, spec.key, res.point, res.model_error or "the fit kept no model")
            size = 0
        data[MODEL_BYTES] = var((), np.float64(size))
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


def write_extras(path, spec: ModelSpec, index: tuple, extras: dict, layout: Layout) -> None:
    """Write extra outputs (``extras``: name -> array, e.g. GLLE's generations, its scale study and
    their per-point flag) into the cell of the finished grid point at ``index``, leaving every
    other array of the cell as it is; the flag (``EXTRAS_FLAG``) goes last, so a cell that says it
    carries them has them."""
    group = zarr.open_group(str(path), mode="r+")[spec.key]
    sel = tuple(slice(i, i + 1) for i in index)
    names = [n for n in stored_extras(spec, layout) if n in extras]
    for name in sorted(names, key=lambda n: n == EXTRAS_FLAG):
        dims = spec.extras[name]
        z = group[name]
        val = _pad(extras[name], extra_shape(dims, layout))
        z[sel + (slice(None),) * (z.ndim - len(index))] = val.reshape((1,) * len(index) + val.shape)


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
    root = zarr.open_group(str(store), mode="r")
    seen = collections.Counter()
    for key in root.group_keys():
        g = root[key]
        status = g["status"][...]
        errors = g["error"][...]
        for msg in errors[status == STATUS_FAILED].ravel():
            seen[(key, re.sub(r" \[[^\]]*\]$", "", str(msg)))] += 1
    return [f"  {key}: {n} point(s): {msg}" for (key, msg), n in seen.most_common(limit)]


def remove_store(path) -> None:
    shutil.rmtree(path, ignore_errors=True)
