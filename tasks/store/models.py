"""Each finished grid point's fitted model in the result store, as plain arrays plus JSON (issue 50
item 1): the group ``<model key>/models/<point id>/`` holds one zarr array per array of the
estimator's ``to_arrays()`` (written with ``CHECKSUMMED``, as every other array of the store) and,
as attributes, its params (JSON text), the arrays' names and the point's coordinates. No pickle,
nothing that executes on load: the estimator is rebuilt by ``lvmcore.models.persist`` from the
class named in the params, among lvmcore's public estimators.

The per-point array ``model_bytes`` of the model's group records the bytes the point's model takes
on disk (NaN: not recorded, a point written before models were kept; 0: none kept, removed by
``--keep-models chosen`` or not persistable), so :func:`tasks.store.integrity.verify_points` knows
which points must hold a model, and the report states the size per point."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import zarr

from tasks.store.schema import CHECKSUMMED, MODEL_BYTES, POINT_CHUNK

#: the subgroup of a model group that holds the points' models
MODELS_GROUP = "models"
#: an array's name that is kept as its node name (others get ``a<i>``, their name in the attributes)
_NODE_NAME = re.compile(r"^(?!__)[A-Za-z0-9_.\-]+$")


def point_id(point: dict) -> str:
    """A grid point's group name from its coordinates, e.g. ``k=8,latent_dim=2,seed=0`` (the
    dimensions in name order, whatever order ``point`` lists them in)."""
    return ",".join(f"{d}={_value(point[d])}" for d in sorted(point))


def _value(v) -> str:
    v = v.item() if hasattr(v, "item") else v
    return repr(float(v)) if isinstance(v, float) else str(v)


def model_dir(path, key: str, point: dict) -> Path:
    return Path(path) / key / MODELS_GROUP / point_id(point)


def _dir_bytes(d: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(d):
        for n in names:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(dirpath, n))
    return total


def _chunks(shape: tuple) -> tuple:
    """``POINT_CHUNK`` rows along the first axis (a large model, LL-LVM's q(C), is read a part at
    a time), every other axis whole; at least 1 along each."""
    if not shape:
        return ()
    return (max(1, min(shape[0], POINT_CHUNK)),) + tuple(max(1, s) for s in shape[1:])


def _models_group(path, key: str):
    """The ``models`` subgroup of a model group, made where missing or its metadata damaged (it
    holds nothing but its points' groups)."""
    meta = Path(path) / key / MODELS_GROUP / "zarr.json"
    try:
        return zarr.open_group(str(meta.parent), mode="r+")
    except Exception:  # missing or damaged: written afresh (its points' groups are left as they are)
        meta.unlink(missing_ok=True)
        return zarr.open_group(str(path), mode="r+")[key].require_group(MODELS_GROUP)


def write_model(path, key: str, point: dict, arrays: dict, params: dict) -> int:
    """Write one grid point's fitted model (``to_arrays()``'s ``arrays`` and ``params``) under its
    group, replacing any earlier one; returns its bytes on disk. The attributes go last: a group
    whose write was interrupted has no ``arrays`` attribute and reads as damaged."""
    group = _models_group(path, key)
    pid = point_id(point)
    target = Path(path) / key / MODELS_GROUP / pid
    if target.exists():
        shutil.rmtree(target)
    g = group.create_group(pid)
    names = {}
    for i, (name, value) in enumerate(arrays.items()):
        a = np.asarray(value)
        boolean = a.dtype.kind == "b"
        if boolean:
            a = a.astype(np.int8)
        elif a.dtype.kind in "iu":
            a = a.astype(np.int64)
        elif a.dtype.kind == "f":
            a = a.astype(np.float64)
        else:
            raise TypeError(f"model array {name} of {key} has dtype {a.dtype}; only numbers are stored")
        node = name if _NODE_NAME.match(name) and name not in (".", "..") else f"a{i}"
        while node in names:  # a kept name that another array's stand-in took
            node += "_"
        arr = g.create_array(
            node, shape=a.shape, chunks=_chunks(a.shape), dtype=a.dtype, compressors=CHECKSUMMED,
            dimension_names=[f"{node}_{j}" for j in range(a.ndim)] or None, fill_value=0,
        )  # fmt: skip
        if a.size:
            arr[...] = a
        names[node] = [name, boolean]
    g.attrs.update(
        {
            "point": json.dumps({d: (v.item() if hasattr(v, "item") else v) for d, v in point.items()}),
            "params": json.dumps(params, sort_keys=True),
            "arrays": json.dumps(names, sort_keys=True),
        }
    )
    return _dir_bytes(target)


def write_model_note(path, key: str, point: dict, why: str) -> None:
    """Record that a point's model could not be kept (``to_arrays`` refused it): a group with the
    reason only, which :func:`read_model` names."""
    group = _models_group(path, key)
    target = Path(path) / key / MODELS_GROUP / point_id(point)
    if target.exists():
        shutil.rmtree(target)
    group.create_group(point_id(point)).attrs.update({"not_kept": why[:400]})


class ModelArrayError(ValueError):
    """A point's stored model that cannot be read: a missing or damaged array (named)."""


def _open(path, key: str, point: dict):
    d = model_dir(path, key, point)
    if not (d / "zarr.json").exists():
        return None
    try:
        return zarr.open_group(str(d), mode="r")
    except Exception as e:  # damaged metadata
        raise ModelArrayError(f"{d / 'zarr.json'} cannot be read ({type(e).__name__}: {e})") from e


def has_model(path, key: str, point: dict) -> bool:
    return (model_dir(path, key, point) / "zarr.json").exists()


def read_model(path, key: str, point: dict) -> tuple[dict, dict]:
    """(arrays, params) of one grid point's stored model, every chunk's checksum checked;
    ModelArrayError naming the array that cannot be read, or LookupError where the point has no
    model (with the reason where one was recorded)."""
    g = _open(path, key, point)
    where = model_dir(path, key, point)
    if g is None:
        raise LookupError(f"{where} does not exist")
    if "not_kept" in g.attrs:
        raise LookupError(f"the model of {where} was not kept: {g.attrs['not_kept']}")
    if "arrays" not in g.attrs:
        raise ModelArrayError(f"{where / 'zarr.json'} lists no arrays (its write was interrupted)")
    names = json.loads(g.attrs["arrays"])
    params = json.loads(g.attrs["params"])
    arrays = {}
    for node, (name, boolean) in names.items():
        try:
            a = np.asarray(g[node][...])
        except Exception as e:
            raise ModelArrayError(f"model array {where / node} {_why(e)}") from e
        arrays[name] = a.astype(bool) if boolean else a
    return arrays, params


def _why(e: Exception) -> str:
    if "checksum" in str(e):
        return "fails its crc32c checksum (its bytes changed after it was written)"
    if isinstance(e, KeyError | FileNotFoundError):
        return "is missing"
    return f"cannot be read ({type(e).__name__}: {str(e)[:120]})"


def model_problem(path, key: str, point: dict) -> str | None:
    """What is wrong with a point's stored model (None: it reads, every checksum holding), for
    ``verify``: the group or an array missing, a chunk that fails its checksum. Large arrays are
    read a chunk row at a time."""
    try:
        g = _open(path, key, point)
    except ModelArrayError as e:
        return str(e)
    where = f"{key}/{MODELS_GROUP}/{point_id(point)}"
    if g is None:
        return f"its model ({where}) is missing"
    if "not_kept" in g.attrs:
        return None
    if "arrays" not in g.attrs:
        return f"its model ({where}) lists no arrays (its write was interrupted)"
    for node in json.loads(g.attrs["arrays"]):
        try:
            arr = g[node]
            if arr.ndim == 0 or arr.shape[0] <= arr.chunks[0]:
                arr[...]
            else:
                for a in range(0, arr.shape[0], arr.chunks[0]):
                    arr[a : a + arr.chunks[0]]
        except Exception as e:
            return f"model array {where}/{node} {_why(e)}"
    return None


def remove_model(path, key: str, point: dict) -> None:
    shutil.rmtree(model_dir(path, key, point), ignore_errors=True)


def stored_model_ids(path, key: str) -> list[str]:
    """The point ids whose model group exists under ``key``."""
    d = Path(path) / key / MODELS_GROUP
    try:
        return sorted(e.name for e in os.scandir(d) if e.is_dir() and (Path(e.path) / "zarr.json").exists())
    except OSError:
        return []


def _cells(group):
    """(sweep dims, their coordinate values) of a model group, in its ``status`` order."""
    st = group["status"]
    dims = list(st.metadata.dimension_names or st.attrs.get("_ARRAY_DIMENSIONS") or [])
    return dims, {d: [v.item() for v in np.asarray(group[d][...])] for d in dims}


def prune_models(path, key: str, keep: dict | None) -> int:
    """Remove the stored models of ``key`` except the one at grid point ``keep`` (``--keep-models
    chosen``); each removed point's ``model_bytes`` becomes 0 (none kept, on purpose: ``verify``
    expects no model there). Returns how many were removed."""
    root = zarr.open_group(str(path), mode="r+")
    g = root[key]
    if MODEL_BYTES not in g:
        return 0
    dims, coords = _cells(g)
    sizes = np.asarray(g[MODEL_BYTES][...])
    want = point_id(keep) if keep else None
    removed = 0
    for idx in np.ndindex(sizes.shape):
        point = {d: coords[d][i] for d, i in zip(dims, idx)}
        if point_id(point) == want or not has_model(path, key, point):
            continue
        remove_model(path, key, point)
        g[MODEL_BYTES][idx] = 0.0
        removed += 1
    return removed


def record_model(path, key: str, index: tuple, point: dict, model, why: str = "", numerics: str = "") -> int:
    """Write one finished point's model alone (``--refit-models``: its embedding and metrics stay
    as stored) and its ``model_bytes``; ``numerics``: the version to record for the point (the refit
    reproduced its embedding), or "" to leave it. Returns the bytes written."""
    if model is not None:
        size = write_model(path, key, point, *model)
    else:
        write_model_note(path, key, point, why or "the fit kept no model")
        size = 0
    g = zarr.open_group(str(path), mode="r+")[key]
    g[MODEL_BYTES][tuple(index)] = float(size)
    if numerics:
        g["numerics"][tuple(index)] = np.array(numerics, dtype=g["numerics"].dtype)
    return size
