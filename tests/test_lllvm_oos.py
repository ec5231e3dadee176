"""LL-LVM's out-of-sample E-step on the dense solver, gaussian likelihood (paper 000 section 4.2):
the new point's rows of the enlarged model (``oos._transform_gaussian``) against the slow reference
that builds the whole enlarged (N + 1)-point dense model per new point (``_oracle_transform``, the
implementation it replaced), for both epsilon forms; each new point its own problem; the rows of
the enlarged Lt* against a direct inverse."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
import scipy.sparse as sp

from lvmcore import graph as lg
from lvmcore.data.synthetic import lllvm_swiss_roll
from lvmcore.models import LLLVM
from lvmcore.models import lllvm as ll
from lvmcore.models.lllvm import oos
from lvmcore.models.lllvm import operators as ops

N_TRAIN, N_NEW, K = 80, 5, 6


# --------------------------------------------------------------------------- the slow reference
def _oracle_conditional(P, rhs, nt: int, fixed_mean):
    """Moments of the new block of N(P^{-1} rhs, P^{-1}) with the first ``nt`` rows held at
    ``fixed_mean`` in expectation: precision P_nn, mean P_nn^{-1}(rhs_n - P_nt <train>)."""
    Pnn = 0.5 * (P[nt:, nt:] + P[nt:, nt:].T)
    c = sla.cho_factor(Pnn, lower=True)
    mean = sla.cho_solve(c, rhs[nt:] - P[nt:, :nt] @ fixed_mean)
    cov = sla.cho_solve(c, np.eye(Pnn.shape[0]))
    return mean, 0.5 * (cov + cov.T)


def _oracle_batch(Y, g, qx, qc, th, Ynew, nbr, sweeps):
    """The enlarged (n + m)-point dense model built whole: its Laplacian's eigen-decomposition, Lt*,
    the full c_quad / x_quad, then the new block conditioned on the frozen training block."""
    n, D, Q = qc.mean.shape
    m, k = nbr.shape
    N = n + m
    rows = np.repeat(np.arange(n, N), k)
    cols = nbr.ravel()
    extra = sp.csr_matrix((np.ones(m * k), (rows, cols)), shape=(N, N))
    W = sp.block_diag([g.W, sp.csr_matrix((m, m))]).tocsr() + extra + extra.T
    W.data[:] = 1.0
    ga = ll.prepare_graph(W, "dense", likelihood="gaussian", epsilon_form=g.epsilon_form)
    Ya = np.vstack([Y, Ynew])
    Lt = ops.eps_lap_inverse(ga, th.eps_y, th.gamma)
    prior_x = np.kron(th.alpha * np.eye(N) + 2.0 * ga.laplacian(), np.eye(Q))
    prior_c = th.beta * np.kron(ops.eps_lap_matrix(ga, th.eps_c), np.eye(Q))
    nt = n * Q
    mx = qx.mean[nbr].mean(axis=1)
    Sx = np.zeros((m * Q, m * Q))
    Cs = SC = None
    for _ in range(int(sweeps)):
        xm = np.vstack([qx.mean, mx])
        S = sla.block_diag(qx.full, Sx) + np.outer(xm.ravel(), xm.ravel())
        P = th.gamma**2 * ops.c_quad(ga, S, Lt) + prior_c
        rhs = th.gamma * np.swapaxes(ops.h_stat(Ya, ga, xm), 1, 2).reshape(N * Q, D)
        fixed = np.swapaxes(qc.mean, 1, 2).reshape(nt, D)
        cm, SC = _oracle_conditional(P, rhs, nt, fixed)
        Cs = np.swapaxes(cm.reshape(m, Q, D), 1, 2)
        Cm = np.concatenate([qc.mean, Cs])
        Mu = np.swapaxes(Cm, 0, 1).reshape(D, N * Q)
        K_ = D * sla.block_diag(qc.full, SC) + Mu.T @ Mu
        P = th.gamma**2 * ops.x_quad(ga, K_, Lt) + prior_x
        rhs = th.gamma * ops.b_tilde(Ya, ga, Cm).reshape(N * Q, 1)
        xn, Sx = _oracle_conditional(P, rhs, nt, qx.mean.reshape(nt, 1))
        xn = xn.reshape(m, Q)
        done = np.max(np.abs(xn - mx)) <= 1e-10 * (1.0 + np.max(np.abs(xn)))
        mx = xn
        if done:
            break
    idx = np.arange(m)
    cov = Sx.reshape(m, Q, m, Q)[idx, :, idx, :]
    ccov = SC.reshape(m, Q, m, Q)[idx, :, idx, :]
    return mx, cov, Cs, ccov


def _oracle_transform(Y, g, qx, qc, th, Ynew, nbr, sweeps=oos.OOS_SWEEPS):
    outs = [
        _oracle_batch(Y, g, qx, qc, th, Ynew[a : a + 1], nbr[a : a + 1], sweeps) for a in range(len(Ynew))
    ]
    return tuple(np.concatenate([o[t] for o in outs]) for t in range(4))


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", params=["identity", "ones"])
def fitted(request):
    """A short dense fit on the authors' roll and a few new rows with their training neighbours."""
    Y, _, _ = lllvm_swiss_roll(N_TRAIN + N_NEW, seed=1)
    m = LLLVM(solver="dense", n_neighbors=K, max_iter=3, epsilon_form=request.param, random_state=0).fit(
        Y[:N_TRAIN]
    )
    Ys = (Y[N_TRAIN:] - m.center_) / m.scale_
    nbr, _ = lg.knn_query(m.Y_train_, Ys, K)
    return m, Ys, nbr


def _run(m, Ys, nbr, fn=ll.transform_points):
    return fn(m.Y_train_, m.graph_, m.qx_, m.qc_, m.theta_, Ys, nbr)


# --------------------------------------------------------------------------- tests
def test_matches_the_enlarged_dense_model(fitted):
    """x*, its covariance, C* and C*'s covariance equal the whole enlarged model's to 1e-10."""
    m, Ys, nbr = fitted
    new = _run(m, Ys, nbr)
    ref = _run(m, Ys, nbr, _oracle_transform)
    start = m.qx_.mean[nbr].mean(axis=1)
    assert np.max(np.abs(ref[0] - start)) > 1e-3 * np.max(np.abs(start))  # the E-step moved x*
    for name, a, b in zip(("mean", "cov", "C", "C cov"), new, ref):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10 * np.max(np.abs(b)), err_msg=name)


def test_each_new_point_is_its_own_problem(fitted):
    """One point at a time or all at once (sharing neighbours, in another order): the same answer."""
    m, Ys, nbr = fitted
    together = _run(m, Ys, nbr)
    order = np.arange(N_NEW)[::-1]
    rev = _run(m, Ys[order], nbr[order])
    for a in range(N_NEW):
        alone = _run(m, Ys[a : a + 1], nbr[a : a + 1])
        for t in range(4):
            np.testing.assert_allclose(alone[t][0], together[t][a], rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(rev[t][N_NEW - 1 - a], together[t][a], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("form", ["identity", "ones"])
def test_enlarged_lt_rows_match_a_direct_inverse(form):
    """The rank-k update and bordering of the training Lt give the rows of (eps_y O* + 2 gamma L*)^-1
    of the enlarged graph at the new point and its neighbours."""
    rng = np.random.default_rng(0)
    n, k = 30, 4
    Y = rng.normal(size=(n, 3))
    W = lg.adjacency(lg.knn(Y, 5)[0])
    g = ll.prepare_graph(sp.csr_matrix(W), "dense", likelihood="gaussian", epsilon_form=form)
    th = ll.Theta(alpha=1e-3, beta=1.0, gamma=2.5, eps_c=1e-3, eps_y=0.01)
    T = np.array([2, 7, 11, 19])
    Lt = ops.eps_lap_inverse(g, th.eps_y, th.gamma)
    rows_T, row_new = oos._enlarged_lt_rows(g, th, Lt[T], Lt.sum(axis=1), T)
    Wa = np.zeros((n + 1, n + 1))
    Wa[:n, :n] = W.toarray()
    Wa[n, T] = Wa[T, n] = 1.0
    La = np.diag(Wa.sum(axis=1)) - Wa
    O = np.eye(n + 1) if form == "identity" else np.ones((n + 1, n + 1))
    direct = np.linalg.inv(th.eps_y * O + 2.0 * th.gamma * La)
    assert rows_T.shape == (k, n + 1)
    np.testing.assert_allclose(rows_T, direct[T], rtol=1e-10, atol=1e-10 * np.max(np.abs(direct)))
    np.testing.assert_allclose(row_new, direct[n], rtol=1e-10, atol=1e-10 * np.max(np.abs(direct)))
