"""The ingested data store: a zarr group of the data set's variables in row chunks, written whole
under a temporary name and renamed into place (:func:`write_store`, :func:`replace_dir`), opened
lazily (:func:`open_dataset`).

Its attributes: the loaded data set's, plus ``fingerprint`` (what a sweep planned with: a file's
plan, a named data set's recipe, else the content's) and ``content_fingerprint`` (of the arrays
written, lvmcore.data.fingerprint).

Beside the variables, the subgroup ``preprocessing/<view>/`` keeps what made each view's fitted
matrix from the file's genes (:func:`write_preprocessing`, :func:`read_preprocessing`):
``var_names`` (the view's genes, where its columns are genes), and for a PCA ``components`` (k, D:
the loadings, as scanpy's ``varm["PCs"].T``), ``mean`` (D) and ``columns`` (the genes of
``mask_var`` among ``var_names``; absent: every gene). They are not part of the content
fingerprint (the data the models were fitted on is the variables).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import xarray as xr
import zarr

from lvmcore.data.fingerprint import fingerprint

__all__ = [
    "open_dataset",
    "write_store",
    "replace_dir",
    "temporary_path",
    "check_target",
    "store_encoding",
    "write_preprocessing",
    "preprocessing_kept",
    "read_preprocessing",
]

#: the subgroup of a data store that keeps each view's preprocessing arrays
PREPROCESSING_GROUP = "preprocessing"


def replace_dir(tmp: Path, path: Path) -> None:
    """Put the finished store ``tmp`` at ``path``: a reader sees the old store or the new one, never
    a half-written one (an old store is moved aside first, then removed)."""
    if path.exists():
        old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(path)


def open_dataset(path, *, dask: bool = True) -> xr.Dataset:
    """Open a data store written by :func:`ingest`, with a clear error if it is not one.

    ``dask=False`` opens it with lazily indexed numpy-backed variables instead of Dask arrays:
    use it for reads inside a Dask task, where computing a Dask array makes the task secede from
    the worker's thread pool and lets the worker start its next task beside it."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"data store {str(path)!r} does not exist; run ingest first")
    try:
        ds = xr.open_zarr(path, consolidated=False, **({} if dask else {"chunks": None}))
    except Exception as e:
        raise ValueError(
            f"{path} is not a readable zarr data store ({type(e).__name__}: {e}); delete it and ingest again"
        ) from e
    if "Y" not in ds:
        raise ValueError(f"{path} has no 'Y' variable; it was not written by lvmcore.data.ingest")
    if isinstance(ds.attrs.get("views"), str):
        ds.attrs["views"] = json.loads(ds.attrs["views"])
    return ds


def write_store(
    ds: xr.Dataset,
    path,
    fp: str | None = None,
    *,
    chunk_rows: int = 4096,
    overwrite: bool = False,
    content: str | None = None,
) -> Path:
    """Write ``ds`` to a data store at ``path`` (see :func:`ingest`), recording ``fp`` as its
    ``fingerprint`` (None: the data's content fingerprint) and the content fingerprint as
    ``content_fingerprint`` (``content``, if the caller computed it already)."""
    path = check_target(path, overwrite)
    tmp = temporary_path(path)
    encoding = {name: store_encoding(var.dims, var.shape, chunk_rows) for name, var in ds.data_vars.items()}
    out = ds.copy()
    out.attrs = {k: (json.dumps(v) if isinstance(v, list) else v) for k, v in ds.attrs.items()}
    content = content or fingerprint(ds)
    # a file read with options (lvmcore.data.sources.planned) is identified by its plan
    info = ds.attrs.get("source_info")
    kind = json.loads(info).get("kind") if isinstance(info, str) else None
    planned = ds.attrs.get("fingerprint") if kind in ("h5ad", "h5mu", "views") else None
    out.attrs["fingerprint"] = fp or planned or content
    out.attrs["content_fingerprint"] = content
    try:
        out.to_zarr(tmp, mode="w", encoding=encoding, consolidated=False, zarr_format=3)
        replace_dir(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def check_target(path, overwrite: bool) -> Path:
    """``path`` as a Path, its folder made; refused if a store is there and not ``overwrite``."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists; pass overwrite=True or choose another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def temporary_path(path: Path) -> Path:
    """The name a store is written under beside ``path`` until it is complete."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def store_encoding(dims, shape, chunk_rows: int) -> dict:
    """A variable's zarr encoding: chunks of ``chunk_rows`` points, whole along every other dim."""
    return {"chunks": tuple(min(chunk_rows, s) if d == "point" else s for d, s in zip(dims, shape))}


def write_preprocessing(path, arrays: dict) -> None:
    """Keep ``{view: {name: array}}`` (``var_names``, ``components``, ``mean``, ``columns``) in the
    data store at ``path`` (written before the store is renamed into place)."""
    root = zarr.open_group(str(path), mode="r+").require_group(PREPROCESSING_GROUP)
    root.attrs["kept"] = True  # this writer keeps them (an empty group: the source had none to keep)
    for view, named in arrays.items():
        g = root.require_group(view)
        for name, value in named.items():
            a = np.asarray(value)
            if a.dtype.kind in "OSU":
                a = a.astype(str)
            elif a.dtype.kind in "iu":
                a = a.astype(np.int64)
            else:
                a = a.astype(np.float64)
            arr = g.create_array(name, shape=a.shape, dtype=a.dtype, chunks=tuple(max(1, n) for n in a.shape))
            if a.size:
                arr[...] = a


def preprocessing_kept(path) -> bool:
    """Whether the data store at ``path`` was written by an ingest that keeps the preprocessing
    beside the data (:func:`write_preprocessing`); a store from before has no such group."""
    try:
        root = zarr.open_group(str(path), mode="r")
    except Exception:  # no store there
        return False
    return PREPROCESSING_GROUP in root and bool(root[PREPROCESSING_GROUP].attrs.get("kept"))


def read_preprocessing(path) -> dict:
    """``{view: {name: array}}`` as :func:`write_preprocessing` kept it (``var_names`` a list of
    str); empty for a store without any (a named data set, or one ingested before they were kept)."""
    try:
        root = zarr.open_group(str(path), mode="r")
    except Exception:  # no store there: nothing kept
        return {}
    if PREPROCESSING_GROUP not in root:
        return {}
    out = {}
    for view, g in root[PREPROCESSING_GROUP].groups():
        out[view] = {}
        for name, arr in g.arrays():
            a = np.asarray(arr[...])
            out[view][name] = [str(x) for x in a] if name == "var_names" else a
    return out
