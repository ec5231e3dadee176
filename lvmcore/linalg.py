"""One home for dense linear algebra: Cholesky with jitter, solves, log-determinants, in numpy and
in JAX.

The jitter policy is set here once. A factorisation is first tried as it is; each retry adds
``DEFAULT_JITTER * JITTER_GROWTH**i`` times the mean diagonal (:func:`jitter_schedule`), in numpy
(:func:`jitter_cholesky`, :mod:`lvmcore.sparse_chol`) and in JAX, where a traced function cannot
retry and the caller re-evaluates with the next relative jitter (:func:`cholesky_jax`,
:func:`jitter_escalation`: the Bayesian GP-LVM's and the minibatch fits). Fixed jitters that are
part of a model's definition are named here too, each in the scale of its matrix: ``KMM_JITTER``
(inducing covariances of the Euclidean kernels; a fit multiplies it by its view's variance),
``KERNEL_JITTER`` (the hyperboloid kernel's K and K_mm, times the kernel variance) and
``TIME_PRIOR_JITTER`` (the temporal prior's unit-variance covariance).
No explicit inverse is formed on a hot path except one, named: :func:`chol_inverse` (LAPACK potrf +
potri), which the exact point hyperboloid GP-LVM's step needs whole (its gradient is a product
with K^-1; about 2/3 N^3 flops after the Cholesky against 2 N^3 for triangular solves with the
identity).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla
from scipy.linalg import lapack

__all__ = [
    "chol_inverse",
    "chol_inverse_lower",
    "DEFAULT_JITTER",
    "JITTER_GROWTH",
    "MAX_JITTER_TRIES",
    "NumericalError",
    "jitter_cholesky",
    "chol_solve",
    "logdet_from_chol",
    "jitter_schedule",
    "jitter_escalation",
    "MAX_JITTER",
    "TIME_PRIOR_START_RIDGE",
    "cholesky_jax",
    "KMM_JITTER",
    "KERNEL_JITTER",
    "TIME_PRIOR_JITTER",
]

#: relative jitter (times the mean diagonal) of the first retry
DEFAULT_JITTER = 1e-10
#: factor by which the jitter grows on every further retry
JITTER_GROWTH = 100.0
#: retries after the plain attempt before giving up (1e-10 ... 1e-2 relative)
MAX_JITTER_TRIES = 5
#: the largest relative jitter of the schedule
MAX_JITTER = DEFAULT_JITTER * JITTER_GROWTH ** (MAX_JITTER_TRIES - 1)
#: absolute jitter on K_mm's diagonal in the collapsed GP-LVM bound (GPy 1.15 VarDTC's const_jitter,
#: so that the bounds compare with GPy's exactly)
KMM_JITTER = 1e-8
#: absolute jitter on the temporal prior's covariance over time stamps (unit variance)
TIME_PRIOR_JITTER = 1e-6
#: ridge on that covariance (unit variance) when solving K mubar = mu for the start of q(X)
TIME_PRIOR_START_RIDGE = 1e-3
#: jitter relative to the kernel variance sigma (K's diagonal) on the hyperboloid GP-LVM's K (eq. 4)
#: and K_mm (eqs. 5, 6): part of those models' definition, the start of their escalation
KERNEL_JITTER = 1e-6


def jitter_schedule(jitter: float = DEFAULT_JITTER, max_tries: int = MAX_JITTER_TRIES, scale: float = 1.0):
    """Jitters to try in turn: 0, then ``jitter * scale * JITTER_GROWTH**i`` for i = 0 .. max_tries - 1
    (``scale``: the matrix's mean diagonal; 1 gives the relative values)."""
    return [0.0] + [jitter * scale * JITTER_GROWTH**i for i in range(max_tries)]


def jitter_escalation(current: float = 0.0) -> list[float]:
    """The relative jitters a fit tries in turn when a bound is not finite: the one in use, then the
    larger values of :func:`jitter_schedule` (a traced bound cannot retry itself)."""
    return [current] + [j for j in jitter_schedule() if j > current]


def cholesky_jax(A, rel_jitter=0.0):
    """JAX, float64: lower Cholesky factor of A + rel_jitter * mean(diag A) * I (NaN where A is not
    positive definite: the caller retries with the next value of :func:`jitter_schedule`)."""
    import jax  # here: the numpy users of this module (LL-LVM, sparse_chol) do not load jax (seconds)
    import jax.numpy as jnp

    with jax.enable_x64(True):
        n = A.shape[-1]
        return jnp.linalg.cholesky(A + rel_jitter * jnp.mean(jnp.abs(jnp.diagonal(A))) * jnp.eye(n))


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
    scale = np.mean(np.abs(np.diagonal(A, axis1=-2, axis2=-1)))
    scale = scale if scale > 0 else 1.0
    eye = np.eye(A.shape[-1])
    for added in jitter_schedule(DEFAULT_JITTER if jitter is None else jitter, max_tries, scale):
        try:
            L = np.linalg.cholesky(A + added * eye if added else A)
            if return_jitter:
                return L, added
            return L
        except np.linalg.LinAlgError:
            pass
    raise NumericalError(
        f"{name} is not positive definite{' at ' + context if context else ''} even with jitter "
        f"{added:.3g} added to the diagonal; the problem is ill-conditioned (try more data, a "
        "larger noise floor or fewer latent dimensions)",
        name=name,
        context=context,
        matrix=A,
    )


def chol_solve(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Solve A X = B given the lower Cholesky factor L of A."""
    return sla.cho_solve((L, True), B, check_finite=False)


def logdet_from_chol(L: np.ndarray) -> float | np.ndarray:
    """log det A from its Cholesky factor L (batched over leading dims)."""
    return 2.0 * np.sum(np.log(np.diagonal(L, axis1=-2, axis2=-1)), axis=-1)


def chol_inverse_lower(K, what: str = "K"):
    """(lower triangle of K^-1, log|K|) of a symmetric positive definite float64 matrix by LAPACK
    potrf + potri; the upper triangle of the first result is left as it was (see
    :func:`chol_inverse`). Raises ``np.linalg.LinAlgError`` naming ``what`` if K is not positive
    definite."""
    L, info = lapack.dpotrf(np.asarray(K, dtype=np.float64), lower=1, clean=0)
    if info != 0:
        raise np.linalg.LinAlgError(f"{what} is not positive definite (potrf info {info})")
    logdet = 2.0 * float(np.sum(np.log(np.diag(L))))
    Ki, info = lapack.dpotri(L, lower=1)
    return Ki, logdet


def chol_inverse(K, what: str = "K"):
    """(K^-1, log|K|) of a symmetric positive definite float64 matrix (LAPACK potrf + potri), the
    explicit inverse of :func:`chol_inverse_lower` made symmetric."""
    Ki, logdet = chol_inverse_lower(K, what)
    return np.tril(Ki) + np.tril(Ki, -1).T, logdet
