"""The exact hyperboloid GP-LVM (paper 002, eq. 4): the log marginal likelihood of Y (N, D) at
latent points X (N, Q+1) on the Lorentz model,

    F = sum_d log N(y_d | 0, K),   K = sigma E + (1/beta + jitter) I,   E_ij = exp(-d_L(x_i, x_j) / kappa)

(the HE kernel of eq. 10 with unit variance; ``jitter`` = ``lvmcore.linalg.KERNEL_JITTER`` x sigma),
and its restricted form, with a flat-prior constant mean per column of Y integrated out (REML):
y^T K^-1 y becomes y^T P y with P = K^-1 - K^-1 1 1^T K^-1 / (1^T K^-1 1), and log|K| becomes
log|K| + log(1^T K^-1 1) - log 2 pi.

One definition of each piece: :func:`point_kernel` is K (with dK/dsq for the gradient),
:func:`eq4` the value from log|K| and the quadratic term. :func:`point_objective` evaluates F by a
Cholesky factor (differentiable by autodiff: the reference); the fit's step takes K^-1 whole from
LAPACK (:func:`lvmcore.linalg.chol_inverse_lower`, about 2/3 N^3 flops after the Cholesky) and the
hand-written gradient :func:`point_grads` (checked against autodiff of :func:`point_objective`
in tests/test_hgplvm.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lvmcore import linalg
from lvmcore.kernels.hyperbolic import he_kernel_chords
from lvmcore.precision import x64

__all__ = [
    "point_kernel",
    "eq4",
    "point_objective",
    "point_grads",
    "point_value_and_grad",
    "reml_projection",
]

_LOG2PI = float(np.log(2.0 * np.pi))


def _sq_lorentz_chords(X):
    """Squared Lorentz norms <x_i - x_j, x_i - x_j>_L (N, N) = 4 sinh^2(d_ij / 2), built one ambient
    coordinate at a time (no (N, N, Q+1) temporaries); clipped at 0 against rounding."""
    sq = -((X[:, None, 0] - X[None, :, 0]) ** 2)
    for q in range(1, X.shape[1]):
        sq = sq + (X[:, None, q] - X[None, :, q]) ** 2
    return jnp.maximum(sq, 0.0)


@x64
def point_kernel(X, log_sigma, log_beta, kappa):
    """(K, E, dE/dsq) of eq. (4): K = sigma E + (1/beta + jitter) I with the unit-variance kernel E
    of the squared chords (:func:`lvmcore.kernels.hyperbolic.he_kernel_chords`)."""
    n = X.shape[0]
    sigma = jnp.exp(log_sigma)
    E, dE = he_kernel_chords(_sq_lorentz_chords(X), 1.0, kappa)
    return (
        sigma * E + (1.0 / jnp.exp(log_beta) + linalg.KERNEL_JITTER * sigma) * jnp.eye(n),
        E,
        dE,
    )


def eq4(logdet, quad, n, d):
    """Eq. (4) from log|K| and the quadratic term sum_d y_d^T K^-1 y_d (restricted: their
    projected forms, module docstring)."""
    return -0.5 * n * d * _LOG2PI - 0.5 * d * logdet - 0.5 * quad


@x64
def point_objective(X, log_sigma, log_beta, Y, kappa, restricted=False):
    """Eq. (4) at hyperboloid points X (N, Q+1) for Y (N, D) by a Cholesky factor of K;
    ``restricted``: with a flat-prior constant mean per column of Y integrated out (REML)."""
    n, d = Y.shape
    L = jnp.linalg.cholesky(point_kernel(X, log_sigma, log_beta, kappa)[0])
    logdet = 2.0 * jnp.sum(jnp.log(jnp.diag(L)))
    if restricted:  # y^T K^-1 y - (1^T K^-1 y)^2 / 1^T K^-1 1, and log|K| + log 1^T K^-1 1 - log 2 pi
        A = jax.scipy.linalg.solve_triangular(L, jnp.concatenate([Y, jnp.ones((n, 1))], axis=1), lower=True)
        a, a1 = A[:, :d], A[:, d]
        s = jnp.sum(a1 * a1)
        return eq4(
            logdet + jnp.log(s) - _LOG2PI,
            jnp.sum(a * a) - jnp.sum((a1 @ a) ** 2) / s,
            n,
            d,
        )
    a = jax.scipy.linalg.solve_triangular(L, Y, lower=True)
    return eq4(logdet, jnp.sum(a * a), n, d)


@x64
def point_grads(X, log_sigma, log_beta, Y, E, dE, Ki, logdet):
    """Eq. (4) and its gradients from K^-1 (or the restricted P) and log|K| (K from
    :func:`point_kernel`).

    With G = dF/dK = (alpha alpha^T - D K^-1) / 2, alpha = K^-1 Y, and C_ij = G_ij dK_ij/dsq_ij
    (zero on the diagonal: the kernel's kink at d = 0 gets the zero sub-gradient), the ambient
    gradient is dF/dx_i = 4 sum_j C_ij (x_i - x_j) (time coordinate negated), since
    sq_ij = <x_i - x_j, x_i - x_j>_L.  Returns (F, dF/dX (N, Q+1) ambient, dF/dlog_sigma,
    dF/dlog_beta).  The Riemannian gradient (metric flip + projection) equals that of
    :func:`point_objective`; only the off-manifold extension differs.
    """
    n, d = Y.shape
    sigma = jnp.exp(log_sigma)
    beta = jnp.exp(log_beta)
    alpha = Ki @ Y
    F = eq4(logdet, jnp.sum(alpha * Y), n, d)
    G = 0.5 * (alpha @ alpha.T - d * Ki)
    trG = jnp.trace(G)
    g_ls = sigma * (jnp.sum(G * E) + linalg.KERNEL_JITTER * trG)
    g_lb = -trG / beta
    C = G * (sigma * dE)  # dK/dsq = sigma dE/dsq, zero on the diagonal (the kink)
    gX = 4.0 * (jnp.sum(C, axis=1)[:, None] * X - C @ X)
    gX = gX.at[:, 0].multiply(-1.0)
    return F, gX, g_ls, g_lb


@x64
def point_value_and_grad(X, log_sigma, log_beta, Y, kappa):
    """:func:`point_grads` with K^-1 by XLA's Cholesky solve, in one traced function."""
    K, E, dE = point_kernel(X, log_sigma, log_beta, kappa)
    L = jnp.linalg.cholesky(K)
    Ki = jax.scipy.linalg.cho_solve((L, True), jnp.eye(K.shape[0]))
    return point_grads(X, log_sigma, log_beta, Y, E, dE, Ki, 2.0 * jnp.sum(jnp.log(jnp.diag(L))))


def symmetrize_lower(A):
    """The symmetric matrix whose lower triangle is A's (potri writes only the lower triangle);
    in XLA, one fused pass."""
    return jnp.tril(A) + jnp.tril(A, -1).T


def chol_inverse_lower(K):
    """:func:`lvmcore.linalg.chol_inverse_lower` of eq. (4)'s K, with the fix named in its refusal."""
    try:
        return linalg.chol_inverse_lower(K, "hyperboloid GP-LVM: K")
    except np.linalg.LinAlgError as e:
        raise np.linalg.LinAlgError(f"{e}; lower learning_rate") from e


@jax.jit
def reml_projection(Ki_lower, logdet):
    """(P, log|K| + log 1^T K^-1 1 - log 2 pi) from K^-1's lower triangle: in place of (K^-1,
    log|K|), :func:`point_grads` gives the restricted likelihood and its gradients."""
    Ki = symmetrize_lower(Ki_lower)
    u = jnp.sum(Ki, axis=1)
    s = jnp.sum(u)
    return Ki - jnp.outer(u, u) / s, logdet + jnp.log(s) - _LOG2PI
