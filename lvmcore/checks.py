"""Input checks shared by the estimators: each failure is a ValueError naming the value and the fix."""

from __future__ import annotations

import numbers

import numpy as np

from lvmcore.rows import attach, is_source, source_of


def check_data(Y, name: str = "Y") -> np.ndarray:
    """A finite float64 (N, D) array, or a ValueError saying what is wrong with ``Y``.

    ``Y`` may be a row source (:mod:`lvmcore.rows`), read here once; the array returned then
    carries it, as it does when ``Y`` carried one, so chunked work reads rows where they are used."""
    if is_source(Y):
        src = Y
        Y = Y.whole()
    else:
        src = source_of(Y)
    Y = np.asarray(Y)
    if Y.dtype == object or not np.issubdtype(Y.dtype, np.number):
        raise ValueError(f"{name} must be a numeric array, got dtype={Y.dtype}")
    if Y.ndim != 2:
        raise ValueError(f"{name} must be 2-D (points x features), got shape {Y.shape}; reshape it to (N, D)")
    Y = Y.astype(np.float64)
    if not np.all(np.isfinite(Y)):
        r, c = np.argwhere(~np.isfinite(Y))[0]
        raise ValueError(
            f"{name} contains NaN or inf (first at row {r}, column {c}); remove or impute those values first"
        )
    return Y if src is None else attach(Y, src)


def check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_graph(graph, n: int, k: int | None = None) -> np.ndarray:
    """kNN indices (N, k') as int64: the right number of rows, in range, no self loops. ``graph``
    may carry or be a row source (:mod:`lvmcore.rows`); the result carries it when its columns
    are the source's own."""
    src = graph if is_source(graph) else source_of(graph)
    idx = np.asarray(graph.whole() if is_source(graph) else graph)
    if idx.ndim != 2 or idx.shape[0] != n:
        raise ValueError(f"graph must be kNN indices of shape ({n}, k), got shape {idx.shape}")
    if not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"graph indices must be integers, got dtype={idx.dtype}")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"graph indices must lie in [0, {n - 1}], got values in [{idx.min()}, {idx.max()}]")
    if k is not None:
        if idx.shape[1] < k:
            raise ValueError(
                f"graph has {idx.shape[1]} neighbours per point, n_neighbors={k} needs at least {k}"
            )
        idx = idx[:, :k]
    if np.any(idx == np.arange(n)[:, None]):
        raise ValueError("graph lists a point among its own neighbours; pass neighbour indices without self")
    idx = idx.astype(np.int64)
    if src is None or tuple(src.shape) != idx.shape or getattr(src, "dtype", idx.dtype) != idx.dtype:
        return idx
    return attach(idx, src)


#: Label layout shared by every loader, the store and the metrics: integer codes, MISSING_LABEL
#: for a point with no label (never a class of its own), category names kept beside the codes.
MISSING_LABEL = -1


def check_options(given, accepted, what: str) -> None:
    """Refuse any key of ``given`` that is not in ``accepted``, before any work.

    The one mechanism for every user-facing set of keys (data-set options, configuration keys):
    the ValueError names the unknown key(s) and lists the accepted ones, e.g.
    ``unknown data-set option 'bogus_option' for pbmc.h5ad; accepted: label_column, layer, use_rep``.
    """
    accepted = sorted(set(accepted))
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        keys = ", ".join(repr(k) for k in unknown)
        noun = "option" if len(unknown) == 1 else "options"
        raise ValueError(
            f"unknown {what} {noun} {keys}; accepted: {', '.join(accepted) if accepted else '(none)'}"
        )
