"""Minibatch Bayesian hyperboloid GP-LVM (lvmcore/models/hgplvm/minibatch.py) against independent
references: the batch estimates average to the full uncollapsed bound; at q(u)'s optimum that bound
is the full-batch collapsed bound of hgplvm.bayesian_objective (same draws); the per-point formula
of the final bound equals the psi-statistics form; gradients by central differences; and the
sweep model's choice of training."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lvmcore.data import synthetic as S
from lvmcore.linalg import KERNEL_JITTER
from lvmcore.manifolds.lorentz import expmap0
from lvmcore.models.hgplvm import (
    FULL_BATCH_MAX_N,
    BayesianHyperboloidGPLVM,
    bayesian_objective,
    sparse_objective,
)
from lvmcore.models.hgplvm.objectives import minibatch_bound as _minibatch_bound
from lvmcore.models.hgplvm.objectives import optimal_qu, point_terms
from lvmcore.precision import jit64
from lvmcore.uncollapsed import kl_qu

minibatch_bound = jit64(_minibatch_bound)  # compiled once per shape: the tests run in a second

KAPPA = 3.0  # a short length scale: the kernel is far from linear over the latent spread


def _problem(n=24, m=5, d=3, q=2, h=3, seed=0):
    """Random q(X) on L^2, globals, a positive definite q(v), data and draws (float64)."""
    rng = np.random.default_rng(seed)
    with jax.enable_x64(True):
        local = {
            "X": expmap0(jnp.asarray(rng.normal(0, 0.7, (n, q)))),
            "log_S": jnp.asarray(np.log(rng.uniform(0.02, 0.3, (n, q)))),
        }
        glob = {
            "Z": expmap0(jnp.asarray(rng.normal(0, 0.7, (m, q)))),
            "hyp": jnp.array([np.log(1.3), np.log(4.0), np.log(0.8)]),
        }
        A = rng.normal(size=(m, m))
        qu = {"m": jnp.asarray(rng.normal(size=(m, d))), "P": jnp.asarray(np.eye(m) + A @ A.T / m)}
        Y = jnp.asarray(rng.normal(size=(n, d)))
        eps = jnp.asarray(rng.normal(size=(h, n, q)))
    return local, glob, qu, Y, eps


def _rows(tree, sl):
    return {k: v[sl] for k, v in tree.items()}


def test_batch_estimates_average_to_the_full_uncollapsed_bound():
    local, glob, qu, Y, eps = _problem()
    n = Y.shape[0]
    full, _ = minibatch_bound(local, glob, qu, Y, eps, n, 1.0, KAPPA)
    ests = [
        minibatch_bound(_rows(local, sl), glob, qu, Y[sl], eps[:, sl], n, n / 6, KAPPA)[0]
        for sl in (slice(i, i + 6) for i in range(0, n, 6))
    ]
    assert np.isfinite(float(full))
    np.testing.assert_allclose(np.mean(ests), float(full), rtol=1e-11)
    # and a single batch is not the full bound (the test can fail)
    assert abs(float(ests[0]) - float(full)) > 1e-3 * abs(float(full))


def test_at_the_optimal_qu_the_bound_is_the_collapsed_bound_of_hgplvm():
    local, glob, qu, Y, eps = _problem(seed=1)
    n = Y.shape[0]
    _, stats = minibatch_bound(local, glob, qu, Y, eps, n, 1.0, KAPPA)
    best = optimal_qu(stats, glob, KAPPA)
    F_opt, _ = minibatch_bound(local, glob, best, Y, eps, n, 1.0, KAPPA)
    h = glob["hyp"]
    with jax.enable_x64(True):
        collapsed = bayesian_objective(local["X"], local["log_S"], glob["Z"], h[0], h[1], Y, KAPPA, eps, h[2])
    np.testing.assert_allclose(float(F_opt), float(collapsed), rtol=1e-10)
    # any other q(u) is lower (it is the maximiser)
    for s in (0.5, 1.5):
        other = {"m": best["m"] * s, "P": best["P"]}
        assert float(minibatch_bound(local, glob, other, Y, eps, n, 1.0, KAPPA)[0]) < float(F_opt)
    assert float(minibatch_bound(local, glob, qu, Y, eps, n, 1.0, KAPPA)[0]) < float(F_opt)


def test_the_per_point_formula_equals_the_psi_statistics_form():
    local, glob, qu, Y, eps = _problem(seed=2)
    n = Y.shape[0]
    F, _ = minibatch_bound(local, glob, qu, Y, eps, n, 1.0, KAPPA)
    lt = point_terms(local, glob, qu, Y, eps, KAPPA)
    assert lt.shape == (eps.shape[0], n)
    np.testing.assert_allclose(np.asarray(lt).mean(0).sum() - float(kl_qu(qu)), float(F), rtol=1e-11)


def test_gradients_match_central_differences():
    local, glob, qu, Y, eps = _problem(n=8, seed=3)

    def f(hyp, log_S):
        g = {"Z": glob["Z"], "hyp": hyp}
        lo = {"X": local["X"], "log_S": log_S}
        return minibatch_bound(lo, g, qu, Y, eps, 40.0, 5.0, KAPPA)[0]

    f = jit64(f)
    with jax.enable_x64(True):
        gh, gs = jit64(jax.grad(f, argnums=(0, 1)))(glob["hyp"], local["log_S"])
        h = 1e-6
        for i in range(3):
            e = jnp.zeros(3).at[i].set(h)
            fd = (f(glob["hyp"] + e, local["log_S"]) - f(glob["hyp"] - e, local["log_S"])) / (2 * h)
            np.testing.assert_allclose(float(gh[i]), float(fd), rtol=1e-5, atol=1e-6)
        e = jnp.zeros_like(local["log_S"]).at[3, 1].set(h)
        fd = (f(glob["hyp"], local["log_S"] + e) - f(glob["hyp"], local["log_S"] - e)) / (2 * h)
        np.testing.assert_allclose(float(gs[3, 1]), float(fd), rtol=1e-5, atol=1e-6)


#: small fits, all of one shape (so the compiled steps are shared by the tests)
FIT = dict(n_inducing=10, batch_size=50, max_iter=60, tol=0.0, fix_variance_iter=10, random_state=0)


@pytest.fixture(scope="module")
def roll():
    return np.asarray(S.swiss_roll(300, seed=0)[0])


@pytest.mark.slow
def test_fit_visits_every_point_and_its_trace_ends_at_the_bound(roll):
    """The one fit test (compiling the steps costs tens of seconds): the sweep's model forced to
    minibatch training against the same fit without the per-point pass."""
    a = BayesianHyperboloidGPLVM(training="minibatch", local_iter=0, **FIT).fit(roll)
    b = BayesianHyperboloidGPLVM(training="minibatch", local_iter=15, **FIT).fit(roll)
    assert b.training_ == "minibatch" and b.minibatch_ == 1.0
    for m in (a, b):
        assert m.embedding_.shape == (300, 2) and np.all(np.linalg.norm(m.embedding_, axis=1) < 1)
        assert m.embedding_var_.shape == (300, 2) and np.all(m.embedding_var_ > 0)
        assert m.elbo_trace_[-1] == m.elbo_ and m.n_iter_ == len(m.elbo_trace_) == 61
        assert np.isfinite(m.elbo_) and 0 < m.elbo_se_ < 0.01 * abs(m.elbo_)
    # 60 steps of 50 rows reach every point about 10 times; the per-point pass moves every one of
    # them further and raises the bound by far more than its standard error
    moved = np.linalg.norm(b.lorentz_embedding_ - a.lorentz_embedding_, axis=1)
    assert np.all(moved > 0)
    assert b.elbo_ - a.elbo_ > 5 * np.hypot(a.elbo_se_, b.elbo_se_)
    # held-out rows halfway (in data space) between a training row and its nearest neighbour:
    # transform starts each at the fitted mean of one of the two (equally near), and its per-point
    # steps move it off that start and keep it between the two; with no steps it stays at the start
    from lvmcore.graph import knn
    from lvmcore.manifolds.lorentz import from_poincare, pairwise_dist

    idx = np.arange(0, 300, 15)
    nb = knn(roll, 1)[0][idx, 0]
    held = 0.5 * (roll[idx] + roll[nb])
    E = b.lorentz_embedding_
    dab = np.median(np.asarray(pairwise_dist(E[idx], E[nb])).diagonal())

    def to_pair(P):  # distances to the two neighbours' fitted means, nearer first
        L = np.asarray(from_poincare(P))
        da, db = (np.asarray(pairwise_dist(L, E[j])).diagonal() for j in (idx, nb))
        return np.minimum(da, db), np.maximum(da, db)

    near0, _ = to_pair(b.transform(held, max_iter=0))
    assert np.median(near0) < 1e-3 * dab  # no steps: at the start
    near, far = to_pair(b.transform(held))
    assert np.median(near) > 0.2 * dab  # moved off the start
    assert np.median(far) < 3.0 * dab  # and stayed between the two


def test_the_rules_full_pass_bound_is_eq6_at_draws_fixed_by_its_key():
    """The Bayesian minibatch fit's plateau rule reads _full_bound: one pass over all rows in chunks
    (here 3 of 8), q(v) at its optimum, less the KL of q(X): hgplvm.bayesian_objective (the
    collapsed eq. 6) at the draws its key gives chunk by chunk. The same key gives the same value
    (common random numbers from window to window); another key another value."""
    from lvmcore.models.hgplvm.minibatch import _chunks, _full_bound

    local, glob, _, Y, _ = _problem(seed=6)
    n, H = Y.shape[0], 3
    X, log_S = np.asarray(local["X"]), np.asarray(local["log_S"])
    key = jax.random.PRNGKey(11)
    with jax.enable_x64(True):  # as in the fit (the draws of a key depend on the precision)
        F, qu = _full_bound(X, log_S, glob, Y, key, H, KAPPA, KERNEL_JITTER, 10)
        again = _full_bound(X, log_S, glob, Y, key, H, KAPPA, KERNEL_JITTER, 10)[0]
        other = _full_bound(X, log_S, glob, Y, jax.random.PRNGKey(12), H, KAPPA, KERNEL_JITTER, 10)[0]
        eps = jnp.concatenate(
            [
                jax.random.normal(jax.random.fold_in(key, i), (H, sl.stop - sl.start, 2))
                for i, sl in enumerate(_chunks(n, 10))
            ],
            axis=1,
        )
        h = glob["hyp"]
        collapsed = bayesian_objective(local["X"], local["log_S"], glob["Z"], h[0], h[1], Y, KAPPA, eps, h[2])
    assert len(_chunks(n, 10)) == 3
    np.testing.assert_allclose(F, float(collapsed), rtol=1e-10)
    assert again == F
    assert abs(other - F) > 1e-6 * abs(F)


@pytest.mark.slow
def test_bayesian_minibatch_rule_stops_on_the_full_pass_bound_after_whole_epochs(roll, monkeypatch):
    """The minibatch Bayesian fit with tol > 0: the rule is read after every window of whole epochs
    (6 batches of 50 of the 300 rows, 9 epochs = 54 steps), on the full-pass bound at one draw per
    point, the same at every window (one key; the final pass's q(v) another, with H = n_samples),
    which is a function of the state alone (recomputed from the recorded state it is the same
    number); the fit stops at the first window where the full-batch Bayesian rule (patience 2,
    after the warm-up) fires on those values, before its budget. A budget that ends before the
    rule could first stop the fit (1 + 2 x 2 windows) runs no pass."""
    import lvmcore.models.hgplvm.minibatch as svi
    from lvmcore.optim import window_plateau

    calls, full_bound = [], svi._full_bound

    def spy(X, log_S, glob, Y, key, *rest):
        F, qu = full_bound(X, log_S, glob, Y, key, *rest)
        calls.append(((X.copy(), log_S.copy(), glob, Y, key, *rest), np.asarray(key), F))
        return F, qu

    monkeypatch.setattr(svi, "_full_bound", spy)
    kw = dict(FIT, max_iter=1000, tol=0.1, local_iter=0)  # stops at about 540 steps
    m = BayesianHyperboloidGPLVM(training="minibatch", **kw).fit(roll)
    nd, window, K = roll.size, 54, len(calls) - 1  # the last call: the final bound's pass
    assert m.converged_ and m.n_steps_ < kw["max_iter"] and m.n_steps_ == K * window
    bounds = [c[-1] for c in calls[:K]]
    np.testing.assert_array_equal(m.window_bounds_, bounds)
    assert all(np.array_equal(c[1], calls[0][1]) for c in calls[:K])  # one key for the rule
    assert not np.array_equal(calls[K][1], calls[0][1])  # the final pass's draws are others
    assert [c[0][5] for c in calls] == [1] * K + [m.n_samples]  # draws per point
    with jax.enable_x64(True):  # as in the fit
        assert all(full_bound(*args)[0] == F for args, _, F in (calls[0], calls[K - 1]))
    # the rule on these values fires at the last window and at no earlier one
    assert window_plateau(bounds, 1, 2, kw["tol"], nd, 1)
    assert not any(window_plateau(bounds[:k], 1, 2, kw["tol"], nd, 1) for k in range(1, K))
    assert K >= 5  # the warm-up window and 2 x 2 more
    calls.clear()
    short = BayesianHyperboloidGPLVM(training="minibatch", **dict(kw, max_iter=5 * window - 1)).fit(roll)
    assert len(calls) == 1 and short.window_bounds_.size == 0 and not short.converged_


def test_sweep_model_chooses_training_by_n_and_refuses_what_it_cannot_honour(roll):
    est = BayesianHyperboloidGPLVM()
    assert est.resolve_training(FULL_BATCH_MAX_N) == "full"
    assert est.resolve_training(FULL_BATCH_MAX_N + 1) == "minibatch"
    assert BayesianHyperboloidGPLVM(training="minibatch").resolve_training(10) == "minibatch"
    big = np.zeros((FULL_BATCH_MAX_N + 1, 3)) + np.arange(3)
    with pytest.raises(ValueError, match=r"chunks=4 .*full-batch.*N = 5,001 > 5,000.*training='full'"):
        BayesianHyperboloidGPLVM(chunks=4).fit(big)
    with pytest.raises(ValueError, match=r"optimizer='rsgd' .*full-batch.*training='minibatch'"):
        BayesianHyperboloidGPLVM(optimizer="rsgd", training="minibatch").fit(roll)
    with pytest.raises(ValueError, match=r"batch_size \(1000\) exceeds the number of points \(300\)"):
        BayesianHyperboloidGPLVM(training="minibatch").fit(roll)
    with pytest.raises(ValueError, match=r"n_inducing \(400\) exceeds the number of points \(300\)"):
        BayesianHyperboloidGPLVM(training="minibatch", n_inducing=400, batch_size=10).fit(roll)


def test_one_bayesian_entry_with_one_set_of_defaults(roll):
    """The Bayesian hyperboloid GP-LVM has one entry: HyperboloidGPLVM(variant="bayesian") is
    refused naming it, lvmcore.models names no second estimator of it, and its full-batch fit runs
    on itself with its own parameters (the budget it was given is the one the fit ran to). A fit
    after a fit of the other training carries none of the earlier fit's attributes."""
    import inspect

    import lvmcore.models
    from lvmcore.models.hgplvm import HyperboloidGPLVM

    with pytest.raises(ValueError, match="one entry, lvmcore.models.BayesianHyperboloidGPLVM"):
        HyperboloidGPLVM(variant="bayesian").fit(roll)
    assert [n for n in lvmcore.models.__all__ if "Hyperboloid" in n] == [
        "HyperboloidGPLVM",
        "BayesianHyperboloidGPLVM",
    ]
    own = inspect.signature(BayesianHyperboloidGPLVM).parameters
    assert isinstance(own["max_iter"].default, int)  # the sweep and the cost plan read it as a budget
    small = dict(n_inducing=8, max_iter=7, tol=0, n_samples=2, random_state=0)
    m = BayesianHyperboloidGPLVM(training="minibatch", batch_size=20, local_iter=1, **small).fit(roll[:60])
    assert m.training_ == "minibatch" and hasattr(m, "qu_") and m.n_iter_ == 8
    m.set_params(training="full").fit(roll[:60])
    assert m.training_ == "full" and m.n_iter_ == 7 and m.embedding_var_.shape == (60, 2)
    assert not hasattr(m, "qu_") and not hasattr(m, "elbo_se_")


def test_the_registry_states_the_rule_it_runs():
    from tasks.registry import MODELS

    spec = MODELS["hgplvm_bayesian"]
    assert spec.estimator_class() is BayesianHyperboloidGPLVM and "minibatch" in spec.extras


# ------------------------------------------------------------------ the sparse variant (point latents)
def _point_problem(seed):
    """The problem of :func:`_problem` with point latents: q(x_n) = delta(x_n - mu_n), no draws."""
    local, glob, qu, Y, _ = _problem(seed=seed)
    return {"X": local["X"]}, glob, qu, Y


def test_point_latents_batch_estimates_average_to_the_bound_and_its_optimum_is_the_sparse_bound():
    """With point latents the statistics are exact (no draws): the scaled batch estimates average
    to the full uncollapsed bound, and at q(v)'s optimum that bound is the collapsed Titsias bound
    of hgplvm.sparse_objective (eq. 5), which the full-batch sparse fit maximises."""
    local, glob, qu, Y = _point_problem(seed=4)
    n = Y.shape[0]
    full, stats = minibatch_bound(local, glob, qu, Y, None, n, 1.0, KAPPA)
    ests = [
        minibatch_bound(_rows(local, sl), glob, qu, Y[sl], None, n, n / 6, KAPPA)[0]
        for sl in (slice(i, i + 6) for i in range(0, n, 6))
    ]
    np.testing.assert_allclose(np.mean(ests), float(full), rtol=1e-11)
    assert abs(float(ests[0]) - float(full)) > 1e-3 * abs(float(full))  # one batch is not the bound
    best = optimal_qu(stats, glob, KAPPA)
    F_opt, _ = minibatch_bound(local, glob, best, Y, None, n, 1.0, KAPPA)
    h = glob["hyp"]
    with jax.enable_x64(True):
        collapsed = sparse_objective(local["X"], glob["Z"], h[0], h[1], Y, KAPPA)
    np.testing.assert_allclose(float(F_opt), float(collapsed), rtol=1e-8)
    assert float(full) < float(F_opt)  # a q(v) off its optimum is lower
    # and the point-latent statistics are the Bayesian ones' limit of vanishing variances
    lo = {"X": local["X"], "log_S": jnp.full((n, 2), np.log(1e-12))}
    eps = jnp.asarray(np.random.default_rng(0).normal(size=(2, n, 2)))
    _, mc = minibatch_bound(lo, glob, qu, Y, eps, n, 1.0, KAPPA)
    for a, b in zip(mc, stats, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5)


def test_point_latent_gradient_matches_central_differences():
    local, glob, qu, Y = _point_problem(seed=5)

    def f(X, hyp):
        return minibatch_bound({"X": X}, {"Z": glob["Z"], "hyp": hyp}, qu, Y[:8], None, 40.0, 5.0, KAPPA)[0]

    f = jit64(f)
    X = local["X"][:8]
    with jax.enable_x64(True):
        gX, gh = jit64(jax.grad(f, argnums=(0, 1)))(X, glob["hyp"])
        h = 1e-6
        e = jnp.zeros(3).at[0].set(h)
        fd = (f(X, glob["hyp"] + e) - f(X, glob["hyp"] - e)) / (2 * h)
        np.testing.assert_allclose(float(gh[0]), float(fd), rtol=1e-5, atol=1e-6)
        for i, j in ((2, 1), (5, 2)):  # ambient coordinates of the points (the kernel's arguments)
            e = jnp.zeros_like(X).at[i, j].set(h)
            fd = (f(X + e, glob["hyp"]) - f(X - e, glob["hyp"])) / (2 * h)
            np.testing.assert_allclose(float(gX[i, j]), float(fd), rtol=1e-5, atol=1e-6)


#: the sparse fits on the tree: one shape, so the compiled steps are shared
SPARSE = dict(n_components=2, kappa=100.0, n_inducing=20, random_state=0)
SPARSE_MB = dict(SPARSE, variant="sparse", training="minibatch", batch_size=50, max_iter=600, tol=0.0)


@pytest.fixture(scope="module")
def tree():
    from scipy.spatial.distance import cdist

    from lvmcore.data.synthetic import binary_tree

    Y, node, codes, _ = binary_tree(4, n_per_node=10, seed=0)
    return Y, cdist(codes[node], codes[node], "cityblock")


@pytest.fixture(scope="module")
def sparse_fits(tree):
    from lvmcore.models.hgplvm import HyperboloidGPLVM

    Y, _ = tree
    return {
        "full": HyperboloidGPLVM(variant="sparse", max_iter=600, tol=0.0, **SPARSE).fit(Y),
        "minibatch": HyperboloidGPLVM(**SPARSE_MB).fit(Y),
        "no_pass": HyperboloidGPLVM(**dict(SPARSE_MB, local_iter=0)).fit(Y),
    }


def _tree_score(m, Dh):
    from lvmcore.manifolds.lorentz import pairwise_dist
    from lvmcore.metrics import pearson_distance_correlation

    Dl = np.asarray(pairwise_dist(m.lorentz_embedding_, m.lorentz_embedding_))
    return pearson_distance_correlation(Dl, Dh, "precomputed", "precomputed")


@pytest.mark.slow
def test_sparse_minibatch_fit_reaches_the_full_batch_fit(tree, sparse_fits):
    """HyperboloidGPLVM(variant="sparse") on minibatches of 50 of the depth-4 tree's 150 points
    against its full-batch fit (same M, the same 600 steps): its final bound is the exact collapsed
    bound (eq. 5) at its state, within 1% of the full-batch fit's, and its tree score (Pearson of
    hyperbolic against tree distances, test_hgplvm's) within 0.03 of it; noise fixed at the PPCA
    level in both (the sparse variant's "auto")."""
    Y, Dh = tree
    full, mb = sparse_fits["full"], sparse_fits["minibatch"]
    assert full.training_ == "full" and full.minibatch_ == 0.0
    assert mb.training_ == "minibatch" and mb.minibatch_ == 1.0 and mb.embedding_var_ is None
    assert mb.noise_fixed_ and mb.beta_ == pytest.approx(full.beta_, rel=1e-12)
    assert mb.n_iter_ == len(mb.elbo_trace_) == 601 and mb.elbo_trace_[-1] == mb.elbo_
    ls, lb = np.log(mb.sigma_), np.log(mb.beta_)
    with jax.enable_x64(True):
        exact = sparse_objective(mb.lorentz_embedding_, mb.inducing_, ls, lb, jnp.asarray(mb._Y), mb.kappa)
    assert float(exact) == pytest.approx(mb.elbo_, rel=1e-8)
    assert abs(mb.elbo_ - full.elbo_) < 0.01 * abs(full.elbo_), (mb.elbo_, full.elbo_)
    s_full, s_mb = _tree_score(full, Dh), _tree_score(mb, Dh)
    assert s_mb > s_full - 0.03 and s_mb > 0.85, (s_mb, s_full)
    new = mb.transform(Y[:5])
    assert new.shape == (5, 2) and np.all(np.linalg.norm(new, axis=1) < 1)


@pytest.mark.slow
def test_sparse_per_point_pass_moves_every_point_and_raises_the_bound(sparse_fits):
    """The same minibatch fit with and without the per-point pass (local_iter 50 / 0): the pass
    moves every one of the 150 points and raises the exact final bound."""
    a, b = sparse_fits["no_pass"], sparse_fits["minibatch"]
    moved = np.linalg.norm(b.lorentz_embedding_ - a.lorentz_embedding_, axis=1)
    assert np.all(moved > 1e-6), np.sort(moved)[:5]
    assert b.elbo_ > a.elbo_
    np.testing.assert_array_equal(a.inducing_, b.inducing_)  # the globals come from the same steps


def test_sparse_training_is_chosen_by_n_and_what_it_cannot_honour_is_refused(roll):
    from lvmcore.models.hgplvm import HyperboloidGPLVM

    est = HyperboloidGPLVM(variant="sparse")
    assert est.resolve_training(FULL_BATCH_MAX_N) == "full"
    assert est.resolve_training(FULL_BATCH_MAX_N + 1) == "minibatch"
    assert HyperboloidGPLVM(variant="point").resolve_training(10**6) == "full"
    big = np.zeros((FULL_BATCH_MAX_N + 1, 3)) + np.arange(3)
    with pytest.raises(ValueError, match=r"optimizer='rsgd' .*full-batch.*N = 5,001 > 5,000.*'full'"):
        HyperboloidGPLVM(variant="sparse", optimizer="rsgd").fit(big)
    with pytest.raises(ValueError, match=r"mean='integrated' with variant='sparse'.*'zero'"):
        HyperboloidGPLVM(variant="sparse", mean="integrated", training="minibatch").fit(roll)
    with pytest.raises(ValueError, match=r"training='minibatch' with variant='point'.*variant='sparse'"):
        HyperboloidGPLVM(variant="point", training="minibatch").fit(roll)
    with pytest.raises(ValueError, match=r"batch_size \(1000\) exceeds the number of points \(300\)"):
        HyperboloidGPLVM(variant="sparse", training="minibatch").fit(roll)
    with pytest.raises(ValueError, match=r"callback .*full-batch.*training='full'"):
        HyperboloidGPLVM(variant="sparse", training="minibatch", batch_size=10).fit(
            roll, callback=lambda it, state: None
        )
    with pytest.raises(ValueError, match="training"):
        HyperboloidGPLVM(variant="sparse", training="sgd").fit(roll)


def test_the_sweeps_sparse_model_goes_through_auto_and_stores_which_training_ran(tmp_path):
    """hgplvm_sparse is HyperboloidGPLVM(variant="sparse") with training "auto": the cost plan
    resolves its entry by N, and the sweep's fit records the ``minibatch`` output."""
    from tasks.costs import regime
    from tasks.fit import fit_point
    from tasks.ingest import ingest_dataset
    from tasks.registry import MODELS

    spec = MODELS["hgplvm_sparse"]
    assert "minibatch" in spec.extras and spec.fixed == {"variant": "sparse"}
    assert "training" not in spec.fixed  # "auto", the constructor's default
    args = spec.constructor_args({"kappa": 100.0, "latent_dim": 2, "seed": 0}, {})
    assert regime("hgplvm_sparse", args, FULL_BATCH_MAX_N) == "hgplvm_sparse/full"
    assert regime("hgplvm_sparse", args, FULL_BATCH_MAX_N + 1) == "hgplvm_sparse/minibatch"
    path = str(tmp_path / "tree.zarr")
    ingest_dataset({"name": "binary_tree", "depth": 3, "n_per_node": 6, "seed": 0}, path)
    point = {"kappa": 100.0, "latent_dim": 2, "seed": 0}
    opts = dict(training="minibatch", max_iter=10, n_inducing=8, batch_size=20, local_iter=2)
    res = fit_point("hgplvm_sparse", opts, path, None, (0, 0, 0), point)  # (full: test_hgplvm's sweep test)
    assert res.status == "done", res.error
    assert float(res.extras["minibatch"]) == 1.0 and res.n_iter == 11
