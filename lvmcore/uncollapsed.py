"""The uncollapsed variational bound of a sparse GP with uncertain inputs and an explicit whitened
q(u), for minibatch training (Hensman, Fusi and Lawrence 2013; paper 004 eq. 13 before Titsias'
collapse, with the expectations of appendix A), from the same sufficient statistics as the
collapsed bound (``lvmcore.collapsed``). Both minibatch estimators use it: the Euclidean
Bayesian GP-LVM (``lvmcore.models.bgplvm_svi``, closed-form psi statistics) and the hyperboloid one
(``lvmcore.models.hgplvm.minibatch``, Monte-Carlo psi statistics, paper 002 eqs. 15-20).

Whitened: u = L_m v with K_mm = L_m L_m^T and q(v) = N(m, S_v) shared by the D output columns
(m: M x D, precision P = S_v^-1). With c = L_m^-1 Psi1^T Y (M x D) and C = L_m^-1 Psi2 L_m^-T
(M x M) from statistics summed over a set of points and scaled by ``scale`` (N / B for a batch of
B of the N points),

    sum_n E[log p(y_n | f_n)] = -N D/2 log 2 pi + N D/2 log beta + scale (-beta/2 tr(Y^T Y)
                                + beta tr(c^T m) - beta/2 tr(m^T C m) - beta D/2 psi0
                                + beta D/2 tr(C) - beta D/2 tr(S_v C))
    KL(q(v) || N(0, I))       = 1/2 (D tr(S_v) + ||m||^2 - D M - D log|S_v|).

The bound is linear in the statistics, so a scaled batch gives an unbiased estimate. Its optimum
in q(v) for given statistics is P = I + beta C, m = beta P^-1 c (:func:`optimal_qu`, the
natural-gradient step of size one; :func:`natural_step` the step of any size), where it equals the
collapsed bound. :func:`jitter_tries` is
the minibatch fits' retry with a larger jitter on K_mm where a step is not finite.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve, solve_triangular

from lvmcore.linalg import MAX_JITTER, NumericalError, cholesky_jax, jitter_escalation
from lvmcore.precision import x64

__all__ = ["bound", "kl_qu", "optimal_qu", "natural_step", "jitter_tries"]


def _whitened(Kmm, p1y, p2, rel_jitter):
    """(c, C) of the module docstring (unscaled)."""
    Lm = cholesky_jax(Kmm, rel_jitter)
    c = solve_triangular(Lm, p1y, lower=True)
    C = solve_triangular(Lm, solve_triangular(Lm, p2, lower=True).T, lower=True)
    return c, C


def _precision_factors(P):
    """(R^-1, log|S_v|) with P = R R^T, S_v = R^-T R^-1."""
    R = jnp.linalg.cholesky(P)
    Rinv = solve_triangular(R, jnp.eye(R.shape[0]), lower=True)
    return Rinv, -2.0 * jnp.sum(jnp.log(jnp.diag(R)))


def _kl(m, Rinv, logdet_S):
    D, M = m.shape[1], m.shape[0]
    return 0.5 * (D * jnp.sum(Rinv * Rinv) + jnp.sum(m * m) - D * M - D * logdet_S)


@x64
def kl_qu(qu):
    """KL(q(v) || N(0, I)) of ``qu`` = {"m": (M, D), "P": (M, M) precision}."""
    return _kl(qu["m"], *_precision_factors(qu["P"]))


@x64
def bound(Kmm, stats, log_beta, qu, N, scale=1.0, rel_jitter=0.0):
    """sum_n E[log p(y_n | f_n)] - KL(q(v)) of the module docstring from K_mm (``rel_jitter`` is
    added relative to its mean diagonal), the statistics (psi0, Psi1^T Y, Psi2, tr(Y^T Y)) scaled by
    ``scale``, log beta and q(v) = {"m", "P"}; the KL of q(X) is the caller's."""
    psi0, p1y, p2, tryy = stats
    beta = jnp.exp(log_beta)
    D = p1y.shape[1]
    c, C = _whitened(Kmm, p1y, p2, rel_jitter)
    m = qu["m"]
    Rinv, logdet_S = _precision_factors(qu["P"])
    tr_SC = jnp.sum(Rinv * (Rinv @ C))  # tr(R^-T R^-1 C) = <R^-1, R^-1 C>
    expected = (
        -0.5 * N * D * jnp.log(2 * jnp.pi)
        + 0.5 * N * D * log_beta
        + scale
        * (
            -0.5 * beta * tryy
            + beta * jnp.sum(c * m)
            - 0.5 * beta * jnp.sum(m * (C @ m))
            - 0.5 * beta * D * psi0
            + 0.5 * beta * D * jnp.trace(C)
            - 0.5 * beta * D * tr_SC
        )
    )
    return expected - _kl(m, Rinv, logdet_S)


def optimal_qu(Kmm, stats, log_beta, scale=1.0, rel_jitter=0.0):
    """The q(v) maximising :func:`bound` for these statistics (traceable): (P, m) with
    P = I + beta scale C and m = beta scale P^-1 c."""
    _, p1y, p2, _ = stats
    beta = jnp.exp(log_beta)
    c, C = _whitened(Kmm, p1y, p2, rel_jitter)
    c, C = scale * c, scale * C
    P = jnp.eye(C.shape[0]) + beta * C
    P = 0.5 * (P + P.T)
    return P, beta * cho_solve((jnp.linalg.cholesky(P), True), c)


def natural_step(qu, P_t, m_t, r):
    """The natural-gradient step of size ``r`` on q(v) = {"m", "P"} toward (P_t, m_t) (e.g. a
    batch's :func:`optimal_qu`): a convex combination of the natural parameters (P, P m). Returns
    {"m", "P"}, in the arrays' own library (NumPy stays NumPy, jax stays jax)."""
    P = (1.0 - r) * qu["P"] + r * P_t
    eta = (1.0 - r) * (qu["P"] @ qu["m"]) + r * (P_t @ m_t)
    solve = jnp.linalg.solve if isinstance(P, jax.Array) else np.linalg.solve
    return {"m": solve(P, eta), "P": P}


def jitter_tries(current, what, fix=""):
    """The relative jitters on K_mm a minibatch step tries in turn, :func:`lvmcore.linalg.jitter_escalation`
    from ``current`` up (the caller breaks at the first that works); asked for one after the last, it
    raises NumericalError("``what`` even with jitter MAX_JITTER x mean diag(K_mm)``fix``")."""
    yield from jitter_escalation(current)
    raise NumericalError(f"{what} even with jitter {MAX_JITTER:g} x mean diag(K_mm){fix}", name="K_mm")
