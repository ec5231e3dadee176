"""Tests of the hyperboloid GP-LVM (lvmcore.models.hgplvm) and the MC psi statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial.distance import cdist

from lvmcore.data.synthetic import binary_tree
from lvmcore.kernels.hyperbolic import he_kernel
from lvmcore.linalg import chol_inverse
from lvmcore.manifolds.lorentz import (
    check_point,
    egrad2rgrad,
    inner,
    logmap0,
    origin,
    pairwise_dist,
    to_poincare,
)
from lvmcore.metrics import pearson_distance_correlation
from lvmcore.models.hgplvm import (
    BayesianHyperboloidGPLVM,
    HyperboloidGPLVM,
    bayesian_objective,
    lift,
    sparse_objective,
)
from lvmcore.models.hgplvm.estimators import POINT_INIT_SCALE
from lvmcore.models.hgplvm.full import drift_search
from lvmcore.models.hgplvm.point import (
    chol_inverse_lower,
    point_grads,
    point_kernel,
    point_objective,
    point_value_and_grad,
    reml_projection,
    symmetrize_lower,
)
from lvmcore.models.hgplvm.training import PATIENCE, rule_windows
from lvmcore.pca import pca_start as _pca
from lvmcore.pca import ppca_noise_variance
from lvmcore.psi.monte_carlo import log_sinhc, mc_psi_chunk, sample_wrapped

N, D, Q, KAPPA = 12, 3, 2, 3.0
_psi = jax.jit(mc_psi_chunk)


@pytest.fixture(autouse=True)
def _float64():
    """Every test runs under the scoped float64 switch the model itself uses."""
    with jax.enable_x64(True):
        yield


def _fd(f, x, e=1e-6):
    x = np.asarray(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += e
        xm[i] -= e
        g[i] = (float(f(jnp.asarray(xp))) - float(f(jnp.asarray(xm)))) / (2 * e)
    return g


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(0)
    Y = jnp.asarray(rng.standard_normal((N, D)))
    Xs = jnp.asarray(0.8 * rng.standard_normal((N, Q)))
    Z = lift(Xs[:5] + 0.1)
    eps = jax.random.normal(jax.random.PRNGKey(0), (4, N, Q))
    log_S = jnp.asarray(np.log(rng.uniform(0.01, 0.2, (N, Q))))
    return Y, Xs, Z, eps, log_S


def _objectives(tiny):
    Y, Xs, Z, eps, log_S = tiny
    return {
        "point": lambda xs, h, ls: point_objective(lift(xs), h[0], h[1], Y, KAPPA),
        "sparse": lambda xs, h, ls: sparse_objective(lift(xs), Z, h[0], h[1], Y, KAPPA),
        "bayesian": lambda xs, h, ls: bayesian_objective(lift(xs), ls, Z, h[0], h[1], Y, KAPPA, eps),
    }


@pytest.mark.parametrize("variant", ["point", "sparse", "bayesian"])
def test_gradients_match_finite_differences(tiny, variant):
    _, Xs, _, _, log_S = tiny
    f = jax.jit(_objectives(tiny)[variant])
    h = jnp.array([0.3, 1.2])
    gx, gh, gs = jax.grad(f, argnums=(0, 1, 2))(Xs, h, log_S)
    np.testing.assert_allclose(gx, _fd(lambda x: f(x, h, log_S), Xs), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(gh, _fd(lambda x: f(Xs, x, log_S), h), rtol=1e-5, atol=1e-7)
    if variant == "bayesian":
        np.testing.assert_allclose(gs, _fd(lambda x: f(Xs, h, x), log_S), rtol=1e-5, atol=1e-7)


def test_bayesian_bound_is_sparse_bound_minus_kl_at_vanishing_variance(tiny):
    """With S -> 0 every sample sits at its mean, so the Bayesian bound's psi statistics are the
    sparse bound's kernel sums: bound = sparse bound - KL, the KL from the same samples."""
    Y, Xs, Z, eps, _ = tiny
    X = lift(Xs)
    log_S = jnp.full((N, Q), -40.0)
    bay = float(bayesian_objective(X, log_S, Z, 0.3, 1.2, Y, KAPPA, eps))
    kl = float(mc_psi_chunk(X, jnp.exp(log_S), eps, Y, Z, np.exp(0.3), KAPPA)[3])
    sparse = float(sparse_objective(X, Z, 0.3, 1.2, Y, KAPPA))
    assert bay == pytest.approx(sparse - kl, rel=1e-9)
    assert abs(kl) > 100.0  # the KL of a near-point mass is large: the identity is not trivially 0 = 0


def test_point_value_and_grad_matches_autodiff_and_finite_differences(tiny):
    """The hand-written eq. (4) gradient (one host Cholesky) against autodiff of point_objective
    (same value, same Riemannian gradient, same hyperparameter gradients) and against central
    differences in the spatial coordinates (chain rule through x0 = sqrt(1 + |x~|^2))."""
    Y, Xs, *_ = tiny
    X = lift(Xs)
    vg = jax.jit(point_value_and_grad)
    F, gX, g_ls, g_lb = vg(X, 0.3, 1.2, Y, KAPPA)
    F0, (gX0, g_ls0, g_lb0) = jax.value_and_grad(point_objective, argnums=(0, 1, 2))(X, 0.3, 1.2, Y, KAPPA)
    assert float(F) == pytest.approx(float(F0), rel=1e-12)
    np.testing.assert_allclose(egrad2rgrad(X, gX), egrad2rgrad(X, gX0), rtol=1e-9, atol=1e-10)
    assert float(g_ls) == pytest.approx(float(g_ls0), rel=1e-9)
    assert float(g_lb) == pytest.approx(float(g_lb0), rel=1e-9)
    g_space = np.asarray(gX[:, 1:] + gX[:, :1] * Xs / X[:, :1])
    fd = _fd(lambda xs: point_objective(lift(xs), 0.3, 1.2, Y, KAPPA), Xs)
    np.testing.assert_allclose(g_space, fd, rtol=1e-5, atol=1e-7)
    # a far-out configuration (distances > 2: the arccosh branch of pairwise_dist) and coincident
    # points (the kernel's kink: both implementations use the zero sub-gradient)
    X2 = lift(jnp.concatenate([3.0 * Xs[:-1], 3.0 * Xs[:1]]))
    F2, gX2, *_ = vg(X2, 0.3, 1.2, Y, KAPPA)
    F20, gX20 = jax.value_and_grad(point_objective)(X2, 0.3, 1.2, Y, KAPPA)
    assert float(F2) == pytest.approx(float(F20), rel=1e-10)
    np.testing.assert_allclose(egrad2rgrad(X2, gX2), egrad2rgrad(X2, gX20), rtol=1e-7, atol=1e-8)


def test_point_step_inverse_by_lapack_matches_traced(tiny):
    """The fit's point step takes K^-1 and log|K| from LAPACK potrf + potri on the host
    (chol_inverse) between two compiled halves: same value and gradients as the one traced
    function point_value_and_grad (XLA Cholesky solve); a K that is not positive definite is
    refused."""
    Y, Xs, *_ = tiny
    X = lift(Xs)
    K, E, dE = point_kernel(X, 0.3, 1.2, KAPPA)
    Ki, logdet = chol_inverse(K)
    np.testing.assert_allclose(Ki @ np.asarray(K), np.eye(N), atol=1e-9)
    # the fit's path: potri's lower triangle, symmetrised inside the compiled step
    np.testing.assert_array_equal(np.asarray(symmetrize_lower(chol_inverse_lower(K)[0])), Ki)
    assert logdet == pytest.approx(np.linalg.slogdet(np.asarray(K))[1], rel=1e-12)
    got = point_grads(X, 0.3, 1.2, Y, E, dE, Ki, logdet)
    ref = point_value_and_grad(X, 0.3, 1.2, Y, KAPPA)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
    with pytest.raises(np.linalg.LinAlgError, match="positive definite"):
        chol_inverse(-np.asarray(K))


def test_ppca_noise():
    rng = np.random.default_rng(2)
    # PPCA noise (Tipping & Bishop) against scikit-learn's PCA.noise_variance_ (which divides by n-1)
    from sklearn.decomposition import PCA

    Y = rng.standard_normal((50, 7)) @ rng.standard_normal((7, 7))
    ref = PCA(n_components=2).fit(Y).noise_variance_
    assert ppca_noise_variance(Y, 2) * 50 / 49 == pytest.approx(ref, rel=1e-10)
    assert ppca_noise_variance(Y[:, :2], 2) is None


def test_noise_setting():
    # the data of the convergence-rule and drift tests: the fits share their compiled steps
    Y, *_ = binary_tree(3, n_per_node=5, seed=0)
    kw = dict(variant="point", max_iter=30, tol=0, random_state=0)
    fixed = HyperboloidGPLVM(**kw).fit(Y)  # "auto": PPCA level for the point variant
    assert fixed.noise_fixed_ and fixed.beta_ == pytest.approx(1.0 / ppca_noise_variance(Y, 2), rel=1e-12)
    given = HyperboloidGPLVM(noise=0.05, **kw).fit(Y)
    assert given.beta_ == pytest.approx(20.0, rel=1e-12)
    learned = HyperboloidGPLVM(noise="learn", **kw).fit(Y)
    assert not learned.noise_fixed_
    var_y = np.sum(np.var(Y, axis=0)) / Y.shape[1]
    assert abs(np.log(learned.beta_) - np.log(100.0 / var_y)) > 0.1  # moved from its start
    sparse = HyperboloidGPLVM(variant="sparse", n_inducing=10, max_iter=5, tol=0).fit(Y)
    assert sparse.noise_fixed_ and sparse.beta_ == pytest.approx(fixed.beta_, rel=1e-12)  # same model
    learned_sparse = HyperboloidGPLVM(variant="sparse", n_inducing=10, max_iter=30, tol=0, noise="learn").fit(
        Y
    )
    assert not learned_sparse.noise_fixed_ and learned_sparse.beta_ != pytest.approx(fixed.beta_, rel=1e-3)


def test_sparse_bound_with_all_points_is_exact(tiny):
    Y, Xs, *_ = tiny
    X = lift(Xs)
    exact = float(point_objective(X, 0.3, 1.2, Y, KAPPA))
    sparse = float(sparse_objective(X, X, 0.3, 1.2, Y, KAPPA))
    sub = float(sparse_objective(X, X[:4], 0.3, 1.2, Y, KAPPA))
    assert sparse == pytest.approx(exact, rel=1e-4)
    assert sub < exact


def _restricted_brute(K, Y):
    """log of the integral over a constant mean per column (flat prior) of prod_d N(y_d | m_d 1, K),
    by NumPy inverse and determinant."""
    n, d = Y.shape
    Ki = np.linalg.inv(K)
    o = np.ones(n)
    s = o @ Ki @ o
    P = Ki - np.outer(Ki @ o, Ki @ o) / s
    logdet = np.linalg.slogdet(K)[1]
    return -0.5 * (n - 1) * d * np.log(2 * np.pi) - 0.5 * d * (logdet + np.log(s)) - 0.5 * np.sum(Y * (P @ Y))


def test_restricted_likelihood_brute_force_invariances_and_gradients(tiny):
    """mean="integrated": eq. (4) with a constant mean per column integrated out (REML).  Equal to
    the brute-force integral; unchanged by a shift of Y and by a constant added to the kernel (the
    HE kernel at kappa >> the latent spread is nearly sigma (1 1^T - D / kappa): that constant part
    no longer rewards a smaller sigma); the fit's path (reml_projection + point_grads) gives
    autodiff's value and gradients; the sparse bound with Z = X equals it."""
    Y, Xs = (jnp.asarray(np.asarray(a, dtype=np.float64)) for a in tiny[:2])  # (tiny is made in float32)
    X = lift(Xs)
    Yn = np.asarray(Y)
    K = np.asarray(point_kernel(X, 0.3, 1.2, KAPPA)[0])
    F = float(point_objective(X, 0.3, 1.2, Y, KAPPA, restricted=True))
    assert F == pytest.approx(_restricted_brute(K, Yn), rel=1e-12)
    assert _restricted_brute(K + 5.0, Yn) == pytest.approx(F, rel=1e-10)
    assert float(point_objective(X, 0.3, 1.2, Y + 3.0, KAPPA, restricted=True)) == pytest.approx(F, rel=1e-10)
    assert float(point_objective(X, 0.3, 1.2, Y + 3.0, KAPPA)) != pytest.approx(F, rel=1e-3)
    _, E, dE = point_kernel(X, 0.3, 1.2, KAPPA)
    P, logdet = reml_projection(*chol_inverse_lower(K))
    got = point_grads(X, 0.3, 1.2, Y, E, dE, P, logdet)
    F0, (gX0, g_ls0, g_lb0) = jax.value_and_grad(point_objective, argnums=(0, 1, 2))(
        X, 0.3, 1.2, Y, KAPPA, True
    )
    assert float(got[0]) == pytest.approx(float(F0), rel=1e-12)
    np.testing.assert_allclose(egrad2rgrad(X, got[1]), egrad2rgrad(X, gX0), rtol=1e-9, atol=1e-10)
    assert float(got[2]) == pytest.approx(float(g_ls0), rel=1e-9)
    assert float(got[3]) == pytest.approx(float(g_lb0), rel=1e-9)


def _psi_problem():
    rng = np.random.default_rng(1)
    mu = lift(jnp.asarray(0.7 * rng.standard_normal((5, Q))))
    S = jnp.asarray(rng.uniform(0.05, 0.3, (5, Q)))
    Y = jnp.asarray(rng.standard_normal((5, D)))
    Z = lift(jnp.asarray(rng.standard_normal((4, Q))))
    return mu, S, Y, Z


def test_mc_psi_converges():
    mu, S, Y, Z = _psi_problem()
    ref = _psi(mu, S, jax.random.normal(jax.random.PRNGKey(99), (100_000, 5, Q)), Y, Z, 1.3, KAPPA)
    errs = {}
    for h in (200, 20_000):
        e = []
        for s in range(3):
            est = _psi(mu, S, jax.random.normal(jax.random.PRNGKey(s), (h, 5, Q)), Y, Z, 1.3, KAPPA)
            e.append([float(jnp.linalg.norm(est[k] - ref[k]) / jnp.linalg.norm(ref[k])) for k in (1, 2)])
        errs[h] = np.sqrt(np.mean(np.square(e), axis=0))
    assert np.all(errs[20_000] < 0.02)
    # error shrinks like 1/sqrt(H): 100x the samples -> ~10x smaller (reference noise aside)
    assert np.all(errs[20_000] < errs[200] / 4)
    # sums over rows: two chunks' statistics add up to the one-shot statistics
    eps = jax.random.normal(jax.random.PRNGKey(3), (50, 5, Q))
    full = _psi(mu, S, eps, Y, Z, 1.3, KAPPA)
    parts = [_psi(mu[r], S[r], eps[:, r], Y[r], Z, 1.3, KAPPA) for r in (slice(0, 2), slice(2, 5))]
    for a, b, c in zip(full, *parts, strict=True):
        np.testing.assert_allclose(a, b + c, rtol=1e-12, atol=1e-12)


def test_mc_psi_limits():
    mu, S, Y, Z = _psi_problem()
    eps = jax.random.normal(jax.random.PRNGKey(0), (200, 5, Q))
    # vanishing variance: Psi1 -> K(mu, Z), Psi2 -> K_Zmu K_muZ
    psi0, psi1ty, psi2, _ = mc_psi_chunk(mu, jnp.full_like(S, 1e-16), eps, Y, Z, 1.3, KAPPA)
    K = he_kernel(mu, Z, 1.3, KAPPA)
    np.testing.assert_allclose(psi1ty, K.T @ Y, rtol=1e-6)
    np.testing.assert_allclose(psi2, K.T @ K, rtol=1e-6)
    assert float(psi0) == pytest.approx(5 * 1.3)
    # q equal to the prior: KL -> 0; a narrow q away from the origin has KL > 0
    mu0 = jnp.tile(origin(Q), (5, 1))
    kl = float(_psi(mu, S, eps, Y, Z, 1.3, KAPPA)[3])
    eps = jax.random.normal(jax.random.PRNGKey(1), (20_000, 5, Q))
    kl0 = float(_psi(mu0, jnp.ones((5, Q)), eps, Y, Z, 1.3, KAPPA)[3])
    assert abs(kl0) < 0.05
    assert kl > 0.5
    r = jnp.array([0.0, 1e-4, 0.5, 3.0, 30.0, 400.0])
    np.testing.assert_allclose(log_sinhc(r)[2:5], np.log(np.sinh(r[2:5]) / r[2:5]), rtol=1e-10)
    assert float(log_sinhc(r)[1]) == pytest.approx(1e-8 / 6, rel=1e-6)
    assert float(log_sinhc(r)[5]) == pytest.approx(400.0 - np.log(2.0) - np.log(400.0), rel=1e-12)
    assert np.isfinite(float(log_sinhc(r)[-1])) and float(log_sinhc(r)[0]) == 0.0


# ---------------------------------------------------------------------------------------------- fits
@pytest.fixture(scope="module")
def tree():
    Y, node, codes, _ = binary_tree(4, n_per_node=10, seed=0)
    C = codes[node]
    return Y, cdist(C, C, "cityblock")


@pytest.fixture(scope="module")
def fits(tree):
    Y, _ = tree
    common = dict(n_components=2, kappa=100.0, learning_rate=0.02, random_state=0, tol=0)
    return {
        "point": HyperboloidGPLVM(variant="point", max_iter=500, **common).fit(Y),
        "sparse": HyperboloidGPLVM(variant="sparse", n_inducing=30, max_iter=300, **common).fit(Y),
        "bayesian": BayesianHyperboloidGPLVM(n_inducing=30, max_iter=300, n_samples=5, **common).fit(Y),
    }


def _score(m, Dh):
    Dl = np.asarray(pairwise_dist(m.lorentz_embedding_, m.lorentz_embedding_))
    return pearson_distance_correlation(Dl, Dh, "precomputed", "precomputed")


def test_point_and_bayesian_beat_pca_on_binary_tree(tree, fits):
    # depth-4 tree with 10 samples per node (150 points) to keep the test short (PCA 0.838, point
    # 0.929 with these settings; the sparse and Bayesian scores were not re-recorded after issue 24)
    Y, Dh = tree
    pca = pearson_distance_correlation(_pca(Y, 2), Dh, metric_b="precomputed")
    for variant in ("point", "bayesian"):
        score = _score(fits[variant], Dh)
        assert score > pca, (variant, score, pca)


def test_point_ppca_noise_beats_learned_noise(tree, fits):
    """The point variant's default noise (beta fixed at the 2-D PPCA level) against a learned beta,
    same data and settings otherwise: measured 0.929 vs 0.849 (PCA 0.838); the learned beta ends
    ~120x the fixed one (it fits the within-node jitter)."""
    Y, Dh = tree
    fixed = fits["point"]
    learned = HyperboloidGPLVM(
        n_components=2, kappa=100.0, learning_rate=0.02, random_state=0, tol=0, max_iter=500, noise="learn"
    ).fit(Y)
    pca = pearson_distance_correlation(_pca(Y, 2), Dh, metric_b="precomputed")
    assert fixed.noise_fixed_ and not learned.noise_fixed_
    assert learned.beta_ > 20 * fixed.beta_
    assert _score(fixed, Dh) > _score(learned, Dh) + 0.03
    assert _score(fixed, Dh) > pca + 0.05


@pytest.mark.parametrize("variant", ["point", "sparse", "bayesian"])
def test_fit_outputs(tree, fits, variant):
    Y, Dh = tree
    m = fits[variant]
    n = Y.shape[0]
    assert m.embedding_.shape == (n, 2) and m.lorentz_embedding_.shape == (n, 3)
    assert np.all(np.linalg.norm(m.embedding_, axis=1) < 1.0)
    check_point(m.lorentz_embedding_)
    tr = m.elbo_trace_
    assert len(tr) == m.n_iter_ and np.all(np.isfinite(tr))
    assert tr[-1] > tr[0] and np.mean(tr[-10:]) > np.mean(tr[:10])
    if variant != "bayesian":  # elbo_ is the objective at the fit's last step (one step before the end)
        ls, lb, Yc = np.log(m.sigma_), np.log(m.beta_), jnp.asarray(m._Y)
        if variant == "point":
            f = point_objective(m.lorentz_embedding_, ls, lb, Yc, m.kappa, m.restricted_)
        else:
            f = sparse_objective(m.lorentz_embedding_, m.inducing_, ls, lb, Yc, m.kappa)
        assert float(f) == pytest.approx(m.elbo_, rel=1e-3)
    assert (m.embedding_var_ is not None) == (variant == "bayesian")
    assert _score(m, Dh) > 0.75


@pytest.mark.parametrize("variant", ["point", "sparse", "bayesian"])
def test_transform_places_held_out_rows_between_their_neighbours(tree, fits, variant):
    """New rows halfway (in data space) between a training row and its nearest neighbour: each
    starts at the fitted point of one of the two (both equally near) and the optimisation moves it
    off that start, towards the other, staying in their neighbourhood. With the steps skipped the
    distance to the nearer of the two would be exactly 0. transform writes no state."""
    from lvmcore.graph import knn

    Y, _ = tree
    m = fits[variant]
    idx = np.arange(0, Y.shape[0], 15)
    nb = knn(Y, 1)[0][idx, 0]
    Y_new = 0.5 * (Y[idx] + Y[nb])
    before = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in vars(m).items()}
    P = m.transform(Y_new, max_iter=30)
    L = m.transform_lorentz(Y_new, max_iter=30)
    after = vars(m)
    assert before.keys() == after.keys()  # transform writes no state
    for k, v in before.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(after[k], v)
        else:
            assert after[k] is v or after[k] == v, k
    assert P.shape == (len(idx), 2)
    assert np.all(np.linalg.norm(P, axis=1) < 1.0)
    check_point(L)
    np.testing.assert_allclose(np.asarray(to_poincare(L)), P, atol=1e-12)
    E = m.lorentz_embedding_
    da = np.asarray(pairwise_dist(L, E[idx])).diagonal()
    db = np.asarray(pairwise_dist(L, E[nb])).diagonal()
    dab = np.median(np.asarray(pairwise_dist(E[idx], E[nb])).diagonal())
    assert np.median(np.minimum(da, db)) > 0.2 * dab  # moved off the start
    assert np.median(np.maximum(da, db)) < 3.0 * dab  # and stayed between the two
    L0 = m.transform_lorentz(Y_new, max_iter=0)  # no steps: each row stays at its start
    d0 = np.minimum(*(np.asarray(pairwise_dist(L0, E[j])).diagonal() for j in (idx, nb)))
    assert np.median(d0) < 1e-3 * dab


def test_fit_is_reproducible(tree):
    Y, _ = tree
    # same shapes and settings as the fixture's bayesian fit: the compiled step is reused
    kw = dict(n_inducing=30, n_samples=5, max_iter=15, learning_rate=0.02, random_state=3)
    a = BayesianHyperboloidGPLVM(**kw).fit(Y)
    b = BayesianHyperboloidGPLVM(**kw).fit(Y)
    np.testing.assert_array_equal(a.embedding_, b.embedding_)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kappa=0.0), "kappa"),
        (dict(kappa=-1.0), "kappa"),
        (dict(n_components=1), "n_components"),
        (dict(variant="full"), "variant"),
        (dict(optimizer="sgd"), "optimizer"),
        (dict(n_inducing=0), "n_inducing"),
        (dict(n_inducing="many"), "n_inducing"),
        (dict(tol=-1.0), "tol"),
        (dict(max_iter=0), "max_iter"),
        (dict(noise="fixed"), "noise"),
        (dict(noise=0.0), "noise"),
        (dict(noise=True), "noise"),
        (dict(init="sparse"), "init"),
        (dict(variant="sparse", mean="integrated"), "mean='integrated' with variant='sparse'"),
        (dict(mean="estimated"), "mean"),
        (dict(variant="bayesian"), "one entry, lvmcore.models.BayesianHyperboloidGPLVM"),
    ],
)
def test_bad_parameters(kwargs, match):
    Y = np.random.default_rng(0).standard_normal((10, 3))
    with pytest.raises(ValueError, match=match):
        HyperboloidGPLVM(**kwargs).fit(Y)


def test_bad_data():
    Y = np.random.default_rng(0).standard_normal((10, 3))
    Y[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        HyperboloidGPLVM().fit(Y)
    with pytest.raises(ValueError, match="2-D"):
        HyperboloidGPLVM().fit(np.zeros(5))


def test_bayesian_chunked_map_reduce_equals_in_process(tree, shared_cluster):
    """The Monte-Carlo psi statistics map-reduced over row chunks on a 2-process LocalCluster: the
    bound equals the one-piece evaluation to 1e-10 and the gradients to 1e-9 relative (measured
    3e-10 for the latent points: shape-dependent XLA fusion changes rounding, and the gradient
    through the collapsed bound cancels large terms), and a short fit follows the
    same trajectory (Adam divides by the gradient's running scale, which magnifies round-off in
    near-zero gradient entries, hence the absolute tolerance on the points)."""
    import jax
    from distributed import Client

    from lvmcore.chunks import RowChunks
    from lvmcore.models.hgplvm.objectives import MCStats, mc_objective

    Y, _ = tree
    Yc = Y - Y.mean(0)
    n, d = Yc.shape
    rng = np.random.default_rng(0)
    X = np.asarray(lift(0.3 * rng.standard_normal((n, 2))))
    local = {"X": X, "log_S": np.log(rng.uniform(0.01, 0.1, (n, 2))), "eps": rng.standard_normal((n, 5, 2))}
    glob = {"Z": X[rng.permutation(n)[:20]], "hyp": np.array([0.1, 2.0, 0.0])}  # log sigma, beta, s^2
    one = RowChunks(MCStats(100.0), mc_objective(100.0, n, d), (Yc,), None).value_and_grad(local, glob)
    kw = dict(n_inducing=20, max_iter=5, tol=0, random_state=3, fix_variance_iter=2)
    plain = BayesianHyperboloidGPLVM(**kw).fit(Y)
    with Client(shared_cluster) as client:
        many = RowChunks(MCStats(100.0), mc_objective(100.0, n, d), (Yc,), 40, client=client)
        many = many.value_and_grad(local, glob)
        chunked = BayesianHyperboloidGPLVM(chunks=40, **kw).fit(Y, client=client)
    assert abs(many[0] - one[0]) <= 1e-10 * abs(one[0])
    # the inducing inputs' gradient runs through Kmm^-1, near-singular at kappa = 100 (the kernel
    # is nearly sigma (1 - d / kappa)): measured 1.5e-9 relative, hence 1e-8 for that leaf only
    leaves = jax.tree_util.tree_leaves_with_path
    for (path, a), (_, b) in zip(leaves(many[1:]), leaves(one[1:]), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        tol = 1e-8 if "'Z'" in jax.tree_util.keystr(path) else 1e-9
        assert np.linalg.norm(a - b) <= tol * max(np.linalg.norm(b), 1e-300), jax.tree_util.keystr(path)
    np.testing.assert_allclose(chunked.elbo_trace_, plain.elbo_trace_, rtol=1e-9)
    np.testing.assert_allclose(chunked.lorentz_embedding_, plain.lorentz_embedding_, rtol=0, atol=1e-7)


def test_estimator_contract():
    """LatentModel contract: keyword-only constructor that only stores, NotFittedError, clone,
    random_state default None, graph refused, trace length, variances only for the Bayesian q(X)."""
    from sklearn.base import clone
    from sklearn.exceptions import NotFittedError

    with pytest.raises(TypeError):
        HyperboloidGPLVM(2, 100.0)
    # n_samples at its default, as test_bayesian_warm_start_from_sparse's fit on the same data: the
    # two share their compiled steps
    m = BayesianHyperboloidGPLVM(n_inducing=8, max_iter=60, fix_variance_iter=10)
    assert m.random_state is None and m.get_params()["n_inducing"] == 8
    with pytest.raises(NotFittedError):
        m.transform(np.zeros((2, 3)))
    c = clone(m)
    assert c.get_params() == m.get_params() and c is not m
    Y, *_ = binary_tree(3, n_per_node=5, seed=1)
    with pytest.raises(ValueError, match="graph"):
        m.fit(Y, graph=np.zeros((len(Y), 3), dtype=int))
    m.fit(Y)
    assert len(m.elbo_trace_) == m.n_iter_ and m.elbo_ == m.elbo_trace_[-1]
    assert m.embedding_var_.shape == (len(Y), 2) and np.all(m.embedding_var_ > 0)
    assert m.inducing_.shape == (8, 3)
    check_point(m.inducing_)
    p = HyperboloidGPLVM(max_iter=5).fit(Y)
    assert p.embedding_var_ is None and p.inducing_ is None


def test_point_starts_from_pca_near_the_origin():
    """init_scale="auto": the point variant starts from PCA scaled to tangent radius 0.2 (the fit
    maps these tangent vectors by expmap0, so they are the hyperbolic radii), the others from
    radius 1; an explicit init_scale overrides it."""
    Y, *_ = binary_tree(3, n_per_node=5, seed=1)
    norms = np.linalg.norm(_pca(Y, 2), axis=1)
    for kw, r0 in (({}, POINT_INIT_SCALE), ({"variant": "sparse"}, 1.0), ({"init_scale": 0.7}, 0.7)):
        P = HyperboloidGPLVM(**kw).init_tangent(Y, np.random.default_rng(0))
        np.testing.assert_allclose(np.linalg.norm(P, axis=1), r0 * norms / norms.max(), atol=1e-5)


def test_convergence_rule_stops_before_the_budget():
    """The fit stops by its convergence rule (window means of the objective, their gain per data
    value), not the budget; with tol=0 it runs the budget. (tol = 5e-4 per value: a tight tol lets
    this small fit creep on for thousands of iterations, and where it stops then depends on XLA's
    threading.)"""
    Y, *_ = binary_tree(3, n_per_node=5, seed=0)
    tol = 5e-4
    nv = Y.size  # N x D
    m = HyperboloidGPLVM(variant="sparse", n_inducing=10, max_iter=5000, tol=tol, random_state=0).fit(Y)
    assert m.converged_ and m.n_iter_ < 5000 and m.n_iter_ % 25 == 0
    w = m.elbo_trace_.reshape(-1, 25).mean(axis=1)  # window means
    window, p = rule_windows("sparse", m.setting("drift_every"))
    assert window == 25 and p == PATIENCE
    assert max(w[-p:]) - max(w[:-p]) <= tol * nv  # plateau: the rule's condition
    if len(w) > 2 * p:  # first checked after 2 p windows; one window earlier it had not converged
        assert max(w[-p - 1 : -1]) - max(w[: -p - 1]) > tol * nv
    full = HyperboloidGPLVM(variant="sparse", n_inducing=10, max_iter=60, tol=0, random_state=0).fit(Y)
    assert full.n_iter_ == 60 and not full.converged_


def test_drift_search_moves_only_uphill():
    """The drift line search (every 250 iterations by default), from the state of a 100-iteration
    fit with no drift: along a small gradient step of eq. (4) (restricted, the default; autodiff of
    :func:`point_objective` in the points' spatial coordinates), given as the change of the tangent
    coordinates at the origin, it keeps the largest a = 1, 2, 4, ... whose move raised the
    objective, keeps the points on the hyperboloid, carries the Adam moments into the new tangent
    spaces, and leaves the state alone (a = 0) along the reverse, downhill, direction."""
    Y, *_ = binary_tree(3, n_per_node=5, seed=0)
    m = HyperboloidGPLVM(variant="point", max_iter=100, tol=0, random_state=0, drift_every=0).fit(Y)
    Yc, lb, ls = jnp.asarray(m._Y), np.log(m.beta_), np.log(m.sigma_)
    assert m.restricted_

    def value(X):
        return float(point_objective(X, ls, lb, Yc, 100.0, restricted=True))

    X = jnp.asarray(m.lorentz_embedding_)
    st = {"X": X, "Z": None, "hyp": jnp.array([ls, lb, 0.0]), "mX": 0.1 * egrad2rgrad(X, jnp.ones_like(X))}
    xs = X[:, 1:]
    g = jax.grad(lambda v: point_objective(lift(v), ls, lb, Yc, 100.0, restricted=True))(xs)
    step = lift(xs + 1e-4 * g / jnp.max(jnp.abs(g)))
    f0 = value(X)
    assert value(step) > f0
    up, here = {"X": logmap0(step), "ls": ls}, {"X": logmap0(X), "ls": ls}
    new, a = drift_search(st, up, here, Yc, 100.0, True)
    assert a in (1, 2, 4, 8, 16, 32, 64)
    assert value(new["X"]) > f0
    np.testing.assert_allclose(np.asarray(new["X"]), np.asarray(_drift_move_ref(X, up, here, a)), atol=1e-9)
    check_point(np.asarray(new["X"]), atol=1e-8)
    assert np.allclose(inner(new["X"], new["mX"]), 0.0, atol=1e-8)  # the moments in the new tangent spaces
    same, a = drift_search(st, here, up, Yc, 100.0, True)  # the reverse: downhill, no move
    assert a == 0 and same is st


def _drift_move_ref(pts, now, prev, a):
    """The drift move written out: each point moved by a times the drift of its averaged position
    (at the later average, the tangent pointing away from the earlier one), parallel-transported
    from the later average to the point."""
    from lvmcore.manifolds.lorentz import expmap, expmap0, logmap, proj, transp

    p_now, p_prev = expmap0(now["X"]), expmap0(prev["X"])
    v = proj(pts, transp(p_now, pts, -logmap(p_now, p_prev)))
    return expmap(pts, a * v)


def test_drift_every_setting():
    """drift_every: "auto" is 250 for the point variant and 0 (off) for sparse, which refuses a
    period, and for the Bayesian model, which has no such parameter; with 0 the rule's patience is
    six windows, with 250 a whole cycle and one."""
    assert HyperboloidGPLVM(variant="point").setting("drift_every") == 250
    assert HyperboloidGPLVM(variant="sparse").setting("drift_every") == 0
    assert BayesianHyperboloidGPLVM().setting("drift_every") == 0
    assert rule_windows("point", 0) == (25, 6) and rule_windows("point", 250) == (25, 11)
    assert rule_windows("bayesian", 0) == (50, 2)
    Y = np.random.default_rng(0).standard_normal((20, 3))
    with pytest.raises(ValueError, match="drift_every=100 with variant='sparse'.*point variant"):
        HyperboloidGPLVM(variant="sparse", drift_every=100).fit(Y)
    Y, *_ = binary_tree(3, n_per_node=5, seed=0)
    m = HyperboloidGPLVM(variant="point", max_iter=100, tol=0, drift_every=25, random_state=0).fit(Y)
    assert [i for i, _ in m.drift_moves_] == [50, 75, 100]  # the first search needs two averages
    assert HyperboloidGPLVM(variant="point", max_iter=100, tol=0, drift_every=0).fit(Y).drift_moves_ == []


def test_importing_changes_no_global_jax_setting():
    """The model's own modules switch float64 on only inside their calls (jax.enable_x64), never by
    jax.config.update at import: every config update made while importing them is recorded with
    its calling file (lorentz.py and chunks.py, imported by them, are other modules' business)."""
    import subprocess
    import sys

    code = (
        "import sys, jax\n"
        "calls = []\n"
        "orig = jax.config.update\n"
        "def rec(name, val):\n"
        "    calls.append((sys._getframe(1).f_code.co_filename, name))\n"
        "    return orig(name, val)\n"
        "jax.config.update = rec\n"
        "import lvmcore.kernels.hyperbolic, lvmcore.psi.monte_carlo, lvmcore.models.hgplvm\n"
        "print(repr(calls))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    calls = eval(out.stdout.strip())
    mine = ("hyperbolic.py", "monte_carlo.py")
    assert not [c for c in calls if c[0].endswith(mine) or "/models/hgplvm/" in c[0]], calls


@pytest.mark.parametrize("key", ["hgplvm_point", "hgplvm_sparse", "hgplvm_bayesian"])
def test_sweep_fits_and_scores_every_variant(tmp_path, key):
    """The sweep's registry keys construct the model, and the evaluation stores Qlocal / Qglobal
    computed from hyperbolic distances (equal to the metric on the Poincare-ball distances)."""
    from lvmcore.metrics import quality_scores
    from tasks.evaluate import poincare_distances
    from tasks.fit import fit_point
    from tasks.ingest import ingest_dataset
    from tasks.inputs import load_data

    path = str(tmp_path / "tree.zarr")
    ingest_dataset({"name": "binary_tree", "depth": 3, "n_per_node": 6, "seed": 0}, path)
    point = {"kappa": 100.0, "latent_dim": 2, "seed": 0}
    from tasks.evaluate import evaluate_point

    res = evaluate_point(fit_point(key, {"max_iter": 30}, path, None, (0, 0, 0), point), path)
    assert res.status == "done" and res.error == "", res.error
    assert 0 < res.n_iter <= 30
    Y = load_data(path)["Y"]
    ref = quality_scores(Y, poincare_distances(res.embedding), metric_x="precomputed")
    assert (res.metrics["qlocal"], res.metrics["qglobal"]) == pytest.approx(ref[:2], abs=1e-12)


def test_kl_of_wrapped_normal_matches_quadrature():
    """The Monte-Carlo KL(q || p) of :func:`mc_psi_chunk` (closed-form Gaussian entropy + MC
    Jacobian and prior terms) against an independent Gauss-Hermite quadrature over the tangent
    coordinates v of q (Q = 2: the Jacobian of x = exp_mu(PT(v)) cancels the wrapped density's
    (r / sinh r) factor, so KL = E_{v ~ N(0, S)}[log q(x(v)) - log p(x(v))]), with log p from the
    arccosh of the time coordinate (not logmap0); the quadrature itself against the Euclidean
    closed form at mu = mu0 (where the two Jacobians cancel)."""
    mu = lift(jnp.array([[0.0, 0.0], [0.7, -0.4], [1.5, 0.9]]))
    S = jnp.array([[0.3, 0.3], [0.05, 0.2], [0.4, 0.1]])
    Z, Y = lift(jnp.zeros((1, Q))), jnp.zeros((3, 1))
    t, w = np.polynomial.hermite_e.hermegauss(40)  # nodes for the weight exp(-t^2 / 2)
    e = np.stack(np.meshgrid(t, t, indexing="ij"), -1).reshape(-1, 1, Q)
    ww = np.outer(w, w).ravel() / np.sum(w) ** 2
    x, r = (np.asarray(a) for a in sample_wrapped(mu, S, jnp.asarray(np.repeat(e, 3, axis=1))))
    v = e * np.sqrt(np.asarray(S))[None]  # (G, 3, Q)
    lsc = lambda a: np.log(np.sinh(np.maximum(a, 1e-12)) / np.maximum(a, 1e-12))  # noqa: E731
    r0 = np.arccosh(np.maximum(x[..., 0], 1.0))
    eps = jax.random.normal(jax.random.PRNGKey(5), (5_000, 3, Q))
    for log_s2 in (0.0, np.log(2.5)):
        log_q = -np.log(2 * np.pi) - 0.5 * np.sum(np.log(S), 1) - 0.5 * np.sum(v * v / S, -1) - lsc(r)
        log_p = -np.log(2 * np.pi) - log_s2 - 0.5 * r0**2 / np.exp(log_s2) - lsc(r0)
        kl_rows = ww @ (log_q - log_p)  # (3,)
        s = np.asarray(S[0]) / np.exp(log_s2)
        assert kl_rows[0] == pytest.approx(0.5 * np.sum(s - 1.0 - np.log(s)), rel=1e-8)
        kl_mc = float(_psi(mu, S, eps, Y, Z, 1.0, KAPPA, log_s2)[3])
        assert kl_mc == pytest.approx(float(np.sum(kl_rows)), rel=0.01)
