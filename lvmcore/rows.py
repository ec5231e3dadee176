"""The row-source protocol: where a fit's rows can be read again, so that chunked work on a
cluster sends "rows a:b of this source" instead of the rows.

A :class:`RowSource` is small and picklable and reads the same values on any machine:
``shape``, ``read(a, b)`` (rows a:b as a C-contiguous array), ``whole()`` (every row) and
``shifted(shift)`` (the same rows less ``shift``, a model's centred data). The zarr reader is
:class:`lvmcore.data.rowsource.ZarrRows`.

A fit receives its rows as an argument: ``est.fit(source)`` reads the source once
(:func:`lvmcore.checks.check_data`) and keeps it beside the values as a :class:`Rows` array, the
only way a source reaches the chunk engine (:func:`source_of`); ``est.fit(attach(Y, source))``
does the same for values already read. A plain array has no source: its chunks are sent from
the caller. Any array derived from a :class:`Rows` (a slice, a difference, a copy) has no source,
so a changed value can never be read back as the stored one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class RowSource(Protocol):
    """Rows that can be read again where they are used (picklable, comparable, hashable)."""

    shape: tuple

    def read(self, a: int, b: int) -> np.ndarray: ...

    def whole(self) -> np.ndarray: ...

    def shifted(self, shift) -> RowSource: ...


class Rows(np.ndarray):
    """An array holding the values of ``source`` (a :class:`RowSource`) and carrying it.

    Made only by :func:`attach`; every array NumPy derives from it has ``source`` None and ufunc
    results are plain arrays."""

    source = None

    def __array_finalize__(self, obj):
        self.source = None

    def __array_wrap__(self, arr, context=None, return_scalar=False):
        if return_scalar:
            return arr[()]
        return np.asarray(arr).view(np.ndarray)

    def __reduce__(self):  # pickled as a plain array: a source is vouched for in this process only
        return np.asarray(self).copy().__reduce__()


def attach(values, source: RowSource) -> Rows:
    """``values`` (an array equal to ``source``'s rows; the caller vouches for it) carrying ``source``."""
    values = np.asarray(values)
    shape = tuple(getattr(source, "shape", values.shape))
    if values.shape != shape:
        raise ValueError(f"values of shape {values.shape} cannot be the rows of a source of shape {shape}")
    out = values.view(Rows)
    out.source = source
    return out


def is_source(x) -> bool:
    """Whether ``x`` is a row source (not an array)."""
    return not isinstance(x, np.ndarray) and isinstance(x, RowSource)


def source_of(x, shift=None):
    """The :class:`RowSource` ``x`` carries (shifted by ``shift`` if given), or None."""
    src = getattr(x, "source", None) if isinstance(x, Rows) else None
    if src is None:
        return None
    return src if shift is None else src.shifted(shift)


class RowBlock:
    """Rows a:b of a :class:`RowSource`, read on the worker that receives it."""

    def __init__(self, src, a: int, b: int):
        self.src, self.a, self.b = src, int(a), int(b)

    def __eq__(self, other):
        return isinstance(other, RowBlock) and (self.src, self.a, self.b) == (other.src, other.a, other.b)

    def __hash__(self):
        return hash((self.src, self.a, self.b))


def resolve(x):
    """A worker's view of what it was sent: row blocks and whole sources read there."""
    if isinstance(x, RowBlock):
        return x.src.read(x.a, x.b)
    if is_source(x):
        return x.whole()
    return x
