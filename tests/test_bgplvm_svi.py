"""Stochastic variational Bayesian GP-LVM (lvmcore.models.bgplvm_svi): the uncollapsed bound
against the collapsed one (lvmcore.collapsed, an identity at the optimal q(u)), unbiasedness of
the minibatch estimate, gradients by finite differences, and a small fit against the collapsed
model's."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from lvmcore.data import synthetic as S
from lvmcore.models.bgplvm import BayesianGPLVM, kmm, view_bound
from lvmcore.models.bgplvm_svi import (
    StochasticBayesianGPLVM,
    _batch_step,
    batch_statistics,
    optimal_qu,
    uncollapsed_bound,
)
from lvmcore.psi.closed_form import kl_diag_gaussian


def _problem(kind, n=60, q=2, m=7, d=3, seed=0):
    rng = np.random.default_rng(seed)
    Y = rng.standard_normal((n, d))
    Y -= Y.mean(0)
    mu = rng.standard_normal((n, q))
    S_ = rng.uniform(0.05, 0.5, (n, q))
    glob = {
        "Z": rng.standard_normal((1, m, q)),
        "kern": [
            {"log_var": np.log(1.3), "log_ls": np.log([0.9, 1.4])}
            if kind == "rbf"
            else {"log_vars": np.log([0.7, 1.2])}
        ],
        "log_beta": np.array([np.log(3.0)]),
    }
    A = rng.standard_normal((m, m))
    qu = {"m": rng.standard_normal((m, d)), "P": A @ A.T + m * np.eye(m)}
    return Y, mu, S_, glob, qu


@pytest.mark.parametrize("kind", ["rbf", "linear"])
def test_uncollapsed_bound_at_optimal_qu_equals_collapsed_bound(kind):
    """At q(u)'s optimum the uncollapsed bound is Titsias' collapsed bound (paper 004 eq. 15)."""
    Y, mu, S_, glob, _ = _problem(kind)
    n, d = Y.shape
    stats = batch_statistics(kind, mu, S_, Y, glob)
    qu = optimal_qu(kind, stats, glob)
    with jax.enable_x64(True):
        Kmm = kmm(kind, glob["Z"][0], glob["kern"][0])
        collapsed = float(view_bound(stats, Kmm, glob["log_beta"][0], n, d))
    unc = float(uncollapsed_bound(kind, stats, glob, qu, n))
    assert unc == pytest.approx(collapsed, rel=1e-10, abs=1e-8)
    # and it is the maximum over q(u): any other q(u) gives less
    rng = np.random.default_rng(1)
    for _ in range(3):
        E = 0.05 * rng.standard_normal(qu["P"].shape)
        other = {"m": qu["m"] + 0.05 * rng.standard_normal(qu["m"].shape), "P": qu["P"] + E @ E.T}
        assert float(uncollapsed_bound(kind, stats, glob, other, n)) < unc


def test_minibatch_estimate_is_unbiased():
    """The mean over the batches of a partition of the N / B-scaled batch estimates (KL of q(X)
    included) is the full bound, for any q(u)."""
    kind = "rbf"
    Y, mu, S_, glob, qu = _problem(kind, n=60)
    n = Y.shape[0]
    full = float(uncollapsed_bound(kind, batch_statistics(kind, mu, S_, Y, glob), glob, qu, n)) - float(
        kl_diag_gaussian(mu, S_)
    )
    perm = np.random.default_rng(2).permutation(n)
    ests = []
    for rows in np.split(perm, 6):
        st = batch_statistics(kind, mu[rows], S_[rows], Y[rows], glob)
        scale = n / len(rows)
        ests.append(
            float(uncollapsed_bound(kind, st, glob, qu, n, scale))
            - scale * float(kl_diag_gaussian(mu[rows], S_[rows]))
        )
    assert np.mean(ests) == pytest.approx(full, rel=1e-12)
    assert np.std(ests) > 1e-3 * abs(full)  # the batches do differ: the check is not vacuous


@pytest.mark.parametrize("kind", ["rbf", "linear"])
def test_batch_gradient_equals_finite_differences(kind):
    """The jitted batch step's gradient (local and global parameters) against central differences.
    Linear: M = Q inducing points (with M > Q its K_mm has rank Q and differences of the whitened
    bound lose their digits to the jitter's conditioning)."""
    Y, mu, S_, glob, qu = _problem(kind, n=30, m=7 if kind == "rbf" else 2)
    n_total = 90.0
    scale = n_total / Y.shape[0]
    local = {"mu": mu, "logS": np.log(S_)}
    step = _batch_step(kind)
    (_, _), (g_lo, g_gl) = step(local, glob, qu, Y, n_total, scale, 0.0)

    def value(lo, gl):
        return float(step(lo, gl, qu, Y, n_total, scale, 0.0)[0][0])

    h = 1e-6
    # absolute floor: the differences' round-off, relative to the largest gradient entry
    tol = 1e-6 * max(float(np.max(np.abs(np.asarray(x)))) for x in jax.tree_util.tree_leaves((g_lo, g_gl)))
    checks = [("local", "mu", (3, 1)), ("local", "logS", (7, 0)), ("glob", "Z", (0, 1, 1))]
    checks.append(("glob", "log_beta", (0,)))
    for where, key, ix in checks:
        tree = local if where == "local" else glob
        plus = {k: np.array(v, copy=True) if k == key else v for k, v in tree.items()}
        minus = {k: np.array(v, copy=True) if k == key else v for k, v in tree.items()}
        plus[key][ix] += h
        minus[key][ix] -= h
        if where == "local":
            fd = (value(plus, glob) - value(minus, glob)) / (2 * h)
            an = float(np.asarray(g_lo[key])[ix])
        else:
            fd = (value(local, plus) - value(local, minus)) / (2 * h)
            an = float(np.asarray(g_gl[key])[ix])
        assert an == pytest.approx(fd, rel=1e-5, abs=tol), (where, key, ix)
    pname = "log_ls" if kind == "rbf" else "log_vars"
    kp_p = [{k: np.array(v, copy=True) for k, v in glob["kern"][0].items()}]
    kp_m = [{k: np.array(v, copy=True) for k, v in glob["kern"][0].items()}]
    kp_p[0][pname][1] += h
    kp_m[0][pname][1] -= h
    fd = (value(local, dict(glob, kern=kp_p)) - value(local, dict(glob, kern=kp_m))) / (2 * h)
    assert float(np.asarray(g_gl["kern"][0][pname])[1]) == pytest.approx(fd, rel=1e-5, abs=tol)


@pytest.mark.slow
def test_small_fit_reaches_the_collapsed_bound():
    """On a 300-point roll the minibatch fit (batches of 100, 400 epochs) ends within 1% per point
    of the collapsed L-BFGS fit's bound (measured: 0.26% below it; at 800 epochs 0.67% above), and
    its reported bound is the full collapsed bound at its state."""
    Y, _ = S.swiss_roll(300, seed=0)
    n = Y.shape[0]
    ref = BayesianGPLVM(n_components=2, n_inducing=10, random_state=0).fit(Y)
    svi = StochasticBayesianGPLVM(
        n_components=2, n_inducing=10, batch_size=100, max_iter=400, random_state=0
    ).fit(Y)
    assert abs(svi.elbo_ - ref.elbo_) < 0.01 * abs(ref.elbo_)
    # elbo_ is the collapsed bound at the fitted q(X) and hyperparameters, and at least the
    # uncollapsed bound with q(u) as trained
    stats = batch_statistics("rbf", svi.embedding_, svi.embedding_var_, svi.Y_train_[0], svi.glob_)
    with jax.enable_x64(True):
        Kmm = kmm("rbf", svi.glob_["Z"][0], svi.glob_["kern"][0], svi.kmm_jitter_[0])  # in data units
        F = float(view_bound(stats, Kmm, svi.glob_["log_beta"][0], n, 3, svi.extra_jitter_))
    F -= float(kl_diag_gaussian(svi.embedding_, svi.embedding_var_))
    assert svi.elbo_ == pytest.approx(F, rel=1e-9)
    assert svi.elbo_uncollapsed_ <= svi.elbo_ + 1e-9 * abs(svi.elbo_)
    assert svi.elbo_trace_.shape == (svi.n_iter_,)


def test_a_batch_size_above_n_is_one_batch_per_epoch_and_zero_is_refused():
    """batch_size is at most N (a data set of fewer points, e.g. scanpy's 700-cell pbmc68k_reduced
    under the default 1,000, is one batch per epoch): the fit equals the fit with batch_size N,
    and differs from one with two batches per epoch."""
    Y, _ = S.swiss_roll(40, seed=0)
    kw = dict(n_components=2, n_inducing=5, max_iter=3, tol=0.0, random_state=0)
    above = StochasticBayesianGPLVM(batch_size=1000, **kw).fit(Y)
    whole = StochasticBayesianGPLVM(batch_size=40, **kw).fit(Y)
    halves = StochasticBayesianGPLVM(batch_size=20, **kw).fit(Y)
    np.testing.assert_array_equal(above.embedding_, whole.embedding_)
    assert above.elbo_ == whole.elbo_ != halves.elbo_
    with pytest.raises(ValueError, match="batch_size"):
        StochasticBayesianGPLVM(n_components=2, n_inducing=5, batch_size=0).fit(Y)


def test_rule_judges_window_means_not_successive_epochs():
    """The stopping rule compares means of RULE_WINDOW epoch estimates (the best of the last
    RULE_PATIENCE against the best earlier one), first after init_epochs and 2 RULE_PATIENCE windows
    more: a tolerance no gain can exceed stops the fit exactly there (not at the first epoch after
    init_epochs, where a rule on successive estimates would), converged; tol = 0 runs the budget."""
    from lvmcore.models.bgplvm_svi import RULE_PATIENCE, RULE_WINDOW

    Y, _ = S.swiss_roll(200, seed=0)
    first = 2 + 2 * RULE_PATIENCE * RULE_WINDOW  # init_epochs = 2
    first += -first % RULE_WINDOW
    kw = dict(n_components=2, n_inducing=5, batch_size=50, init_epochs=2, random_state=0)
    stop = StochasticBayesianGPLVM(max_iter=first + 10, tol=1e9, **kw).fit(Y)
    assert stop.converged_ and stop.n_iter_ == first + 1  # the epochs, then the final exact bound
    run = StochasticBayesianGPLVM(max_iter=first + 3, tol=0.0, **kw).fit(Y)
    assert not run.converged_ and run.n_iter_ == first + 4
