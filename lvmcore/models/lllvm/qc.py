"""q(C), the E-step for C (paper 000 appendix C, eqs. 64-71): q(C) = MN(mu_C, I_D, Sigma_C) with row
precision Sigma_C^{-1} = <Gamma^{-1}> + beta (eps_c O + 2 L) kron I_Q and mean mu_C = gamma <H> Sigma_C.

One entry, ``update_qc``, for every solver (``g.solver``):

- ``gaussian`` (eqs. 29-31), dense: <Gamma^{-1}> = gamma^2 <G(x)' Lt G(x)> (full covariance,
  ``operators.c_quad``);
- ``gaussian``, factorised: q(C) = prod_i MN(C_i; M_i, I_D, V_i), the same precision with the other
  factor's covariances per point (``local``'s module docstring), applied matrix-free (``c_system``);
  row means by preconditioned CG, covariances the inverse diagonal blocks;
- ``quadratic`` (eq. 28), dense or sparse: gamma sum_j eta_ij <(x_j - x_i)(x_j - x_i)'> on the graph
  pattern.
"""

from __future__ import annotations

import numpy as np

from .cg import cached_lu, graph_blocks_csc, inverse_blocks, pcg
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
    etilde,
    etilde_adj_c,
    h_stat,
    lt_at,
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
        return _update_qc_factorised(Y, g, qx, th, c0=c0, context=context)
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


# --------------------------------------------------------------------------- factorised solver
def c_system(Y, g: LLGraph, qx: QX, th: Theta):
    """The factorised C row precision given q(x) as (apply on (N, D, Q), diagonal blocks (N, Q, Q),
    b (N, D, Q))."""
    n, Q = qx.mean.shape
    D = Y.shape[1]
    m, S = qx.mean, qx.cov
    lt = lt_at(g, th.eps_y, th.gamma)
    gam2 = th.gamma**2
    diag = np.zeros((n, Q, Q))
    Rs = []
    for grp in g.local.groups:
        Lk = lt.vals[grp.pos]
        U = np.einsum("ik,gkq->giq", grp.J, m[grp.nb])
        diag[grp.centres] += np.einsum("gij,giq,gjr->gqr", Lk, U, U, optimize=True)
        R = np.einsum("ia,gij,jb->gab", grp.K, Lk, grp.K, optimize=True)
        rd = np.diagonal(R, axis1=1, axis2=2)
        contrib = rd[:, :, None, None] * S[grp.centres][:, None]
        diag += np.asarray(grp.scat @ contrib.reshape(-1, Q * Q)).reshape(n, Q, Q)
        Rs.append(R)
    diag = gam2 * diag + (th.beta * (th.eps_c + 2.0 * g.deg))[:, None, None] * np.eye(Q)
    lap = g.local.lap

    def apply(c):
        out = etilde_adj_c(g, m, lt.solve(etilde(g, c, m)))
        for grp, R in zip(g.local.groups, Rs):
            loc = np.einsum("gkl,gldq,gqr->gkdr", R, c[grp.nb], S[grp.centres], optimize=True)
            out += np.asarray(grp.scat @ loc.reshape(-1, D * Q)).reshape(n, D, Q)
        Lc = np.asarray(lap @ c.reshape(n, D * Q)).reshape(n, D, Q)
        return gam2 * out + th.beta * (th.eps_c * c + 2.0 * Lc)

    return apply, diag, th.gamma * etilde_adj_c(g, m, Y)


def _update_qc_factorised(Y, g: LLGraph, qx: QX, th: Theta, c0=None, context: str = ""):
    """Factorised q(C) given q(x): row means solve the full system (one per output row), covariances the
    inverse diagonal blocks (shared by the D rows)."""
    n, Q = qx.mean.shape
    D = Y.shape[1]
    m, S = qx.mean, qx.cov
    apply, diag, b = c_system(Y, g, qx, th)
    cov, ld = inverse_blocks(diag)
    # preconditioner: the graph-sparse C precision of the f-term form (eq. 28) with <(x_j - x_i)(.)'>
    # (per-point covariances), plus the prior; one SuperLU factor shared by the D rows
    eye = np.eye(Q)

    def build():
        i, j = g.ei, g.ej
        dm = m[j] - m[i]
        Exx = S[i] + S[j] + np.einsum("eq,er->eqr", dm, dm)
        gam_pt = np.asarray(g.inc @ Exx.reshape(len(i), -1)).reshape(n, Q, Q)
        point = th.gamma * gam_pt + (th.beta * (th.eps_c + 2.0 * g.deg))[:, None, None] * eye
        return graph_blocks_csc(g, point, np.broadcast_to(-2.0 * th.beta * eye, (len(i), Q, Q)))

    pre = cached_lu(g, "c", build, "precision of q(C)", context)

    def prec(r):
        z = pre["lu"].solve(np.ascontiguousarray(np.swapaxes(r, 1, 2).reshape(n * Q, D)))
        return np.swapaxes(z.reshape(n, Q, D), 1, 2)

    mean, it = pcg(apply, b, prec(b) if c0 is None else c0, prec)
    pre["cg"] = it
    E = len(g.ei)
    qc = QC(mean=mean, cov=cov, cov_edge=np.zeros((E, Q, Q)), logdet_prec=ld)
    qc.cg_iters = it
    return qc
