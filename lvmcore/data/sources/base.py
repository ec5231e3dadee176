"""User files too large to hold twice: read in row blocks, never whole.

A ``.npy`` file is memory-mapped, a ``.zarr`` data store (written by :func:`lvmcore.data.ingest`)
is read chunk by chunk, an ``.h5ad`` / ``.h5mu`` file by lvmcore.data.sources (h5py row
blocks, optional streamed preprocessing). :func:`describe` gives a file's sizes, attributes and
content fingerprint in one pass; :func:`ingest_stream` writes the file to a data store in one pass
(fingerprint and NaN/inf check on the way). Both agree exactly with the in-memory route
(:func:`lvmcore.data.load` then :func:`lvmcore.data.fingerprint` / :func:`lvmcore.data.ingest`):
same values (float64 ``Y``, int64 labels), same attributes, same fingerprint, the fingerprint being
a hash of each variable's rows in order, which a row-block pass feeds it in the same order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger("lvmcore.data")

#: rows read and written per block (a multiple of the store's chunk rows is written per call)
BLOCK_ROWS = 65536
#: file types read in blocks; others (.csv, named data sets) are read whole
STREAM_SUFFIXES = (".npy", ".zarr", ".h5ad", ".h5mu")


@dataclass
class Variable:
    dims: tuple
    shape: tuple
    dtype: np.dtype
    read: object  # (a, b) -> rows a:b as an array of ``dtype``
    whole: bool = False  # a small per-point variable held whole (h5ad labels)


@dataclass
class Source:
    """A file's data variables, read in row blocks, with the attributes a loaded data set has."""

    where: str
    variables: dict
    attrs: dict
    close: object = field(default=lambda: None)

    @property
    def n(self) -> int:
        return self.variables["Y"].shape[0]

    def sizes(self) -> dict:
        out = {}
        for v in self.variables.values():
            out.update(zip(v.dims, v.shape))
        return out


def is_streamable(src, options: dict | None = None) -> bool:
    from lvmcore.data import sources

    if options is not None and sources.handles(src, options):
        return True
    p = Path(str(src))
    return p.suffix.lower() in STREAM_SUFFIXES or (p.is_dir() and (p / "zarr.json").exists())


def _file_attrs(path: Path, params: dict) -> dict:
    from lvmcore.data.loaders import _attrs

    return _attrs(name=path.stem, source=f"file:{path.resolve()}", params=params)


def _open_npy(path: Path) -> np.ndarray:
    """The .npy file memory-mapped, with the in-memory loader's refusals (same messages)."""
    from lvmcore.data.loaders import check_npy_magic

    check_npy_magic(path)
    try:
        with open(path, "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            )
            _, _, dtype = read_header(f)
    except Exception as e:
        raise ValueError(f"{path} is not a readable .npy file ({e}); re-export it with np.save") from e
    if dtype.hasobject:
        raise ValueError(
            f"{path} holds pickled Python objects, not a numeric array; save it with "
            "np.save(path, np.asarray(data, dtype=float))"
        )
    try:
        Y = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # truncated data, corrupt header
        raise ValueError(f"{path} is not a readable .npy file ({e}); re-export it with np.save") from e
    if Y.dtype.kind not in "fiu":
        raise ValueError(f"{path} holds dtype {Y.dtype}; a numeric (float or int) array is needed")
    if Y.ndim != 2:
        raise ValueError(f"{path} holds an array of shape {Y.shape}; an (N, D) array is needed")
    return Y


def _npy_rows(path: Path, mm: np.memmap):
    """Rows a:b of a C-ordered .npy file by plain reads at their offset: unlike reading through the
    memory map, the pages read do not stay in this process's resident set (a pass over a 400 MB
    file left 400 MB of mapped pages counted in the reading process's RSS)."""
    offset, row_bytes, dtype = mm.offset, mm.shape[1] * mm.dtype.itemsize, mm.dtype

    def read(a, b):
        with open(path, "rb") as f:
            f.seek(offset + a * row_bytes)
            out = np.fromfile(f, dtype=dtype, count=(b - a) * mm.shape[1])
        if out.size != (b - a) * mm.shape[1]:
            raise ValueError(
                f"{path} is shorter than its header says (rows {a}:{b}); re-export it with np.save"
            )
        return out.reshape(b - a, mm.shape[1]).astype(np.float64, copy=False)

    return read


def _rows_f64(arr):
    return lambda a, b: np.asarray(arr[a:b], dtype=np.float64)


def _plain_options(path: Path, options: dict, width: int) -> dict:
    """A .npy / .zarr file's options checked (only ``max_features``) and its width against the
    limit; returns the options applied."""
    from lvmcore.checks import check_options
    from lvmcore.data.sources import check_width, max_features

    check_options(options, ("max_features",), f"data-set ({path.name})")
    limit = max_features(options, str(path))
    check_width(width, limit, str(path), reducible=False)
    return {"max_features": limit} if "max_features" in options else {}


def _source_info(path: Path, kind: str, applied: dict) -> str:
    from lvmcore.data.provenance import file_fingerprint

    info = {
        "kind": kind,
        "path": str(path.resolve()),
        "fingerprint": file_fingerprint(path),
        "options": applied,
        "modalities": [],
        "dropped": {},
    }
    return json.dumps(info, sort_keys=True)


def open_source(src, **options) -> Source:
    """The file ``src`` as a :class:`Source` (ValueError naming the file and the fix if it cannot be)."""
    from lvmcore.data import sources

    if sources.handles(src, options):
        return sources.open_source(src, **options)[0]
    path = Path(str(src))
    if not path.exists():
        raise ValueError(f"data file {str(path)!r} does not exist; check the path")
    suffix = path.suffix.lower()
    if suffix == ".zarr" or path.is_dir():
        from lvmcore.data.loaders import open_dataset

        ds = open_dataset(path, dask=False)
        _plain_options(path, options, int(ds.sizes.get("feature", 0)))
        attrs = {k: v for k, v in ds.attrs.items() if k not in ("fingerprint", "content_fingerprint")}
        variables = {
            name: Variable(var.dims, var.shape, var.dtype, (lambda a, b, v=var: np.asarray(v[a:b].values)))
            for name, var in ds.data_vars.items()
        }
        return Source(str(path), variables, attrs)
    if suffix == ".npy":
        Y = _open_npy(path)
        applied = _plain_options(path, options, int(Y.shape[1]))
        read = _rows_f64(Y) if Y.flags.f_contiguous and Y.shape[1] > 1 else _npy_rows(path, Y)
        variables = {"Y": Variable(("point", "feature"), Y.shape, np.dtype(np.float64), read)}
        attrs = _file_attrs(path, applied)
        attrs["source_info"] = _source_info(path, "npy", applied)
        return Source(str(path), variables, attrs)
    raise ValueError(f"{path}: only {', '.join(STREAM_SUFFIXES)} files are read in blocks")


def _blocks(n: int, rows: int):
    for a in range(0, n, rows):
        yield a, min(a + rows, n)


class _FiniteCheck:
    """NaN / inf in the fitted variables, found block by block: the first position and the count,
    reported after the pass in the in-memory loader's words."""

    def __init__(self, where: str):
        self.where, self.first, self.count = where, {}, {}

    def see(self, name: str, a: int, block: np.ndarray) -> None:
        bad = ~np.isfinite(block)
        if bad.any():
            self.count[name] = self.count.get(name, 0) + int(bad.sum())
            if name not in self.first:
                r, c = np.argwhere(bad)[0]
                self.first[name] = (a + int(r), int(c))

    def raise_if_bad(self, order) -> None:
        for name in order:
            if name in self.first:
                r, c = self.first[name]
                raise ValueError(
                    f"{self.where}: {name} contains NaN or inf (first at row {r}, column {c}, "
                    f"{self.count[name]} values in all); remove or impute them before loading"
                )


def _pass(source: Source, rows: int, sink=None) -> str:
    """One pass over every variable in fingerprint order; returns the content fingerprint.
    ``sink(name, a, b, block)`` receives each block (e.g. to write it)."""
    h = hashlib.sha256()
    check = _FiniteCheck(source.where)
    fitted = ["Y", *source.attrs.get("views", [])]
    for name in sorted(source.variables):
        v = source.variables[name]
        h.update(f"{name}|{np.dtype(v.dtype).str}|{tuple(v.shape)}|".encode())
        for a, b in _blocks(v.shape[0], rows):
            block = np.ascontiguousarray(v.read(a, b), dtype=v.dtype)
            if name in fitted:
                check.see(name, a, block)
            h.update(block.tobytes())
            if sink is not None:
                sink(name, a, b, block)
    check.raise_if_bad(fitted)
    return h.hexdigest()[:32]


def describe(src, **options) -> dict:
    """Sizes, attributes and content fingerprint of a user file, read in blocks (the file is
    never held whole): what a sweep plans from."""
    from lvmcore.data import sources

    if sources.handles(src, options):
        return sources.describe(src, **options)
    source = open_source(src, **options)
    try:
        fp = _pass(source, BLOCK_ROWS)
        sizes = source.sizes()
        log.info("%s: read %d rows x %d columns (in blocks)", src, sizes["point"], sizes["feature"])
        return {"sizes": source.sizes(), "attrs": dict(source.attrs), "fingerprint": fp}
    finally:
        source.close()


def ingest_stream(
    src, path, *, chunk_rows: int = 4096, overwrite: bool = False, **options
) -> tuple[Path, str]:
    """Write a user file to a data store at ``path`` in row blocks, as :func:`lvmcore.data.ingest`
    writes it from memory (same chunks, metadata, attributes and fingerprint); returns (path,
    fingerprint). Written under a temporary name and renamed into place when complete; a file with
    NaN or inf is refused and nothing is left behind.

    A .h5ad / .h5mu file or a list of view files (lvmcore.data.sources) is recorded with its
    plan's fingerprint (the files' content and the options, known before the data pass, as
    :func:`describe` gives it) and the written data's ``content_fingerprint``; the fingerprint
    returned is the recorded ``fingerprint``."""
    import dask.array as da
    import xarray as xr
    import zarr

    from lvmcore.data.loaders import replace_dir

    path = Path(path)
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists; pass overwrite=True or choose another path")
    from lvmcore.data import sources

    planned = None
    if sources.handles(src, options):
        source, planned = sources.open_source(src, **options)
    else:
        source = open_source(src, **options)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        template, encoding = {}, {}
        for name, v in source.variables.items():
            chunks = tuple(min(chunk_rows, s) if d == "point" else s for d, s in zip(v.dims, v.shape))
            template[name] = (v.dims, da.zeros(v.shape, dtype=v.dtype, chunks=chunks))
            encoding[name] = {"chunks": chunks}
        attrs = {k: (json.dumps(x) if isinstance(x, list) else x) for k, x in source.attrs.items()}
        xr.Dataset(template, attrs=attrs).to_zarr(
            tmp, mode="w", encoding=encoding, consolidated=False, zarr_format=3, compute=False
        )
        group = zarr.open_group(str(tmp), mode="r+")
        rows = max(chunk_rows, (BLOCK_ROWS // chunk_rows) * chunk_rows)  # whole chunks per write

        def write(name, a, b, block):
            group[name][a:b] = block

        content = _pass(source, rows, write)
        fp = planned or content
        group.attrs["fingerprint"] = fp
        group.attrs["content_fingerprint"] = content
        replace_dir(tmp, path)
    finally:
        source.close()
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path, fp
