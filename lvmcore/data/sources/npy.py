"""A NumPy ``.npy`` file (an N x D numeric array) as a source: its rows read at their offset per
block, never mapped whole; refused with the fix when it is pickled, truncated, not numeric or not
2-D."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lvmcore.data.sources.base import (
    Source,
    Variable,
    check_extent,
    dataset_attrs,
    file_source_info,
    plain_options,
    refuse_nonfinite,
)

__all__ = ["check_npy_magic", "open_npy", "npy_rows", "NpyMatrix", "npy_source"]


def check_npy_magic(path: Path) -> None:
    """Refuse a file without NumPy's header before NumPy reads it (a pickle renamed to .npy)."""
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":
        raise ValueError(
            f"{path} is not a readable .npy file (no NumPy header; a pickle or another format "
            "renamed to .npy?); save the array with np.save(path, np.asarray(data, dtype=float))"
        )


def open_npy(path: Path) -> np.ndarray:
    """The .npy file memory-mapped (for its shape, dtype and layout), or a ValueError with the fix."""
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


def npy_rows(path: Path, mm: np.memmap):
    """Rows a:b of a .npy file as float64, NaN / inf refused in the file's coordinates. A C-ordered
    file is read by plain reads at the rows' offset: unlike reading through the memory map, the
    pages read do not stay in this process's resident set (a pass over a 400 MB file left 400 MB
    of mapped pages counted in the reading process's RSS); a Fortran-ordered one through its map."""
    offset, row_bytes, dtype = mm.offset, mm.shape[1] * mm.dtype.itemsize, mm.dtype

    def plain(a, b):
        with open(path, "rb") as f:
            f.seek(offset + a * row_bytes)
            out = np.fromfile(f, dtype=dtype, count=(b - a) * mm.shape[1])
        if out.size != (b - a) * mm.shape[1]:
            raise ValueError(
                f"{path} is shorter than its header says (rows {a}:{b}); re-export it with np.save"
            )
        return out.reshape(b - a, mm.shape[1]).astype(np.float64, copy=False)

    def mapped(a, b):
        return np.asarray(mm[a:b], dtype=np.float64)

    read_rows = mapped if mm.flags.f_contiguous and mm.shape[1] > 1 else plain

    def read(a, b):
        block = read_rows(a, b)
        refuse_nonfinite(block, str(path), "Y", a)
        return block

    return read


@dataclass(frozen=True)
class NpyMatrix:
    """A .npy file's rows as a view's matrix (a list of view files); ``rows``: a selection."""

    path: str
    shape: tuple
    rows: tuple | None = None
    sparse: bool = False

    def where(self) -> str:
        return self.path

    def select(self, rows):
        return NpyMatrix(self.path, (len(rows), self.shape[1]), tuple(int(r) for r in rows))

    def read(self, a, b):
        Y = open_npy(Path(self.path))
        if self.rows is None:
            return npy_rows(Path(self.path), Y)(a, b)
        block = np.asarray(Y[np.asarray(self.rows[a:b])], dtype=np.float64)
        refuse_nonfinite(block, self.path, "Y", rows=self.rows[a:b])
        return block

    dense = read


def npy_source(path: Path, options: dict) -> Source:
    """The .npy file as a source (``max_features`` its only option)."""
    Y = open_npy(path)
    check_extent(Y.shape, str(path))
    applied = plain_options(path, options, int(Y.shape[1]))
    variables = {"Y": Variable(("point", "feature"), Y.shape, np.dtype(np.float64), npy_rows(path, Y))}
    attrs = dataset_attrs(name=path.stem, source=f"file:{path.resolve()}", params=applied)
    attrs["source_info"] = file_source_info(path, "npy", applied)
    return Source(str(path), variables, attrs)
