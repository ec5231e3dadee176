"""lvmcore.optim (one Adam, Riemannian with Euclidean the trivial case; the L-BFGS wrapper and its
stopping rule per data value) and lvmcore.graph.knn_query (the nearest-training-row start)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lvmcore.graph import knn_query
from lvmcore.manifolds.lorentz import check_point, expmap0, inner
from lvmcore.optim import Lorentz, adam, lbfgs, plateau, stalled


def test_adam_is_one_formula_for_numpy_and_jax_and_per_row_counts():
    rng = np.random.default_rng(0)
    p, g = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    m, v = 0.1 * rng.standard_normal((5, 3)), rng.uniform(0.1, 1.0, (5, 3))
    out_np = adam(p, g, m, v, 3.0, 0.05)
    with jax.enable_x64(True):
        out_jax = adam(jnp.asarray(p), jnp.asarray(g), jnp.asarray(m), jnp.asarray(v), 3.0, 0.05)
    for a, b in zip(out_np, out_jax, strict=True):
        assert isinstance(a, np.ndarray)
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-14)
    # written out (Kingma and Ba, ascent): the bias-corrected moments
    m1, v1 = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
    want = p + 0.05 * (m1 / (1 - 0.9**3)) / (np.sqrt(v1 / (1 - 0.999**3)) + 1e-8)
    np.testing.assert_allclose(out_np[0], want, rtol=1e-14)
    # one step count per row: row i as if stepped alone with its own count
    t = np.array([1.0, 2.0, 3.0, 7.0, 20.0])
    rows = adam(p, g, m, v, t[:, None], 0.05)[0]
    for i in range(5):
        np.testing.assert_allclose(rows[i], adam(p[i], g[i], m[i], v[i], t[i], 0.05)[0], rtol=1e-14)


def test_riemannian_adam_stays_on_the_hyperboloid_and_takes_per_point_counts():
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        X = expmap0(jnp.asarray(rng.uniform(-1, 1, (6, 2))))
        g = jnp.asarray(rng.standard_normal((6, 3)))
        m, v = jnp.zeros((6, 3)), jnp.zeros(6)
        Xn, mn, vn = adam(X, g, m, v, 1.0, 0.1, Lorentz)
        check_point(Xn)
        np.testing.assert_allclose(inner(Xn, mn), 0.0, atol=1e-12)  # moments in the new tangent spaces
        assert np.all(vn > 0)
        t = jnp.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        per = adam(X, g, m + 0.01, v + 0.1, t, 0.1, Lorentz)[0]
        for i in range(6):
            one = adam(
                X[i : i + 1], g[i : i + 1], m[i : i + 1] + 0.01, v[i : i + 1] + 0.1, t[i], 0.1, Lorentz
            )[0]
            np.testing.assert_allclose(per[i], one[0], rtol=1e-12)


def test_lbfgs_stops_by_the_gain_per_data_value_whatever_the_shift():
    """The same iterations and the same stop for f(x) + shift: the rule compares the gain per data
    value, not the gain relative to |f|, which a shift changes (a bound that is a density of Y
    shifts by -N D log c when Y is scaled by c)."""
    A = np.diag(np.linspace(1.0, 30.0, 8))
    b = np.linspace(-1, 1, 8)

    def make(c, shift):
        return lambda x: (c * (0.5 * x @ A @ x - b @ x) + shift, c * (A @ x - b))

    ref = lbfgs(make(1.0, 0.0), np.zeros(8), n_values=100, max_iter=200, tol=1e-12)
    assert ref.converged and ref.nit > 3
    np.testing.assert_allclose(ref.x, np.linalg.solve(A, b), rtol=1e-4)
    for shift in (1e4, -1e3, 1e-3):  # (a shift far above the gains loses them to round-off)
        r = lbfgs(make(1.0, shift), np.zeros(8), n_values=100, max_iter=200, tol=1e-12)
        assert r.converged and r.nit == ref.nit, shift
        np.testing.assert_allclose(r.x, ref.x, rtol=1e-6)
    assert stalled(1e-3, 1e-5, 100) and not stalled(2e-3, 1e-5, 100) and not stalled(np.nan, 1.0, 1)
    budget = lbfgs(make(1.0, 0.0), np.zeros(8), n_values=100, max_iter=2, tol=0.0)
    assert not budget.converged and budget.nit == 2


def test_lbfgs_at_fs_round_off_converges_but_a_failed_first_step_does_not():
    """f known only to a grid of 1e-4 (the round-off of a bound whose constant is large: data
    scaled by 1e-12 or 1e6), the gradient exact: L-BFGS-B stops by its ftol, the restart's first
    line search finds no lower f, and the fit has converged: x is stationary to f's round-off
    (the quadratic's gain from x to the optimum is below the grid). A first segment whose first
    step fails (a gradient of the wrong sign) has not."""
    A = np.diag([1.0, 10.0, 100.0])
    opt = 1.0 / np.diag(A)

    def grid(x):
        q = 0.5 * x @ A @ x - x.sum()
        return np.round(q / 1e-4) * 1e-4, A @ x - 1.0

    r = lbfgs(grid, np.zeros(3), n_values=1.0, max_iter=200, tol=1e-12)
    assert r.converged and r.nit < 200
    assert 0.5 * (r.x - opt) @ A @ (r.x - opt) < 1e-4  # within f's round-off of the optimum
    wrong = lambda x: (0.5 * x @ A @ x - x.sum(), -(A @ x - 1.0))  # noqa: E731
    r = lbfgs(wrong, np.zeros(3), n_values=1.0, max_iter=200, tol=1e-12)
    assert not r.converged and r.nit == 0


def test_the_window_rule_is_the_stopping_rule_on_window_means_and_ignores_the_bounds_level():
    """plateau: the best recent window mean's gain over the best earlier one, per data value; a
    bound moved by a constant (Y scaled by c moves a density's bound by -N D log c) stops at the
    same window."""
    rng = np.random.default_rng(0)
    gains = 1e-3 * 0.5 ** np.arange(30)  # window means rising ever more slowly, with noise below
    means = np.cumsum(gains) + 1e-7 * rng.standard_normal(30)
    n_values, tol, p = 200, 1e-8, 3

    def first_stop(m):
        return next(i for i in range(2 * p, len(m) + 1) if plateau(list(m[:i]), p, tol, n_values))

    stop = first_stop(means)
    assert 2 * p < stop < len(means)
    gain = max(means[stop - p : stop]) - max(means[: stop - p])
    assert gain <= tol * n_values < max(means[stop - 1 - p : stop - 1]) - max(means[: stop - 1 - p])
    for shift in (-1e4, 1e4, 0.37):
        assert first_stop(means + shift) == stop, shift
    assert not plateau([0.0, 1.0, np.nan], 1, tol, n_values)  # a non-finite window is no plateau


@pytest.mark.parametrize("k", [1, 3])
def test_knn_query_is_the_exact_nearest_rows_in_blocks(k, monkeypatch):
    import lvmcore.graph as graph

    rng = np.random.default_rng(2)
    R = rng.standard_normal((200, 4))
    Q = np.vstack([rng.standard_normal((30, 4)), R[:5]])  # the last five are training rows
    monkeypatch.setattr(graph, "QUERY_BLOCK_ENTRIES", 1000)  # 5 query rows per block
    idx, dist = knn_query(R, Q, k)
    d = np.linalg.norm(Q[:, None] - R[None], axis=-1)
    want = np.argsort(d, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_allclose(dist, np.take_along_axis(d, want, axis=1), atol=1e-7)
    np.testing.assert_array_equal(idx[-5:, 0], np.arange(5))  # a training row finds itself
    tie = knn_query(np.array([[1.0, 0.0], [-1.0, 0.0]]), np.zeros((1, 2)))[0]
    assert tie[0, 0] == 0  # ties: the lower index
    with pytest.raises(ValueError, match="same columns"):
        knn_query(R, Q[:, :3])
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 200\]"):
        knn_query(R, Q, 201)
