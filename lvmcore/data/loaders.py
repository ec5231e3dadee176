"""The data set's entry points: :func:`load` (in memory), :func:`describe` (what a sweep plans
from), :func:`ingest` (the store a sweep reads), all three over the one source a reader gives
(:func:`lvmcore.data.sources.open_source`): load reads it whole, ingest a row block at a time, so
the two cannot disagree.

A loaded data set is an ``xarray.Dataset`` with

- ``Y`` (point, feature): the data every single-view model fits (for multi-view data the
  concatenation of the views);
- ``view_<v>`` (point, feature_<v>) for multi-view data, listed in ``attrs["views"]``;
- optional ``label`` (point) int classes, ``color`` (point) the manifold parameter used for
  colouring, ``truth`` (point, truth_dim) the true latent coordinates (``attrs["truth_metric"]``
  names the distance to compare with: ``euclidean`` or ``cityblock`` for tree codes);
- attributes ``name``, ``source``, ``params`` (JSON of the generator options), ``seed`` and
  ``code_version``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import dask.array as da
import numpy as np
import xarray as xr
import zarr

from lvmcore.data.sources import PLANNED, kind_of, named, open_source, plan
from lvmcore.data.sources.base import Source, content_pass
from lvmcore.data.sources.planned import check_values
from lvmcore.data.store import (
    check_target,
    replace_dir,
    store_encoding,
    temporary_path,
    write_preprocessing,
    write_store,
)

__all__ = ["load", "describe", "check_input", "ingest", "ingest_source", "views_of", "BLOCK_ROWS"]

log = logging.getLogger("lvmcore.data")

#: rows read and written per block by describe's and ingest's passes (a multiple of the store's
#: chunk rows is written per call)
BLOCK_ROWS = 65536


def load(name_or_path, *, client=None, **options) -> xr.Dataset:
    """Load a named data set (see :func:`lvmcore.data.list_datasets`) or a user file as an xarray
    Dataset: its source (:func:`lvmcore.data.sources.open_source`) read whole.

    Named sets take their generator options (``n``, ``seed``, ``depth`` ...). Files: ``.npy``
    (loaded with ``allow_pickle=False``), ``.csv`` (numeric columns; ``label_column=`` names a
    label column), ``.zarr`` (a store written by :func:`ingest`), ``.h5ad`` / ``.h5mu`` and
    ``load("views", views=[...])`` (use_rep, layer, preprocess, modalities, view, label_column,
    color_column, max_features). Unknown options are refused. ``client``: the Dask client a
    preprocessing PCA runs on (None: in this process).
    """
    source = open_source(name_or_path, client=client, **options)
    try:
        data = {
            name: (v.dims, np.asarray(v.read(0, v.shape[0]), dtype=v.dtype))
            for name, v in source.variables.items()
        }
    finally:
        source.close()
    attrs = dict(source.attrs)
    if source.fingerprint is not None:
        attrs["fingerprint"] = source.fingerprint
    ds = xr.Dataset(data, attrs=attrs)
    log.info("%s: read %d rows x %d columns", name_or_path, ds.sizes["point"], ds.sizes["feature"])
    return ds


def check_input(name_or_path, **options) -> None:
    """Refuse what the ingest would refuse, before any server or cluster starts: unknown options,
    and NaN or inf in the user's data, named in the file's coordinates (``X[3, 4]``,
    ``obsm['X_pca'][7, 0]``). A file read with options is read here when its matrices are small
    (lvmcore.data.sources.planned.PRECHECK_VALUES), a larger one as the ingest's pass reads it; a
    .npy, .csv or .zarr file is checked by the pass that fingerprints it. :func:`describe` calls
    this, so a caller that describes the data needs no second call."""
    if kind_of(name_or_path, options) in PLANNED:
        check_values(plan(name_or_path, **options))
    else:
        describe(name_or_path, **options)


def describe(name_or_path, **options) -> dict:
    """``{"sizes": {dim: size}, "attrs": ..., "fingerprint": ...}`` of what :func:`load` would give,
    without holding a large file, its values checked (:func:`check_input`). A named data set is not
    drawn (its fingerprint is its recipe's, its sizes come from a small probe); a file read with
    options is planned (metadata only; the plan's fingerprint); a .npy, .csv or .zarr file is read
    in row blocks for its content fingerprint."""
    kind = kind_of(name_or_path, options)
    if kind == "named":
        named.check_named_options(str(name_or_path), options)
        return named.describe_named(str(name_or_path), dict(options))
    if kind in PLANNED:
        p = plan(name_or_path, **options)
        check_values(p)
        return {"sizes": p.sizes(), "attrs": p.attrs(), "fingerprint": p.fingerprint()}
    source = open_source(name_or_path, **options)
    try:
        fp = content_pass(source, BLOCK_ROWS)
        sizes = source.sizes()
        log.info("%s: read %d rows x %d columns (in blocks)", name_or_path, sizes["point"], sizes["feature"])
        return {"sizes": sizes, "attrs": dict(source.attrs), "fingerprint": fp}
    finally:
        source.close()


def ingest(
    ds_or_name, path, *, chunk_rows: int = 4096, overwrite: bool = False, client=None, **options
) -> Path:
    """Write a data set to a chunked zarr store at ``path`` (row chunks of ``chunk_rows``).

    The store is written beside the target under a temporary name and renamed into place once
    complete, so a crash never leaves a half-written store under the final name. An existing
    store is kept unless ``overwrite=True``. A name or a file is read through its source a row
    block at a time (:func:`ingest_source`: a large file is never held whole); an
    ``xarray.Dataset`` is written as it is (:func:`lvmcore.data.write_store`). A named data set is
    drawn here and recorded with its recipe's fingerprint (what :func:`describe` gives for it).
    """
    if isinstance(ds_or_name, xr.Dataset):
        return write_store(ds_or_name, path, None, chunk_rows=chunk_rows, overwrite=overwrite)
    return ingest_source(
        ds_or_name, path, chunk_rows=chunk_rows, overwrite=overwrite, client=client, **options
    )[0]


def ingest_source(
    src, path, *, chunk_rows: int = 4096, overwrite: bool = False, client=None, **options
) -> tuple[Path, str]:
    """Write ``src`` with ``options`` to a data store at ``path`` in row blocks, as
    :func:`lvmcore.data.write_store` writes it from memory (same chunks, metadata, attributes and
    fingerprint); returns (path, fingerprint). Written under a temporary name and renamed into
    place when complete; data with NaN or inf are refused (in the user's coordinates, by the pass
    that fingerprints what it writes) and nothing is left behind.

    The store records as ``fingerprint`` the source's planned one (a file read with options: the
    files' content and the options, known before the data pass, as :func:`describe` gives it; a
    named data set: its recipe's), else the content's, and the written data's
    ``content_fingerprint``; the fingerprint returned is the recorded ``fingerprint``."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists; pass overwrite=True or choose another path")
    planned = named.recipe_fingerprint(str(src), **options) if kind_of(src, options) == "named" else None
    source = open_source(src, client=client, **options)
    try:
        path = check_target(path, overwrite=True)
        return path, write_source(source, path, planned or source.fingerprint, chunk_rows)
    finally:
        source.close()


def write_source(source: Source, path: Path, planned: str | None, chunk_rows: int) -> str:
    """Write ``source`` to a store at ``path`` (see :func:`ingest_source`); returns its fingerprint."""
    tmp = temporary_path(path)
    try:
        template, encoding = {}, {}
        for name, v in source.variables.items():
            encoding[name] = store_encoding(v.dims, v.shape, chunk_rows)
            template[name] = (v.dims, da.zeros(v.shape, dtype=v.dtype, chunks=encoding[name]["chunks"]))
        attrs = {k: (json.dumps(x) if isinstance(x, list) else x) for k, x in source.attrs.items()}
        xr.Dataset(template, attrs=attrs).to_zarr(
            tmp, mode="w", encoding=encoding, consolidated=False, zarr_format=3, compute=False
        )
        group = zarr.open_group(str(tmp), mode="r+")
        rows = max(chunk_rows, (BLOCK_ROWS // chunk_rows) * chunk_rows)  # whole chunks per write

        def write(name, a, b, block):
            group[name][a:b] = block

        content = content_pass(source, rows, write)
        write_preprocessing(tmp, source.preprocessing)  # marks the store as keeping them (tasks.ingest)
        fp = planned or content
        group.attrs["fingerprint"] = fp
        group.attrs["content_fingerprint"] = content
        replace_dir(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return fp


def views_of(ds: xr.Dataset) -> list[np.ndarray]:
    """The views of a multi-view data set as arrays (a single-view set gives [Y])."""
    names = list(ds.attrs.get("views", []))
    return [ds[v].values for v in names] if names else [ds["Y"].values]
