"""Tests of the closed-form psi statistics (lvmcore.psi.closed_form).

Checks: slow textbook loops, Monte-Carlo expectations, GPy 1.15 as an oracle, jax gradients against
central finite differences, and additivity over row chunks / row blocks.
"""

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lvmcore.kernels import euclidean as E
from lvmcore.psi import closed_form as cf

N, M, Q, D = 7, 4, 3, 2


@pytest.fixture(scope="module", autouse=True)
def _float64():
    """This module's own jax arithmetic in float64 (lvmcore scopes its own; the process flag stays off)."""
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(0)
    return dict(
        mu=rng.normal(size=(N, Q)),
        S=rng.uniform(0.05, 0.8, size=(N, Q)),
        Z=rng.normal(size=(M, Q)),
        Y=rng.normal(size=(N, D)),
        variance=1.3,
        lengthscale=np.array([0.7, 1.4, 2.1]),
        variances=np.array([0.5, 1.7, 0.9]),
    )


# ------------------------------------------------------------------------------------------
# slow references: explicit loops over n, m, m', q
# ------------------------------------------------------------------------------------------


def ref_rbf(mu, S, Z, variance, lengthscale):
    n_, q_ = mu.shape
    m_ = Z.shape[0]
    psi0 = np.zeros(n_)
    psi1 = np.zeros((n_, m_))
    psi2 = np.zeros((n_, m_, m_))
    for n in range(n_):
        psi0[n] = variance
        for m in range(m_):
            val = variance
            for q in range(q_):
                l2 = lengthscale[q] ** 2
                val *= (1.0 + S[n, q] / l2) ** -0.5 * math.exp(
                    -0.5 * (mu[n, q] - Z[m, q]) ** 2 / (l2 + S[n, q])
                )
            psi1[n, m] = val
        for m in range(m_):
            for mp in range(m_):
                val = variance**2
                for q in range(q_):
                    l2 = lengthscale[q] ** 2
                    zbar = 0.5 * (Z[m, q] + Z[mp, q])
                    val *= (1.0 + 2.0 * S[n, q] / l2) ** -0.5 * math.exp(
                        -((Z[m, q] - Z[mp, q]) ** 2) / (4.0 * l2)
                        - (mu[n, q] - zbar) ** 2 / (l2 + 2.0 * S[n, q])
                    )
                psi2[n, m, mp] = val
    return psi0, psi1, psi2


def ref_linear(mu, S, Z, v):
    n_, q_ = mu.shape
    m_ = Z.shape[0]
    psi0 = np.zeros(n_)
    psi1 = np.zeros((n_, m_))
    psi2 = np.zeros((n_, m_, m_))
    for n in range(n_):
        for q in range(q_):
            psi0[n] += v[q] * (mu[n, q] ** 2 + S[n, q])
        for m in range(m_):
            for q in range(q_):
                psi1[n, m] += v[q] * mu[n, q] * Z[m, q]
        for m in range(m_):
            for mp in range(m_):
                for q in range(q_):
                    for qp in range(q_):
                        exx = mu[n, q] * mu[n, qp] + (S[n, q] if q == qp else 0.0)
                        psi2[n, m, mp] += v[q] * v[qp] * Z[m, q] * Z[mp, qp] * exx
    return psi0, psi1, psi2


def _rel_close(a, b, rtol):
    a, b = np.asarray(a), np.asarray(b)
    scale = max(np.max(np.abs(b)), 1e-300)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale * 1e-3)


def _rbf_all(c, block_size=cf.DEFAULT_BLOCK, sl=slice(None)):
    """The XLA path (the default, the native kernel, is checked against it in test_psi_native.py)."""
    return cf.rbf_psi(
        c["mu"][sl], c["S"][sl], c["Z"], c["variance"], c["lengthscale"], c["Y"][sl], block_size=block_size,
        impl="xla",
    )  # fmt: skip


def _lin_all(c, sl=slice(None)):
    return cf.linear_psi(c["mu"][sl], c["S"][sl], c["Z"], c["variances"], c["Y"][sl])


@pytest.mark.parametrize("block_size", [cf.DEFAULT_BLOCK, 3, 1])
def test_rbf_matches_loop_reference(case, block_size):
    c = case
    p0, p1, p2 = ref_rbf(c["mu"], c["S"], c["Z"], c["variance"], c["lengthscale"])
    f0, f1Y, f2 = _rbf_all(c, block_size)
    _rel_close(f0, p0.sum(), 1e-12)
    _rel_close(f1Y, p1.T @ c["Y"], 1e-12)
    _rel_close(f2, p2.sum(0), 1e-12)
    _rel_close(cf.rbf_psi1(c["mu"], c["S"], c["Z"], c["variance"], c["lengthscale"]), p1, 1e-12)
    np.testing.assert_array_equal(np.asarray(f2), np.asarray(f2).T)


def test_linear_matches_loop_reference(case):
    c = case
    p0, p1, p2 = ref_linear(c["mu"], c["S"], c["Z"], c["variances"])
    f0, f1Y, f2 = _lin_all(c)
    _rel_close(f0, p0.sum(), 1e-12)
    _rel_close(f1Y, p1.T @ c["Y"], 1e-12)
    _rel_close(f2, p2.sum(0), 1e-12)
    _rel_close(cf.linear_psi1(c["mu"], c["S"], c["Z"], c["variances"]), p1, 1e-12)


# ------------------------------------------------------------------------------------------
# Monte Carlo: E_q[k(x, Z)] etc. with 200,000 samples, within 5 standard errors
# ------------------------------------------------------------------------------------------


def _mc_check(kfun, kdiag, mu, S, Z, psi0, psi1, psi2, n_samples=200_000, seed=1):
    rng = np.random.default_rng(seed)
    for n in range(mu.shape[0]):
        x = mu[n] + np.sqrt(S[n]) * rng.standard_normal((n_samples, mu.shape[1]))
        k0 = kdiag(x)
        k1 = kfun(x, Z)  # (K, M)
        k2 = k1[:, :, None] * k1[:, None, :]  # (K, M, M)
        for est, target in ((k0, psi0[n]), (k1, psi1[n]), (k2, psi2[n])):
            mean = est.mean(0)
            se = est.std(0, ddof=1) / math.sqrt(n_samples)
            diff = np.abs(mean - np.asarray(target))
            assert np.all(diff < 5.0 * se + 1e-12), (n, diff, se)


def test_rbf_monte_carlo(case):
    c = case
    mu, S, Z = c["mu"][:3], c["S"][:3], c["Z"]
    var, ls = c["variance"], c["lengthscale"]
    p1 = np.asarray(cf.rbf_psi1(mu, S, Z, var, ls))
    # per-point psi2 from the fast code: one-row chunks
    p2 = np.stack(
        [
            np.asarray(cf.rbf_psi(mu[i : i + 1], S[i : i + 1], Z, var, ls, np.zeros((1, 1)))[2])
            for i in range(3)
        ]
    )
    p0 = np.full(3, var)

    def kfun(x, z):
        return var * np.exp(-0.5 * (((x[:, None, :] - z[None]) / ls) ** 2).sum(-1))

    _mc_check(kfun, lambda x: np.full(x.shape[0], var), mu, S, Z, p0, p1, p2)


def test_linear_monte_carlo(case):
    c = case
    mu, S, Z, v = c["mu"][:3], c["S"][:3], c["Z"], c["variances"]
    p1 = np.asarray(cf.linear_psi1(mu, S, Z, v))
    per = [cf.linear_psi(mu[i : i + 1], S[i : i + 1], Z, v, np.zeros((1, 1))) for i in range(3)]
    p0 = np.array([float(t[0]) for t in per])
    p2 = np.stack([np.asarray(t[2]) for t in per])
    _mc_check(lambda x, z: (x * v) @ z.T, lambda x: (x * x * v).sum(1), mu, S, Z, p0, p1, p2)


# ------------------------------------------------------------------------------------------
# GPy oracle
# ------------------------------------------------------------------------------------------


def _gpy_stats(kern, c):
    from GPy.core.parameterization.variational import NormalPosterior

    vp = NormalPosterior(c["mu"], c["S"])
    return kern.psi0(c["Z"], vp), kern.psi1(c["Z"], vp), kern.psi2n(c["Z"], vp)


def test_rbf_matches_gpy(case):
    GPy = pytest.importorskip("GPy")
    c = case
    kern = GPy.kern.RBF(Q, variance=c["variance"], lengthscale=c["lengthscale"], ARD=True)
    g0, g1, g2n = _gpy_stats(kern, c)
    f0, f1Y, f2 = _rbf_all(c)
    _rel_close(f0, g0.sum(), 1e-10)
    _rel_close(cf.rbf_psi1(c["mu"], c["S"], c["Z"], c["variance"], c["lengthscale"]), g1, 1e-10)
    _rel_close(f1Y, g1.T @ c["Y"], 1e-10)
    _rel_close(f2, g2n.sum(0), 1e-10)
    _rel_close(E.rbf_K(c["Z"], c["Z"], c["variance"], c["lengthscale"]), kern.K(c["Z"]), 1e-10)
    _rel_close(E.rbf_K(c["mu"], c["Z"], c["variance"], c["lengthscale"]), kern.K(c["mu"], c["Z"]), 1e-10)


def test_linear_matches_gpy(case):
    GPy = pytest.importorskip("GPy")
    c = case
    kern = GPy.kern.Linear(Q, variances=c["variances"], ARD=True)
    g0, g1, g2n = _gpy_stats(kern, c)
    f0, f1Y, f2 = _lin_all(c)
    _rel_close(f0, g0.sum(), 1e-10)
    _rel_close(cf.linear_psi1(c["mu"], c["S"], c["Z"], c["variances"]), g1, 1e-10)
    _rel_close(f1Y, g1.T @ c["Y"], 1e-10)
    _rel_close(f2, g2n.sum(0), 1e-10)
    _rel_close(E.linear_K(c["mu"], c["Z"], c["variances"]), kern.K(c["mu"], c["Z"]), 1e-10)


# ------------------------------------------------------------------------------------------
# gradients vs central finite differences
# ------------------------------------------------------------------------------------------


def _fd_check(f, args, grads, h=1e-6, rtol=1e-5):
    """gradients ``grads`` of f (numpy-valued) against central finite differences with step h."""
    for i, (a, g) in enumerate(zip(args, grads)):
        a = np.asarray(a, dtype=float)
        fd = np.zeros(a.size)
        for j in range(a.size):
            e = np.zeros(a.size)
            e[j] = h
            e = e.reshape(a.shape)
            argp = list(args)
            argm = list(args)
            argp[i] = a + e
            argm[i] = a - e
            fd[j] = (f(*argp) - f(*argm)) / (2 * h)
        np.testing.assert_allclose(np.ravel(g), fd, rtol=rtol, atol=1e-8, err_msg=f"argument {i}")


@pytest.mark.slow
def test_rbf_gradients_finite_differences(case):
    """jax.grad of sum(psi2_sum * W) + sum(psi1TY * V) on the blocked path (the hand-written
    custom_vjp backward; block_size=3 over N=7 rows: a lax.scan over two blocks plus a one-row
    tail) against finite differences; then jax.vjp of the single-block path with all three
    cotangents against it to 1e-12."""
    c = case
    rng = np.random.default_rng(5)
    W = rng.normal(size=(M, M))
    V = rng.normal(size=(M, D))

    def f(mu, S, Z, ls, var, Y):
        _, p1Y, p2 = cf.rbf_psi(mu, S, Z, var, ls, Y, block_size=3, impl="xla")
        return jnp.sum(p2 * W) + jnp.sum(p1Y * V)

    args = (c["mu"], c["S"], c["Z"], c["lengthscale"], np.array(c["variance"]), c["Y"])
    # the gradient goes through the hand-written rule, not through autodiff of the forward pass
    assert "custom_vjp_call" in str(jax.make_jaxpr(f)(*args))
    grads = jax.jit(jax.grad(f, argnums=tuple(range(len(args)))))(*args)
    _fd_check(lambda *a: float(f(*a)), args, grads)

    vargs = (c["mu"], c["S"], c["Z"], c["variance"], c["lengthscale"], c["Y"])
    _, vjp = jax.vjp(lambda *a: cf.rbf_psi(*a, impl="xla"), *vargs)
    g_vjp = vjp((jnp.asarray(0.7), jnp.asarray(V), jnp.asarray(W)))
    # d/dvariance also picks up psi0_sum = N * variance (cotangent 0.7)
    _rel_close(g_vjp[3], grads[4] + 0.7 * N, 1e-12)
    for k_vjp, k_grad in ((0, 0), (1, 1), (2, 2), (4, 3), (5, 5)):
        _rel_close(g_vjp[k_vjp], grads[k_grad], 1e-12)


def _rbf_direct(mu, S, Z, variance, lengthscale, Y):
    """Textbook broadcasting formulas ((N, M, M, Q) intermediates, no GEMM expansion), for plain
    reverse-mode autodiff as an independent reference for the hand-written backward pass."""
    l2 = lengthscale**2
    d1 = mu[:, None, :] - Z[None, :, :]  # (N, M, Q)
    psi1 = variance * jnp.exp(
        (-0.5 * jnp.log1p(S[:, None, :] / l2) - 0.5 * d1**2 / (l2 + S[:, None, :])).sum(-1)
    )
    zbar = 0.5 * (Z[:, None, :] + Z[None, :, :])  # (M, M, Q)
    d2 = mu[:, None, None, :] - zbar[None]  # (N, M, M, Q)
    S4 = S[:, None, None, :]
    dz = Z[:, None, :] - Z[None, :, :]
    psi2n = variance**2 * jnp.exp(
        (-0.5 * jnp.log1p(2.0 * S4 / l2) - (dz**2)[None] / (4.0 * l2) - d2**2 / (l2 + 2.0 * S4)).sum(-1)
    )
    return mu.shape[0] * variance, psi1.T @ Y, psi2n.sum(0)


@jax.jit
def _rbf_direct_vjp(args, cot):
    """The direct formulas and their VJP with ``cot``, compiled as one program (op by op, each
    primitive compiled alone, it cost most of the test's time)."""
    out, vjp = jax.vjp(_rbf_direct, *args)
    return out, vjp(cot)


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [256, 7, 3, 1])
def test_rbf_backward_equals_autodiff_of_direct_formulas(case, block_size):
    """jax.vjp of rbf_psi (custom rule) = jax.vjp of the direct formulas (plain autodiff) for all
    six inputs, with a non-symmetric Psi2 cotangent, for one tail block only (256), exactly one
    full block (7), a scan plus a tail (3) and a scan without tail (1)."""
    c = case
    rng = np.random.default_rng(7)
    cot = (jnp.asarray(0.3), jnp.asarray(rng.normal(size=(M, D))), jnp.asarray(rng.normal(size=(M, M))))
    args = tuple(
        jnp.asarray(c[k], dtype=jnp.float64) for k in ("mu", "S", "Z", "variance", "lengthscale", "Y")
    )
    out, vjp = jax.vjp(lambda *a: cf.rbf_psi(*a, block_size=block_size, impl="xla"), *args)
    ref_out, ref_grads = _rbf_direct_vjp(args, cot)
    for a, b in zip(out, ref_out):
        _rel_close(a, b, 1e-12)
    for k, (g, r) in enumerate(zip(vjp(cot), ref_grads)):
        assert np.shape(g) == np.shape(r), k
        _rel_close(g, r, 1e-10)
    # primal=False (the chunked backward task): zero sums, no forward row pass, the same VJP; its
    # backward pass accumulates the row sums that the variance and pair gradients need itself
    out0, vjp0 = jax.vjp(lambda *a: cf.rbf_psi(*a, block_size=block_size, primal=False, impl="xla"), *args)
    assert not np.any(np.asarray(out0[1])) and not np.any(np.asarray(out0[2]))
    for k, (g, r) in enumerate(zip(vjp0(cot), ref_grads)):
        assert np.shape(g) == np.shape(r), k
        _rel_close(g, r, 1e-10)


def test_linear_gradients_finite_differences(case):
    c = case
    rng = np.random.default_rng(6)
    W = rng.normal(size=(M, M))
    V = rng.normal(size=(M, D))

    def f(mu, S, Z, v):
        p0, p1Y, p2 = cf.linear_psi(mu, S, Z, v, c["Y"])
        return jnp.sum(p2 * W) + jnp.sum(p1Y * V) + 0.3 * p0

    args = (c["mu"], c["S"], c["Z"], c["variances"])
    grads = jax.jit(jax.grad(f, argnums=(0, 1, 2, 3)))(*args)
    _fd_check(lambda *a: float(f(*a)), args, grads)


# ------------------------------------------------------------------------------------------
# chunk additivity, jit, KL
# ------------------------------------------------------------------------------------------


CHUNKS = (slice(0, 2), slice(2, 5), slice(5, 7))


def test_rbf_chunk_sums(case):
    full = _rbf_all(case)
    parts = [_rbf_all(case, sl=sl) for sl in CHUNKS]
    for k in range(3):
        _rel_close(sum(p[k] for p in parts), full[k], 1e-12)


def test_linear_chunk_sums(case):
    full = _lin_all(case)
    parts = [_lin_all(case, sl=sl) for sl in CHUNKS]
    for k in range(3):
        _rel_close(sum(p[k] for p in parts), full[k], 1e-12)


def test_jit_and_dtype(case):
    c = case
    jf = jax.jit(partial(cf.rbf_psi, impl="xla"), static_argnames="block_size")
    out = jf(c["mu"], c["S"], c["Z"], c["variance"], c["lengthscale"], c["Y"], block_size=3)
    ref = _rbf_all(c)
    for a, b in zip(out, ref):
        assert a.dtype == jnp.float64
        _rel_close(a, b, 1e-12)
    jl = jax.jit(cf.linear_psi)(c["mu"], c["S"], c["Z"], c["variances"], c["Y"])
    for a, b in zip(jl, _lin_all(c)):
        _rel_close(a, b, 1e-12)


def test_kl_diag_gaussian(case):
    mu, S = case["mu"], case["S"]
    ref = sum(0.5 * (mu[n, q] ** 2 + S[n, q] - math.log(S[n, q]) - 1.0) for n in range(N) for q in range(Q))
    _rel_close(cf.kl_diag_gaussian(mu, S), ref, 1e-12)
    assert float(cf.kl_diag_gaussian(np.zeros((3, 2)), np.ones((3, 2)))) == 0.0
