"""One home for dense linear algebra: Cholesky with jitter, solves, log-determinants.

Every model factorises through :func:`jitter_cholesky`; no explicit inverse is formed on a hot
path. The jitter schedule is set here once (``DEFAULT_JITTER``, ``JITTER_GROWTH``,
``MAX_JITTER_TRIES``): the first attempt adds nothing, each retry adds
``DEFAULT_JITTER * JITTER_GROWTH**i`` times the mean diagonal.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla

__all__ = [
    "DEFAULT_JITTER",
    "JITTER_GROWTH",
    "MAX_JITTER_TRIES",
    "NumericalError",
    "jitter_cholesky",
    "chol_solve",
    "tri_solve",
    "logdet_from_chol",
    "sym",
]

#: relative jitter (times the mean diagonal) of the first retry
DEFAULT_JITTER = 1e-10
#: factor by which the jitter grows on every further retry
JITTER_GROWTH = 100.0
#: retries after the plain attempt before giving up (1e-10 ... 1e-2 relative)
MAX_JITTER_TRIES = 5


class NumericalError(FloatingPointError):
    """A factorisation failed even with the largest jitter.

    ``name`` says which matrix failed, ``context`` where (e.g. the EM iteration), ``matrix`` holds
    the offending matrix for inspection.
    """

    def __init__(self, message: str, *, name: str = "matrix", context: str = "", matrix=None):
        super().__init__(message)
        self.name = name
        self.context = context
        self.matrix = matrix


def sym(A: np.ndarray) -> np.ndarray:
    """Symmetric part of A (new array)."""
    return 0.5 * (A + np.swapaxes(A, -1, -2))


def jitter_cholesky(
    A: np.ndarray,
    *,
    name: str = "matrix",
    context: str = "",
    jitter: float | None = None,
    max_tries: int = MAX_JITTER_TRIES,
    return_jitter: bool = False,
):
    """Lower Cholesky factor of a symmetric positive-definite A (..., n, n), with escalating jitter.

    The plain factorisation is tried first; on failure ``jitter * mean(diag) * JITTER_GROWTH**i``
    is added to the diagonal for i = 0 .. max_tries-1. Raises :class:`NumericalError` naming the
    matrix, the context and the largest jitter tried. Batched input (leading dims) is supported.
    """
    A = np.asarray(A, dtype=np.float64)
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"{name} must be square, got shape {A.shape}")
    if not np.all(np.isfinite(A)):
        raise NumericalError(
            f"{name} has non-finite entries{' at ' + context if context else ''}; "
            "check the inputs and hyperparameters for overflow",
            name=name,
            context=context,
            matrix=A,
        )
    base = DEFAULT_JITTER if jitter is None else jitter
    scale = np.mean(np.abs(np.diagonal(A, axis1=-2, axis2=-1)))
    scale = scale if scale > 0 else 1.0
    eye = np.eye(A.shape[-1])
    added = 0.0
    for attempt in range(max_tries + 1):
        try:
            L = np.linalg.cholesky(A + added * eye if added else A)
            if return_jitter:
                return L, added
            return L
        except np.linalg.LinAlgError:
            added = base * scale * JITTER_GROWTH**attempt
    raise NumericalError(
        f"{name} is not positive definite{' at ' + context if context else ''} even with jitter "
        f"{added:.3g} added to the diagonal; the problem is ill-conditioned (try more data, a "
        "larger noise floor or fewer latent dimensions)",
        name=name,
        context=context,
        matrix=A,
    )


def tri_solve(L: np.ndarray, B: np.ndarray, *, lower: bool = True, trans: bool = False) -> np.ndarray:
    """Solve L X = B (or L^T X = B with trans=True) for triangular L."""
    return sla.solve_triangular(L, B, lower=lower, trans=1 if trans else 0, check_finite=False)


def chol_solve(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Solve A X = B given the lower Cholesky factor L of A."""
    return sla.cho_solve((L, True), B, check_finite=False)


def logdet_from_chol(L: np.ndarray) -> float | np.ndarray:
    """log det A from its Cholesky factor L (batched over leading dims)."""
    return 2.0 * np.sum(np.log(np.diagonal(L, axis1=-2, axis2=-1)), axis=-1)
