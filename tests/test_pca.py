"""The one PCA start and PPCA noise estimate (lvmcore.pca) and the PPCA model: maximum likelihood
also with fewer points than features, against a direct numerical maximisation of the likelihood."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.stats import multivariate_normal

from lvmcore.models.ppca import PPCA
from lvmcore.pca import pca_start, ppca_noise_variance, principal


def _low_rank(n, d, q=2, noise=1.0, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((n, q)) @ (3.0 * rng.standard_normal((q, d)))
        + np.sqrt(noise) * rng.standard_normal((n, d))
        + 5.0
    )


def test_ppca_with_fewer_points_than_features_is_the_likelihood_maximum():
    """200 x 5000: the closed form equals L-BFGS on the log-likelihood over (W, log noise) from a
    random start (Woodbury form, written here). scikit-learn's noise_variance_ (averaged over
    min(N, D) - q eigenvalues of the (N - 1)-normalised covariance) is 25x the ML noise here."""
    Y = _low_rank(200, 5000, noise=1.0)
    n, d, q = Y.shape[0], Y.shape[1], 2
    Yc = Y - Y.mean(0)
    tr = float(np.sum(Yc * Yc))

    def nll(theta):
        W, log_s2 = theta[:-1].reshape(d, q), theta[-1]
        s2 = jnp.exp(log_s2)
        M = W.T @ W + s2 * jnp.eye(q)
        YW = Yc @ W
        quad = (tr - jnp.sum(YW * jnp.linalg.solve(M, YW.T).T)) / s2
        logdet = (d - q) * log_s2 + jnp.linalg.slogdet(M)[1]
        return 0.5 * (quad + n * (d * np.log(2 * np.pi) + logdet))

    with jax.enable_x64(True):
        f = jax.jit(jax.value_and_grad(nll))
        x0 = np.concatenate([0.1 * np.random.default_rng(1).standard_normal(d * q), [0.0]])
        res = minimize(
            lambda x: tuple(np.asarray(v, dtype=np.float64) for v in f(x)),
            x0,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 2000, "gtol": 1e-8, "ftol": 1e-15},
        )
        W, s2 = res.x[:-1].reshape(d, q), float(np.exp(res.x[-1]))
    m = PPCA(n_components=q).fit(Y)
    assert m.elbo_ == pytest.approx(-res.fun, rel=1e-7)
    assert m.elbo_ >= -res.fun - 1e-6 * abs(res.fun)  # the closed form is not below the search
    assert m.noise_variance_ == pytest.approx(s2, rel=1e-4)
    assert m.noise_variance_ == pytest.approx(1.0, rel=0.05)  # the noise the data were made with
    M_inv = np.linalg.inv(W.T @ W + s2 * np.eye(q))
    np.testing.assert_allclose(np.sort(m.embedding_var_[0]), s2 * np.linalg.eigvalsh(M_inv), rtol=1e-3)
    from sklearn.decomposition import PCA

    assert PCA(n_components=q).fit(Y).noise_variance_ > 20 * m.noise_variance_  # the old estimate


@pytest.mark.parametrize("shape", [(20, 60), (300, 6)])
def test_ppca_likelihood_and_noise_against_scipy(shape):
    """elbo_ is the exact log-likelihood of the fitted model (scipy's multivariate normal with the
    D x D covariance W W^T + noise I), and the noise is the mean of the D - q discarded eigenvalues
    of the N-normalised covariance, zeros included (N < D)."""
    Y = _low_rank(*shape, seed=3)
    m = PPCA(n_components=2).fit(Y)
    C = m.loadings_ @ m.loadings_.T + m.noise_variance_ * np.eye(Y.shape[1])
    ref = multivariate_normal(mean=m.mean_, cov=C).logpdf(Y).sum()
    assert m.elbo_ == pytest.approx(ref, rel=1e-10)
    ev = np.sort(np.linalg.eigvalsh(np.cov(Y.T, bias=True)))[::-1]
    assert m.noise_variance_ == pytest.approx(np.mean(ev[2:]), rel=1e-8)
    assert ppca_noise_variance(Y, 2) == pytest.approx(np.mean(ev[2:]), rel=1e-8)
    assert ppca_noise_variance(Y[:, :2], 2) is None


def test_principal_and_pca_start_match_the_svd():
    """The tall (covariance) and wide (SVD) routes give the same leading eigenvalues; the start's
    scores span the leading directions (up to sign)."""
    Y = _low_rank(400, 8, seed=4)
    p = principal(Y, 3)  # N >= 10 D: the covariance route
    s = np.linalg.svd(Y - Y.mean(0), compute_uv=False)
    np.testing.assert_allclose(p.values, s[:3] ** 2 / 400, rtol=1e-10)
    assert p.total == pytest.approx(np.sum(s**2) / 400, rel=1e-12)
    P = pca_start(Y, 2)
    np.testing.assert_allclose(
        np.abs(P.T @ (Y - Y.mean(0)) @ p.vectors[:, :2]), np.diag(s[:2] ** 2), atol=1e-6 * s[0] ** 2
    )
    assert pca_start(Y[:, :1], 2)[:, 1].tolist() == [0.0] * 400  # zero columns past the rank


def test_ppca_refuses_data_without_noise():
    """Data in a q-dimensional subspace have no ML noise: the fit fails saying the covariance is
    singular (a grid point's recorded reason)."""
    Y = np.hstack([np.random.default_rng(0).normal(size=(60, 2)), np.zeros((60, 1))])
    with pytest.raises(np.linalg.LinAlgError, match="singular"):
        PPCA(n_components=2).fit(Y)
