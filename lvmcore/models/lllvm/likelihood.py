"""The variational lower bound (paper 000 appendix C, eqs. 72-80):
  F = <log p(y | x, C)> - KL(q(x) || p(x)) - KL(q(C) || p(C)).

``gaussian`` (the paper's normalised likelihood, eqs. 29-31, 36):
  <log p(y | x, C)> = -1/2 y' Sigma_y^{-1} y + <y' e> - 1/2 <e' Sigma_y e>
                      - N D/2 log 2 pi + D/2 log|eps_y O + 2 gamma L|,
with y' Sigma_y^{-1} y = eps_y y' (O kron I) y + 2 gamma tr(Y' L Y), <y'e> = gamma mu_x' <b~> and
<e' Sigma_y e> = gamma^2 sum_k r_k / (o_k + 2 gamma w_k), r = diag(V' R V), R = sum_d <e~_d e~_d'>.
``quadratic`` (eq. 28, not normalised in y): -eps_y/2 |y|^2 - gamma/2 <S> + the same normaliser,
S = sum_i sum_j eta_ij |(y_j - y_i) - C_i (x_j - x_i)|^2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .operators import (
    LOG2PI,
    QC,
    QX,
    LLGraph,
    Theta,
    b_tilde,
    c_prior_quad,
    ctc,
    e_moment,
    edge_reduce,
    eps_lap_logdet,
    lap_logdet_trace,
    lap_quad_blocks,
    lap_quad_mean,
    second_moment_c,
    second_moment_x,
)


@dataclass
class LikStats:
    """The gamma-independent parts of <log p(y | x, C)> under the gaussian likelihood for one
    (q(x), q(C)): eps-free |y|^2 term ``yy`` (y'(O kron I)y), ``trYLY`` = tr(Y'LY), ``lin`` = mu_x'<b~>,
    ``rk`` = diag(V' R V)."""

    yy: float
    trYLY: float
    lin: float
    rk: np.ndarray


def lik_stats(Y, g: LLGraph, qx: QX, qc: QC):
    if g.solver == "factorised":
        from .factorised import lik_stats as fact_stats

        return fact_stats(Y, g, qx, qc)
    yy = float(np.sum(Y * Y)) if g.epsilon_form == "identity" else float(np.sum(Y.sum(axis=0) ** 2))
    trYLY = float(np.sum((Y[g.ei] - Y[g.ej]) ** 2))
    lin = float(np.sum(qx.mean * b_tilde(Y, g, qc.mean)))
    R = e_moment(g, second_moment_c(qc), second_moment_x(qx))
    V = g.eigvec
    rk = np.einsum("ik,ik->k", V, R @ V)
    return LikStats(yy=yy, trYLY=trYLY, lin=lin, rk=rk)


def gauss_loglik(Y, g: LLGraph, th: Theta, st: LikStats, gamma: float | None = None) -> float:
    """<log N(y | Sigma_y e, Sigma_y)> at ``gamma`` (default th.gamma)."""
    if g.solver == "factorised":
        from .factorised import gauss_loglik as fact_loglik

        return fact_loglik(Y, g, th, st, gamma)
    n, D = Y.shape
    gam = th.gamma if gamma is None else gamma
    lam = g.offset(th.eps_y) + 2.0 * gam * g.omega
    return float(
        -0.5 * th.eps_y * st.yy
        - gam * st.trYLY
        + gam * st.lin
        - 0.5 * gam**2 * np.sum(st.rk / lam)
        - 0.5 * n * D * LOG2PI
        + 0.5 * D * np.sum(np.log(lam))
    )


def _S_stats(Y, ei, ej, xmean, xcov, xcov_edge, M, Cmean, sl):
    """Chunk of edges sl -> (contribution to <S>,)."""
    i, j = ei[sl], ej[sl]
    dy = Y[j] - Y[i]
    dm = xmean[j] - xmean[i]
    Sij = xcov_edge[sl]
    Exx = xcov[i] + xcov[j] - Sij - np.swapaxes(Sij, 1, 2) + np.einsum("eq,er->eqr", dm, dm)
    lin = np.einsum("ed,edq,eq->", dy, Cmean[i] + Cmean[j], dm)
    quad = np.einsum("eqr,erq->", M[i] + M[j], Exx)
    return (np.array(2.0 * np.sum(dy * dy) - 2.0 * lin + quad),)


def expected_S(Y, g: LLGraph, qx: QX, qc: QC) -> float:
    """<S> under q(x) q(C) (the quadratic variant's likelihood statistic)."""
    (S,) = edge_reduce(g, _S_stats, Y, g.ei, g.ej, qx.mean, qx.cov, qx.cov_edge, ctc(qc), qc.mean)
    return float(S)


def expected_loglik(Y, g: LLGraph, qx: QX, qc: QC, th: Theta, st: LikStats | None = None) -> float:
    n, D = Y.shape
    if g.likelihood == "gaussian":
        return gauss_loglik(Y, g, th, st if st is not None else lik_stats(Y, g, qx, qc))
    S = expected_S(Y, g, qx, qc)
    ld_y = lap_logdet_trace(g, th.eps_y, th.gamma, trace=False)[0]
    return float(-0.5 * th.eps_y * np.sum(Y * Y) - 0.5 * n * D * LOG2PI + 0.5 * D * ld_y - 0.5 * th.gamma * S)


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


def elbo(Y, g: LLGraph, qx: QX, qc: QC, th: Theta, *, terms: bool = False, stats: LikStats | None = None):
    """The bound F; ``terms=True`` also returns (expected log-likelihood, -KL(q(x)||p(x)),
    -KL(q(C)||p(C))). ``stats``: the likelihood statistics of (qx, qc) if already computed."""
    parts = (expected_loglik(Y, g, qx, qc, th, stats), neg_kl_x(g, qx, th), neg_kl_c(g, qc, th))
    F = float(sum(parts))
    return (F, parts) if terms else F
