"""The store's integrity: every metadata file present and parsing (else named, with the fix, or
rebuilt from the sweep's definition), every finished point's chunks present, readable (crc32c
checksums) and finite, damaged points set pending, the numerics version of finished points checked,
and the store opened for reading only once it passes."""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import xarray as xr
import zarr
from zarr.codecs import Crc32cCodec

from tasks.registry import MODELS, SWEEP_DIMS
from tasks.store.fingerprint import numerics_version
from tasks.store.models import MODELS_GROUP, model_problem
from tasks.store.paths import store_path
from tasks.store.schema import (
    MODEL_BYTES,
    STATUS_DONE,
    STATUS_FAILED,
    STATUS_PENDING,
    Layout,
    array_dims,
    group_template,
    open_root,
    write_template,
)


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
#: older store: tasks.store.layout adds them when the store is resumed or grown)
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
    as ``[{"key", "name" (None: the group's own), "file", "what"}]`` for
    :func:`tasks.store.layout.prepare_store` to rebuild (:func:`rebuild_metadata`)."""
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
                if a.name == MODELS_GROUP:  # the points' fitted models: verify_points checks each
                    continue
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


def rebuild_metadata(path: Path, found: list[dict], specs, layout: Layout) -> None:
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
            write_template(tmpl, side, key)
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


def verify_points(path, finite: bool = True, models: bool = True) -> list[dict]:
    """The grid points of a store that cannot be trusted, each as ``{"key", "index", "point",
    "what", "chunk"}`` (``chunk``: the damaged chunk file under the group, if one is):

    - a finished (done) point with a chunk file of its ``embedding`` or ``elbo_trace`` missing (a
      listing of the files, which every done point writes: they always hold values);
    - a chunk of any of its arrays that cannot be read: a crc32c checksum that fails
      (``CHECKSUMMED``) or bytes that do not decode; for failed points, their ``error`` and
      ``numerics`` (what the summaries read); a ``status`` chunk (the point's state is unknown);
    - with ``finite``, a done point's embedding value that is NaN or infinite within its latent
      dimensions (every model promises a finite embedding);
    - with ``models``, a done point that recorded a kept model (``model_bytes`` > 0) whose model
      group or one of its arrays is missing, or a chunk of it that fails its checksum
      (:mod:`tasks.store.models`; the readers of embeddings, ``show`` and ``export``, leave the
      models out).

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
        sdims = array_dims(st)
        status, unknown = _read_status(st)
        coords = {d: np.asarray(g[d][...]) for d in sdims}
        cells = {}  # per-point arrays: name -> array
        for name in g.array_keys():
            arr = g[name]
            dims = array_dims(arr)
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
        if models and MODEL_BYTES in cells and done:
            kept, _ = _read_cells(cells[MODEL_BYTES], np.nan)
            for idx in done:
                if idx in why or not kept[idx] > 0:
                    continue
                problem = model_problem(path, key, {d: coords[d][i].item() for d, i in zip(sdims, idx)})
                if problem is not None:
                    why[idx] = (problem, None)
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


class NotAStoreError(ValueError):
    """A path given as a result store that is a file, or a folder that holds no store."""


#: what a result store is, for the refusal of a path that is not one
STORE_IS = "a store is a folder ending .zarr written by `embed-sweep run`"


def existing_store(path) -> Path:
    """The result store a reader names: ``path`` where it exists, else ``x`` names ``x.zarr``.
    Refused (ValueError) where nothing is there; :class:`NotAStoreError` where it is a file, or a
    folder with neither the store's root ``zarr.json`` nor a model group (a folder that holds groups
    is a store whose root metadata is damaged: :func:`check_metadata` names it)."""
    path = Path(path)
    if not path.exists() and store_path(path).exists():  # `x` names `x.zarr`
        path = store_path(path)
    if not path.exists():
        raise ValueError(f"result store {str(path)!r} does not exist")
    if not path.is_dir():
        raise NotAStoreError(f"{path} is a file, not a result store ({STORE_IS})")
    if not (path / "zarr.json").exists() and not any((p / "zarr.json").exists() for p in _subfolders(path)):
        raise NotAStoreError(f"{path} is not a result store (no zarr.json)")
    return path


def _subfolders(path: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(path) if e.is_dir()]
    except OSError:
        return []


def open_results(path, check: bool = True) -> xr.DataTree:
    """The result store as an xarray DataTree (one group per model key), checked first: that it is
    a store (:func:`existing_store`), its metadata (:func:`check_metadata`) and, with ``check``, its
    finished points (:func:`verify_points`); a damaged store is refused naming what and the fix
    (StoreDamagedError)."""
    path = existing_store(path)
    check_metadata(path)
    root = open_root(path)
    if "sweep_id" not in root.attrs:
        raise ValueError(f"{path} is not an embed-sweep result store")
    if check:
        bad = verify_points(path, models=False)  # its readers read embeddings, not the models
        if bad:
            raise StoreDamagedError(f"{describe_damage(path, bad)}; {POINTS_FIX}")
    return _model_tree(path, root)


def _model_tree(path: Path, root) -> xr.DataTree:
    """The store's root attributes and its model groups (lazily read datasets) as a DataTree, as
    ``xr.open_datatree`` gives them, without opening the fitted models' subgroups (one per grid
    point, tasks.store.models: opening each would cost a metadata read per array per point)."""
    keys = json.loads(root.attrs.get("groups") or "null") or list(root.group_keys())
    nodes = {"/": xr.Dataset(attrs=dict(root.attrs))}
    for key in keys:
        if key in root:
            nodes[key] = xr.open_dataset(str(path), group=key, engine="zarr", consolidated=False)
    tree = xr.DataTree.from_dict(nodes)
    tree.encoding = {"source": str(path)}  # as open_datatree records it: selection reads it
    return tree


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
