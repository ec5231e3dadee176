"""The closed-form per-row curvature of the RBF psi statistics (``closed_form.rbf_row_curvature``)
against ``rbf_psi`` on single rows (values, gradients, and Hessians by reverse over reverse through
its custom rule), and the new-point Newton's Hessian (``newpoints._hessian``) against autodiff's
reverse over reverse of the whole per-row bound, for an RBF view alone and beside a linear one
(MRD). Small problems: the references differentiate per row. And the one-row covariance of the
bound's terms (``lvmcore.psi.row_moments``) against the textbook Psi2 - psi1 psi1^T in extended
precision, and the start search (``newpoints.start_candidates``) against exact kNN."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lvmcore import newpoints
from lvmcore.kernels.euclidean import get_kernel
from lvmcore.psi import closed_form as cf


def _rows(N, Q, M, seed=0):
    r = np.random.default_rng(seed)
    mu = r.normal(size=(N, Q))
    S = r.uniform(0.05, 2.0, (N, Q))
    Z = 1.5 * r.normal(size=(M, Q))
    ls = r.uniform(0.5, 2.0, Q)
    w1 = r.normal(size=(N, M))
    C = r.normal(size=(M, M))
    return mu, S, Z, 1.7, ls, w1, C + C.T


def _reference(Z, var, ls, C):
    """T(x; w) = sum_m w_m Psi1_m + <C, Psi2> of one row at x = (mu, log S), through rbf_psi."""
    Q = Z.shape[1]

    def T(x, w):
        _, p1, p2 = cf.rbf_psi(x[None, :Q], jnp.exp(x[None, Q:]), Z, var, ls, jnp.ones((1, 1)), impl="xla")
        return jnp.sum(p1[:, 0] * w) + jnp.sum(p2 * C)

    return T


def test_row_curvature_equals_rbf_psi_per_row(monkeypatch):
    """Value, gradient and Hessian (reverse over reverse through its rule) of each row against
    rbf_psi's XLA path (the one the new-point bound takes); row blocks of 2 rows (two scanned
    blocks and a remainder)."""
    N, Q, M = 5, 3, 6
    monkeypatch.setattr(cf, "CURVATURE_BLOCK_ENTRIES", 2 * (M * (M + 1) // 2) * 2 * Q)
    mu, S, Z, var, ls, w1, C = _rows(N, Q, M)
    x = np.concatenate([mu, np.log(S)], axis=1)
    with jax.enable_x64(True):
        v, g, H = (np.asarray(a) for a in cf.rbf_row_curvature(mu, S, Z, var, ls, w1, C))
        T = _reference(Z, var, ls, C)
        rv, rg = (np.asarray(a) for a in jax.jit(jax.vmap(jax.value_and_grad(T)))(x, w1))
        np.testing.assert_allclose(v, rv, rtol=1e-12, atol=0)
        np.testing.assert_allclose(g, rg, rtol=0, atol=1e-12 * np.abs(rg).max())
        rH = np.asarray(jax.jit(jax.vmap(jax.jacrev(jax.grad(T))))(x, w1))
        np.testing.assert_allclose(H, rH, rtol=0, atol=1e-12 * np.abs(rH).max())


def _terms(kind, Q, M, D, seed):
    """A view's ViewTerms from random globals and a random whitened q(v)."""
    r = np.random.default_rng(seed)
    Z = 1.5 * r.normal(size=(M, Q))
    kern = get_kernel(kind)
    kp = {"log_var": np.log(1.3), "log_ls": np.log(r.uniform(0.7, 2.0, Q))} if kind == "rbf" else {
        "log_vars": np.log(r.uniform(0.2, 1.0, Q))
    }  # fmt: skip
    with jax.enable_x64(True):
        Kmm = np.asarray(kern.K(Z, Z, kp)) + 1e-6 * np.eye(M)
    A = r.normal(size=(M, M)) / np.sqrt(M)
    cov = 0.3 * A @ A.T + 0.05 * np.eye(M)
    return newpoints.view_terms(Kmm, Z, kp, np.log(20.0), r.normal(size=(M, D)), cov)


@pytest.mark.parametrize("kinds", [("rbf",), ("rbf", "linear")])
def test_newton_hessian_equals_reverse_over_reverse(kinds):
    """newpoints._hessian (closed form for RBF views) = vmap(jacrev(grad)) of the row's -F*."""
    n, Q, M, D = 6, 3, 7, 4
    terms = tuple(_terms(k, Q, M, D, seed=v) for v, k in enumerate(kinds))
    r = np.random.default_rng(5)
    Ys = [r.normal(size=(n, D)) for _ in kinds]
    x = np.concatenate([0.8 * r.normal(size=(n, Q)), np.log(r.uniform(0.05, 1.0, (n, Q)))], axis=1)

    def neg(x, terms, ys):
        return -newpoints._row_bound(kinds, x, terms, ys)

    with jax.enable_x64(True):
        ref = jax.jit(jax.vmap(jax.jacrev(jax.grad(neg)), in_axes=(0, None, 0)))
        args = (jnp.asarray(x), terms, tuple(jnp.asarray(Y) for Y in Ys))
        H = np.asarray(jax.jit(newpoints._hessian(kinds))(*args))
        Hr = np.asarray(ref(*args))
    for i in range(n):
        np.testing.assert_allclose(H[i], Hr[i], rtol=0, atol=1e-10 * np.abs(Hr[i]).max())


@pytest.mark.parametrize("scale", [1e-6, 1e-2, 1.0])
def test_row_moments_covariance_against_extended_precision(scale):
    """``row_moments``' Psi2 - psi1 psi1^T of one row, RBF-ARD and linear-ARD, against the
    textbook formulas evaluated in long double (64-bit mantissa) and subtracted there, to 1e-11 of
    the covariance's size: formed in float64 as Psi2 - psi1 psi1^T, at S ~ 1e-6 the difference
    keeps ~1e-10 of it (the terms are ~1e6 times the covariance), and a new point's bound rounded at
    a few 1e-7 of its size. psi0 and psi1 to 1e-14."""
    from lvmcore.psi import row_moments

    if np.finfo(np.longdouble).eps > 1e-18:
        pytest.skip("needs an extended-precision long double (x86-64) for the reference")
    r = np.random.default_rng(3)
    Q, M = 3, 6
    Z = 1.5 * r.normal(size=(M, Q))
    mu = r.normal(size=Q)
    S = scale * r.uniform(0.5, 1.5, Q)
    ls, var, vs = r.uniform(0.6, 2.0, Q), 1.7, r.uniform(0.2, 1.0, Q)
    L = np.longdouble
    Zl, mul, Sl, c = Z.astype(L), mu.astype(L), S.astype(L), ls.astype(L) ** 2
    # RBF-ARD (GPy's / Titsias's psi statistics of one row)
    p1 = L(var) * np.prod(1 + Sl / c) ** L(-0.5) * np.exp(-0.5 * (((mul - Zl) ** 2) / (c + Sl)).sum(1))
    zbar = 0.5 * (Zl[:, None, :] + Zl[None, :, :])
    dz = Zl[:, None, :] - Zl[None, :, :]
    p2 = (
        L(var) ** 2
        * np.prod(1 + 2 * Sl / c) ** L(-0.5)
        * np.exp(-(dz**2 / (4 * c)).sum(2) - (((mul - zbar) ** 2) / (c + 2 * Sl)).sum(2))
    )
    # linear-ARD: psi1 = Z diag(v) mu, Psi2 = Z diag(v) (mu mu^T + diag S) diag(v) Z^T
    Zv = Zl * vs.astype(L)
    l1 = Zv @ mul
    l2 = Zv @ (np.outer(mul, mul) + np.diag(Sl)) @ Zv.T
    cases = [
        ("rbf", {"log_var": np.log(var), "log_ls": np.log(ls)}, L(var), p1, p2),
        ("linear", {"log_vars": np.log(vs)}, (vs.astype(L) * (mul**2 + Sl)).sum(), l1, l2),
    ]
    with jax.enable_x64(True):
        for kind, kp, r0, r1, r2 in cases:
            q0, q1, cov = (np.asarray(a) for a in row_moments(get_kernel(kind), mu, S, Z, kp))
            want = np.asarray(r2 - np.outer(r1, r1), dtype=np.float64)
            np.testing.assert_allclose(q0, float(r0), rtol=1e-14, err_msg=kind)
            np.testing.assert_allclose(q1, np.asarray(r1, dtype=np.float64), rtol=1e-14, err_msg=kind)
            np.testing.assert_allclose(cov, want, rtol=0, atol=1e-11 * np.abs(want).max(), err_msg=kind)


@pytest.mark.parametrize("rank", [3, 12, 40])
def test_start_candidates_are_the_exact_nearest_rows(rank):
    """The start search in the span of the reference rows (a k-d tree up to START_TREE_DIM
    dimensions, brute force above) finds each query row's k nearest reference rows in the full
    space, in order, as graph.knn_query does; the query rows lie off that span. A row's answer
    alone equals its answer in the batch."""
    from lvmcore.graph import knn_query

    r = np.random.default_rng(rank)
    D, N, n, k = 40, 3000, 200, 5
    basis = r.normal(size=(rank, D))
    ref = r.normal(size=(N, rank)) @ basis + 0.5
    qry = r.normal(size=(n, rank)) @ basis + 0.5 + 0.3 * r.normal(size=(n, D))
    got = newpoints.start_candidates(ref, qry, k)
    np.testing.assert_array_equal(got, knn_query(ref, qry, k)[0])
    alone = np.vstack([newpoints.start_candidates(ref, qry[i : i + 1], k) for i in range(10)])
    np.testing.assert_array_equal(alone, got[:10])
