"""AnnData (.h5ad) and MuData (.h5mu) files by scanpy's conventions: matrices in row blocks, the
``obs`` and ``var`` tables as anndata reads them.

A matrix is addressed as scanpy addresses it: ``use_rep`` names an ``obsm`` key (or ``"X"``),
``layer`` a layer; its rows are read straight from the HDF5 file with h5py, a block at a time (a
CSR matrix by its ``indptr`` slice, a dense one by a row slice), never whole: anndata's backed mode
is not used for matrices because it loads every layer into memory. A CSC matrix cannot be read by
rows without reading all of it and is refused with the fix. ``obs`` (the cells' table) is read
whole: it is small beside the matrix and holds the names, labels and colours. ``obs`` and ``var``
are read by anndata's own reader (:func:`read_obs`, :func:`read_var`): ``anndata.io.read_elem`` of
the group, as ``anndata.read_h5ad`` reads it, or ``anndata.read_h5ad(path, backed="r")`` for the
old (pre-0.7) one-table layout (scanpy's bundled ``pbmc68k_reduced.h5ad``).

A block holding NaN or inf is refused as it is read, in the file's coordinates (``X[3, 4]``,
``obsm['X_pca'][7, 0]``); a file HDF5 cannot read is refused as damaged, and only a real lock
conflict as open for writing elsewhere (:func:`hdf5_refusal`).

A :class:`Matrix` is a picklable description (file, key, row selection) that opens the file per
read, so the blocks can be read by Dask tasks on any worker that sees the file.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp

from lvmcore.data.sources.base import refuse_nonfinite

__all__ = [
    "Matrix",
    "open_matrix",
    "read_obs",
    "read_var",
    "obsm_keys",
    "layer_keys",
    "h5mu_modalities",
    "check_unique_names",
    "hdf5_refusal",
    "element_name",
]


def hdf5_refusal(path, e: OSError) -> ValueError:
    """The refusal of an HDF5 file h5py could not open or read, naming its cause: another process
    holding it open for writing (HDF5's file lock), no permission to read it, or anything else
    (a file cut short, random bytes, a corrupt chunk): damaged or not an HDF5 file."""
    text = str(e)
    low = text.lower()
    if "unable to lock file" in low:
        return ValueError(
            f"{path} is open for writing elsewhere (HDF5 could not lock it: {text}); close it there "
            "(e.g. a notebook's AnnData read with backed='r+': adata.file.close()) and run again"
        )
    if isinstance(e, PermissionError) or "errno = 13" in low or "permission denied" in low:
        return ValueError(f"{path} cannot be read (permission denied: {text}); make it readable")
    return ValueError(
        f"{path} is damaged or not an HDF5 file ({text}); write it again "
        "(adata.write_h5ad(path) / mdata.write(path)) or give another copy"
    )


def element_name(key: str, field: str | None = None) -> str:
    """The element at ``key`` as a user names it: ``X``, ``obsm['X_pca']``, ``layers['counts']``,
    ``mod['rna'].X`` (``field``: the representation's name in an old-format obsm table)."""
    parts = key.split("/")
    prefix = ""
    if len(parts) >= 3 and parts[0] == "mod":
        prefix, parts = f"mod[{parts[1]!r}].", parts[2:]
    if field is not None:
        parts = [*parts, field]
    name = parts[0] + "".join(f"[{p!r}]" for p in parts[1:])
    return prefix + name


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

    def element(self) -> str:
        return element_name(self.key, self.field)

    def stored_values(self) -> int:
        """The values stored for the whole matrix (a CSR one: its non-zeros)."""
        if self.kind != "csr":
            return self.n_rows * self.n_cols
        with h5py.File(self.path, "r") as f:
            return int(f[self.key]["indptr"][-1])

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
        """Rows a:b (of the selection) as float64: a CSR matrix for sparse storage, else an array;
        a block holding NaN or inf is refused in the file's coordinates."""
        try:
            with h5py.File(self.path, "r") as f:
                if self.rows is None:
                    block = self._read_range(f, a, b)
                    refuse_nonfinite(block, self.path, self.element(), a)
                    return block
                want = np.asarray(self.rows[a:b], dtype=np.int64)
                block = _take(lambda i, j: self._read_range(f, i, j), want, self.sparse)
        except OSError as e:
            raise hdf5_refusal(self.path, e) from e
        refuse_nonfinite(block, self.path, self.element(), rows=want)
        return block

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
        if enc == "dataframe":
            parent, _, name = key.rpartition("/")
            slot = f"{parent.rpartition('/')[2]}[{name!r}]"
            raise ValueError(
                f"{where} is a DataFrame, not a matrix of cells x features; store it as an array: "
                f"adata.{slot} = adata.{slot}.to_numpy() (numeric columns only), then adata.write_h5ad(path)"
            )
        raise ValueError(f"{where} is a {enc or 'group'} element, not a matrix of cells x features")


def _read_table(path: str, group: str, which: str):
    """The ``obs`` or ``var`` table of the AnnData at ``group`` of the file, as anndata reads it:
    a group in the current format by ``anndata.io.read_elem`` (what ``anndata.read_h5ad`` calls
    for it, without reading the layers and obsm read_h5ad would also load); the old (pre-0.7)
    one-table layout through ``anndata.read_h5ad(path, backed="r")`` itself (its categories are
    kept in ``uns``, which only read_h5ad puts back). None where the file has no such table."""
    import anndata  # heavy (seconds to import): only where an AnnData file is read
    import anndata.io

    key = f"{group}/{which}" if group else which
    with h5py.File(path, "r") as f:
        if key not in f:
            return None
        node = f[key]
        if isinstance(node, h5py.Group):
            return anndata.io.read_elem(node)
    if group:
        raise ValueError(f"{path}: {key} is in a format this reader does not know; re-save the file")
    with warnings.catch_warnings():  # the old format's own warnings (re-save the file) are not ours
        warnings.simplefilter("ignore")
        ad = anndata.read_h5ad(path, backed="r")
    try:
        return getattr(ad, which).copy()
    finally:
        ad.file.close()


def read_obs(path: str, group: str = "") -> pd.DataFrame:
    """The ``obs`` table (pandas DataFrame, index = obs_names) of the AnnData at ``group`` of the
    file (``""``: an .h5ad's root; ``"mod/rna"``: a MuData modality; MuData's root ``obs`` too), in
    every on-disk format anndata reads."""
    obs = _read_table(path, group, "obs")
    if obs is None:
        raise ValueError(f"{path}: {group + '/' if group else ''}obs is missing; the file is damaged")
    return obs


def read_var(path: str, group: str = "") -> pd.DataFrame | None:
    """The ``var`` table (pandas DataFrame, index = var_names) of the AnnData at ``group`` of the
    file, in every on-disk format anndata reads (None where the file has none)."""
    return _read_table(path, group, "var")


def obsm_keys(path: str, group: str = "") -> list[str]:
    with h5py.File(path, "r") as f:
        key = f"{group}/obsm" if group else "obsm"
        if key not in f:
            return []
        node = f[key]
        return list(node.dtype.names or []) if isinstance(node, h5py.Dataset) else list(node.keys())


def layer_keys(path: str, group: str = "") -> list[str]:
    with h5py.File(path, "r") as f:
        key = f"{group}/layers" if group else "layers"
        return list(f[key].keys()) if key in f and isinstance(f[key], h5py.Group) else []


def h5mu_modalities(path: str) -> list[str]:
    """The modality names of a .h5mu file, in the file's ``mod-order`` where it has one."""
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
    idx = pd.Index(names)
    if not idx.is_unique:
        dup = idx[idx.duplicated()].unique()[:3].tolist()
        raise ValueError(
            f"{where}: obs_names are not unique (e.g. {dup}); make them unique first "
            "(adata.obs_names_make_unique()) and save the file again"
        )
