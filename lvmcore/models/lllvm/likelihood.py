"""The likelihood term of the bound (paper 000 appendix C, eqs. 72-80): <log p(y | x, C)> under
q(x) q(C), its gamma-independent statistics and the Gaussian log-likelihood at any gamma.

``gaussian`` (the paper's normalised likelihood, eqs. 29-31, 36):
  <log p(y | x, C)> = -1/2 y' Sigma_y^{-1} y + <y' e> - 1/2 <e' Sigma_y e>
                      - N D/2 log 2 pi + D/2 log|eps_y O + 2 gamma L|,
with y' Sigma_y^{-1} y = eps_y y' (O kron I) y + 2 gamma tr(Y' L Y) and <y'e> = gamma <y' e~>. The
solver (``g.solver``) decides how the quartic term and the log-determinant are taken:

- dense (full-covariance q): <e' Sigma_y e> = gamma^2 sum_k r_k / (o_k + 2 gamma w_k), r = diag(V' R V),
  R = sum_d <e~_d e~_d'> (``LikStats``), log-det from the eigenvalues of L;
- factorised (per-point q): sum_d <e~_d' Lt e~_d> from e~ at the means and the local covariance weights
  R^(k) on the distance-2 pattern (``FactStats``; ``local``'s module docstring), log-det from a sparse
  factorisation (``operators.lt_at``).

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
    LtAt,
    Theta,
    b_tilde,
    ctc,
    e_moment,
    edge_reduce,
    etilde,
    lap_logdet_trace,
    lt_at,
    second_moment_c,
    second_moment_x,
)


@dataclass
class LikStats:
    """The gamma-independent parts of <log p(y | x, C)> under the gaussian likelihood for one
    (q(x), q(C)) of the dense solver: eps-free |y|^2 term ``yy`` (y'(O kron I)y), ``trYLY`` = tr(Y'LY),
    ``lin`` = mu_x'<b~>, ``rk`` = diag(V' R V)."""

    yy: float
    trYLY: float
    lin: float
    rk: np.ndarray


@dataclass
class FactStats:
    """The same for the factorised solver: ``yy`` = |y|^2, ``trYLY`` = tr(Y'LY), ``lin`` =
    <y' e~>, ``e`` = e~(M, m) (N, D), ``R`` the local covariance weights R^(k) per group."""

    yy: float
    trYLY: float
    lin: float
    e: np.ndarray
    R: list


def lik_stats(Y, g: LLGraph, qx: QX, qc: QC) -> LikStats | FactStats:
    """The gamma-independent statistics of the gaussian likelihood for (q(x), q(C)) on ``g``'s solver."""
    if g.solver == "factorised":
        return _lik_stats_factorised(Y, g, qx, qc)
    yy = float(np.sum(Y * Y)) if g.epsilon_form == "identity" else float(np.sum(Y.sum(axis=0) ** 2))
    trYLY = float(np.sum((Y[g.ei] - Y[g.ej]) ** 2))
    lin = float(np.sum(qx.mean * b_tilde(Y, g, qc.mean)))
    R = e_moment(g, second_moment_c(qc), second_moment_x(qx))
    V = g.eigvec
    rk = np.einsum("ik,ik->k", V, R @ V)
    return LikStats(yy=yy, trYLY=trYLY, lin=lin, rk=rk)


def _lik_stats_factorised(Y, g: LLGraph, qx: QX, qc: QC) -> FactStats:
    n, D, Q = qc.mean.shape
    m, S, M, V = qx.mean, qx.cov, qc.mean, qc.cov
    e = etilde(g, M, m)
    Rs = []
    for grp in g.local.groups:
        U = np.einsum("ik,gkq->giq", grp.J, m[grp.nb])
        B = np.einsum("ik,gkdq->gidq", grp.K, M[grp.nb])
        Vc, Sc = V[grp.centres], S[grp.centres]
        R = D * np.einsum("giq,gqr,gjr->gij", U, Vc, U, optimize=True)
        R += np.einsum("gidq,gqr,gjdr->gij", B, Sc, B, optimize=True)
        tau = np.einsum("gqr,gbrq->gb", Vc, S[grp.nb])
        R += D * np.einsum("ia,ga,ja->gij", grp.J, tau, grp.J, optimize=True)
        Rs.append(R)
    return FactStats(
        yy=float(np.sum(Y * Y)),
        trYLY=float(np.sum((Y[g.ei] - Y[g.ej]) ** 2)),
        lin=float(np.sum(Y * e)),
        e=e,
        R=Rs,
    )


def expected_quad(g: LLGraph, st: FactStats, lt: LtAt) -> float:
    """sum_d <e~_d' Lt e~_d> under the factorised q(x) q(C)."""
    r = float(np.sum(st.e * lt.solve(st.e)))
    for grp, R in zip(g.local.groups, st.R):
        r += float(np.sum(lt.vals[grp.pos] * R))
    return r


def gauss_loglik(Y, g: LLGraph, th: Theta, st: LikStats | FactStats, gamma: float | None = None) -> float:
    """<log N(y | Sigma_y e, Sigma_y)> at ``gamma`` (default th.gamma) from ``lik_stats`` of the
    same solver: the quartic term and log|eps_y O + 2 gamma L| by eigenvalues (dense) or by a sparse
    factorisation with Lt on the distance-2 pattern (factorised)."""
    n, D = Y.shape
    if g.solver == "factorised":
        gam = th.gamma if gamma is None else float(gamma)
        lt = lt_at(g, th.eps_y, gam)
        quad, logdet = expected_quad(g, st, lt), lt.logdet
    else:
        gam = th.gamma if gamma is None else gamma
        lam = g.offset(th.eps_y) + 2.0 * gam * g.omega
        quad, logdet = np.sum(st.rk / lam), np.sum(np.log(lam))
    return float(
        -0.5 * th.eps_y * st.yy
        - gam * st.trYLY
        + gam * st.lin
        - 0.5 * gam**2 * quad
        - 0.5 * n * D * LOG2PI
        + 0.5 * D * logdet
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


def expected_loglik(
    Y, g: LLGraph, qx: QX, qc: QC, th: Theta, st: LikStats | FactStats | None = None
) -> float:
    """<log p(y | x, C)> under q(x) q(C) for either likelihood; ``st``: ``lik_stats`` if computed."""
    n, D = Y.shape
    if g.likelihood == "gaussian":
        return gauss_loglik(Y, g, th, st if st is not None else lik_stats(Y, g, qx, qc))
    S = expected_S(Y, g, qx, qc)
    ld_y = lap_logdet_trace(g, th.eps_y, th.gamma, trace=False)[0]
    return float(-0.5 * th.eps_y * np.sum(Y * Y) - 0.5 * n * D * LOG2PI + 0.5 * D * ld_y - 0.5 * th.gamma * S)
