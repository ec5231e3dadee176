"""The graph models (GLLE, LL-LVM) on the persistence contract (issue 50 item 2): the fitted model
as plain arrays and back, with every output equal (1e-10); each new point's answer independent of
the others mapped with it (1e-8); the out-of-sample variance and score against slow per-point
references (explicit Gaussians); GLLE's transform of its training points inside its generations'
spread."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from lvmcore.data import synthetic as S
from lvmcore.graph import knn, knn_query
from lvmcore.lle import match_axes
from lvmcore.models import GLLE, LLLVM
from lvmcore.models import lllvm as ll
from lvmcore.models.glle import sum_to_one_basis
from lvmcore.models.persist import model_from_arrays

N_TRAIN = 80
N_NEW = 45


def _roll(n=N_TRAIN + N_NEW, seed=0):
    Y, _ = S.swiss_roll(n, seed=seed)
    Y = Y + 0.05 * np.random.default_rng(seed).standard_normal(Y.shape)
    return Y[:N_TRAIN], Y[N_TRAIN:]


def _round_trip(m, Ytr, idx):
    """Arrays float64 / int64, params JSON, and the model back through model_from_arrays."""
    arrays, params = m.to_arrays()
    for name, a in arrays.items():
        assert a.dtype in (np.float64, np.int64), (name, a.dtype)
    params = json.loads(json.dumps(params))
    return model_from_arrays({k: np.array(v) for k, v in arrays.items()}, params, data=Ytr, graph=idx)


def _outputs(m, Ynew):
    mean, var = m.transform(Ynew, return_var=True)
    out = {"mean": mean, "var": var, "score": m.score_samples(Ynew)}
    if hasattr(m, "inverse_transform"):
        out["inverse"] = m.inverse_transform(mean)
    return out


# --------------------------------------------------------------------------------------- GLLE
@functools.cache
def _glle_fit(method):
    Ytr, Ynew = _roll()
    idx, _ = knn(Ytr, 12)
    m = GLLE(n_neighbors=8, method=method, cov_scale=2.0, random_state=3).fit(Ytr, graph=idx)
    m.reference_score_stats(Ytr)
    return m, Ytr, Ynew, idx


@pytest.fixture(scope="module", params=["em", "direct"])
def glle(request):
    return _glle_fit(request.param)


def test_glle_round_trip(glle):
    m, Ytr, Ynew, idx = glle
    m2 = _round_trip(m, Ytr, idx)
    a, b = _outputs(m, Ynew), _outputs(m2, Ynew)
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-10, err_msg=key)
    np.testing.assert_allclose(m2.mapping_score(Ynew), m.mapping_score(Ynew), rtol=0, atol=1e-10)
    # generations from the loaded model (its sampling factors recomputed) equal the fitted one's
    np.testing.assert_allclose(m2.sample(3, random_state=5), m.sample(3, random_state=5), rtol=0, atol=1e-10)
    assert m2.embedding_var_ is None and m2.n_iter_ == m.n_iter_ and m2.elbo_ == m.elbo_
    with pytest.raises(ValueError, match="needs the store's inputs"):
        model_from_arrays(*m.to_arrays(), data=Ytr)


def test_glle_per_cell_determinism(glle):
    m, _, Ynew, _ = glle
    batch = _outputs(m, Ynew)
    for i in range(5):
        alone = _outputs(m, Ynew[i : i + 1])
        for key in ("mean", "var", "score"):
            np.testing.assert_allclose(alone[key][0], batch[key][i], rtol=0, atol=1e-8, err_msg=key)


def test_glle_out_of_sample_against_explicit_gaussians():
    """One new point by hand: LLE weights from its k nearest training points (scikit-learn's
    regularised barycentre), EM's sigma by eq. 29 with the E-step moments from direct Gaussian
    conditioning (n_iter_ updates from sigma = 0's), the weights' covariance pushed through the
    neighbours' latents, and the reconstruction log-likelihood as scipy's multivariate normal."""
    m, Ytr, Ynew, _ = _glle_fit("em")  # the explicit sigma iteration is EM's
    y = Ynew[7]
    k, D = m.n_neighbors, Ytr.shape[1]
    d = np.linalg.norm(Ytr - y, axis=1)
    nb = np.argsort(d)[:k]
    G = Ytr[nb] - y
    C = G @ G.T
    eps = m.reg * np.trace(C)
    w = np.linalg.solve(C + eps * np.eye(k), np.ones(k))
    w /= w.sum()
    B = sum_to_one_basis(k)
    Xt = G.T @ B
    yc = y - Ytr[nb].mean(axis=0)
    A = Xt @ Xt.T + eps * np.eye(D)

    def moments(sigma):
        joint = sigma * np.block([[A, Xt], [Xt.T, np.eye(k - 1)]])
        S12 = joint[:D, D:]
        mv = S12.T @ np.linalg.solve(joint[:D, :D], yc)
        return mv, joint[D:, D:] - S12.T @ np.linalg.solve(joint[:D, :D], S12)

    def update(sigma):
        mv, cov = moments(sigma)
        r = yc - Xt @ mv
        S1 = np.outer(r, r) + Xt @ cov @ Xt.T
        return (np.trace(np.linalg.solve(A, S1)) + np.trace(cov + np.outer(mv, mv))) / (D + k - 1)

    sigma = update(1e-300)  # b / (D + k'): the update with no posterior spread
    for _ in range(m.n_iter_):
        sigma = update(sigma)
    _, cov_v = moments(sigma)
    Xn = m.embedding_[nb]
    var = m.cov_scale * np.diag(Xn.T @ B @ cov_v @ B.T @ Xn)
    mean, v = m.transform(y[None], return_var=True)
    np.testing.assert_allclose(mean[0], w @ Xn, rtol=1e-9)
    np.testing.assert_allclose(v[0], var, rtol=1e-7)
    ref = multivariate_normal(np.zeros(D), sigma * A).logpdf(yc)
    np.testing.assert_allclose(m.score_samples(y[None])[0], ref, rtol=1e-9)


def test_glle_transform_of_training_points_within_generations(glle):
    """Each training point's transform lies inside the spread of 40 generations (axes matched to
    the LLE embedding, as sample() returns them): within a few of their sd of their mean."""
    m, Ytr, _, _ = glle
    gens = m.sample(40, random_state=11)  # (G, N, Q), axes matched to lle_embedding_
    x = match_axes(m.lle_embedding_, m.transform(Ytr))
    mu, sd = gens.mean(axis=0), gens.std(axis=0)
    z = np.abs(x - mu) / sd
    assert np.median(z) < 1.5 and np.mean(z < 4.0) > 0.97, (np.median(z), np.mean(z < 4.0))
    lo, hi = gens.min(axis=0), gens.max(axis=0)
    inside = np.mean((x >= lo - sd) & (x <= hi + sd))
    assert inside > 0.95, inside


def test_glle_score_flags_points_off_the_manifold(glle):
    m, Ytr, Ynew, _ = glle
    off = Ynew[:10] + np.array([30.0, 0.0, 0.0])  # far from the reference's every point
    assert np.max(m.mapping_score(off)) < np.min(m.mapping_score(Ynew[:10]))
    # the reference: training points scored with themselves left out, on the new points' scale
    assert abs(np.median(m.mapping_score(Ynew))) < 3.0


# --------------------------------------------------------------------------------------- LL-LVM
_LLLVM = {
    "dense": dict(solver="dense"),
    "factorised": dict(solver="factorised"),
    "quadratic": dict(likelihood="quadratic", solver="dense"),
}


@functools.cache
def _fit_lllvm(name):
    Ytr, Ynew = _roll(seed=1)
    idx, _ = knn(Ytr, 12)
    m = LLLVM(n_neighbors=6, max_iter=8, random_state=0, **_LLLVM[name]).fit(Ytr, graph=idx)
    m.reference_score_stats(Ytr)
    return m, Ytr, Ynew, idx, name


@pytest.fixture(scope="module", params=list(_LLLVM))
def lllvm(request):
    return _fit_lllvm(request.param)


def test_lllvm_round_trip(lllvm):
    m, Ytr, Ynew, idx, name = lllvm
    few = Ynew[: 2 if name == "factorised" else 4]
    m2 = _round_trip(m, Ytr, idx)
    a, b = _outputs(m, few), _outputs(m2, few)
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-10, err_msg=key)
    np.testing.assert_allclose(m2.mapping_score(few), m.mapping_score(few), rtol=0, atol=1e-10)
    for name in ("embedding_", "embedding_var_", "embedding_cov_", "C_", "Y_train_"):
        np.testing.assert_array_equal(getattr(m2, name), getattr(m, name))
    assert m2.elbo_ == m.elbo_ and m2.gamma_ == m.gamma_
    np.testing.assert_array_equal((m2.adjacency_ != m.adjacency_).nnz, 0)


@pytest.mark.parametrize(
    "name",
    # the factorised solver's out-of-sample step costs ~0.2 s a point here (each point on its own
    # enlarged graph, CG over the whole graph per sweep): 9 s for this test
    ["dense", "quadratic", pytest.param("factorised", marks=pytest.mark.slow)],
)
def test_lllvm_per_cell_determinism(name):
    """5 points alone against the same 5 among 40 others, through ``map_points`` (what ``map``
    runs: one E-step per call for the place, the variance and the score), whose answers are
    ``transform``'s and ``mapping_score``'s; the score to 1e-8 in score_samples' units (x MAD)."""
    m, _, Ynew, _, _ = _fit_lllvm(name)
    mean, var, score = m.map_points(Ynew)
    mad = m.score_reference_[1]
    for i in range(5):
        mi, vi, si = m.map_points(Ynew[i : i + 1])
        np.testing.assert_allclose(mi[0], mean[i], rtol=0, atol=1e-8)
        np.testing.assert_allclose(vi[0], var[i], rtol=0, atol=1e-8)
        np.testing.assert_allclose(si[0], score[i], rtol=0, atol=1e-8 / mad)
    assert var.shape == mean.shape and np.all(var > 0)
    mx, cov = m.transform(Ynew[:3], return_cov=True)
    np.testing.assert_array_equal(mx, mean[:3])
    np.testing.assert_array_equal(np.diagonal(cov, axis1=1, axis2=2), var[:3])
    np.testing.assert_allclose(m.mapping_score(Ynew[:3]), score[:3], rtol=0, atol=1e-8 / mad)


def _etilde_loop(W, C, x):
    n = W.shape[0]
    e = np.zeros((n, C.shape[1]))
    for i in range(n):
        for j in np.flatnonzero(W[i]):
            e[i] += (C[i] + C[j]) @ (x[i] - x[j])
    return e


def _enlarged_conditional(m, ys, nbr):
    """log p(y* | training rows) of N(y | Sigma_y e, Sigma_y) on the training graph enlarged by
    y*'s edges to ``nbr``, at the posterior means (x*, C* from transform_points): by dense
    Gaussian conditioning of the joint over all (N + 1) D coordinates. ``ys``: (1, D) scaled."""
    mx, _, Cs, _ = ll.transform_points(m.Y_train_, m.graph_, m.qx_, m.qc_, m.theta_, ys, nbr)
    n, D = m.Y_train_.shape
    W = np.zeros((n + 1, n + 1))
    W[:n, :n] = m.adjacency_.toarray()
    W[n, nbr[0]] = W[nbr[0], n] = 1.0
    L = np.diag(W.sum(1)) - W
    th = m.theta_
    Lam = np.kron(th.eps_y * np.eye(n + 1) + 2.0 * th.gamma * L, np.eye(D))
    e = th.gamma * _etilde_loop(W, np.concatenate([m.C_, Cs]), np.vstack([m.embedding_, mx])).ravel()
    mu = np.linalg.solve(Lam, e)
    Yall = np.vstack([m.Y_train_, ys]).ravel()
    o, t = slice(n * D, None), slice(0, n * D)
    cmean = mu[o] - np.linalg.solve(Lam[o, o], Lam[o, t] @ (Yall[t] - mu[t]))
    return multivariate_normal(cmean, np.linalg.inv(Lam[o, o])).logpdf(ys[0]) - D * np.log(m.scale_)


def test_lllvm_score_is_the_conditional_of_the_enlarged_gaussian(lllvm):
    """score_samples(y*) = log p(y* | training rows) on the training graph enlarged by y*'s k
    edges (``_enlarged_conditional``); the reference scores are the same for each training row
    as a new point whose neighbours are its k nearest other rows (itself left out), so a new
    point from the reference's own manifold scores like a typical reference point."""
    m, Ytr, Ynew, _, name = lllvm
    y = Ynew[3:4]
    ys = (y - m.center_) / m.scale_
    nbr, _ = knn_query(m.Y_train_, ys, m.n_neighbors)
    np.testing.assert_allclose(m.score_samples(y)[0], _enlarged_conditional(m, ys, nbr), rtol=1e-9)
    Yt = m.Y_train_
    scores = []
    for i in range(len(Yt)):  # N = 80: every row, so the median is the reference's
        nb = np.argsort(np.sum((Yt - Yt[i]) ** 2, axis=1), kind="stable")
        nb = nb[nb != i][: m.n_neighbors]
        scores.append(_enlarged_conditional(m, Yt[i : i + 1], nb[None]))
    med = np.median(scores)
    assert med == pytest.approx(m.score_reference_[0], rel=1e-9)
    assert np.median(np.abs(np.array(scores) - med)) == pytest.approx(m.score_reference_[1], rel=1e-8)
    assert abs(np.median(m.mapping_score(Ynew))) < 1.0


@pytest.mark.parametrize("name", ["dense", "quadratic", pytest.param("factorised", marks=pytest.mark.slow)])
def test_lllvm_score_flags_points_off_the_manifold(name):
    m, _, Ynew, _, _ = _fit_lllvm(name)
    off = Ynew[:3] + np.array([30.0, 0.0, 0.0])  # far from the reference's every point
    assert np.max(m.mapping_score(off)) < np.min(m.mapping_score(Ynew[:3]))
