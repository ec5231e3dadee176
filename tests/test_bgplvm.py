"""Bayesian GP-LVM and MRD: the bound against GPy 1.15 at the same parameters, gradients against
finite differences, one chunk = many chunks on a real LocalCluster, the paper's toy segmentation,
inference and cross-view prediction, bad input."""

import jax
import numpy as np
import pytest

from lvmcore.chunks import RowChunks, scheduler_workers
from lvmcore.data import synthetic as S
from lvmcore.models.bgplvm import BayesianGPLVM, ViewStats, bound_objective
from lvmcore.models.mrd import MRD

GPy = pytest.importorskip("GPy")


def _problem(kind, N=60, D=5, Q=3, M=8, seed=0):
    rng = np.random.default_rng(seed)
    Y = rng.standard_normal((N, D))
    Y -= Y.mean(0)
    mu, Sv, Z = rng.standard_normal((N, Q)), rng.uniform(0.1, 0.5, (N, Q)), rng.standard_normal((M, Q))
    if kind == "rbf":
        ls = rng.uniform(0.6, 2.0, Q)
        k = GPy.kern.RBF(Q, ARD=True, variance=1.3, lengthscale=ls)
        kp = {"log_var": np.log(1.3), "log_ls": np.log(ls)}
    else:
        v = rng.uniform(0.2, 1.5, Q)
        k = GPy.kern.Linear(Q, ARD=True, variances=v)
        kp = {"log_vars": np.log(v)}
    return Y, mu, Sv, Z, k, kp


def _runner(kinds, Ys, chunks=None, client=None):
    dims = tuple(Y.shape[1] for Y in Ys)
    obj = bound_objective(tuple(kinds), True, Ys[0].shape[0], dims)
    return RowChunks(ViewStats(tuple(kinds), True), obj, tuple(Ys), chunks, client=client)


def _bound(kinds, Ys, local, glob, chunks=None):
    return _runner(kinds, Ys, chunks).value_and_grad(local, glob, 0.0)


@pytest.mark.parametrize("kind", ["rbf", "linear"])
def test_bound_equals_gpy_bayesian_gplvm(kind):
    Y, mu, Sv, Z, k, kp = _problem(kind)
    m = GPy.models.BayesianGPLVM(Y, 3, X=mu, X_variance=Sv, Z=Z, kernel=k, num_inducing=8)
    m.likelihood.variance = 0.3
    glob = {"Z": Z[None], "kern": [kp], "log_beta": np.array([np.log(1 / 0.3)])}
    val, _, _ = _bound([kind], [Y], {"mu": mu, "logS": np.log(Sv)}, glob)
    ref = float(np.asarray(m.log_likelihood()).ravel()[0])
    assert abs(val - ref) <= 1e-8 * abs(ref)


def test_mrd_bound_equals_sum_of_gpy_views_minus_one_kl():
    """MRD's bound is sum_v F_v - KL; GPy's single-view bound is F_v - KL, so
    MRD = sum_v GPy_v + (V - 1) KL at the same q(X)."""
    Y0, mu, Sv, Z, k0, kp0 = _problem("rbf", seed=1)
    Y1 = np.random.default_rng(5).standard_normal((60, 4))
    Y1 -= Y1.mean(0)
    k1 = GPy.kern.Linear(3, ARD=True, variances=np.array([0.3, 0.9, 1.1]))
    kp1 = {"log_vars": np.log([0.3, 0.9, 1.1])}
    refs = []
    for Y, k, var in ((Y0, k0, 0.3), (Y1, k1, 0.05)):
        m = GPy.models.BayesianGPLVM(Y, 3, X=mu, X_variance=Sv, Z=Z, kernel=k.copy(), num_inducing=8)
        m.likelihood.variance = var
        refs.append(float(np.asarray(m.log_likelihood()).ravel()[0]))
    kl = 0.5 * np.sum(mu**2 + Sv - np.log(Sv) - 1)
    glob = {"Z": Z[None], "kern": [kp0, kp1], "log_beta": np.log([1 / 0.3, 1 / 0.05])}
    val, _, _ = _bound(["rbf", "linear"], [Y0, Y1], {"mu": mu, "logS": np.log(Sv)}, glob)
    ref = sum(refs) + kl
    assert abs(val - ref) <= 1e-8 * abs(ref)


@pytest.mark.parametrize("kind", ["rbf", "linear"])
def test_gradients_equal_finite_differences(kind):
    Y, mu, Sv, Z, _, kp = _problem(kind, N=20, D=3, M=5)
    local = {"mu": mu, "logS": np.log(Sv)}
    glob = {"Z": Z[None], "kern": [kp], "log_beta": np.array([0.4])}
    _, g_lo, g_gl = _bound([kind], [Y], local, glob)
    h = 1e-5

    def f(lo, gl):
        return _bound([kind], [Y], lo, gl)[0]

    for name, idx in (("mu", (3, 1)), ("logS", (7, 2))):
        lp = {k: v.copy() for k, v in local.items()}
        lm = {k: v.copy() for k, v in local.items()}
        lp[name][idx] += h
        lm[name][idx] -= h
        fd = (f(lp, glob) - f(lm, glob)) / (2 * h)
        assert abs(fd - g_lo[name][idx]) <= 1e-5 * max(1.0, abs(fd))
    for path in (("Z", (0, 2, 1)), ("log_beta", (0,))):
        gp = {**glob, path[0]: glob[path[0]].copy()}
        gm = {**glob, path[0]: glob[path[0]].copy()}
        gp[path[0]][path[1]] += h
        gm[path[0]][path[1]] -= h
        fd = (f(local, gp) - f(local, gm)) / (2 * h)
        assert abs(fd - g_gl[path[0]][path[1]]) <= 1e-5 * max(1.0, abs(fd))
    key = "log_ls" if kind == "rbf" else "log_vars"
    kpp = {**kp, key: kp[key] + np.array([h, 0, 0])}
    kpm = {**kp, key: kp[key] - np.array([h, 0, 0])}
    fd = (f(local, {**glob, "kern": [kpp]}) - f(local, {**glob, "kern": [kpm]})) / (2 * h)
    assert abs(fd - g_gl["kern"][0][key][0]) <= 1e-5 * max(1.0, abs(fd))


@pytest.mark.slow
def test_one_chunk_equals_many_chunks_on_local_cluster(cluster_client):
    """7 chunks dealt to both workers of a real 2-process cluster (4 + 3, one actor each); the
    statistics alone (``stats``) and the bound and gradient equal the one-piece evaluation."""
    Y, mu, Sv, Z, _, kp = _problem("rbf", N=700, D=6, Q=3, M=10)
    Y2 = np.random.default_rng(2).standard_normal((700, 4))
    local = {"mu": mu, "logS": np.log(Sv)}
    glob = {"Z": Z[None], "kern": [kp, {"log_vars": np.zeros(3)}], "log_beta": np.array([0.2, -0.1])}
    one = _runner(["rbf", "linear"], [Y, Y2])
    many = _runner(["rbf", "linear"], [Y, Y2], chunks=100, client=cluster_client)
    workers = sorted(scheduler_workers(cluster_client))
    assert many.placement == [workers[0]] * 4 + [workers[1]] * 3
    v1, gl1, gg1 = one.value_and_grad(local, glob, 0.0)
    v7, gl7, gg7 = many.value_and_grad(local, glob, 0.0)
    s1, s7 = one.stats(local, glob), many.stats(local, glob)
    for a, b in zip(jax.tree_util.tree_leaves(s7), jax.tree_util.tree_leaves(s1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11 * np.abs(b).max())
    assert abs(v1 - v7) <= 1e-10 * abs(v1)
    # relative to each gradient block's norm (elementwise, entries that are sums of large
    # cancelling terms, such as d/d log beta, carry absolute round-off of the full terms), or within
    # 10 times what summing the rows in reverse order moves it: d/dZ sums 700 per-point terms of both
    # signs, and on an AVX-512 machine the reversed one-piece sum alone moved it by 7e-11 of its norm
    p = np.arange(len(Y))[::-1]
    _, glr, ggr = _runner(["rbf", "linear"], [Y[p], Y2[p]]).value_and_grad(
        {k: v[p] for k, v in local.items()}, glob, 0.0
    )
    for name, a, b, r in (
        ("mu", gl7["mu"], gl1["mu"], np.asarray(glr["mu"])[p]),
        ("logS", gl7["logS"], gl1["logS"], np.asarray(glr["logS"])[p]),
        ("Z", gg7["Z"], gg1["Z"], ggr["Z"]),
    ):
        a, b, r = np.asarray(a), np.asarray(b), np.asarray(r)
        assert np.linalg.norm(a - b) <= max(1e-10 * np.linalg.norm(b), 10 * np.linalg.norm(r - b)), name
    assert np.linalg.norm(gg7["log_beta"] - gg1["log_beta"]) <= 1e-10 * np.linalg.norm(gg1["log_beta"])
    for key in ("log_var", "log_ls"):
        a, b = np.asarray(gg7["kern"][0][key]), np.asarray(gg1["kern"][0][key])
        assert np.linalg.norm(a - b) <= 1e-10 * np.linalg.norm(b)


def _hold(name):
    """A task that keeps its worker's thread until the test sets the Dask event ``name``."""
    from distributed import Event

    return Event(name).wait(120)


@pytest.mark.slow
def test_chunks_go_to_the_workers_with_a_free_thread(cluster_client):
    """A worker whose thread runs another model's long task would start the row chunks' actor only
    when that task ends (GLLE at 10^6 points: half an hour). The chunks go to the worker with a
    free thread instead, without waiting for the busy one; the result equals one piece."""
    from distributed import Event

    Y, mu, Sv, Z, _, kp = _problem("rbf", N=300, D=4, Q=2, M=8)
    local = {"mu": mu, "logS": np.log(Sv)}
    glob = {"Z": Z[None], "kern": [kp], "log_beta": np.array([0.2])}
    workers = sorted(scheduler_workers(cluster_client))
    release = Event("release-busy-worker", client=cluster_client)
    busy = cluster_client.submit(_hold, "release-busy-worker", workers=[workers[0]], pure=False)
    try:
        _wait_executing(cluster_client, workers[0])
        many = _runner(["rbf"], [Y], chunks=100, client=cluster_client)
        assert not busy.done()  # placed while the other worker's task still ran
        assert many.placement == [workers[1]] * 3
        v1, _, _ = _runner(["rbf"], [Y]).value_and_grad(local, glob, 0.0)
        v3, _, _ = many.value_and_grad(local, glob, 0.0)
        assert abs(v1 - v3) <= 1e-10 * abs(v1)
    finally:
        release.set()
    assert busy.result(timeout=60) is True


def _wait_executing(client, worker, timeout=30.0):
    import time

    from lvmcore.actors import thread_use

    t0 = time.time()
    while client.run(thread_use, workers=[worker])[worker][0] < 1:
        assert time.time() - t0 < timeout, "the busy task did not start"
        time.sleep(0.05)


@pytest.mark.slow
def test_chunks_wait_for_a_worker_when_every_worker_is_busy(cluster_client, monkeypatch):
    """With every worker's thread busy, the chunks' actors start when the threads free up:
    placement waits for them while the workers are alive (here 6 s against a 0.5 s poll) instead
    of failing the fit, and deals the chunks over both; the result equals one piece."""
    import time

    from lvmcore.chunks import RowChunks

    monkeypatch.setattr(RowChunks, "POLL", 0.5)
    Y, mu, Sv, Z, _, kp = _problem("rbf", N=300, D=4, Q=2, M=8)
    local = {"mu": mu, "logS": np.log(Sv)}
    glob = {"Z": Z[None], "kern": [kp], "log_beta": np.array([0.2])}
    workers = sorted(scheduler_workers(cluster_client))
    busy = [cluster_client.submit(time.sleep, 6.0, workers=[w], pure=False) for w in workers]
    for w in workers:
        _wait_executing(cluster_client, w)
    t0 = time.perf_counter()
    many = _runner(["rbf"], [Y], chunks=100, client=cluster_client)
    assert time.perf_counter() - t0 > 2.0  # it did wait behind the busy threads
    assert all(b.done() for b in busy) and sorted(set(many.placement)) == workers
    v1, _, _ = _runner(["rbf"], [Y]).value_and_grad(local, glob, 0.0)
    v3, _, _ = many.value_and_grad(local, glob, 0.0)
    assert abs(v1 - v3) <= 1e-10 * abs(v1)


@pytest.mark.slow
def test_chunked_evaluation_on_two_thread_workers_and_a_lost_worker():
    """2 workers with 2 threads each, 7 chunks:
    - each actor runs its chunks on both of its threads, and the bound, gradient and statistics
      equal the one-piece evaluation;
    - a genuine error in the chunks' work is raised as it is, with the actors kept;
    - a worker holding chunks dies between two evaluations (killed; its nanny starts a new one):
      the next evaluation deals the chunks over the running workers and gives the same result."""
    import os
    import signal
    import time

    from distributed import Client, LocalCluster

    Y, mu, Sv, Z, _, kp = _problem("rbf", N=700, D=5, Q=3, M=10)
    local = {"mu": mu, "logS": np.log(Sv)}
    glob = {"Z": Z[None], "kern": [kp], "log_beta": np.array([0.3])}
    one = _runner(["rbf"], [Y])
    want, want_stats = one.value_and_grad(local, glob, 0.0), one.stats(local, glob)

    def check(got, stats=None):
        assert abs(got[0] - want[0]) <= 1e-10 * abs(want[0])
        for a, b in zip(jax.tree_util.tree_leaves(got[1:]), jax.tree_util.tree_leaves(want[1:]), strict=True):
            assert np.linalg.norm(a - b) <= 1e-10 * np.linalg.norm(b)
        for a, b in zip(jax.tree_util.tree_leaves(stats or {}), jax.tree_util.tree_leaves(want_stats)):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11 * np.abs(b).max())

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, host="127.0.0.1", dashboard_address=None
        ) as lc,
        Client(lc) as client,
    ):
        r = _runner(["rbf"], [Y], chunks=100, client=client)
        check(r.value_and_grad(local, glob, 0.0), r.stats(local, glob))
        assert [h.threads for _, _, h in r.hosts] == [2, 2]
        assert [len(h.last_threads) for _, _, h in r.hosts] == [2, 2]  # the chunks ran on both

        futures = list(r._host_futures)
        with pytest.raises(Exception, match="shape|Incompatible|broadcast"):
            r.value_and_grad(local, {**glob, "Z": np.zeros((1, 10, 4))}, 0.0)
        assert r._host_futures == futures  # not taken for a lost worker

        victim = r.placement[0]
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while victim in scheduler_workers(client) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert victim not in scheduler_workers(client)
        check(r.value_and_grad(local, glob, 0.0))
        assert victim not in r.placement and len(r.placement) == 7


@pytest.fixture(scope="module")
def toy_mrd():
    views, _ = S.mrd_toy(100, seed=0)
    return views, MRD(n_components=8, n_inducing=30, kernel="linear", random_state=0, max_iter=1000).fit(
        views
    )


def test_mrd_toy_segmentation(toy_mrd):
    """Paper 004 section 5.1: 8 initial dimensions end as 1 shared, 1 private per view, the rest
    switched off (normalised weights below 1e-3); the noise is learned near 0.1^2."""
    _, m = toy_mrd
    seg = m.segment(1e-3)
    assert len(seg["shared"]) == 1
    assert len(seg["private"][0]) == 1 and len(seg["private"][1]) == 1
    assert len(seg["inactive"]) == 5 and not seg["partial"]
    np.testing.assert_allclose(m.noise_variance_, 0.01, rtol=0.3)
    assert m.ard_weights_.shape == (2, 8)
    assert m.elbo_trace_[-1] >= m.elbo_trace_[0]


def test_segment_handles_more_than_two_views(toy_mrd):
    _, m = toy_mrd
    m3 = MRD.__new__(MRD)
    m3.glob_, m3.embedding_ = m.glob_, m.embedding_
    m3.ard_weights_ = np.array([[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 0.5, 0.0], [0.0, 0.0, 0.5, 1.0]])
    seg = m3.segment(1e-3)
    assert seg["shared"] == [2] and seg["private"] == {0: [0], 1: [1], 2: [3]} and seg["inactive"] == []
    m3.ard_weights_[1, 3] = 0.7
    assert m3.segment(1e-3)["partial"] == {(1, 2): [3]}


def test_mrd_cross_view_prediction(toy_mrd):
    """Predict view 1 from noisy copies of view 0's rows. View 1's columns 10-14 carry the shared
    signal cos^2 t, which view 0 determines: their error must be small. Columns 0-9 carry sin t,
    which view 0 cannot determine (cos t and cos^2 t leave its sign open); Algorithm 1 fills it
    from the nearest training point, so only its magnitude is checked."""
    views, m = toy_mrd
    rng = np.random.default_rng(3)
    Y0 = views[0][::5] + 0.1 * rng.standard_normal(views[0][::5].shape)
    mean, var = m.predict({0: Y0}, target=1)
    truth = views[1][::5]
    shared = slice(10, 15)
    rmse_shared = np.sqrt(np.mean((mean[:, shared] - truth[:, shared]) ** 2))
    assert rmse_shared < 0.25 * truth[:, shared].std()
    mag = np.linalg.norm(mean[:, :10], axis=1), np.linalg.norm(truth[:, :10], axis=1)
    assert np.corrcoef(*mag)[0, 1] > 0.8
    assert np.all(var > 0)
    print("shared-signal RMSE", rmse_shared, "spread", truth[:, shared].std())


@pytest.mark.slow
def test_bgplvm_fit_transform_of_held_out_rows_and_reconstruction():
    """A 1-D curve, every other point held out: a held-out row's inferred latent point lies
    between its two training neighbours' embeddings (its position along the segment joining them,
    0 at one and 1 at the other, near 1/2). transform starts each row at its nearest training
    row's embedding, position 0 or 1: the check fails if the optimisation steps are skipped.

    Positions are measured in the kernel's metric (each latent coordinate times the square root of
    its ARD weight): Q = 2 for a 1-D curve, and ARD switches the second dimension off as the fit
    proceeds (weight ~0.03 at this budget, down to 1e-7 with 2,000 iterations). A coordinate the
    kernel ignores is not determined by the data, and in raw coordinates it set the segment's
    direction. Over random_state 0..9, with numpy-equal and 1-ulp-different exps in the bound
    (none of the fits converged by its rule): the raw median error was 0.06-0.40 here (5 and 7 of
    10 under 0.2) and 0.16-0.69 with 2,000 iterations (1 of 10); in the kernel's metric 0.03-0.08
    and 0.03-0.06 (all 40)."""
    t = np.linspace(0, 2 * np.pi, 241)
    Y = np.column_stack([np.cos(t), np.sin(t), np.cos(2 * t), np.sin(2 * t), t / np.pi])
    Y += 0.005 * np.random.default_rng(0).standard_normal(Y.shape)
    train, held = Y[::2], Y[1::2]
    m = BayesianGPLVM(n_components=2, n_inducing=15, kernel="rbf", random_state=0, max_iter=300).fit(train)
    assert m.embedding_.shape == (121, 2) and m.embedding_var_.shape == (121, 2)
    assert m.noise_variance_[0] < 0.05
    assert m.ard_weights_.shape == (2,) and np.all(m.ard_weights_ > 0)
    rows = np.arange(20, 100, 8)  # held-out row j lies between training rows j and j + 1
    w = np.sqrt(m.ard_weights_)  # the kernel's metric (RBF: sqrt(variance) / length scale)
    E = m.embedding_ * w
    a, b = E[rows], E[rows + 1]

    def position(X):  # along the segment a -> b
        return np.sum((X - a) * (b - a), axis=1) / np.sum((b - a) ** 2, axis=1)

    d2 = ((held[rows][:, None, :] - train[None]) ** 2).sum(-1)
    start = position(E[np.argmin(d2, axis=1)])
    np.testing.assert_allclose(np.abs(start - 0.5), 0.5)  # the start: one of the two neighbours
    assert np.median(np.abs(position(m.transform(held[rows]) * w) - 0.5)) < 0.2
    rec = m.inverse_transform(m.embedding_[:10])
    assert np.sqrt(np.mean((rec - train[:10]) ** 2)) < 0.3 * Y.std()


def test_fit_is_invariant_to_the_data_scale():
    """Y and c Y (c = 1e-12, 1e6): the linear-kernel fit converges to the same layout with bounds
    differing by -N D log c (the bound is a density of Y; the jitter, the start and the stopping
    rule are in data units or per data value). At 1e-12 it once stopped at the prior (means ~1e-9,
    flagged converged). The RBF fit's first steps agree too (later, K_mm's jitter escalation may
    fire at a different step: its failures depend on round-off)."""
    rng = np.random.default_rng(3)
    Y = rng.standard_normal((60, 2)) @ rng.standard_normal((2, 6)) + 0.1 * rng.standard_normal((60, 6))

    def layout(m):
        return np.linalg.norm(m.embedding_[:, None] - m.embedding_[None], axis=-1)

    kw = dict(n_components=2, n_inducing=8, kernel="linear", random_state=0, max_iter=1000, init_iters=20)
    ref = BayesianGPLVM(**kw).fit(Y)
    assert ref.converged_ and np.std(ref.embedding_) > 0.3  # not the prior's means
    rbf = dict(kw, kernel="rbf", max_iter=3, init_iters=5)
    ref_rbf = BayesianGPLVM(**rbf).fit(Y).elbo_trace_
    for c in (1e-12, 1e6):
        m = BayesianGPLVM(**kw).fit(c * Y)
        assert m.converged_
        assert m.elbo_ + Y.size * np.log(c) == pytest.approx(ref.elbo_, rel=1e-6)
        np.testing.assert_allclose(layout(m), layout(ref), rtol=3e-3, atol=1e-6)  # a weakly fixed scale
        tr = BayesianGPLVM(**rbf).fit(c * Y).elbo_trace_ + Y.size * np.log(c)
        np.testing.assert_allclose(tr, ref_rbf, rtol=1e-8)


def test_bad_input():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="same number of rows"):
        MRD(n_components=2, n_inducing=5).fit([rng.standard_normal((20, 3)), rng.standard_normal((19, 3))])
    bad = rng.standard_normal((20, 3))
    bad[4, 2] = np.inf
    with pytest.raises(ValueError, match="row 4, column 2"):
        BayesianGPLVM(n_components=2, n_inducing=5).fit(bad)
    with pytest.raises(ValueError, match="n_samples = 20, n_inducing = 30"):
        BayesianGPLVM(n_components=2, n_inducing=30).fit(rng.standard_normal((20, 3)))
    with pytest.raises(ValueError, match="'kernel' parameter of BayesianGPLVM.*Got 'matern'"):
        BayesianGPLVM(n_components=2, n_inducing=5, kernel="matern").fit(rng.standard_normal((20, 3)))
    with pytest.raises(ValueError, match="not fitted"):
        MRD().segment()


def test_temporal_posterior_equals_dense_gaussian_algebra():
    """mu = K mubar, S = (K^-1 + Lam)^-1 and KL(N(mu, S) || N(0, K)) per latent dimension, against
    explicit inverses and the textbook Gaussian KL."""
    from lvmcore.models.bgplvm import temporal_posterior, temporal_prior

    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 10, 12))
    seq = np.array([0] * 7 + [1] * 5)
    K = np.asarray(temporal_prior(t, seq)(np.log(1.5)))
    assert np.allclose(K[:7, 7:], 0)
    mubar, loglam = rng.standard_normal((12, 2)), rng.standard_normal((12, 2))
    mu, logS, kl = temporal_posterior(mubar, loglam, K)
    kl_ref = 0.0
    for q in range(2):
        Sq = np.linalg.inv(np.linalg.inv(K) + np.diag(np.exp(loglam[:, q])))
        m = K @ mubar[:, q]
        np.testing.assert_allclose(np.asarray(mu)[:, q], m, rtol=1e-10)
        np.testing.assert_allclose(np.exp(np.asarray(logS)[:, q]), np.diag(Sq), rtol=1e-8)
        kl_ref += 0.5 * (
            np.trace(np.linalg.solve(K, Sq))
            + m @ np.linalg.solve(K, m)
            - 12
            + np.linalg.slogdet(K)[1]
            - np.linalg.slogdet(Sq)[1]
        )
    np.testing.assert_allclose(float(kl), kl_ref, rtol=1e-8)


@pytest.mark.slow
def test_temporal_prior_fit():
    t = np.linspace(0, 4 * np.pi, 80)
    Y = np.column_stack([np.sin(t), np.cos(t), np.sin(t) * np.cos(t)]) @ np.random.default_rng(
        1
    ).standard_normal((3, 6))
    Y += 0.05 * np.random.default_rng(2).standard_normal(Y.shape)
    m = BayesianGPLVM(
        n_components=2, n_inducing=12, kernel="rbf", random_state=0, max_iter=150, init_iters=30
    ).fit(Y, times=t, sequences=np.repeat([0, 1], 40))
    assert np.isfinite(m.elbo_) and m.elbo_trace_[-1] >= m.elbo_trace_[0]
    assert np.all(m.embedding_var_ > 0)
    # neighbouring time steps stay neighbours in the latent space
    step = np.linalg.norm(np.diff(m.embedding_[:40], axis=0), axis=1)
    assert np.median(step) < 0.2 * np.linalg.norm(m.embedding_.std(0)) * 2
    with pytest.raises(ValueError, match="times must be 80 finite time stamps"):
        BayesianGPLVM(n_components=2, n_inducing=12).fit(Y, times=t[:10])


def _solve_refined(A, B):
    """A^-1 B by LU with two steps of iterative refinement, residuals in extended precision: an
    accurate dense reference even for the linear kernel's K_mm (rank Q plus jitter, cond ~1e8)."""
    X = np.linalg.solve(A, B)
    for _ in range(2):
        R = (B.astype(np.longdouble) - A.astype(np.longdouble) @ X.astype(np.longdouble)).astype(float)
        X = X + np.linalg.solve(A, R)
    return X


def test_predict_view_equals_dense_formula():
    """predict_view (triangular solves on the bound's shared factors) against the textbook formula
    (paper 004 appendix C) with dense solves, per test point, for both kernels; at S = 0 the mean
    is the DTC mean K_*m (K_mm + beta Psi2)^-1 beta Psi1^T Y."""
    import jax

    from lvmcore.kernels.euclidean import get_kernel
    from lvmcore.models.bgplvm import kmm
    from lvmcore.psi import psi1, psi_statistics

    rng = np.random.default_rng(4)
    Y = rng.standard_normal((40, 3))
    for kind in ("rbf", "linear"):
        m = BayesianGPLVM(n_components=2, n_inducing=6, kernel=kind, max_iter=5, init_iters=2, random_state=0)
        m.fit(Y)
        kern, kp, Z = get_kernel(kind), m.glob_["kern"][0], m._Z(0)
        beta = float(np.exp(m.glob_["log_beta"][0]))
        _, psi1TY, psi2, _ = (np.asarray(a) for a in m._train_stats["views"][0])
        Kmm = np.asarray(kmm(kind, Z, kp, m.kmm_jitter_[0]))
        Kmm = Kmm + m.extra_jitter_ * np.mean(np.diag(Kmm)) * np.eye(len(Kmm))
        B = Kmm + beta * psi2
        W = beta * _solve_refined(B, psi1TY)
        mu, S = rng.standard_normal((4, 2)), rng.uniform(0.0, 0.3, (4, 2))
        S[0] = 0.0
        mean, var = m.predict_view(mu, S, 0)
        for i in range(4):
            with jax.enable_x64(True):  # the kernel's own statistics of one row, as the reference's input
                row = (mu[i : i + 1], S[i : i + 1], Z, kp)
                p0, _, p2 = (np.asarray(a) for a in psi_statistics(kern, *row, np.zeros((1, 1))))
                p1 = np.asarray(psi1(kern, mu[i : i + 1], S[i : i + 1], Z, kp))[0]
            want_mean = p1 @ W
            trace = np.trace(_solve_refined(Kmm, p2) - _solve_refined(B, p2))
            want_var = p0 - trace + 1 / beta + np.diag(W.T @ p2 @ W) - want_mean**2
            np.testing.assert_allclose(mean[i] - m.view_means_[0], want_mean, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(var[i], want_var, rtol=1e-7, atol=1e-9 * abs(trace))
        with jax.enable_x64(True):
            Ks = np.asarray(kern.K(mu[:1], Z, kp))
        np.testing.assert_allclose(mean[0] - m.view_means_[0], (Ks @ W)[0], rtol=1e-9)


def test_pca_start_of_tall_data_equals_the_svd_route(monkeypatch):
    """q(X)'s PCA start (lvmcore.pca.pca_start, whitened): the covariance-eigenvector route of large
    tall data (one copy of the data, no N x D factor) gives the SVD's scores with the largest
    loading of each column positive."""
    from lvmcore import pca
    from lvmcore.models.bgplvm import _principal_scores

    monkeypatch.setattr(pca, "PCA_COVARIANCE_ROWS", 500)
    rng = np.random.default_rng(3)
    views = [rng.standard_normal((600, 4)) @ rng.standard_normal((4, 4)), rng.standard_normal((600, 3))]
    tall = _principal_scores(views, 3)
    Ys = np.hstack([(Y - Y.mean(0)) / Y.std(0) for Y in views])
    U, s, Vt = np.linalg.svd(Ys - Ys.mean(0), full_matrices=False)
    V = Vt[:3].T
    V = V * np.sign(V[np.argmax(np.abs(V), axis=0), np.arange(3)])
    np.testing.assert_allclose(tall, (Ys - Ys.mean(0)) @ V / s[:3], atol=1e-10)
    np.testing.assert_allclose(tall.T @ tall, np.eye(3), atol=1e-10)
    np.testing.assert_allclose(pca.pca_start(Ys, 3), (Ys - Ys.mean(0)) @ V, atol=1e-10)  # not whitened
    small = _principal_scores([v[:300] for v in views], 3)  # below the threshold: the SVD route
    Ys = np.hstack([(Y - Y.mean(0)) / Y.std(0) for Y in (v[:300] for v in views)])
    np.testing.assert_allclose(np.abs(small), np.abs(np.linalg.svd(Ys - Ys.mean(0))[0][:, :3]), atol=1e-10)
