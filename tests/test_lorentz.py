"""Tests for the Lorentz model (lvmcore.manifolds.lorentz) and the HE kernel (lvmcore.kernels.hyperbolic)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lvmcore.kernels.hyperbolic import he_kernel, he_kernel_diag
from lvmcore.manifolds import lorentz as L

# one batch size and (apart from the H^2 / H^5 point test and the kernel) one dimension everywhere:
# the jitted functions compile once per shape, and compilation dominates the run time
N = 64
Q = 5


@pytest.fixture(scope="module", autouse=True)
def _float64():
    """This module's own jax arithmetic in float64 (lvmcore scopes its own; the process flag stays off)."""
    with jax.enable_x64(True):
        yield


def _tangent0(rng, n, q, max_norm=5.0):
    """n random spatial tangent vectors at the origin with norms uniform in (0, max_norm)."""
    v = rng.standard_normal((n, q))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v * rng.uniform(0.0, max_norm, size=(n, 1))


def _points(rng, n, q, max_norm=5.0):
    return np.asarray(L.expmap0(_tangent0(rng, n, q, max_norm)))


def _tangent_at(rng, x, scale=1.0):
    """Random tangent vectors at the points x (projection of Gaussian ambient vectors)."""
    g = rng.standard_normal(x.shape) * scale
    return np.asarray(L.proj(x, g))


@pytest.mark.parametrize("q", [2, 5])
def test_points_on_manifold(q):
    rng = np.random.default_rng(0)
    x = _points(rng, N, q)
    assert x.shape == (N, q + 1)
    val = np.asarray(L.inner(x, x))
    np.testing.assert_array_less(np.abs(val + 1.0), 1e-10 * np.maximum(1.0, x[:, 0] ** 2))
    assert np.all(x[:, 0] > 0)
    L.check_point(x)
    # logmap0 inverts expmap0; the origin maps to zero
    v = _tangent0(np.random.default_rng(1), N, q)
    np.testing.assert_allclose(np.asarray(L.logmap0(L.expmap0(v))), v, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(L.expmap0(np.zeros((N, q)))), np.eye(q + 1)[[0] * N])
    np.testing.assert_array_equal(np.asarray(L.origin(q)), np.eye(q + 1)[0])


def test_exp_log_roundtrip(q=Q):
    rng = np.random.default_rng(2)
    x = _points(rng, N, q, 3.0)
    y = _points(rng, N, q, 3.0)
    u = L.logmap(x, y)
    np.testing.assert_allclose(np.asarray(L.inner(x, u)), 0.0, atol=1e-9)
    np.testing.assert_allclose(np.asarray(L.expmap(x, u)), y, rtol=1e-9, atol=1e-9)

    v = _tangent_at(rng, x)
    np.testing.assert_allclose(np.asarray(L.logmap(x, L.expmap(x, v))), v, rtol=1e-9, atol=1e-9)
    # tiny vectors (series branches) and zero
    v_small = v * 1e-7
    np.testing.assert_allclose(np.asarray(L.logmap(x, L.expmap(x, v_small))), v_small, rtol=1e-6, atol=1e-14)
    np.testing.assert_allclose(np.asarray(L.expmap(x, np.zeros_like(x))), x, rtol=1e-15)
    np.testing.assert_allclose(np.asarray(L.logmap(x, x)), 0.0, atol=1e-15)


def test_dist_properties(q=Q):
    rng = np.random.default_rng(3)
    x, y, z = (_points(rng, N, q) for _ in range(3))
    d_xy = np.asarray(L.dist(x, y))
    np.testing.assert_allclose(d_xy, np.asarray(L.norm(L.logmap(x, y))), rtol=1e-9)
    np.testing.assert_allclose(d_xy, np.arccosh(-np.asarray(L.inner(x, y))), rtol=1e-9)
    np.testing.assert_allclose(d_xy, np.asarray(L.dist(y, x)), rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(L.dist(x, x)), 0.0)
    d_xz, d_zy = np.asarray(L.dist(x, z)), np.asarray(L.dist(z, y))
    assert np.all(d_xy <= d_xz + d_zy + 1e-10)
    # distance to the origin is the tangent norm at the origin
    v = _tangent0(rng, N, q)
    o = np.broadcast_to(np.eye(q + 1)[0], (N, q + 1))
    np.testing.assert_allclose(np.asarray(L.dist(o, L.expmap0(v))), np.linalg.norm(v, axis=1), rtol=1e-10)
    # pairwise matches elementwise
    D = np.asarray(L.pairwise_dist(x, y))
    assert D.shape == (N, N)
    np.testing.assert_allclose(np.diag(D), d_xy, rtol=1e-14)
    # small separations stay accurate (arccosh(-<x,y>) would lose about half the digits); points
    # near the origin, as the representable separation is limited by rounding of coordinates ~ x0
    x_c = _points(rng, N, q, 0.5)
    eps = 1e-9
    y_near = np.asarray(L.expmap(x_c, eps * _unit_tangent(rng, x_c)))
    np.testing.assert_allclose(np.asarray(L.dist(x_c, y_near)), eps, rtol=1e-5)


def _unit_tangent(rng, x):
    v = _tangent_at(rng, x)
    return v / np.asarray(L.norm(v))[:, None]


def test_parallel_transport(q=Q):
    rng = np.random.default_rng(4)
    x = _points(rng, N, q, 3.0)
    y = _points(rng, N, q, 3.0)
    v = _tangent_at(rng, x)
    w = np.asarray(L.transp(x, y, v))
    np.testing.assert_allclose(np.asarray(L.inner(y, w)), 0.0, atol=1e-9)
    np.testing.assert_allclose(np.asarray(L.norm(w)), np.asarray(L.norm(v)), rtol=1e-9)
    np.testing.assert_allclose(np.asarray(L.transp(y, x, w)), v, rtol=1e-8, atol=1e-9)
    # inner products are preserved, and the geodesic direction is carried to minus its reverse
    v2 = _tangent_at(rng, x)
    w2 = np.asarray(L.transp(x, y, v2))
    np.testing.assert_allclose(np.asarray(L.inner(w, w2)), np.asarray(L.inner(v, v2)), atol=1e-8)
    np.testing.assert_allclose(
        np.asarray(L.transp(x, y, L.logmap(x, y))), -np.asarray(L.logmap(y, x)), rtol=1e-8, atol=1e-8
    )
    # origin -> mu is the reparameterisation used for wrapped Gaussians (eq. 19)
    o = np.broadcast_to(np.eye(q + 1)[0], x.shape)
    v0 = np.concatenate([np.zeros((N, 1)), rng.standard_normal((N, q))], axis=1)
    u = np.asarray(L.transp(o, x, v0))
    np.testing.assert_allclose(np.asarray(L.inner(x, u)), 0.0, atol=1e-9)
    np.testing.assert_allclose(np.asarray(L.norm(u)), np.linalg.norm(v0, axis=1), rtol=1e-9)


def test_poincare(q=Q):
    rng = np.random.default_rng(5)
    x = _points(rng, N, q, 4.0)
    y = _points(rng, N, q, 4.0)
    p, r = np.asarray(L.to_poincare(x)), np.asarray(L.to_poincare(y))
    assert np.all(np.linalg.norm(p, axis=1) < 1)
    np.testing.assert_allclose(np.asarray(L.from_poincare(p)), x, rtol=1e-9, atol=1e-9)
    num = 2.0 * np.sum((p - r) ** 2, axis=1)
    den = (1.0 - np.sum(p**2, axis=1)) * (1.0 - np.sum(r**2, axis=1))
    np.testing.assert_allclose(np.arccosh(1.0 + num / den), np.asarray(L.dist(x, y)), rtol=1e-8)


def test_project_to_manifold():
    rng = np.random.default_rng(6)
    x = _points(rng, N, Q)
    noisy = x + 1e-3 * rng.standard_normal(x.shape)
    with pytest.raises(ValueError):
        L.check_point(noisy)
    fixed = np.asarray(L.project_to_manifold(noisy))
    L.check_point(fixed)
    np.testing.assert_array_equal(fixed[:, 1:], noisy[:, 1:])


def test_dist_gradients():
    rng = np.random.default_rng(7)
    q = Q
    x = _points(rng, N, q, 2.0)

    # ambient gradients at x == y (also of logmap, and of expmap at v == 0) are finite: dist has the zero
    # sub-gradient there, also through the kernel; all checked in one compiled function
    @jax.jit
    def derivs(a):
        return (
            jax.grad(L.dist)(a, a),
            jax.grad(lambda b: he_kernel(b, b, 1.3, 2.0).sum())(a[None]),
            jax.grad(lambda b: jnp.sum(L.logmap(a, b) ** 2 + L.logmap(a, b)))(a),
            jax.grad(lambda v: jnp.sum(L.expmap(a, v)))(jnp.zeros_like(a)),
        )

    out = derivs(jnp.asarray(x[0]))
    for g in out:
        assert np.all(np.isfinite(np.asarray(g)))
    np.testing.assert_array_equal(np.asarray(out[0]), 0.0)

    # elsewhere: gradient w.r.t. the spatial coordinates (x0 = sqrt(1 + |x~|^2), so the point
    # stays on H^Q) matches central finite differences, row by row; separations from 0.02 to 4
    # exercise both branches of dist (2 asinh(||x - y||_L / 2) and arccosh(-<x, y>_L))
    @jax.jit
    def f(xs, y):
        return L.dist(L.project_to_manifold(jnp.concatenate([jnp.zeros((xs.shape[0], 1)), xs], 1)), y)

    grad_f = jax.jit(jax.grad(lambda xs, y: f(xs, y).sum()))
    xs = x[:, 1:]
    sep = np.geomspace(0.02, 4.0, N)
    y = np.asarray(L.expmap(x, sep[:, None] * _unit_tangent(rng, x)))
    g = np.asarray(grad_f(xs, y))
    h = 1e-6
    fd = np.empty_like(xs)
    for i in range(q):
        e = np.zeros(q)
        e[i] = h
        fd[:, i] = (np.asarray(f(xs + e, y)) - np.asarray(f(xs - e, y))) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-9)
    assert np.all(np.isfinite(g))


def test_check_point_errors():
    x = np.asarray(L.expmap0(np.array([0.3, -0.2])))
    L.check_point(x)
    with pytest.raises(ValueError, match="NaN"):
        L.check_point(np.array([np.nan, 0.0, 0.0]))
    with pytest.raises(ValueError, match="x0 <= 0"):
        L.check_point(-x)
    with pytest.raises(ValueError, match="off the hyperboloid"):
        L.check_point(x * 1.01)
    with pytest.raises(ValueError, match="Q\\+1"):
        L.check_point(np.array([1.0]))


@pytest.mark.parametrize("kappa", [1.0, 10.0, 100.0])
def test_he_kernel_psd(kappa):
    rng = np.random.default_rng(8)
    X = _points(rng, 60, 2, 4.0)
    variance = 1.7
    K = np.asarray(he_kernel(X, X, variance, kappa))
    assert K.shape == (60, 60)
    np.testing.assert_allclose(K, K.T, rtol=1e-14)
    np.testing.assert_allclose(np.diag(K), variance, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(he_kernel_diag(X, variance)), variance)
    eig = np.linalg.eigvalsh(K)
    assert eig.min() >= -1e-8 * eig.max()
    # definition (eq. 10) and rectangular shape
    Z = X[:7]
    Kxz = np.asarray(he_kernel(X, Z, variance, kappa))
    assert Kxz.shape == (60, 7)
    d = np.arccosh(X[5, 0] * Z[3, 0] - X[5, 1:] @ Z[3, 1:])
    np.testing.assert_allclose(Kxz[5, 3], variance * np.exp(-d / kappa), rtol=1e-9)


def test_he_kernel_grad_variance_and_errors():
    rng = np.random.default_rng(9)
    X = _points(rng, N, 2)
    gv = jax.grad(lambda s: he_kernel(X, X, s, 5.0).sum())(2.0)
    np.testing.assert_allclose(float(gv), float(he_kernel(X, X, 1.0, 5.0).sum()), rtol=1e-12)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="kappa"):
            he_kernel(X, X, 1.0, bad)
    with pytest.raises(ValueError, match="variance"):
        he_kernel(X, X, -1.0, 1.0)
