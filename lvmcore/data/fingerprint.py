"""The content fingerprint of a data set held in memory: a hash of every variable's name, dtype,
shape and bytes, in name order. A source's row-block pass
(:func:`lvmcore.data.sources.base.content_pass`) feeds the same hash the same bytes in the same
order, so the two give the same value."""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["fingerprint"]


def fingerprint(ds) -> str:
    """Content hash of a data set (an ``xarray.Dataset``): every data variable's name, dtype, shape
    and bytes. Derived inputs (the kNN graph, evaluation ranks, the result store) record it, and one
    that does not match the data is rebuilt or refused, never reused."""
    h = hashlib.sha256()
    for name in sorted(ds.data_vars):
        a = np.ascontiguousarray(ds[name].values)
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:32]
