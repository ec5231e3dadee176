"""Manifold relevance determination (paper 004): V views share one q(X); each view has its own
kernel with ARD weights and its own noise; the bound is the sum of the views' collapsed bounds
minus one KL (``lvmcore.models.bgplvm``). Adds shared/private segmentation for any number of views
and cross-view prediction (the paper's Algorithm 1)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.utils._param_validation import StrOptions

from lvmcore import newpoints
from lvmcore.graph import knn_query
from lvmcore.models.bgplvm import KERNEL_NAMES, BaseCollapsedGPLVM


@dataclass(kw_only=True, eq=False, repr=False)
class MRD(BaseCollapsedGPLVM):
    """MRD(n_components=8, n_inducing=30, kernel="rbf" | "linear" | one per view).fit([Y1, Y2, ...])

    Parameters as :class:`~lvmcore.models.bgplvm.BayesianGPLVM`, plus ``shared_inducing`` (one set
    of inducing inputs for all views, else one per view). Attributes: ``embedding_`` (N, Q) shared
    posterior means, ``embedding_var_`` (N, Q), ``ard_weights_`` (V, Q), ``elbo_``,
    ``elbo_trace_``, ``n_iter_``."""

    _parameter_constraints = {
        **BaseCollapsedGPLVM._parameter_constraints,
        "kernel": [StrOptions(set(KERNEL_NAMES)), list, tuple],
        "shared_inducing": ["boolean"],
    }

    n_components: int = 8
    n_inducing: int = 30
    kernel: str | list | tuple = "rbf"
    shared_inducing: bool = True
    max_iter: int = 500
    init_iters: int = 100
    snr: float = 100.0
    tol: float = 1e-9
    chunks: int | None = None
    random_state: int | None = None

    def fit(self, views, graph=None, *, times=None, sequences=None, client=None):
        """``views``: a list of (N, D_v) arrays. ``times`` / ``sequences``: optional temporal prior
        on X, and ``client`` (the Dask client of the row chunks), as ``BayesianGPLVM.fit``."""
        self._validate_params()
        self._refuse_graph(graph)
        self._fit_views(views, times, sequences, client)
        self.ard_weights_ = self._view_ard()
        return self

    def relevance(self) -> np.ndarray:
        """ARD weights normalised per view to a maximum of 1, (V, Q) (eq. 22's normalised weights)."""
        self._check_fitted()
        w = self.ard_weights_
        return w / w.max(axis=1, keepdims=True)

    def segment(self, threshold: float = 1e-3) -> dict:
        """Split the latent dimensions by which views use them (normalised weight > threshold):
        ``shared`` (every view), ``private`` {v: dims used by view v only}, ``partial``
        {(views...): dims used by that subset, for V > 2}, ``inactive`` (no view)."""
        rel = self.relevance() > threshold
        V, Q = rel.shape
        out = {"shared": [], "private": {v: [] for v in range(V)}, "partial": {}, "inactive": []}
        for q in range(Q):
            users = tuple(int(v) for v in np.flatnonzero(rel[:, q]))
            if len(users) == V:
                out["shared"].append(q)
            elif len(users) == 1:
                out["private"][users[0]].append(q)
            elif not users:
                out["inactive"].append(q)
            else:
                out["partial"].setdefault(users, []).append(q)
        return out

    def transform(self, views, return_var: bool = False, max_iter: int = newpoints.MAX_ITER):
        """Means (n, Q) of q(x*) for new rows (and variances with ``return_var``) from the views
        they are observed in: a dict {view index: (n, D_v)} (partially observed rows), a list of
        every view, or one array: view 0's rows. Each row is its own problem (:meth:`infer`)."""
        mu, S = self.infer(views if isinstance(views, (dict, list, tuple)) else {0: views}, max_iter)
        return (mu, S) if return_var else mu

    def predict(
        self, observed: dict, target: int, threshold: float = 1e-3, max_iter: int = newpoints.MAX_ITER
    ):
        """Algorithm 1 of paper 004, row by row: q(x*) = N(mu*, diag s*) from the observed views
        only (:meth:`infer`); the latent dimensions none of the observed views uses (normalised
        weight <= threshold) are not informed by them, so their means are taken from the training
        point nearest to mu* in the dimensions the observed views share with the target (those the
        observed views use, where they share none); s* is kept (step 9); then the target view's
        predictive mean and variance there, the noise included. Returns (mean, var), (N*, D_target)."""
        self._check_fitted()
        V = len(self.kinds_)
        if not isinstance(target, (int, np.integer)) or not 0 <= target < V:
            raise ValueError(f"target view {target!r} out of range; this model has views 0..{V - 1}")
        mu, S = self.infer(observed, max_iter=max_iter)
        rel = self.relevance() > threshold
        seen = sorted(dict(enumerate(observed)) if isinstance(observed, (list, tuple)) else observed)
        used = np.any(rel[seen], axis=0)
        if not np.all(used):
            shared = used & rel[int(target)]
            near = shared if shared.any() else used
            X = self.embedding_
            nn = knn_query(X[:, near], mu[:, near])[0][:, 0]
            mu = mu.copy()
            mu[:, ~used] = X[nn][:, ~used]
        return self.predict_view(mu, S, int(target))
