"""E-step for C (paper 000 appendix C, eqs. 64-71): q(C) = MN(mu_C, I_D, Sigma_C) with row precision
Sigma_C^{-1} = <Gamma^{-1}> + beta (eps_c O + 2 L) kron I_Q and mean mu_C = gamma <H> Sigma_C.

``gaussian`` (eqs. 29-31): <Gamma^{-1}> = gamma^2 <G(x)' Lt G(x)> (dense, ``operators.c_quad``);
``quadratic`` (eq. 28): gamma sum_j eta_ij <(x_j - x_i)(x_j - x_i)'> on the graph pattern.
"""

from __future__ import annotations

import numpy as np

from .operators import (
    QC,
    QX,
    LLGraph,
    Theta,
    block_gaussian,
    c_quad,
    dense_gaussian,
    edge_reduce,
    eps_lap_inverse,
    eps_lap_matrix,
    h_stat,
    scatter,
)


def _qc_stats(Y, ei, ej, n, mean, cov, cov_edge, sl):
    """Chunk of edges sl -> (<Gamma_i^{-1}> (N, Q, Q), <H_i> (N, D, Q))."""
    i, j = ei[sl], ej[sl]
    Sij = cov_edge[sl]
    dm = mean[j] - mean[i]
    Exx = cov[i] + cov[j] - Sij - np.swapaxes(Sij, 1, 2) + np.einsum("eq,er->eqr", dm, dm)
    h = np.einsum("ed,eq->edq", Y[j] - Y[i], dm)
    return scatter(n, i, j, Exx, Exx), scatter(n, i, j, h, h)


def update_qc(Y, g: LLGraph, qx: QX, th: Theta, context: str = "", c0=None) -> QC:
    """q(C) given q(x) and theta (exact coordinate ascent of the bound in q(C)). ``c0``: the
    previous means, where the factorised solver's CG starts (other solvers ignore it)."""
    if g.solver == "factorised":
        from .factorised import update_qc as fact_qc

        return fact_qc(Y, g, qx, th, c0=c0, context=context)
    n, Q = qx.mean.shape
    D = Y.shape[1]
    name = "precision of q(C)"
    if g.likelihood == "gaussian":
        full_x = qx.full if qx.full is not None else np.zeros((n * Q, n * Q))
        S = full_x + np.outer(qx.mean.ravel(), qx.mean.ravel())
        P = th.gamma**2 * c_quad(g, S, eps_lap_inverse(g, th.eps_y, th.gamma))
        P += th.beta * np.kron(eps_lap_matrix(g, th.eps_c), np.eye(Q))
        rhs = th.gamma * np.swapaxes(h_stat(Y, g, qx.mean), 1, 2).reshape(n * Q, D)
        mean, full, cov, cov_e, ld = dense_gaussian(g, P, rhs, name, context)
        return QC(
            mean=np.swapaxes(mean.reshape(n, Q, D), 1, 2), cov=cov, cov_edge=cov_e, logdet_prec=ld, full=full
        )
    eye = np.eye(Q)
    Gam, H = edge_reduce(g, _qc_stats, Y, g.ei, g.ej, n, qx.mean, qx.cov, qx.cov_edge)
    point = th.gamma * Gam + (th.beta * (th.eps_c + 2.0 * g.deg))[:, None, None] * eye
    edge = np.ascontiguousarray(np.broadcast_to(-2.0 * th.beta * eye, (len(g.ei), Q, Q)))
    rhs = th.gamma * np.swapaxes(H, 1, 2).reshape(n * Q, D)
    mean, cov, cov_e, ld = block_gaussian(g, point, edge, rhs, name, context)
    return QC(mean=np.swapaxes(mean.reshape(n, Q, D), 1, 2), cov=cov, cov_edge=cov_e, logdet_prec=ld)
