"""Probabilistic PCA (Tipping and Bishop 1999), the closed-form baseline the sweep runs beside
the papers' models."""

from __future__ import annotations

from numbers import Integral

import numpy as np
from sklearn.utils._param_validation import Interval

from lvmcore.checks import check_data
from lvmcore.linalg import chol_solve
from lvmcore.models._base import LatentModel
from lvmcore.pca import ppca_noise_variance, principal


class PPCA(LatentModel):
    """Probabilistic PCA fitted in closed form (maximum likelihood, Tipping and Bishop eqs. 15-16:
    the noise is the mean of the D - q discarded eigenvalues of the N-normalised covariance, the
    zero ones included when N < D; :mod:`lvmcore.pca`).

    ``elbo_`` is the exact log marginal likelihood of the data under the fitted model, on the same
    scale as the other models' bounds; ``embedding_`` (N, Q) the posterior means
    M^-1 W^T (y - mean) with M = W^T W + sigma^2 I; ``embedding_var_`` (N, Q) the posterior
    marginal variances, diag(sigma^2 M^-1), the same for every row. ``random_state`` is accepted
    for the sweep's seed dimension; the fit is deterministic."""

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "random_state": [Interval(Integral, 0, None, closed="left"), None],
    }

    def __init__(self, *, n_components: int = 2, random_state: int | None = None):
        self.n_components = n_components
        self.random_state = random_state

    def fit(self, Y, graph=None):
        self._validate_params()
        self._refuse_graph(graph)
        Y = check_data(Y)
        q, D = int(self.n_components), Y.shape[1]
        if q >= D:
            raise ValueError(
                f"Expected n_components < n_features, but n_features = {D}, n_components = {q}; "
                "lower n_components"
            )
        p = principal(Y, q)
        noise = ppca_noise_variance(Y, q, p)  # eq. 15, every discarded eigenvalue (N < D too)
        if not noise > np.finfo(np.float64).eps * p.total:  # zero up to the rounding of the total
            raise np.linalg.LinAlgError(
                f"PPCA: the noise variance is 0 (the data lie in a {q}-dimensional subspace), so the "
                "model's covariance is singular; lower n_components"
            )
        self.mean_, self.noise_variance_ = p.mean, float(noise)
        self.loadings_ = p.vectors * np.sqrt(np.maximum(p.values - noise, 0.0))  # eq. 16, R = I
        self.elbo_ = _log_likelihood(Y, self.mean_, self.loadings_, self.noise_variance_)
        self.elbo_trace_ = np.array([self.elbo_])
        self.n_iter_ = 1
        self.converged_ = True  # a closed form
        self.embedding_ = self._posterior_mean(Y)
        M_inv = chol_solve(self._chol_M(), np.eye(q))
        self.embedding_var_ = np.tile(self.noise_variance_ * np.diag(M_inv), (Y.shape[0], 1))
        return self

    def _chol_M(self):
        W = self.loadings_
        return np.linalg.cholesky(W.T @ W + self.noise_variance_ * np.eye(W.shape[1]))

    def _posterior_mean(self, Y):
        # W^T (y - mean) as Y W - mean W: no centred N x D copy of the data
        proj = Y @ self.loadings_ - self.mean_ @ self.loadings_
        return chol_solve(self._chol_M(), proj.T).T

    persisted = LatentModel.persisted + (
        "elbo_trace_", "mean_", "noise_variance_", "loadings_", "score_reference_",
    )  # fmt: skip

    def _checked(self, Y):
        self._check_fitted()
        Y = check_data(Y)
        if Y.shape[1] != self.mean_.shape[0]:
            raise ValueError(f"Y has {Y.shape[1]} columns, the model was fitted on {self.mean_.shape[0]}")
        return Y

    def transform(self, Y, return_var: bool = False):
        """Posterior means of the latent points of new rows (N*, Q), and with ``return_var`` their
        marginal variances diag(sigma^2 M^-1) (N*, Q) (each row's posterior is its own)."""
        Y = self._checked(Y)
        mean = self._posterior_mean(Y)
        if not return_var:
            return mean
        q = self.loadings_.shape[1]
        var = self.noise_variance_ * np.diag(chol_solve(self._chol_M(), np.eye(q)))
        return mean, np.tile(var, (Y.shape[0], 1))

    def score_samples(self, Y) -> np.ndarray:
        """Each row's log density log N(y; mean, W W^T + sigma^2 I) (N*,) (Tipping and Bishop eq. 4,
        through the Q x Q matrix M as :func:`_log_likelihood`)."""
        Y = self._checked(Y)
        W, noise = self.loadings_, self.noise_variance_
        D, q = W.shape
        L = self._chol_M()
        R = Y - self.mean_
        RW = R @ W
        quad = (np.einsum("ij,ij->i", R, R) - np.einsum("ij,ji->i", RW, chol_solve(L, RW.T))) / noise
        logdet = (D - q) * np.log(noise) + 2.0 * float(np.sum(np.log(np.diag(L))))
        return -0.5 * (quad + D * np.log(2 * np.pi) + logdet)

    def inverse_transform(self, X, return_var: bool = False):
        """The mean of p(y | x) = N(W x + mean, sigma^2 I) at latent points X (N*, D) (and its
        variance, sigma^2 in every column, with ``return_var``)."""
        self._check_fitted()
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        mean = X @ self.loadings_.T + self.mean_
        return (mean, np.full_like(mean, self.noise_variance_)) if return_var else mean


def _log_likelihood(Y, mean, W, noise, block: int = 65536) -> float:
    """sum_n log N(y_n | mean, C), C = W W^T + noise I (Tipping and Bishop eq. 4), through the
    q x q matrix M = W^T W + noise I: log|C| = (D - q) log noise + log|M| and
    r^T C^-1 r = (|r|^2 - r^T W M^-1 W^T r) / noise. The residuals are summed over row blocks:
    neither the centred data nor a D x D matrix is formed."""
    N, D = Y.shape
    q = W.shape[1]
    L = np.linalg.cholesky(W.T @ W + noise * np.eye(q))
    quad = 0.0
    for a in range(0, N, block):
        R = Y[a : a + block] - mean
        P = chol_solve(L, (R @ W).T)
        quad += float(np.einsum("ij,ij->", R, R) - np.einsum("ij,ji->", R @ W, P))
    logdet = (D - q) * np.log(noise) + 2.0 * float(np.sum(np.log(np.diag(L))))
    return -0.5 * (quad / noise + N * (D * np.log(2 * np.pi) + logdet))
