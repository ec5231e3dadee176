"""The collapsed variational bound of a sparse GP with uncertain inputs (Titsias and Lawrence 2010;
paper 004, section 3.1 eq. 15 and appendix A; Damianou et al.'s notation), from its sufficient
statistics, and the predictive distribution it implies (paper 004, appendix C).

For one view with N x D centred data Y, noise precision beta, inducing covariance K_mm and the
psi statistics (psi0, Psi1^T Y, Psi2) summed over the rows:

    F = -N D/2 log 2 pi + N D/2 log beta - beta/2 tr(Y^T Y) - D/2 log|A|
        + beta^2/2 ||L_A^-1 L_m^-1 Psi1^T Y||^2 - beta D/2 psi0 + beta D/2 tr(C)

with L_m = chol(K_mm), C = L_m^-1 Psi2 L_m^-T, A = I + beta C = L_A L_A^T. The KL term of q(X)
is the model's. :func:`terms` computes the factorisations once (:class:`Terms`, as GPflow's
``sgpr.py`` does); :func:`bound` and :func:`predict` both read them, and nothing forms an inverse.
Any kernel whose psi statistics exist can use this (``lvmcore.kernels.euclidean``); the
hyperboloid GP-LVM's bound has the same form with Monte-Carlo statistics.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from lvmcore.linalg import cholesky_jax
from lvmcore.precision import x64

__all__ = ["Terms", "terms", "bound", "predict"]


class Terms(NamedTuple):
    """Intermediates shared by the bound and by prediction (M inducing points, D output dims)."""

    Lm: jax.Array  # [M, M] chol(K_mm + jitter)
    LA: jax.Array  # [M, M] chol(A), A = I + beta C
    C: jax.Array  # [M, M] L_m^-1 Psi2 L_m^-T
    c: jax.Array  # [M, D] L_A^-1 L_m^-1 Psi1^T Y


@x64
def terms(Kmm, psi1TY, psi2, beta, rel_jitter=0.0) -> Terms:
    """The factorisations of the bound. ``rel_jitter`` is added to K_mm's diagonal relative to its
    mean (``lvmcore.linalg``'s escalation, for a K_mm that is not numerically positive definite)."""
    M = Kmm.shape[0]
    Lm = cholesky_jax(Kmm, rel_jitter)
    C = solve_triangular(Lm, solve_triangular(Lm, psi2, lower=True).T, lower=True)
    LA = jnp.linalg.cholesky(jnp.eye(M) + beta * C)
    c = solve_triangular(LA, solve_triangular(Lm, psi1TY, lower=True), lower=True)
    return Terms(Lm, LA, C, c)


@x64
def bound(t: Terms, psi0, trYY, log_beta, N, D):
    """F of the module docstring (scalar) from :func:`terms` and the scalar statistics."""
    beta = jnp.exp(log_beta)
    return (
        -0.5 * N * D * jnp.log(2 * jnp.pi)
        + 0.5 * N * D * log_beta
        - 0.5 * beta * trYY
        - D * jnp.sum(jnp.log(jnp.diag(t.LA)))
        + 0.5 * beta**2 * jnp.sum(t.c * t.c)
        - 0.5 * beta * D * psi0
        + 0.5 * beta * D * jnp.trace(t.C)
    )


@x64
def predict(t: Terms, beta, psi0, psi1, psi2):
    """Predictive mean [n, D] and variance [n, D] of f + noise at n uncertain inputs, from the
    test points' own statistics psi0 [n], Psi1 [n, M], Psi2 [n, M, M] (paper 004 appendix C):

        mean = Psi1 W,                     W = beta B^-1 Psi1^T Y,  B = K_mm + beta Psi2
        var  = psi0 - tr((K_mm^-1 - B^-1) Psi2_*) + 1/beta + diag(W^T Psi2_* W) - mean^2

    with B = L_m A L_m^T and K_mm^-1 - B^-1 = L_m^-T (I - A^-1) L_m^-1, by triangular solves."""
    Lm, LA = t.Lm, t.LA
    W = beta * solve_triangular(Lm, solve_triangular(LA, t.c, lower=True, trans=1), lower=True, trans=1)
    mean = psi1 @ W

    def trace_term(p2):  # tr((I - A^-1) L_m^-1 Psi2_* L_m^-T)
        P = solve_triangular(Lm, solve_triangular(Lm, p2, lower=True).T, lower=True)
        G = solve_triangular(LA, P, lower=True)
        return jnp.trace(P) - jnp.trace(solve_triangular(LA, G.T, lower=True))

    var = (
        (psi0 - jax.vmap(trace_term)(psi2) + 1.0 / beta)[:, None]
        + jnp.einsum("md,nmk,kd->nd", W, psi2, W)
        - mean**2
    )
    return mean, var
