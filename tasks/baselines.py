"""Reference models that run through the sweep beside the papers' models."""

from __future__ import annotations

import numpy as np


class PPCA:
    """Probabilistic PCA (Tipping and Bishop) fitted in closed form.

    ``elbo_`` is the exact log marginal likelihood of the data under the fitted model, so it
    sits on the same scale as the other models' bounds; ``embedding_`` is the posterior mean of
    the latent points.
    """

    def __init__(self, *, n_components=2, random_state=None, max_iter=1, tol=0.0):
        self.n_components = n_components
        self.random_state = random_state
        self.max_iter = max_iter
        self.tol = tol

    def fit(self, Y, graph=None):
        from sklearn.decomposition import PCA

        Y = np.asarray(Y, dtype=np.float64)
        if not 1 <= self.n_components < Y.shape[1]:
            raise ValueError(f"n_components must be in [1, D) = [1, {Y.shape[1]}), got {self.n_components}")
        pca = PCA(n_components=self.n_components, svd_solver="full").fit(Y)
        self.elbo_ = float(pca.score(Y) * Y.shape[0])
        self.elbo_trace_ = np.array([self.elbo_])
        self.n_iter_ = 1
        # posterior mean of x given y: M^-1 W^T (y - mu), M = W^T W + s2 I
        W = pca.components_.T * np.sqrt(np.maximum(pca.explained_variance_ - pca.noise_variance_, 0.0))
        M = W.T @ W + pca.noise_variance_ * np.eye(self.n_components)
        self.embedding_ = np.linalg.solve(M, W.T @ (Y - pca.mean_).T).T
        self.pca_ = pca
        return self
