"""AnnData (.h5ad) and MuData (.h5mu) files by scanpy's conventions, read in row blocks.

A matrix is addressed as scanpy addresses it: ``use_rep`` names an ``obsm`` key (or ``"X"``),
``layer`` a layer; its rows are read straight from the HDF5 file with h5py, a block at a time (a
CSR matrix by its ``indptr`` slice, a dense one by a row slice), never whole: anndata's backed mode
is not used for matrices because it loads every layer into memory. A CSC matrix cannot be read by
rows without reading all of it and is refused with the fix. ``obs`` (the cells' table) is read
whole: it is small beside the matrix and holds the names, labels and colours.

A :class:`Matrix` is a picklable description (file, key, row selection) that opens the file per
read, so the blocks can be read by Dask tasks on any worker that sees the file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

__all__ = ["Matrix", "open_matrix", "read_obs", "h5mu_modalities", "check_unique_names"]


@dataclass(frozen=True)
class Matrix:
    """Rows of one matrix in an HDF5 file (``key`` like ``"X"``, ``"layers/counts"``,
    ``"obsm/X_pca"``, ``"mod/rna/X"``); ``rows``: a selection of its rows (None: all, in order)."""

    path: str
    key: str
    kind: str  # "dense" | "csr" | "compound" (a field of an old-format obsm table)
    n_rows: int
    n_cols: int
    field: str | None = None
    rows: tuple | None = None  # row numbers (a tuple keeps the dataclass hashable and picklable)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.rows) if self.rows is not None else self.n_rows, self.n_cols)

    @property
    def sparse(self) -> bool:
        return self.kind == "csr"

    def where(self) -> str:
        return f"{self.path}: {self.key}" + (f"[{self.field}]" if self.field else "")

    def select(self, rows) -> Matrix:
        """This matrix restricted to (and reordered as) ``rows`` of the stored matrix."""
        return replace(self, rows=tuple(int(r) for r in np.asarray(rows)))

    def _read_range(self, f, a: int, b: int):
        obj = f[self.key]
        if self.kind == "dense":
            return np.asarray(obj[a:b], dtype=np.float64)
        if self.kind == "compound":
            return np.asarray(obj[self.field][a:b], dtype=np.float64)
        ptr = np.asarray(obj["indptr"][a : b + 1], dtype=np.int64)
        p0, p1 = int(ptr[0]), int(ptr[-1])
        data = np.asarray(obj["data"][p0:p1], dtype=np.float64)
        idx = np.asarray(obj["indices"][p0:p1])
        return sp.csr_matrix((data, idx, ptr - p0), shape=(b - a, self.n_cols))

    def read(self, a: int, b: int):
        """Rows a:b (of the selection) as float64: a CSR matrix for sparse storage, else an array."""
        import h5py

        with h5py.File(self.path, "r") as f:
            if self.rows is None:
                return self._read_range(f, a, b)
            want = np.asarray(self.rows[a:b], dtype=np.int64)
            return _take(lambda i, j: self._read_range(f, i, j), want, self.sparse)

    def dense(self, a: int, b: int) -> np.ndarray:
        block = self.read(a, b)
        return block.toarray() if sp.issparse(block) else block


def _take(read_range, want: np.ndarray, sparse: bool, span: int = 8192):
    """Rows ``want`` (any order) by reading sorted runs of nearby rows (a run spans at most
    ``span`` stored rows beyond its own length), then putting them in the asked order."""
    if len(want) == 0:
        return read_range(0, 0)
    order = np.argsort(want, kind="stable")
    s = want[order]
    parts, i = [], 0
    while i < len(s):
        j = int(np.searchsorted(s, s[i] + span, side="left"))
        j = max(j, i + 1)
        block = read_range(int(s[i]), int(s[j - 1]) + 1)
        parts.append(block[s[i:j] - s[i]])
        i = j
    got = sp.vstack(parts, format="csr") if sparse else np.vstack(parts)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return got[inverse]


def open_matrix(path: str, key: str, where: str | None = None) -> Matrix:
    """The matrix at ``key`` of the HDF5 file ``path`` (ValueError naming it and the fix when it
    cannot be read by rows or is not numeric)."""
    import h5py

    where = where or f"{path}: {key}"
    with h5py.File(path, "r") as f:
        parent, _, name = key.rpartition("/")
        if parent and parent in f and isinstance(f[parent], h5py.Dataset) and f[parent].dtype.names:
            ds = f[parent]  # old-format obsm: one table, one field per representation
            if name not in ds.dtype.names:
                raise KeyError(name)
            sub = ds.dtype[name]
            if sub.kind not in "fiub" and not (sub.subdtype and sub.subdtype[0].kind in "fiub"):
                raise ValueError(f"{where} has dtype {sub}; a numeric matrix is needed")
            width = int(np.prod(sub.shape)) if sub.shape else 1
            return Matrix(path, parent, "compound", ds.shape[0], width, field=name)
        if key not in f:
            raise KeyError(key)
        obj = f[key]
        if isinstance(obj, h5py.Dataset):
            if obj.ndim != 2:
                raise ValueError(f"{where} has shape {obj.shape}; a 2-D (cells x features) matrix is needed")
            if obj.dtype.kind not in "fiub":
                raise ValueError(f"{where} has dtype {obj.dtype}; a numeric matrix is needed")
            return Matrix(path, key, "dense", int(obj.shape[0]), int(obj.shape[1]))
        enc = obj.attrs.get("encoding-type", obj.attrs.get("h5sparse_format"))
        enc = enc.decode() if isinstance(enc, bytes) else enc
        shape = obj.attrs.get("shape", obj.attrs.get("h5sparse_shape"))
        if enc in ("csr_matrix", "csr"):
            if obj["data"].dtype.kind not in "fiub":
                raise ValueError(f"{where} has dtype {obj['data'].dtype}; a numeric matrix is needed")
            return Matrix(path, key, "csr", int(shape[0]), int(shape[1]))
        if enc in ("csc_matrix", "csc"):
            raise ValueError(
                f"{where} is stored column by column (CSC): its rows cannot be read without reading all "
                "of it; store it row-major: adata.X = adata.X.tocsr() (or the layer likewise), then "
                "adata.write_h5ad(path)"
            )
        raise ValueError(f"{where} is a {enc or 'group'} element, not a matrix of cells x features")


def read_obs(path: str, group: str = ""):
    """The ``obs`` table (pandas DataFrame, index = obs_names) of the AnnData at ``group`` of the
    file (``""``: an .h5ad's root; ``"mod/rna"``: a MuData modality; MuData's root ``obs`` too).
    Files in the old (pre-0.7) format, whose obs is one table, are read through anndata."""
    import anndata.io
    import h5py

    with h5py.File(path, "r") as f:
        node = f[f"{group}/obs" if group else "obs"]
        if isinstance(node, h5py.Group):
            return anndata.io.read_elem(node)
    import anndata

    if group:
        raise ValueError(f"{path}: {group}/obs is in a format this reader does not know; re-save the file")
    import warnings

    with warnings.catch_warnings():  # the old format's own warnings (re-save the file) are not ours
        warnings.simplefilter("ignore")
        ad = anndata.read_h5ad(path, backed="r")
    try:
        return ad.obs.copy()
    finally:
        ad.file.close()


def read_var(path: str, group: str = ""):
    """The ``var`` table (pandas DataFrame, index = var_names) of the AnnData at ``group`` of the
    file, or None where it is in the old (pre-0.7) one-table format."""
    import anndata.io
    import h5py

    with h5py.File(path, "r") as f:
        key = f"{group}/var" if group else "var"
        node = f[key] if key in f else None
        return anndata.io.read_elem(node) if isinstance(node, h5py.Group) else None


def obsm_keys(path: str, group: str = "") -> list[str]:
    import h5py

    with h5py.File(path, "r") as f:
        key = f"{group}/obsm" if group else "obsm"
        if key not in f:
            return []
        node = f[key]
        return list(node.dtype.names or []) if isinstance(node, h5py.Dataset) else list(node.keys())


def layer_keys(path: str, group: str = "") -> list[str]:
    import h5py

    with h5py.File(path, "r") as f:
        key = f"{group}/layers" if group else "layers"
        return list(f[key].keys()) if key in f and isinstance(f[key], h5py.Group) else []


def h5mu_modalities(path: str) -> list[str]:
    """The modality names of a .h5mu file, in the file's ``mod-order`` where it has one."""
    import h5py

    with h5py.File(path, "r") as f:
        if "mod" not in f:
            raise ValueError(f"{path} has no 'mod' group: not a MuData file; write it with mdata.write(path)")
        names = list(f["mod"].keys())
        order = f["mod"].attrs.get("mod-order")
        if order is not None:
            order = [o.decode() if isinstance(o, bytes) else str(o) for o in order]
            names = [o for o in order if o in names] + [n for n in names if n not in order]
    return names


def check_unique_names(names, where: str) -> None:
    import pandas as pd

    idx = pd.Index(names)
    if not idx.is_unique:
        dup = idx[idx.duplicated()].unique()[:3].tolist()
        raise ValueError(
            f"{where}: obs_names are not unique (e.g. {dup}); make them unique first "
            "(adata.obs_names_make_unique()) and save the file again"
        )
