"""Out-of-sample E-step and reconstruction (paper 000 section 4.2).

A new point y* joins the training graph with edges to its k nearest training points; the training
posterior q(x) q(C) and theta stay frozen, and q(x*) q(C*) maximise the bound of the enlarged model
by coordinate ascent (``transform_points``, on the fit's solver and likelihood):

- quadratic variant: the new points decouple (graph-local blocks);
- gaussian likelihood, dense solver: the new points couple to every training point through
  (eps_y O + 2 gamma L*)^{-1} of the enlarged Laplacian L*, so the E-step is taken on the enlarged
  dense model with the training factors fixed (exact coordinate ascent in q(x*) and in q(C*)),
  on the new point's rows of its precisions only (Lt*'s rows from the training Lt by a rank-k
  update and a bordering; no enlarged (N Q, N Q) matrix is formed);
- gaussian likelihood, factorised solver: the same in the per-point factorised family, on the new
  point's rows of each factorised system of the enlarged graph (``qx.x_system``, ``qc.c_system``):
  they read Lt* only on the new point's closed neighbourhood against its neighbours' closed
  neighbourhoods, and (Lt* e~)[there], from the training Lt's columns at the k neighbours (k solves
  with one factorisation of the training eps_y I + 2 gamma L per call), a rank-k update and a
  bordering; no enlarged graph is built.

Each new point is its own problem: it joins the training graph alone (so its answer never depends
on which other points are transformed with it), and its coordinate ascent stops by its own rule.

``conditional_loglik`` is the model's per-point likelihood term: the log-density of y_i given every
other row under the likelihood, at the posterior means (both likelihoods give the same conditional).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from .cg import spd_lu
from .operators import (
    QC,
    QX,
    LLGraph,
    Theta,
    ctc,
    eps_lap_inverse,
    etilde,
)

#: coordinate-ascent sweeps of the out-of-sample E-step for (x*, C*)
OOS_SWEEPS = 50


def transform_points(Y, g: LLGraph, qx: QX, qc: QC, th: Theta, Ynew, nbr, *, sweeps: int = OOS_SWEEPS):
    """E-step for new points Ynew (M, D) with the training posterior and theta frozen, on the fit's
    solver and likelihood (``g``, the training graph).

    ``nbr`` (M, k): training neighbours of each new point (the new point joins the graph with these
    edges, alone; the training graph is unchanged). Coordinate ascent over q(x*) and q(C*), per
    point. Returns mean (M, Q), cov (M, Q, Q), C mean (M, D, Q), C cov (M, Q, Q).
    """
    if g.solver == "factorised":
        return _transform_factorised(Y, g, qx, qc, th, Ynew, nbr, sweeps)
    if g.likelihood == "gaussian":
        return _transform_gaussian(Y, g, qx, qc, th, Ynew, nbr, sweeps)
    return _transform_decoupled(Y, qx, qc, th, Ynew, nbr, sweeps)


def _transform_decoupled(Y, qx: QX, qc: QC, th: Theta, Ynew, nbr, sweeps: int):
    """The quadratic variant: q(x*), q(C*) independent across new points."""
    Y = np.asarray(Y, dtype=np.float64)
    Ynew = np.asarray(Ynew, dtype=np.float64)
    m, k = nbr.shape
    D = Y.shape[1]
    Q = qx.mean.shape[1]
    eye = np.eye(Q)
    Mtr = ctc(qc)  # (N, Q, Q)
    mu_j = qx.mean[nbr]  # (M, k, Q)
    S_j = qx.cov[nbr]  # (M, k, Q, Q)
    Cj = qc.mean[nbr]  # (M, k, D, Q)
    Mj = Mtr[nbr]
    a_ = Y[nbr] - Ynew[:, None, :]  # y_j - y*  (M, k, D)
    # x-independent pieces of q(x*)
    P_fix = (th.alpha + 2.0 * k) * eye + th.gamma * Mj.sum(1)
    h_fix = 2.0 * mu_j.sum(1) + th.gamma * (
        np.einsum("mkdq,mkd->mq", Cj, -a_) + np.einsum("mkqr,mkr->mq", Mj, mu_j)
    )
    mx = mu_j.mean(1)
    Sx = np.zeros((m, Q, Q))
    Cs = np.zeros((m, D, Q))
    SC = np.zeros((m, Q, Q))
    a = np.arange(m)  # the points still moving: each stops by its own rule
    for _ in range(int(sweeps)):
        # q(C*): precision gamma Gamma* + beta (eps_c + 2k) I, shared by the D rows
        dm = mu_j[a] - mx[a][:, None, :]  # <x_j - x*>
        Gam = S_j[a].sum(1) + k * Sx[a] + np.einsum("mkq,mkr->mqr", dm, dm)
        PC = th.gamma * Gam + th.beta * (th.eps_c + 2.0 * k) * eye
        Hs = np.einsum("mkd,mkq->mdq", a_[a], dm)
        rhs = th.gamma * Hs + 2.0 * th.beta * Cj[a].sum(1)  # (M, D, Q)
        SC[a] = np.linalg.solve(PC, np.broadcast_to(eye, PC.shape))
        Cs[a] = np.swapaxes(np.linalg.solve(PC, np.swapaxes(rhs, 1, 2)), 1, 2)
        Ms = D * SC[a] + np.einsum("mdq,mdr->mqr", Cs[a], Cs[a])
        # q(x*)
        P = P_fix[a] + th.gamma * k * Ms
        h = h_fix[a] + th.gamma * (
            -np.einsum("mdq,mkd->mq", Cs[a], a_[a]) + np.einsum("mqr,mkr->mq", Ms, mu_j[a])
        )
        mx_new = np.linalg.solve(P, h[..., None])[..., 0]
        Sx[a] = np.linalg.solve(P, np.broadcast_to(eye, P.shape))
        done = np.max(np.abs(mx_new - mx[a]), axis=1) <= 1e-12 * (1.0 + np.max(np.abs(mx_new), axis=1))
        mx[a] = mx_new
        a = a[~done]
        if not len(a):
            break
    return mx, Sx, Cs, SC


def reconstruct(Y, qx: QX, qc: QC, X, k: int):
    """Section 4.2 reconstruction: y* = mean over the k training points nearest to x* in latent
    space of y_i + <C_i> (x* - <x_i>)."""
    X = np.asarray(X, dtype=np.float64)
    d2 = np.sum(X**2, 1)[:, None] + np.sum(qx.mean**2, 1)[None, :] - 2.0 * X @ qx.mean.T
    nb = np.argsort(d2, axis=1)[:, :k]
    diff = X[:, None, :] - qx.mean[nb]  # (M, k, Q)
    return np.mean(Y[nb] + np.einsum("mkdq,mkq->mkd", qc.mean[nb], diff), axis=1)


def conditional_loglik(Y, deg, et, nbr_sum, th: Theta, others_sum=None):
    """log p(y_i | every other row) (M,) under the likelihood at the posterior means, for rows Y
    (M, D) of degree ``deg`` (M,) with e~_i = sum_j (C_i + C_j)(x_i - x_j) at the means (``et``,
    (M, D); ``operators.etilde``) and their neighbours' rows summed (``nbr_sum``, (M, D)):
    Sigma_y^-1 = eps_y O + 2 gamma L (kron I_D) and the linear term e = gamma e~ make it
    N(mu_i, s_i^-1 I_D) with s_i = eps_y + 2 gamma deg_i and s_i mu_i = gamma e~_i + 2 gamma nbr_sum_i
    (- eps_y times the sum of every other row, ``others_sum``, under eps 1 1^T). The quadratic
    variant's exp(-eps_y |y|^2 / 2 - gamma S / 2) has the same conditional (S counts each edge both
    ways)."""
    D = Y.shape[1]
    s = th.eps_y + 2.0 * th.gamma * np.asarray(deg, dtype=np.float64)
    h = th.gamma * et + 2.0 * th.gamma * nbr_sum
    if others_sum is not None:
        h = h - th.eps_y * others_sum
    r = Y - h / s[:, None]
    return -0.5 * D * np.log(2.0 * np.pi / s) - 0.5 * s * np.einsum("md,md->m", r, r)


def _transform_gaussian(Y, g: LLGraph, qx: QX, qc: QC, th: Theta, Ynew, nbr, sweeps: int):
    """The gaussian likelihood on the dense solver: each new point alone on the enlarged dense model
    (through (eps_y O + 2 gamma L*)^-1 the points of one enlarged model would move each other), with
    only what its coordinate ascent reads: the new point's rows of the two precisions (its block and
    its block against the frozen training means, ``_c_rows`` / ``_x_rows``) from the rows of
    Lt* = (eps_y O + 2 gamma L*)^-1 at the new point and its k neighbours (``_enlarged_lt_rows``, a
    rank-k update and a bordering of the training Lt), never the enlarged (N Q, N Q) matrices.

    Shared by every new point, once per call: the training Lt (from the eigen-decomposition of L,
    one product; whole, so that a point's rows of it do not depend on which other points are
    transformed with it) and Lt 1."""
    Y = np.asarray(Y, dtype=np.float64)
    Ynew = np.asarray(Ynew, dtype=np.float64)
    n, D, Q = qc.mean.shape
    Lt = eps_lap_inverse(g, th.eps_y, th.gamma)
    sh = _Shared(
        lt=Lt,
        lt_one=Lt.sum(axis=1) if g.epsilon_form == "ones" else None,
        C_sum=qc.mean.sum(axis=0).T,  # (Q, D)
        x_full=qx.full.reshape(n, Q, n, Q),
        c_full=qc.full.reshape(n, Q, n, Q),
        C_dsj=np.ascontiguousarray(qc.mean.transpose(1, 2, 0)).reshape(D, Q * n),
        C_sjd=np.ascontiguousarray(qc.mean.transpose(2, 0, 1)).reshape(Q * n, D),
    )
    outs = [_transform_one_dense(Y, g, qx, qc, th, sh, Ynew[a], nbr[a], sweeps) for a in range(len(Ynew))]
    return tuple(np.stack([o[t] for o in outs]) for t in range(4))


@dataclass
class _Shared:
    """What every new point of one ``_transform_gaussian`` call reads: ``lt`` (n, n), the training
    Lt = (eps_y O + 2 gamma L)^-1; ``lt_one`` (n,) Lt 1 (``ones`` form, else None);
    ``C_sum`` (Q, D) sum_j <C_j>'; ``x_full``, ``c_full`` (n, Q, n, Q) the training covariances;
    ``C_dsj`` (D, Q n) and ``C_sjd`` (Q n, D) the training C means [j, d, s] laid out for the
    sweeps' contractions over them as matrix products."""

    lt: np.ndarray
    lt_one: np.ndarray | None
    C_sum: np.ndarray
    x_full: np.ndarray
    c_full: np.ndarray
    C_dsj: np.ndarray
    C_sjd: np.ndarray


def _enlarged_lt_rows(g: LLGraph, th: Theta, lt_T, lt_one, T):
    """Rows of Lt* = (eps_y O* + 2 gamma L*)^-1 of the graph enlarged by one point joined to the
    training points ``T`` (k,), from the training Lt's rows ``lt_T`` (k, n) at T (and Lt 1, ``lt_one``,
    for the ``ones`` form): (k, n + 1) at T and (n + 1,) at the new point.

    With A = eps_y O + 2 gamma L and E the (n, k) selector of T, the enlarged matrix is
    [[B, b], [b', c]] with B = A + 2 gamma E E', b = eps_o 1 - 2 gamma E 1 (eps_o = eps_y for ``ones``,
    0 for ``identity``) and c = eps_y + 2 gamma k. B^-1 by Sherman-Morrison-Woodbury,
    B^-1 = Lt - Lt E G^-1 E' Lt with G = I / (2 gamma) + E' Lt E; then by bordering, with
    s = c - b' B^-1 b: Lt* = [[B^-1 + B^-1 b b' B^-1 / s, -B^-1 b / s], [-b' B^-1 / s, 1 / s]]."""
    k = len(T)
    two_g = 2.0 * th.gamma
    G = np.eye(k) / two_g + lt_T[:, T]
    Bi_T = lt_T - lt_T[:, T] @ np.linalg.solve(G, lt_T)  # (k, n) rows of B^-1 at T
    Ab = -two_g * lt_T.sum(axis=0)  # Lt b
    eps_o = 0.0
    if g.epsilon_form == "ones":
        eps_o = th.eps_y
        Ab = Ab + eps_o * lt_one
    Bb = Ab - lt_T.T @ np.linalg.solve(G, Ab[T])  # B^-1 b (n,)
    s = th.eps_y + two_g * k - (eps_o * Bb.sum() - two_g * Bb[T].sum())
    rows_T = np.concatenate([Bi_T + np.outer(Bb[T], Bb) / s, -Bb[T, None] / s], axis=1)
    row_new = np.append(-Bb / s, 1.0 / s)
    return rows_T, row_new


def _lt_products(wmul, lt_new, lt_T):
    """What ``_c_rows`` and ``_x_rows`` read of the rows of Lt* alone: (lt_T W*, lt_new W*, the
    column sums of lt_T, their product with W*)."""
    WL = lt_T.sum(axis=0)
    return wmul(lt_T), wmul(lt_new), WL, wmul(WL)


def _c_rows(wmul, deg, lt_new, lt_T, lt_w, S_T0, T):
    """The new point's rows of c_quad (``operators.c_quad``: <G_r(x)' Lt* G_s(x)>) on the enlarged
    graph as a function ``row(S_new, v)`` -> (Q, Q, N) [r, s, j] = c_quad[(new, r), (j, s)]: row i
    of each of its nine terms reads the rows of Lt* and of S = <x x'> at i and at its neighbours T
    only. ``wmul``: X -> X W* on the last axis; ``deg`` (N,) the enlarged degrees; ``lt_new`` (N,),
    ``lt_T`` (k, N) rows of Lt*, ``lt_w`` their products (``_lt_products``); ``S_new`` (Q, Q, N)
    the new point's rows of S, [r, s, j] = S[(new, r), (j, s)]; the rows at T are ``S_T0`` (k, Q,
    Q, N), fixed for the point, with their new point's column (zero in ``S_T0``) ``v`` (k, Q, Q),
    which a sweep changes. The terms of the fixed part are computed here once: a sweep adds its
    column's share, which reaches column N and the columns T only (W* joins the new point to T
    alone)."""
    k, n = len(lt_T), len(deg) - 1
    wlt_T, LW, WL, wWL = lt_w
    S_sum = S_T0.sum(axis=0)
    fixed = (
        np.einsum("an,arsn->rsn", lt_T, S_T0 * deg - wmul(S_T0))
        + wmul(np.einsum("an,arsn->rsn", lt_T, S_T0))
        - np.einsum("an,arsn->rsn", wlt_T, S_T0)
    )

    def row(S_new, v):
        LS = k * S_new - S_sum  # row i of L* S_rs
        LS[..., n] -= v.sum(axis=0)
        SL = S_new * deg - wmul(S_new)  # the new point's rows of S_rs L*
        out = (
            lt_new * (LS * deg - wmul(LS))
            + wmul(lt_new * LS)
            - LW * LS
            - WL * SL
            - wmul(WL * S_new)
            + wWL * S_new
            + fixed
        )
        u = np.einsum("a,ars->rs", lt_T[:, n], v)
        out[..., n] += deg[n] * u - np.einsum("a,ars->rs", wlt_T[:, n], v)
        out[..., T] += u[..., None] - np.einsum("at,ars->rst", lt_T[:, T], v)
        return out

    return row


def _x_rows(wmul, deg, lt_new, lt_T, lt_w, K_T0, T):
    """The new point's rows of x_quad (``operators.x_quad``: sum_d <F(c_dr)' Lt* F(c_ds)>) as a
    function ``row(K_new, v)`` -> (Q, Q, N), from the rows of Lt* and of K = D Sigma_C + mu_C'
    mu_C at the new point and at T, the fixed part once (as ``_c_rows``)."""
    k, n = len(lt_T), len(deg) - 1
    wlt_T, LW, WL, wWL = lt_w
    K_sum = K_T0.sum(axis=0)
    fixed = (
        -np.einsum("an,arsn->rsn", lt_T, K_T0 * deg + wmul(K_T0))
        + wmul(np.einsum("an,arsn->rsn", lt_T, K_T0))
        + np.einsum("an,arsn->rsn", wlt_T, K_T0)
    )

    def row(K_new, v):
        UK = k * K_new + K_sum  # row i of U* K_rs, U* = diag(deg) + W*
        UK[..., n] += v.sum(axis=0)
        KU = K_new * deg + wmul(K_new)
        out = (
            lt_new * (UK * deg + wmul(UK))
            - wmul(lt_new * UK)
            - LW * UK
            - WL * KU
            + wmul(WL * K_new)
            + wWL * K_new
            + fixed
        )
        u = np.einsum("a,ars->rs", lt_T[:, n], v)
        out[..., n] += np.einsum("a,ars->rs", wlt_T[:, n], v) - deg[n] * u
        out[..., T] += u[..., None] - np.einsum("at,ars->rst", lt_T[:, T], v)
        return out

    return row


def _chol_moments(P, rhs):
    """N(P^-1 rhs, P^-1) for a (Q, Q) precision (the Cholesky of the new block)."""
    c = sla.cho_factor(0.5 * (P + P.T), lower=True)
    cov = sla.cho_solve(c, np.eye(P.shape[0]))
    return sla.cho_solve(c, rhs), 0.5 * (cov + cov.T)


def _transform_one_dense(Y, g: LLGraph, qx: QX, qc: QC, th: Theta, sh: _Shared, ynew, nb, sweeps):
    """One new point ``ynew`` (D,) joined to training points ``nb`` (k,): the coordinate ascent of
    the enlarged dense model (the training factors fixed) on the new point's rows only. Returns
    mean (Q,), cov (Q, Q), C mean (D, Q), C cov (Q, Q)."""
    n, D, Q = qc.mean.shape
    T = np.unique(nb)  # the enlarged graph has one edge per neighbour
    k = len(T)
    W = g.W

    def wmul(X):  # X W* over the last axis (N = n + 1; W* = [[W, e_T], [e_T', 0]])
        lead = X.shape[:-1]
        Z = X.reshape(-1, n + 1)
        out = np.empty_like(Z)
        out[:, :n] = (W @ Z[:, :n].T).T
        out[:, T] += Z[:, n:]
        out[:, n] = Z[:, T].sum(axis=1)
        return out.reshape(lead + (n + 1,))

    deg = np.append(g.deg, float(k))
    deg[T] += 1.0
    lt_T, lt_new = _enlarged_lt_rows(g, th, sh.lt[T], sh.lt_one, T)
    mu, C = qx.mean, qc.mean
    # the rows of S = <x x'> and K = D Sigma_C + mu_C' mu_C at T against the training points: fixed
    S_T = np.empty((k, Q, Q, n + 1))
    S_T[..., :n] = np.transpose(sh.x_full[T], (0, 1, 3, 2)) + np.einsum("ar,js->arsj", mu[T], mu)
    K_T = np.empty((k, Q, Q, n + 1))
    CC_T = (C[T].transpose(0, 2, 1).reshape(k * Q, D) @ sh.C_dsj).reshape(k, Q, Q, n)  # <C_a>' <C_j>
    K_T[..., :n] = D * np.transpose(sh.c_full[T], (0, 1, 3, 2)) + CC_T
    S_new = np.empty((Q, Q, n + 1))
    K_new = np.empty((Q, Q, n + 1))
    dy = Y[T] - ynew  # y_j - y*  (k, D)
    g2 = th.gamma**2
    eps_o_c = th.eps_c if g.epsilon_form == "ones" else 0.0
    # the priors' new-by-training blocks applied to the training means, and their new blocks
    prior_c_t = th.beta * (eps_o_c * sh.C_sum - 2.0 * C[T].sum(axis=0).T)
    prior_c_n = th.beta * (th.eps_c + 2.0 * k) * np.eye(Q)
    prior_x_t = -2.0 * mu[T].sum(axis=0)
    prior_x_n = (th.alpha + 2.0 * k) * np.eye(Q)
    mx = mu[nb].mean(axis=0)  # start: the neighbours' mean latents, no spread
    Sx = np.zeros((Q, Q))
    Cs = SC = None
    S_T[..., n] = 0.0  # the new point's column: a sweep's (``_c_rows``)
    K_T[..., n] = 0.0
    lt_w = _lt_products(wmul, lt_new, lt_T)
    c_row = _c_rows(wmul, deg, lt_new, lt_T, lt_w, S_T, T)
    x_row = _x_rows(wmul, deg, lt_new, lt_T, lt_w, K_T, T)
    for _ in range(int(sweeps)):
        # q(C*) given q(x*) and the frozen training factors
        S_new[..., :n] = np.einsum("r,js->rsj", mx, mu)
        S_new[..., n] = Sx + np.outer(mx, mx)
        row = c_row(S_new, mu[T][:, :, None] * mx[None, None, :])
        rhs = th.gamma * np.einsum("ad,aq->qd", dy, mu[T] - mx)
        rhs -= g2 * (np.ascontiguousarray(row[..., :n]).reshape(Q, Q * n) @ sh.C_sjd) + prior_c_t
        cm, SC = _chol_moments(g2 * row[..., n] + prior_c_n, rhs)
        Cs = cm.T  # (D, Q)
        # q(x*) given q(C*)
        K_new[..., :n] = (Cs.T @ sh.C_dsj).reshape(Q, Q, n)
        K_new[..., n] = D * SC + Cs.T @ Cs
        row = x_row(K_new, np.einsum("adr,ds->ars", C[T], Cs))
        rhs = -th.gamma * np.einsum("adq,ad->q", C[T] + Cs, dy)
        rhs -= g2 * np.einsum("rsj,js->r", row[..., :n], mu) + prior_x_t
        xn, Sx = _chol_moments(g2 * row[..., n] + prior_x_n, rhs)
        done = np.max(np.abs(xn - mx)) <= 1e-10 * (1.0 + np.max(np.abs(xn)))
        mx = xn
        if done:
            break
    return mx, Sx, Cs, SC


# --------------------------------------------------------------------------- factorised solver
def _transform_factorised(Y, g: LLGraph, qx: QX, qc: QC, th: Theta, Ynew, nbr, sweeps: int):
    """Out-of-sample E-step in the factorised family (paper 000 section 4.2): each new point joins
    the training graph alone with edges to its training neighbours ``nbr`` (M, k) (new points sharing
    a neighbour would move each other through Lt); the training factors and theta stay frozen;
    q(x*) and q(C*) by coordinate ascent on the new point's rows of the factorised systems
    (``qx.x_system``, ``qc.c_system`` of the enlarged graph; ``_transform_one_factorised``). Returns
    mean (M, Q), cov (M, Q, Q), C mean (M, D, Q), C cov.

    Shared by every new point, once per call: the SuperLU factor of the training
    A = eps_y I + 2 gamma L, and Lt z0 for the training e~ z0 = e~(<C>, <x>) (n, D)."""
    Y = np.asarray(Y, dtype=np.float64)
    Ynew = np.asarray(Ynew, dtype=np.float64)
    n = g.n
    A = th.eps_y * sp.identity(n, format="csr") + 2.0 * th.gamma * g.local.lap
    lu = spd_lu(A, "eps_y I + 2 gamma L (out-of-sample)")
    sh = _FactorisedShared(lu=lu, lt_z0=lu.solve(etilde(g, qc.mean, qx.mean)))
    outs = [
        _transform_one_factorised(Y, g, qx, qc, th, sh, Ynew[a], nbr[a], sweeps) for a in range(len(Ynew))
    ]
    return tuple(np.stack([o[t] for o in outs]) for t in range(4))


@dataclass
class _FactorisedShared:
    """What every new point of one ``_transform_factorised`` call reads: ``lu`` the factor of the
    training A = eps_y I + 2 gamma L; ``lt_z0`` (n, D) A^-1 e~(<C>, <x>) on the training graph."""

    lu: object
    lt_z0: np.ndarray


def _enlarged_lt_local(th: Theta, lt_HT, posT, lt_z0_T):
    """Lt* = (eps_y I + 2 gamma L*)^-1 of the graph enlarged by one point joined to the training
    points T (k,) (identity form), where the factorised out-of-sample step reads it: on the rows
    H + [new] and the columns T + [new], (h + 1, k + 1), for training rows H (h,) holding T at
    ``posT``; from the training Lt's columns at T on the rows H (``lt_HT`` (h, k)). Also Lt* z at the
    rows T + [new] (k + 1, D) for z = [z0; 0], from (Lt z0)[T] (``lt_z0_T`` (k, D)).

    As ``_enlarged_lt_rows`` with eps_o = 0: the enlarged matrix is [[B, b], [b', c]] with
    B = A + 2 gamma E E', b = -2 gamma E 1, c = eps_y + 2 gamma k, B^-1 = Lt - Lt E G^-1 E' Lt,
    G = I / (2 gamma) + E' Lt E, and s = c - b' B^-1 b."""
    h, k = lt_HT.shape
    two_g = 2.0 * th.gamma
    lt_TT = lt_HT[posT]
    G = np.eye(k) / two_g + lt_TT
    Bi = lt_HT - lt_HT @ np.linalg.solve(G, lt_TT)  # B^-1 on H x T
    Bb = -two_g * Bi.sum(axis=1)  # B^-1 b on H
    Bb_T = Bb[posT]
    s = th.eps_y + two_g * k + two_g * Bb_T.sum()
    out = np.empty((h + 1, k + 1))
    out[:h, :k] = Bi + np.outer(Bb, Bb_T) / s
    out[:h, k] = -Bb / s
    out[h, :k] = -Bb_T / s
    out[h, k] = 1.0 / s
    Bz = lt_z0_T - lt_TT @ np.linalg.solve(G, lt_z0_T)  # (B^-1 z0)[T]
    bBz = -two_g * Bz.sum(axis=0)  # b' B^-1 z0 (D,)
    return out, np.vstack([Bz + np.outer(Bb_T, bBz) / s, -bBz / s])


def _transform_one_factorised(
    Y, g: LLGraph, qx: QX, qc: QC, th: Theta, sh: _FactorisedShared, ynew, nb, sweeps
):
    """One new point ``ynew`` (D,) joined to training points ``nb`` (k,): the coordinate ascent of
    the factorised family on the enlarged graph (the training factors fixed) on the new point's rows
    of the two systems only. Returns mean (Q,), cov (Q, Q), C mean (D, Q), C cov (Q, Q).

    With P = T + [new] (the new point's closed neighbourhood, new last), the new point's row of the
    C row precision (``qc.c_system``: gamma^2 [G(m)' Lt* G(m) + sum_b (K' Lt* K)^(b) kron S_b] +
    beta (eps_c I + 2 L*) kron I_Q) reads: through G(m)' Lt* G(m), (Lt* z)[P] for z = e~ of the
    enlarged graph with C* = 0, which is z0 off P plus a part on P; through the local terms, the
    centres b in P, each with Lt* on its closed neighbourhood against b and the new point. The x
    precision (``qx.x_system``) likewise. So it needs Lt* on (H + [new]) x P only, H the training
    points' closed neighbourhoods of T (``_enlarged_lt_local``); the terms of the centres in T are
    fixed across sweeps, the new centre's and (Lt* z)[P] move with q(x*), q(C*)."""
    n, D, Q = qc.mean.shape
    W = g.W
    T = np.unique(nb)  # the enlarged graph has one edge per neighbour
    k = len(T)
    m, S, M, V = qx.mean, qx.cov, qc.mean, qc.cov
    # the training neighbours of each b in T, flat: own[e] the b (index into T), lnb[e] the neighbour
    own = np.repeat(np.arange(k), W.indptr[T + 1] - W.indptr[T])
    lnb = np.concatenate([W.indices[W.indptr[t] : W.indptr[t + 1]] for t in T]).astype(np.int64)
    H = np.union1d(T, lnb)
    h = len(H)
    posT, posl = np.searchsorted(H, T), np.searchsorted(H, lnb)
    E = np.zeros((n, k))
    E[T, np.arange(k)] = 1.0
    lt_HT = sh.lu.solve(E)[H]  # training Lt[H, T]: k solves with the shared factor
    Ls, zeta0 = _enlarged_lt_local(th, lt_HT, posT, sh.lt_z0[T])
    LPP = Ls[np.append(posT, h)]  # Lt* on P x P
    # centres b in T: with rho_j = Lt*[b, j] - Lt*[new, j] on b's enlarged closed neighbourhood,
    # (K' Lt* K)^(b)[new, b] = deg*_b rho_b - sum_{j in N(b)} rho_j - rho_new = -(J' Lt* J)^(b)[new, b],
    # (K' Lt* K)^(b)[new, l] = rho_b - rho_l = (J' Lt* J)^(b)[new, l] (l in N(b)),
    # (K' Lt* K)^(b)[new, new] = (J' Lt* J)^(b)[new, new] = rho_b - rho_new
    ak = np.arange(k)
    rho_b = Ls[posT, ak] - Ls[posT, k]
    rho_n = Ls[h, :k] - Ls[h, k]
    rho_l = Ls[posl, own] - Ls[posl, k]
    c_b = (g.deg[T] + 1.0) * rho_b - np.bincount(own, rho_l, minlength=k) - rho_n
    R_l = np.zeros((k, len(lnb)))
    R_l[own, np.arange(len(lnb))] = rho_b[own] - rho_l
    r_nn = rho_b - rho_n
    loc_c = np.einsum("adq,aqr->dr", c_b[:, None, None] * M[T] + np.einsum("al,ldq->adq", R_l, M[lnb]), S[T])
    loc_x = D * np.einsum("aq,aqr->r", R_l @ m[lnb] - c_b[:, None] * m[T], V[T])
    diag_c = np.einsum("a,aqr->qr", r_nn, S[T])
    diag_x = D * np.einsum("a,aqr->qr", r_nn, V[T])
    # the new centre: kappa = K^(new)'s (and J^(new)'s) column of the new point on P
    kappa = np.append(-np.ones(k), float(k))
    kL = kappa @ LPP
    k_nn = kL @ kappa
    R_n = kL[k] - kL[:k]  # (K' Lt* K)^(new)[new, t] = -(J' Lt* J)^(new)[new, t]
    mT, MT = m[T], M[T]
    dy = Y[T] - ynew  # y_t - y*  (k, D)
    g2 = th.gamma**2
    eye = np.eye(Q)
    prior_c = th.beta * (th.eps_c + 2.0 * k) * eye
    prior_x = (th.alpha + 2.0 * k) * eye
    lin_c = 2.0 * th.beta * MT.sum(axis=0)  # - beta 2 (L* C)_new with C* = 0
    lin_x = 2.0 * mT.sum(axis=0)
    mx = m[nb].mean(axis=0)  # start: the neighbours' mean latents, no spread
    Sx = np.zeros((Q, Q))
    Cs, SC = M[nb].mean(axis=0), eye  # returned as they are only when sweeps = 0
    for _ in range(int(sweeps)):
        # q(C*) given q(x*): U[i] = d e~_i / d C* on P
        U = np.vstack([mT - mx, k * mx - mT.sum(axis=0)])
        dm = np.einsum("tdq,tq->td", MT, mT - mx)
        zeta = zeta0 + LPP @ np.vstack([dm, -dm.sum(axis=0)])  # (Lt* z)[P], z = e~ with C* = 0
        prec = g2 * (U.T @ LPP @ U + k_nn * Sx + diag_c) + prior_c
        rhs = th.gamma * np.einsum("td,tq->dq", dy, mT - mx) + lin_c
        rhs -= g2 * (zeta.T @ U + np.einsum("t,tdq->dq", R_n, MT) @ Sx + loc_c)
        Cs = np.linalg.solve(prec, rhs.T).T  # (D, Q)
        SC = np.linalg.inv(prec)
        # q(x*) given q(C*): B[i] = d e~_i / d x* on P
        MC = MT + Cs
        B = np.concatenate([-MC, (k * Cs + MT.sum(axis=0))[None]])
        dx = np.einsum("tdq,tq->td", MC, mT)
        zeta = zeta0 + LPP @ np.vstack([dx, -dx.sum(axis=0)])  # (Lt* z)[P], z = e~ with x* = 0
        prec = g2 * (np.einsum("ij,idq,jdr->qr", LPP, B, B) + D * k_nn * SC + diag_x) + prior_x
        rhs = -th.gamma * np.einsum("tdq,td->q", MC, dy) + lin_x
        rhs -= g2 * (np.einsum("idq,id->q", B, zeta) - D * (R_n @ mT) @ SC + loc_x)
        xn = np.linalg.solve(prec, rhs)
        Sx = np.linalg.inv(prec)
        done = np.max(np.abs(xn - mx)) <= 1e-10 * (1.0 + np.max(np.abs(xn)))
        mx = xn
        if done:
            break
    return mx, 0.5 * (Sx + Sx.T), Cs, 0.5 * (SC + SC.T)
