"""The zarr implementation of the row-source protocol (:mod:`lvmcore.rows`): rows of a variable of a
zarr store (an ingested data store, a kNN graph store), read where they are used.

    from lvmcore.data.rowsource import ZarrRows
    BayesianGPLVM(chunks=1000).fit(ZarrRows("data.zarr", "Y"))   # workers read their own rows
"""

from __future__ import annotations

import functools

import numpy as np
import zarr


class ZarrRows:
    """Rows of variable ``name`` of the zarr store at ``path``: small and picklable, what travels to
    a worker instead of the rows.

    ``columns``: only the first columns (a graph at the sweep's largest k fitted at a smaller k);
    ``shift``: subtracted from every row (a model's centred data, Y - mean: the same values as
    slicing the centred array); ``expect``: store attributes that must hold when read (the data's
    fingerprint), so a store rewritten during a fit is refused, never read as if it were the same."""

    def __init__(self, path, name, *, dtype=np.float64, columns=None, shift=None, expect=None):
        self.path, self.name = str(path), str(name)
        self.dtype = np.dtype(dtype)
        self.columns = None if columns is None else int(columns)
        self.shift = None if shift is None else np.asarray(shift, dtype=self.dtype)
        self.expect = dict(expect or {})

    @property
    def shape(self) -> tuple:
        n, *rest = self._array().shape
        if self.columns is not None and rest:
            rest[0] = min(rest[0], self.columns)
        return (n, *rest)

    def shifted(self, shift) -> ZarrRows:
        """The same rows less ``shift``."""
        out = ZarrRows(self.path, self.name, dtype=self.dtype, columns=self.columns, expect=self.expect)
        out.shift = np.asarray(shift, dtype=self.dtype) + (0 if self.shift is None else self.shift)
        return out

    def _array(self):
        group = zarr.open_group(self.path, mode="r")
        for k, v in self.expect.items():
            if group.attrs.get(k) != v:
                raise RuntimeError(
                    f"the store {self.path} changed while a fit read it ({k} is {group.attrs.get(k)!r}, "
                    f"the fit started with {v!r}); run the fit again"
                )
        return group[self.name]

    def read(self, a: int, b: int) -> np.ndarray:
        """Rows a:b (a C-contiguous array of ``dtype``)."""
        arr = self._array()
        x = arr[a:b] if self.columns is None else arr[a:b, : self.columns]
        x = np.ascontiguousarray(x, dtype=self.dtype)
        return x if self.shift is None else x - self.shift

    def whole(self) -> np.ndarray:
        """Every row, read once per process (cached while the store records the same attributes)."""
        self._array()  # the store's attributes checked on every use, not only on the first read
        return _whole_cached(self)

    def _key(self):
        shift = None if self.shift is None else self.shift.tobytes()
        return (self.path, self.name, self.dtype.str, self.columns, shift, tuple(sorted(self.expect.items())))

    def __eq__(self, other):
        return isinstance(other, ZarrRows) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f"ZarrRows({self.path!r}, {self.name!r}, columns={self.columns})"


@functools.lru_cache(maxsize=2)
def _whole_cached(src: ZarrRows) -> np.ndarray:
    x = src.read(0, src._array().shape[0])
    x.flags.writeable = False  # shared by every task of this process that reads it
    return x
