"""q(x), the E-step for x (paper 000 appendix C, eqs. 50-57): q(x) = N(mu_x, Sigma_x) with
Sigma_x^{-1} = <A^{-1}> + Pi^{-1}, Pi^{-1} = (alpha I + 2 L) kron I_Q, mu_x = Sigma_x <b>.

One entry, ``update_qx``, for every solver (``g.solver``):

- ``gaussian`` (the paper's normalised likelihood, eqs. 29-31), dense: <A^{-1}> = gamma^2 sum_d
  <F(c_d)' Lt F(c_d)> (full covariance, see ``operators.x_quad``);
- ``gaussian``, factorised: q(x) = prod_i N(x_i; m_i, S_i), the same precision with the other factor's
  covariances per point (``local``'s module docstring), applied matrix-free (``x_system``); means by
  preconditioned CG, covariances the inverse diagonal blocks;
- ``quadratic`` (the f-term variant, eq. 28), dense or sparse: the graph-sparse
  gamma sum_j eta_ij <C_i^T C_i + C_j^T C_j> blocks.
"""

from __future__ import annotations

import numpy as np

from .cg import cached_lu, graph_blocks_csc, inverse_blocks, pcg
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
    etilde,
    etilde_adj_x,
    lt_at,
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
        return _update_qx_factorised(Y, g, qc, th, x0=x0, context=context)
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


# --------------------------------------------------------------------------- factorised solver
def x_system(Y, g: LLGraph, qc: QC, th: Theta):
    """The factorised x precision given q(C) as (apply, diagonal blocks (N, Q, Q), linear term b (N, Q))."""
    n, D, Q = qc.mean.shape
    M, V = qc.mean, qc.cov
    lt = lt_at(g, th.eps_y, th.gamma)
    gam2 = th.gamma**2
    diag = np.zeros((n, Q, Q))
    Ts = []
    for grp in g.local.groups:
        Lk = lt.vals[grp.pos]
        T = np.einsum("ia,gij,jb->gab", grp.J, Lk, grp.J, optimize=True)
        B = np.einsum("ik,gkdq->gidq", grp.K, M[grp.nb])
        diag[grp.centres] += np.einsum("gij,gidq,gjdr->gqr", Lk, B, B, optimize=True)
        td = np.diagonal(T, axis1=1, axis2=2)  # (G, n)
        contrib = D * td[:, :, None, None] * V[grp.centres][:, None]
        diag += np.asarray(grp.scat @ contrib.reshape(-1, Q * Q)).reshape(n, Q, Q)
        Ts.append(T)
    diag = gam2 * diag + (th.alpha + 2.0 * g.deg)[:, None, None] * np.eye(Q)
    lap = g.local.lap

    def apply(v):
        out = etilde_adj_x(g, M, lt.solve(etilde(g, M, v)))
        for grp, T in zip(g.local.groups, Ts):
            loc = np.einsum("gab,gbq,gqr->gar", T, v[grp.nb], V[grp.centres], optimize=True)
            out += D * np.asarray(grp.scat @ loc.reshape(-1, Q))
        return gam2 * out + th.alpha * v + 2.0 * np.asarray(lap @ v)

    return apply, diag, th.gamma * etilde_adj_x(g, M, Y)


def _update_qx_factorised(Y, g: LLGraph, qc: QC, th: Theta, x0=None, context: str = ""):
    """Factorised q(x) given q(C): means solve the full system, covariances the inverse diagonal blocks."""
    n, D, Q = qc.mean.shape
    M, V = qc.mean, qc.cov
    apply, diag, b = x_system(Y, g, qc, th)
    cov, ld = inverse_blocks(diag)
    # preconditioner: the graph-sparse x precision of the f-term form (eq. 28) with <C_i'C_i>, plus the
    # prior: spectrally close to the likelihood term (both ~ gamma L <C'C>), factorised by SuperLU
    eye = np.eye(Q)

    def build():
        Mc = D * V + np.einsum("ndq,ndr->nqr", M, M)
        Ms = Mc[g.ei] + Mc[g.ej]
        pt = np.asarray(g.inc @ Ms.reshape(len(g.ei), -1)).reshape(n, Q, Q)
        point = th.gamma * pt + (th.alpha + 2.0 * g.deg)[:, None, None] * eye
        return graph_blocks_csc(g, point, -th.gamma * Ms - 2.0 * eye)

    pre = cached_lu(g, "x", build, "precision of q(x)", context)
    start = np.zeros((n, Q)) if x0 is None else x0
    mean, it = pcg(apply, b, start, lambda r: pre["lu"].solve(r.reshape(-1)).reshape(n, Q), _center)
    pre["cg"] = it
    E = len(g.ei)
    qx = QX(mean=mean, cov=cov, cov_edge=np.zeros((E, Q, Q)), logdet_prec=ld)
    qx.cg_iters = it
    return qx


def _center(v):
    """Remove the common translation (the exact eigenvector of the x precision with eigenvalue alpha)."""
    return v - v.mean(axis=0, keepdims=True)
