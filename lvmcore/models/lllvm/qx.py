"""E-step for x (paper 000 appendix C, eqs. 50-57): q(x) = N(mu_x, Sigma_x) with
Sigma_x^{-1} = <A^{-1}> + Pi^{-1}, Pi^{-1} = (alpha I + 2 L) kron I_Q, mu_x = Sigma_x <b>.

``gaussian`` (the paper's normalised likelihood, eqs. 29-31): <A^{-1}> = gamma^2 sum_d <F(c_d)' Lt F(c_d)>
(dense, see ``operators.x_quad``); ``quadratic`` (the f-term variant, eq. 28): the graph-sparse
gamma sum_j eta_ij <C_i^T C_i + C_j^T C_j> blocks.
"""

from __future__ import annotations

import numpy as np

from .operators import (
    QC,
    QX,
    LLGraph,
    Theta,
    b_tilde,
    block_gaussian,
    ctc,
    dense_gaussian,
    edge_reduce,
    eps_lap_inverse,
    scatter,
    second_moment_c,
    x_quad,
)


def _qx_stats(Y, ei, ej, n, M, Cmean, sl):
    """Chunk of edges sl -> (sum_j eta_ij (M_i + M_j) (N, Q, Q), b / gamma (N, Q))."""
    i, j = ei[sl], ej[sl]
    Msum = M[i] + M[j]
    v = np.einsum("edq,ed->eq", Cmean[i] + Cmean[j], Y[i] - Y[j])
    return scatter(n, i, j, Msum, Msum), scatter(n, i, j, v, -v)


def update_qx(Y, g: LLGraph, qc: QC, th: Theta, context: str = "", x0=None) -> QX:
    """q(x) given q(C) and theta (exact coordinate ascent of the bound in q(x)). ``x0``: the
    previous means, where the factorised solver's CG starts (other solvers ignore it)."""
    if g.solver == "factorised":
        from .factorised import update_qx as fact_qx

        return fact_qx(Y, g, qc, th, x0=x0, context=context)
    n, Q = qc.cov.shape[0], qc.cov.shape[-1]
    rhs_name = "precision of q(x)"
    if g.likelihood == "gaussian":
        Lt = eps_lap_inverse(g, th.eps_y, th.gamma)
        P = th.gamma**2 * x_quad(g, second_moment_c(qc), Lt)
        P += np.kron(th.alpha * np.eye(n) + 2.0 * g.laplacian(), np.eye(Q))
        rhs = th.gamma * b_tilde(Y, g, qc.mean).reshape(n * Q, 1)
        mean, full, cov, cov_e, ld = dense_gaussian(g, P, rhs, rhs_name, context)
        return QX(mean=mean.reshape(n, Q), cov=cov, cov_edge=cov_e, logdet_prec=ld, full=full, alpha=th.alpha)
    M = ctc(qc)
    eye = np.eye(Q)
    Mpt, b = edge_reduce(g, _qx_stats, Y, g.ei, g.ej, n, M, qc.mean)
    point = th.gamma * Mpt + (th.alpha + 2.0 * g.deg)[:, None, None] * eye
    edge = -th.gamma * (M[g.ei] + M[g.ej]) - 2.0 * eye
    rhs = th.gamma * b.reshape(n * Q, 1)
    mean, cov, cov_e, ld = block_gaussian(g, point, edge, rhs, rhs_name, context)
    return QX(mean=mean.reshape(n, Q), cov=cov, cov_edge=cov_e, logdet_prec=ld, alpha=th.alpha)
