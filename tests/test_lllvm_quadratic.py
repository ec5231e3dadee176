"""LL-LVM's f-term variant (``likelihood="quadratic"``, paper 000 eq. 28; not the paper's model):
E-step moments and the bound against brute force, M-step stationarity, the sparse solver's pieces,
monotone bound, dense = sparse, out-of-sample, chunked statistics."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from lvmcore.data.synthetic import lllvm_swiss_roll
from lvmcore.graph import adjacency, knn
from lvmcore.linalg import NumericalError
from lvmcore.models import LLLVM
from lvmcore.models import lllvm as ll
from lvmcore.sparse_chol import BlockTridiagonal, LevelStructure
from tests.lllvm_brute import (
    D3,
    LOG2PI,
    N6,
    Q2,
    blocks,
    check_mstep_stationary,
    check_out_of_sample,
    em_steps,
    expected_log_joint,
    full_cov_from_blocks,
    identify_quadratic,
    tiny,
    zero,
)

QUAD = dict(likelihood="quadratic", alpha=None, beta=None)


def QLLVM(**kw):
    """The quadratic variant with alpha and beta learned (its settings before the default changed)."""
    return LLLVM(**QUAD, **kw)


@pytest.fixture(scope="module")
def tiny_state():
    """A few EM iterations on the tiny graph (dense solver), keeping each intermediate q."""
    Y, Wd = tiny()
    g = ll.prepare_graph(sp.csr_matrix(Wd), "dense", likelihood="quadratic")
    th = ll.Theta(alpha=0.7, beta=1.3, gamma=0.9, eps_c=1e-3, eps_y=1e-3)
    rng = np.random.default_rng(0)
    qx = ll.QX(rng.normal(size=(N6, Q2)), np.zeros((N6, Q2, Q2)), np.zeros((len(g.ei), Q2, Q2)), 0.0)
    return em_steps(Y, Wd, g, qx, th)


def test_qx_moments_match_brute_force(tiny_state):
    s = tiny_state
    Y, Wd, g, qc, th = s["Y"], s["Wd"], s["g"], s["qc"], s["th_prev"]
    SC = full_cov_from_blocks(g, qc, N6, Q2)

    def f(v):
        return expected_log_joint(Y, Wd, th, v.reshape(N6, Q2), zero(Q2), qc.mean, SC)

    P, h = identify_quadratic(f, N6 * Q2)
    cov = np.linalg.inv(P)
    mean = (cov @ h).reshape(N6, Q2)
    qx = ll.update_qx(Y, g, qc, th)
    np.testing.assert_allclose(qx.mean, mean, rtol=1e-7, atol=1e-9)
    Sb = blocks(cov, Q2)
    np.testing.assert_allclose(qx.cov, np.array([Sb(i, i) for i in range(N6)]), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(qx.cov_edge, np.array([Sb(i, j) for i, j in zip(g.ei, g.ej)]), atol=1e-10)
    assert qx.logdet_prec == pytest.approx(np.linalg.slogdet(P)[1], rel=1e-9)


def test_qc_moments_match_brute_force(tiny_state):
    s = tiny_state
    Y, Wd, g, qx, th = s["Y"], s["Wd"], s["g"], s["qx"], s["th"]
    Sx = full_cov_from_blocks(g, qx, N6, Q2)

    def f(v):  # v = vec of C row-major: row d of C = [C_1[d], ..., C_N[d]]
        C = v.reshape(D3, N6, Q2).transpose(1, 0, 2)
        return expected_log_joint(Y, Wd, th, qx.mean, Sx, C, zero(Q2))

    P, h = identify_quadratic(f, D3 * N6 * Q2)
    # rows of C are independent with one shared precision
    nQ = N6 * Q2
    P0 = P[:nQ, :nQ]
    np.testing.assert_allclose(P, np.kron(np.eye(D3), P0), atol=1e-8 * np.abs(P0).max())
    cov = np.linalg.inv(P0)
    mean = np.linalg.solve(P, h).reshape(D3, N6, Q2).transpose(1, 0, 2)
    qc = ll.update_qc(Y, g, qx, th)
    np.testing.assert_allclose(qc.mean, mean, rtol=1e-7, atol=1e-9)
    Sb = blocks(cov, Q2)
    np.testing.assert_allclose(qc.cov, np.array([Sb(i, i) for i in range(N6)]), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(qc.cov_edge, np.array([Sb(i, j) for i, j in zip(g.ei, g.ej)]), atol=1e-10)
    assert qc.logdet_prec == pytest.approx(np.linalg.slogdet(P0)[1], rel=1e-9)


def test_bound_matches_brute_force(tiny_state):
    s = tiny_state
    Y, Wd, g, qx, qc, th = s["Y"], s["Wd"], s["g"], s["qx"], s["qc"], s["th"]
    Sx = full_cov_from_blocks(g, qx, N6, Q2)
    SC = full_cov_from_blocks(g, qc, N6, Q2)
    elj = expected_log_joint(Y, Wd, th, qx.mean, Sx, qc.mean, SC)
    nQ = N6 * Q2
    ent_x = 0.5 * nQ * (1 + LOG2PI) - 0.5 * qx.logdet_prec
    ent_c = D3 * (0.5 * nQ * (1 + LOG2PI) - 0.5 * qc.logdet_prec)
    assert ll.elbo(Y, g, qx, qc, th) == pytest.approx(elj + ent_x + ent_c, rel=1e-10, abs=1e-9)


@pytest.mark.parametrize("name", ["alpha", "beta", "gamma"])
def test_mstep_is_stationary(tiny_state, name):
    check_mstep_stationary(tiny_state, name)


# --------------------------------------------------------------------------- solver pieces
def test_block_tridiagonal_selected_inverse_matches_dense():
    Y, _, _ = lllvm_swiss_roll(150, 1)
    idx, _ = knn(Y, 6)
    W = adjacency(idx)
    ls = LevelStructure(W)
    rng = np.random.default_rng(1)
    Q = 2
    eb = rng.normal(size=(len(ls.ei), Q, Q)) * 0.3
    pb = np.zeros((150, Q, Q))
    mag = np.abs(eb).sum((1, 2)) + 0.1
    np.add.at(pb, ls.ei, mag[:, None, None] * np.eye(Q))
    np.add.at(pb, ls.ej, mag[:, None, None] * np.eye(Q))
    M = BlockTridiagonal.assemble(ls, pb, eb).factor()
    A = M.to_sparse().toarray()
    Ai = np.linalg.inv(A)
    assert M.logdet() == pytest.approx(np.linalg.slogdet(A)[1], rel=1e-12)
    b = rng.normal(size=(300, 2))
    np.testing.assert_allclose(M.solve(b), np.linalg.solve(A, b), atol=1e-12)
    Z = M.selected_inverse()
    P = Z.point_blocks()
    Eb = Z.edge_blocks()
    for i in range(150):
        np.testing.assert_allclose(P[i], Ai[2 * i : 2 * i + 2, 2 * i : 2 * i + 2], atol=1e-13)
    for e, (i, j) in enumerate(zip(ls.ei, ls.ej)):
        np.testing.assert_allclose(Eb[e], Ai[2 * i : 2 * i + 2, 2 * j : 2 * j + 2], atol=1e-13)
    # the assembled matrix is the intended one
    assert np.allclose(A[0:2, 0:2], pb[0])


def test_block_tridiagonal_factor_in_place_equals_the_copying_one():
    """``factor(rebuild=...)`` overwrites the matrix's level blocks with the factor (one set of blocks
    held instead of two): the same solve, log-determinant and selected inverse as the copying
    factor, bit for bit, the matrix's blocks released, and a retry with jitter (a matrix that is
    not positive definite until shifted) starts from the rebuilt matrix and gives the copying
    factor's jitter and result."""
    Y, _, _ = lllvm_swiss_roll(150, 1)
    ls = LevelStructure(adjacency(knn(Y, 6)[0]))
    rng = np.random.default_rng(1)
    Q = 2
    eb = rng.normal(size=(len(ls.ei), Q, Q)) * 0.3
    mag = np.abs(eb).sum((1, 2)) + 0.1
    pb = np.zeros((150, Q, Q))
    np.add.at(pb, ls.ei, mag[:, None, None] * np.eye(Q))
    np.add.at(pb, ls.ej, mag[:, None, None] * np.eye(Q))
    b = rng.normal(size=(300, 3))
    copy = BlockTridiagonal.assemble(ls, pb, eb).factor()
    inplace = BlockTridiagonal.assemble(ls, pb, eb).factor(rebuild=lambda: 1 / 0)  # needs no retry
    assert inplace.diag is None and inplace.sub is None and inplace.jitter_ == copy.jitter_ == 0.0
    assert inplace.logdet() == copy.logdet()
    np.testing.assert_array_equal(inplace.solve(b), copy.solve(b))
    zi, zc = inplace.selected_inverse(second=True), copy.selected_inverse(second=True)
    np.testing.assert_array_equal(zi.point_blocks(), zc.point_blocks())
    np.testing.assert_array_equal(zi.edge_blocks(), zc.edge_blocks())
    for a, c in zip(zi.sub2, zc.sub2, strict=True):
        np.testing.assert_array_equal(a, c)
    # indefinite until shifted: the smallest eigenvalue moved to -1e-5 of the mean diagonal (the
    # schedule's 1e-4 jitter fixes it), so the first attempts fail part-way through the blocks
    A = BlockTridiagonal.assemble(ls, pb, eb).to_sparse().toarray()
    low = pb - (np.linalg.eigvalsh(A)[0] + 1e-5 * np.mean(np.diag(A))) * np.eye(Q)
    copy = BlockTridiagonal.assemble(ls, low, eb).factor()
    rebuilt = []
    inplace = BlockTridiagonal.assemble(ls, low, eb).factor(
        rebuild=lambda: rebuilt.append(1) or BlockTridiagonal.assemble(ls, low, eb)
    )
    assert copy.jitter_ > 0 and inplace.jitter_ == copy.jitter_ and len(rebuilt) >= 1
    assert inplace.logdet() == copy.logdet()
    np.testing.assert_array_equal(inplace.solve(b), copy.solve(b))


@pytest.mark.parametrize("scale", [1e3, 1.0, 1e-3, 1e-5])
def test_alpha_root_by_log_secant_equals_eigenvalue_brent(roll300, scale):
    """The sparse path's alpha (secant steps in log alpha on factorisation traces, warm-started
    anywhere in its bracket) equals Brent's method on the eigenvalue form of eq. 79's derivative,
    for alpha from ~1e-4 (smoothness-dominated) to ~1e2 (the run-away regime)."""
    from scipy.optimize import brentq

    Y, idx, _ = roll300
    W = adjacency(idx)
    gs = ll.prepare_graph(W, "sparse", likelihood="quadratic")
    omega = np.linalg.eigvalsh(np.diag(np.asarray(W.sum(1)).ravel()) - W.toarray())
    n, Q = len(Y), 2
    rng = np.random.default_rng(0)
    qx = ll.QX(
        rng.normal(size=(n, Q)) * np.sqrt(scale), np.zeros((n, Q, Q)), np.zeros((len(gs.ei), Q, Q)), 0.0
    )
    c = np.sum(qx.mean**2)
    ref = brentq(lambda a: Q * np.sum(1.0 / (a + 2.0 * omega)) - c, Q / c, Q * n / c, rtol=1e-14)
    for a0 in (None, 0.5 * ref, 2.0 * ref, 1.0001 * Q / c, 0.9999 * Q * n / c):
        assert ll.update_alpha(gs, qx, a0) == pytest.approx(ref, rel=1e-9), a0


def test_gamma_root_by_log_secant_equals_eigenvalue_brent(roll300):
    Y, idx, _ = roll300
    W = adjacency(idx)
    from scipy.optimize import brentq

    gs = ll.prepare_graph(W, "sparse", likelihood="quadratic")
    omega = np.linalg.eigvalsh(np.diag(np.asarray(W.sum(1)).ravel()) - W.toarray())
    th = ll.Theta(alpha=1e-3, beta=1.0, gamma=1.0, eps_c=1e-3, eps_y=1e-3)
    n, D = Y.shape
    rng = np.random.default_rng(0)
    qx = ll.QX(rng.normal(size=(n, 2)), np.zeros((n, 2, 2)), np.zeros((len(gs.ei), 2, 2)), 0.0)
    qc = ll.update_qc(Y, gs, qx, th)
    S = ll.expected_S(Y, gs, qx, qc)
    hi = D * (n - 1) / S
    # eq. 72-73's derivative in eigenvalue form, by Brent's method
    ref = brentq(
        lambda gm: D / gm * (n - th.eps_y * np.sum(1 / (th.eps_y + 2 * gm * omega))) - S,
        1e-8 * hi,
        hi,
        rtol=1e-14,
    )
    for g0 in (1.0, 0.5 * ref, 2.0 * ref, 0.999 * hi, 1e-6 * hi):
        th.gamma = g0
        assert ll.update_gamma(Y, gs, qx, qc, th) == pytest.approx(ref, rel=1e-9), g0


def test_bad_factor_raises_with_context():
    Y, Wd = tiny()
    g = ll.prepare_graph(sp.csr_matrix(Wd), "sparse", likelihood="quadratic")
    th = ll.Theta(alpha=-50.0, beta=1.0, gamma=1.0, eps_c=1e-3, eps_y=1e-3)
    qc = ll.QC(np.zeros((N6, D3, Q2)), np.zeros((N6, Q2, Q2)), np.zeros((len(g.ei), Q2, Q2)), 0.0)
    with pytest.raises(NumericalError) as ei:
        ll.update_qx(Y, g, qc, th, context="EM iteration 7")
    assert "EM iteration 7" in str(ei.value) and ei.value.matrix is not None
    assert "q(x)" in ei.value.name


# --------------------------------------------------------------------------- EM
@pytest.fixture(scope="module")
def roll300():
    Y, lat, iso = lllvm_swiss_roll(300, 0)
    idx, _ = knn(Y, 8)
    return Y, idx, iso


def test_bound_monotone_and_dense_equals_sparse(roll300):
    Y, idx, _ = roll300
    fits = {
        s: QLLVM(n_neighbors=8, solver=s, max_iter=25, tol=0, random_state=0).fit(Y, idx)
        for s in ("dense", "sparse")
    }
    for m in fits.values():
        tr = m.elbo_trace_
        assert np.all(np.diff(tr) >= -1e-9 * np.abs(tr[1:])), np.diff(tr).min()
        assert tr[-1] > tr[0] + 10
        assert m.n_iter_ == 25 and m.embedding_.shape == (300, 2)
    d, s = fits["dense"], fits["sparse"]
    assert s.elbo_ == pytest.approx(d.elbo_, rel=1e-6)
    scale = np.abs(d.embedding_).max()
    np.testing.assert_allclose(s.embedding_, d.embedding_, atol=1e-6 * scale)
    np.testing.assert_allclose(s.embedding_var_, d.embedding_var_, atol=1e-6 * np.abs(d.embedding_var_).max())
    for name in ("alpha_", "beta_", "gamma_"):
        assert getattr(s, name) == pytest.approx(getattr(d, name), rel=1e-6)


@pytest.fixture(scope="module")
def fit400():
    """The authors' roll, n = 400, k = 6 (no short circuit); this seed's start unrolls it."""
    Y, lat, iso = lllvm_swiss_roll(400, 0)
    idx, _ = knn(Y, 6)
    m = QLLVM(n_neighbors=6, solver="sparse", max_iter=50, tol=0, random_state=1).fit(Y, idx)
    return Y, iso, m


def test_out_of_sample_transform_and_reconstruction(fit400):
    Y, iso, m = fit400
    from scipy.spatial.distance import pdist
    from scipy.stats import spearmanr

    assert spearmanr(pdist(m.embedding_), pdist(iso))[0] > 0.8  # the fit is unrolled
    Ynew, _, _ = lllvm_swiss_roll(40, 99)
    check_out_of_sample(m, Y, Ynew, 6, gain=0.8)
    np.testing.assert_allclose(m.Y_train_ * m.scale_ + m.center_, Y, atol=1e-12)


def test_out_of_sample_is_a_fixed_point_of_the_joint_e_step(fit400):
    """q(x*) from transform equals the brute-force optimum of the expected log joint with the new
    point added to the graph, everything else frozen (and the same for q(C*))."""
    _, _, m = fit400
    Y = m.Y_train_  # the scaled data the model was fitted on
    ystar = Y[:1] + np.array([[0.01, 0.02, -0.01]])
    nbr = np.argsort(((Y - ystar) ** 2).sum(1))[:6][None, :]
    mx, Sx, Cs, SC = ll.transform_points(Y, m.graph_, m.qx_, m.qc_, m.theta_, ystar, nbr)
    # brute force on the sub-problem: the new point and its neighbours, other points irrelevant
    th = m.theta_
    k = nbr.shape[1]
    Mj = ll.operators.ctc(m.qc_)[nbr[0]]

    def f(v):  # expected log joint terms that involve x* (fixed at v), C* ~ q(C*)
        val = -0.5 * th.alpha * v @ v
        ECs = 3 * SC[0] + Cs[0].T @ Cs[0]
        for t, j in enumerate(nbr[0]):
            mj, Sj = m.qx_.mean[j], m.qx_.cov[j]
            val -= 2 * 0.5 * ((v - mj) @ (v - mj) + np.trace(Sj))
            a = Y[j] - ystar[0]  # term (*, j): C* maps x_j - x*
            dm = mj - v
            val -= 0.5 * th.gamma * (a @ a - 2 * a @ Cs[0] @ dm + np.trace(ECs @ (Sj + np.outer(dm, dm))))
            a2 = ystar[0] - Y[j]  # term (j, *): C_j maps x* - x_j
            Cj = m.qc_.mean[j]
            # E over x_j and C_j jointly: |a2 + C_j x_j - C_j v|^2, C_j and x_j independent
            e = a2 @ a2 + 2 * a2 @ Cj @ (mj - v) + np.trace(Mj[t] @ (Sj + np.outer(mj - v, mj - v)))
            val -= 0.5 * th.gamma * e
        return val

    P, h = identify_quadratic(f, 2)
    np.testing.assert_allclose(mx[0], np.linalg.solve(P, h), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(Sx[0], np.linalg.inv(P), rtol=1e-8, atol=1e-12)
    assert k == 6


def test_chunked_statistics_equal_unchunked(roll300):
    Y, idx, _ = roll300
    Y, idx = Y[:150], knn(Y[:150], 6)[0]
    kw = dict(n_neighbors=6, solver="sparse", max_iter=4, tol=0, random_state=0)
    ref = QLLVM(**kw).fit(Y, idx)
    m = QLLVM(chunks=40, **kw).fit(Y, idx)  # default (threaded) scheduler, 4 chunks
    np.testing.assert_allclose(m.elbo_trace_, ref.elbo_trace_, rtol=1e-10)
    np.testing.assert_allclose(m.embedding_, ref.embedding_, rtol=1e-8, atol=1e-10)
    with pytest.raises(ValueError, match="chunks"):
        QLLVM(chunks=0).fit(Y)


def test_chunked_statistics_on_a_local_cluster(roll300, shared_cluster):
    from distributed import Client

    Y, _, _ = roll300
    Y = Y[:120]
    idx, _ = knn(Y, 6)
    kw = dict(n_neighbors=6, solver="dense", max_iter=2, tol=0, random_state=0)
    ref = QLLVM(**kw).fit(Y, idx)
    with Client(shared_cluster):
        m = QLLVM(chunks=50, **kw).fit(Y, idx)
    np.testing.assert_allclose(m.elbo_trace_, ref.elbo_trace_, rtol=1e-10)
    np.testing.assert_allclose(m.embedding_, ref.embedding_, rtol=1e-8, atol=1e-10)
