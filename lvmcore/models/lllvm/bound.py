"""The variational lower bound (paper 000 appendix C, eqs. 72-80):
  F = <log p(y | x, C)> - KL(q(x) || p(x)) - KL(q(C) || p(C)),
the likelihood term from ``likelihood`` (on the fit's solver), the two KL terms here.
"""

from __future__ import annotations

import numpy as np

from .likelihood import FactStats, LikStats, expected_loglik
from .operators import (
    QC,
    QX,
    LLGraph,
    Theta,
    c_prior_quad,
    eps_lap_logdet,
    lap_logdet_trace,
    lap_quad_blocks,
    lap_quad_mean,
)


def neg_kl_x(g: LLGraph, qx: QX, th: Theta) -> float:
    """-KL(q(x) || N(0, ((alpha I + 2 L) kron I)^{-1}))."""
    n, Q = qx.mean.shape
    ld_x = lap_logdet_trace(g, th.alpha, 1.0, trace=False)[0]
    tr_x = th.alpha * np.sum(np.trace(qx.cov, axis1=1, axis2=2)) + 2.0 * lap_quad_blocks(
        g, qx.cov, qx.cov_edge
    )
    mq_x = th.alpha * np.sum(qx.mean**2) + 2.0 * lap_quad_mean(g, qx.mean)
    return float(0.5 * (Q * ld_x - qx.logdet_prec - tr_x - mq_x + n * Q))


def neg_kl_c(g: LLGraph, qc: QC, th: Theta) -> float:
    """-KL(q(C) || MN(0, beta^{-1} I_D, ((eps_c O + 2 L) kron I)^{-1})) (eq. 78 with U = I / beta)."""
    n, D, Q = qc.mean.shape
    nQ = n * Q
    ld_c = eps_lap_logdet(g, th.eps_c, 1.0)
    tr_cov, tr_mean = c_prior_quad(g, qc, th.eps_c)
    return float(
        0.5 * D * (nQ * np.log(th.beta) + Q * ld_c - qc.logdet_prec - th.beta * tr_cov + nQ)
        - 0.5 * th.beta * tr_mean
    )


def elbo(
    Y,
    g: LLGraph,
    qx: QX,
    qc: QC,
    th: Theta,
    *,
    terms: bool = False,
    stats: LikStats | FactStats | None = None,
):
    """The bound F; ``terms=True`` also returns (expected log-likelihood, -KL(q(x)||p(x)),
    -KL(q(C)||p(C))). ``stats``: the likelihood statistics of (qx, qc) if already computed."""
    parts = (expected_loglik(Y, g, qx, qc, th, stats), neg_kl_x(g, qx, th), neg_kl_c(g, qc, th))
    F = float(sum(parts))
    return (F, parts) if terms else F
