"""Out-of-sample E-step and reconstruction (paper 000 section 4.2).

A new point y* joins the training graph with edges to its k nearest training points; the training
posterior q(x) q(C) and theta stay frozen, and q(x*) q(C*) maximise the bound of the enlarged model
by coordinate ascent (``transform_points``, on the fit's solver and likelihood):

- quadratic variant: the new points decouple (graph-local blocks);
- gaussian likelihood, dense solver: the new points couple to every training point through
  (eps_y O + 2 gamma L*)^{-1} of the enlarged Laplacian L*, so the E-step is taken on the enlarged
  dense model with the training factors fixed (exact coordinate ascent in q(x*) and in q(C*));
- gaussian likelihood, factorised solver: the same in the per-point factorised family, CG on the new
  points' block of each factorised system (``qx.x_system``, ``qc.c_system``).

Each new point is its own problem: it joins the training graph alone (so its answer never depends
on which other points are transformed with it), and its coordinate ascent stops by its own rule.

``conditional_loglik`` is the model's per-point likelihood term: the log-density of y_i given every
other row under the likelihood, at the posterior means (both likelihoods give the same conditional).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from .cg import pcg
from .operators import (
    QC,
    QX,
    LLGraph,
    Theta,
    b_tilde,
    c_quad,
    ctc,
    eps_lap_inverse,
    eps_lap_matrix,
    h_stat,
    prepare_graph,
    x_quad,
)
from .qc import c_system
from .qx import x_system

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


def _conditional(P, rhs, nt: int, fixed_mean):
    """Moments of the new block of N(P^{-1} rhs, P^{-1}) with the first ``nt`` rows held at
    ``fixed_mean`` in expectation (the optimum of a factor q(new) with q(train) frozen):
    precision P_nn, mean P_nn^{-1}(rhs_n - P_nt <train>)."""
    Pnn = 0.5 * (P[nt:, nt:] + P[nt:, nt:].T)
    c = sla.cho_factor(Pnn, lower=True)
    mean = sla.cho_solve(c, rhs[nt:] - P[nt:, :nt] @ fixed_mean)
    cov = sla.cho_solve(c, np.eye(Pnn.shape[0]))
    return mean, 0.5 * (cov + cov.T)


def _transform_gaussian(Y, g: LLGraph, qx: QX, qc: QC, th: Theta, Ynew, nbr, sweeps: int):
    """The gaussian likelihood on the dense solver: each new point alone on the enlarged dense model
    (through (eps_y O + 2 gamma L*)^-1 the points of one enlarged model would move each other)."""
    Y = np.asarray(Y, dtype=np.float64)
    Ynew = np.asarray(Ynew, dtype=np.float64)
    outs = [
        _transform_batch_dense(Y, g, qx, qc, th, Ynew[a : a + 1], nbr[a : a + 1], sweeps)
        for a in range(Ynew.shape[0])
    ]
    return tuple(np.concatenate([o[t] for o in outs]) for t in range(4))


def _transform_batch_dense(Y, g, qx, qc, th, Ynew, nbr, sweeps):
    n, D, Q = qc.mean.shape
    m, k = nbr.shape
    N = n + m
    rows = np.repeat(np.arange(n, N), k)
    cols = nbr.ravel()
    extra = sp.csr_matrix((np.ones(m * k), (rows, cols)), shape=(N, N))
    W = sp.block_diag([g.W, sp.csr_matrix((m, m))]).tocsr() + extra + extra.T
    W.data[:] = 1.0
    ga = prepare_graph(W, "dense", likelihood="gaussian", epsilon_form=g.epsilon_form)
    Ya = np.vstack([Y, Ynew])
    Lt = eps_lap_inverse(ga, th.eps_y, th.gamma)
    prior_x = np.kron(th.alpha * np.eye(N) + 2.0 * ga.laplacian(), np.eye(Q))
    prior_c = th.beta * np.kron(eps_lap_matrix(ga, th.eps_c), np.eye(Q))
    nt = n * Q
    mx = qx.mean[nbr].mean(axis=1)  # start: the neighbours' mean latents, no spread
    Sx = np.zeros((m * Q, m * Q))
    Cs = SC = None
    for _ in range(int(sweeps)):
        # q(C*) given q(x*) and the frozen training factors
        xm = np.vstack([qx.mean, mx])
        S = sla.block_diag(qx.full, Sx) + np.outer(xm.ravel(), xm.ravel())
        P = th.gamma**2 * c_quad(ga, S, Lt) + prior_c
        rhs = th.gamma * np.swapaxes(h_stat(Ya, ga, xm), 1, 2).reshape(N * Q, D)
        fixed = np.swapaxes(qc.mean, 1, 2).reshape(nt, D)
        cm, SC = _conditional(P, rhs, nt, fixed)
        Cs = np.swapaxes(cm.reshape(m, Q, D), 1, 2)
        # q(x*) given q(C*)
        Cm = np.concatenate([qc.mean, Cs])
        Mu = np.swapaxes(Cm, 0, 1).reshape(D, N * Q)
        K = D * sla.block_diag(qc.full, SC) + Mu.T @ Mu
        P = th.gamma**2 * x_quad(ga, K, Lt) + prior_x
        rhs = th.gamma * b_tilde(Ya, ga, Cm).reshape(N * Q, 1)
        xn, Sx = _conditional(P, rhs, nt, qx.mean.reshape(nt, 1))
        xn = xn.reshape(m, Q)
        done = np.max(np.abs(xn - mx)) <= 1e-10 * (1.0 + np.max(np.abs(xn)))
        mx = xn
        if done:
            break
    idx = np.arange(m)
    cov = Sx.reshape(m, Q, m, Q)[idx, :, idx, :]
    ccov = SC.reshape(m, Q, m, Q)[idx, :, idx, :]
    return mx, cov, Cs, ccov


# --------------------------------------------------------------------------- factorised solver
def _transform_factorised(Y, g: LLGraph, qx: QX, qc: QC, th: Theta, Ynew, nbr, sweeps: int):
    """Out-of-sample E-step in the factorised family (paper 000 section 4.2): each new point joins
    the training graph alone with edges to its training neighbours ``nbr`` (M, k) (new points sharing
    a neighbour would move each other through Lt); the training factors and theta stay frozen;
    q(x*) and q(C*) by coordinate ascent (CG on the new point's block of each system). Returns mean
    (M, Q), cov (M, Q, Q), C mean (M, D, Q), C cov."""
    outs = [
        _transform_batch_factorised(Y, g, qx, qc, th, Ynew[a : a + 1], nbr[a : a + 1], sweeps)
        for a in range(len(Ynew))
    ]
    return tuple(np.concatenate([o[t] for o in outs]) for t in range(4))


def _restricted_solve(apply, b, fixed, new, diag_inv, x0):
    """Means of the new rows with the others held at ``fixed``: CG on Lambda_nn v = b_n - Lambda_nt f_t."""
    full = fixed.copy()
    full[new] = 0.0
    rhs = (b - apply(full))[new]

    def op(v):
        z = np.zeros_like(fixed)
        z[new] = v
        return apply(z)[new]

    def prec(r):
        return np.einsum("nqr,n...r->n...q", diag_inv, r)

    return pcg(op, rhs, x0, prec)[0]


def _transform_batch_factorised(Y, g, qx, qc, th, Ynew, nbr, sweeps):
    n, D, Q = qc.mean.shape
    m, k = nbr.shape
    N = n + m
    extra = sp.csr_matrix((np.ones(m * k), (np.repeat(np.arange(n, N), k), nbr.ravel())), shape=(N, N))
    W = (sp.block_diag([g.W, sp.csr_matrix((m, m))]).tocsr() + extra + extra.T).tocsr()
    W.data[:] = 1.0
    ga = prepare_graph(W, "factorised")
    Ya = np.vstack([Y, Ynew])
    new = np.arange(n, N)
    mx = np.vstack([qx.mean, qx.mean[nbr].mean(axis=1)])
    Sx = np.concatenate([qx.cov, np.zeros((m, Q, Q))])
    Cm = np.concatenate([qc.mean, qc.mean[nbr].mean(axis=1)])
    SC = np.concatenate([qc.cov, np.broadcast_to(np.eye(Q), (m, Q, Q))])
    E = len(ga.ei)
    for _ in range(int(sweeps)):
        qxa = QX(mean=mx, cov=Sx, cov_edge=np.zeros((E, Q, Q)), logdet_prec=0.0)
        apply, diag, b = c_system(Ya, ga, qxa, th)
        dinv = np.linalg.inv(diag[new])
        Cm = Cm.copy()
        Cm[new] = _restricted_solve(apply, b, Cm, new, dinv, Cm[new])
        SC = np.concatenate([qc.cov, dinv])
        qca = QC(mean=Cm, cov=SC, cov_edge=np.zeros((E, Q, Q)), logdet_prec=0.0)
        apply, diag, b = x_system(Ya, ga, qca, th)
        dinv = np.linalg.inv(diag[new])
        xn = _restricted_solve(apply, b, mx, new, dinv, mx[new])
        done = np.max(np.abs(xn - mx[new])) <= 1e-10 * (1.0 + np.max(np.abs(xn)))
        mx = mx.copy()
        mx[new] = xn
        Sx = np.concatenate([qx.cov, dinv])
        if done:
            break
    sym = lambda A: 0.5 * (A + np.swapaxes(A, 1, 2))  # noqa: E731
    return mx[new], sym(Sx[new]), Cm[new], sym(SC[new])
