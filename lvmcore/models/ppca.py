"""Probabilistic PCA (Tipping and Bishop 1999), the closed-form baseline the sweep runs beside
the papers' models."""

from __future__ import annotations

from numbers import Integral

import numpy as np
from sklearn.utils._param_validation import Interval

from lvmcore.checks import check_data
from lvmcore.linalg import chol_solve
from lvmcore.models._base import LatentModel


class PPCA(LatentModel):
    """Probabilistic PCA fitted in closed form (maximum likelihood, Tipping and Bishop eqs. 15-16).

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
        from sklearn.decomposition import PCA

        self._validate_params()
        self._refuse_graph(graph)
        Y = check_data(Y)
        q, D = int(self.n_components), Y.shape[1]
        if q >= D:
            raise ValueError(
                f"Expected n_components < n_features, but n_features = {D}, n_components = {q}; "
                "lower n_components"
            )
        # many more rows than columns: the D x D covariance's eigenvectors (no centred copy, no
        # N x D factor U; sklearn's "covariance_eigh"); else the SVD of the centred data
        tall = Y.shape[0] >= 10 * D
        pca = PCA(n_components=q, svd_solver="covariance_eigh" if tall else "full").fit(Y)
        self.elbo_ = _log_likelihood(Y, pca.mean_, pca.get_precision())
        self.elbo_trace_ = np.array([self.elbo_])
        self.n_iter_ = 1
        self.converged_ = True  # a closed form
        self.mean_, self.noise_variance_ = pca.mean_, float(pca.noise_variance_)
        self.loadings_ = pca.components_.T * np.sqrt(
            np.maximum(pca.explained_variance_ - pca.noise_variance_, 0.0)
        )
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

    def transform(self, Y):
        """Posterior means of the latent points of new rows (N*, Q)."""
        self._check_fitted()
        Y = check_data(Y)
        if Y.shape[1] != self.mean_.shape[0]:
            raise ValueError(f"Y has {Y.shape[1]} columns, the model was fitted on {self.mean_.shape[0]}")
        return self._posterior_mean(Y)


def _log_likelihood(Y, mean, precision, block: int = 65536) -> float:
    """sum_n log N(y_n | mean, C) with C^-1 = ``precision`` (Tipping and Bishop eq. 4), the
    quadratic terms summed over row blocks: the centred data is never held whole."""
    N, D = Y.shape
    quad = 0.0
    for a in range(0, N, block):
        R = Y[a : a + block] - mean
        quad += float(np.einsum("ij,ij->", R @ precision, R))
    _, logdet = np.linalg.slogdet(precision)
    return -0.5 * (quad + N * (D * np.log(2 * np.pi) - logdet))
