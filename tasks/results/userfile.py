"""The user's own .h5ad / .h5mu file that a store's data came from: where it is and whether it is
unchanged, its cells against the store's, the keys it already has, and a byte-for-byte copy of it
with new obsm and uns entries written into it (its matrices never read)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import h5py
import numpy as np

from lvmcore.data import file_fingerprint, obs_names, source_info
from lvmcore.data.sources.hdf5 import read_obs
from tasks.results.selection import store_data_path


def recorded_file(info: dict | None) -> dict | None:
    """``info`` (lvmcore.data.source_info of a store's data) where the data came from an .h5ad /
    .h5mu file, else None."""
    return info if info is not None and info.get("kind") in ("h5ad", "h5mu") else None


def recorded_source(store) -> dict | None:
    """The store's record of the user's .h5ad / .h5mu file its data came from (lvmcore.data.source_info:
    ``{"kind", "path", "fingerprint", ...}``), or None for any other data. Nothing is checked."""
    data_path = store_data_path(store)
    return recorded_file(source_info(str(data_path)) if data_path.exists() else None)


def source_of(store, source=None) -> dict | None:
    """The user's own .h5ad / .h5mu file the store's data came from, checked: ``{"kind", "path",
    "fingerprint" (now), "sweep_fingerprint" (what the sweep read), "options", "dropped",
    "obs_names" (the store's cells)}``; None for any other data.

    The sweep's source must be where it was and unchanged; ``source`` (``--from``) names another
    copy, or the file as it is now (its cells must be the store's, :func:`rows_of`)."""
    data_path = store_data_path(store)
    info = source_info(str(data_path)) if data_path.exists() else None
    if recorded_file(info) is None:
        if source is not None:
            what = f"a .{info['kind']} file" if info else "a named data set"
            raise ValueError(
                f"--from {source}: the data of {store} came from {what}, not an AnnData or MuData "
                "file; leave --from out (the export writes a new .h5ad)"
            )
        return None
    recorded = str(info["path"])
    if source is None:
        path = Path(recorded)
        if not path.is_file():
            raise ValueError(
                f"the file the sweep read, {recorded}, is missing; pass --from FILE naming a copy of it "
                "(its cells must be the sweep's)"
            )
    else:
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"--from {source}: no such file")
        if path.suffix.lower() != f".{info['kind']}":
            kind = info["kind"]
            raise ValueError(
                f"--from {source}: the sweep read a .{kind} file ({recorded}); name a .{kind} file"
            )
    now = file_fingerprint(str(path))
    if source is None and now != info["fingerprint"]:
        raise ValueError(
            f"{recorded} changed since the sweep read it (fingerprint {now}, the sweep read "
            f"{info['fingerprint']}); pass --from FILE naming the file the sweep read, or this one to "
            "write into it as it is now (its cells must be the sweep's)"
        )
    names = obs_names(str(data_path))
    return {
        "kind": info["kind"],
        "path": str(path),
        "fingerprint": now,
        "sweep_fingerprint": str(info["fingerprint"]),
        "options": info.get("options") or {},
        "dropped": info.get("dropped") or {},
        "obs_names": np.asarray(names, dtype=object) if names is not None else None,
    }


def file_obs_names(path: str) -> np.ndarray:
    """The obs_names of an .h5ad file or of a .h5mu file's MuData (its root ``obs``)."""
    with warnings.catch_warnings():  # an old-format file's warnings are about parts not read here
        warnings.simplefilter("ignore")
        obs = read_obs(path)
    return np.asarray(obs.index.astype(str), dtype=object)


def rows_of(src: dict) -> tuple[np.ndarray, int, np.ndarray]:
    """(for each cell of the file, its row in the store or -1; the number of cells of the file not
    in the store; their names, in the file's order).

    The store's cells must all be in the file. An .h5ad file must hold exactly them; a .h5mu
    file's MuData may also hold cells the sweep's join on obs_names dropped (those not in every
    modality it used): their rows of the embeddings are NaN. Anything else is another data set
    and is refused (ValueError)."""
    file_names = file_obs_names(src["path"])
    mine = src["obs_names"]
    where = f"{src['path']}"
    if mine is None:
        raise ValueError(f"the store does not record the names of its cells; cannot match them to {where}")
    if len(file_names) == len(mine) and (file_names == mine).all():
        return np.arange(len(mine)), 0, file_names[:0]
    pos = {n: i for i, n in enumerate(mine)}
    if len(pos) != len(mine) or len(set(file_names)) != len(file_names):
        raise ValueError(f"{where}: its cells are not the sweep's and their obs_names are not unique")
    rows = np.array([pos.get(n, -1) for n in file_names], dtype=np.int64)
    missing = len(mine) - int((rows >= 0).sum())
    extra = int((rows < 0).sum())
    if missing:
        absent = [n for n in mine if n not in set(file_names)][:3]
        raise ValueError(
            f"{where} lacks {missing} of the sweep's {len(mine)} cells (e.g. {absent}): it is not the "
            "data the sweep ran on; pass --from FILE naming that file"
        )
    if extra and not (src["kind"] == "h5mu" and sum(int(v) for v in _counts(src["dropped"])) > 0):
        others = [n for n, r in zip(file_names, rows) if r < 0][:3]
        raise ValueError(
            f"{where} has {extra} cells the sweep did not fit (e.g. {others}): it is not the data the "
            "sweep ran on; pass --from FILE naming that file"
        )
    return rows, extra, file_names[rows < 0]


def _counts(dropped) -> list:
    """The cell counts in a source's ``dropped`` record (a count per modality, or nested)."""
    if isinstance(dropped, dict):
        return [c for v in dropped.values() for c in _counts(v)]
    if isinstance(dropped, (int, np.integer)):
        return [int(dropped)]
    if isinstance(dropped, (list, tuple)):
        return [len(dropped)]
    return []


def on_rows(obsm: dict, rows: np.ndarray) -> dict:
    """The embeddings (store order) laid out on the file's cells: NaN where a cell is not in the store."""
    out = {}
    for k, X in obsm.items():
        Z = np.full((len(rows), X.shape[1]), np.nan)
        Z[rows >= 0] = X[rows[rows >= 0]]
        out[k] = Z
    return out


def export_records(path, prefix: str) -> list[dict]:
    """The records of embed-sweep's exports in an .h5ad / .h5mu file (its root ``uns`` entries named
    ``prefix`` or ``prefix_NAME`` that hold a ``sweep_id``), each ``{"key", "sweep_fingerprint"
    (the fingerprint of the user's file the sweep read, or None), "identity" (the sweep's, JSON
    text)}``. OSError where the file is not HDF5."""
    from anndata.io import read_elem  # loaded only where a file is read or written (about a second)

    out = []
    with h5py.File(path, "r") as f:
        uns = f.get("uns")
        if not isinstance(uns, h5py.Group):
            return out
        for key in uns:
            rec = uns[key]
            if not (key == prefix or key.startswith(f"{prefix}_")) or not isinstance(rec, h5py.Group):
                continue
            if "sweep_id" not in rec:
                continue
            src = rec.get("source")
            fp = src.get("sweep_fingerprint") if isinstance(src, h5py.Group) else None
            ident = rec.get("identity")
            out.append(
                {
                    "key": key,
                    "sweep_fingerprint": None if fp is None else str(read_elem(fp)),
                    "identity": None if ident is None else str(read_elem(ident)),
                }
            )
    return out


def existing_keys(path) -> tuple[set[str], set[str]]:
    """(obsm keys, uns keys) of an .h5ad file, or of a .h5mu file's MuData (its root ``obsm`` and
    ``uns``), read from the file's HDF5 tree (nothing loaded; an old-format obsm table's columns)."""
    with h5py.File(path, "r") as f:
        obsm, uns = f.get("obsm"), f.get("uns")
        if isinstance(obsm, h5py.Dataset):  # old format: one table, a column per key
            have_obsm = set(obsm.dtype.names or ())
        else:
            have_obsm = set(obsm.keys()) if isinstance(obsm, h5py.Group) else set()
        have_uns = set(uns.keys()) if isinstance(uns, h5py.Group) else set()
    return have_obsm, have_uns


def write_into_copy(src: dict, path: Path, obsm: dict, uns_key: str, uns: dict, replace: dict) -> None:
    """Copy the user's file to ``path`` byte for byte (its matrices are never read) and add
    ``obsm`` entries and ``uns[uns_key]`` with h5py and anndata's element writer; the keys in
    ``replace`` (``{"obsm": [...], "uns": [...]}``, from :func:`_clashes` with overwrite) are
    deleted first, and no other: another key of the export found in the copy (the file changed
    since it was checked) is refused. An old (pre-0.7) file's obsm table is rewritten as the
    current format's group, its entries kept."""
    from anndata.io import (
        read_elem,
        write_elem,
    )  # loaded only where a file is read or written (about a second)

    shutil.copyfile(src["path"], path)
    with h5py.File(path, "r+") as f:
        if "obsm" in f and isinstance(f["obsm"], h5py.Dataset):  # old format: one table
            table = read_elem(f["obsm"])
            del f["obsm"]
            write_elem(f, "obsm", {k: np.ascontiguousarray(table[k]) for k in table.dtype.names})
        if "obsm" not in f:
            write_elem(f, "obsm", {})
        taken = [k for k in obsm if k in f["obsm"] and k not in replace["obsm"]]
        taken += [uns_key] if "uns" in f and uns_key in f["uns"] and uns_key not in replace["uns"] else []
        if taken:
            raise ValueError(f"{src['path']} changed while it was exported: it now has {taken}; export again")
        for k in replace["obsm"]:
            del f["obsm"][k]
        for k, v in obsm.items():
            write_elem(f["obsm"], k, v)
        if "uns" not in f:
            write_elem(f, "uns", {})
        for k in replace["uns"]:
            del f["uns"][k]
        write_elem(f["uns"], uns_key, uns)
