"""Manifold relevance determination (paper 004): V views share one q(X); each view has its own
kernel with ARD weights and its own noise; the bound is the sum of the views' collapsed bounds
minus one KL (``lvmcore.models.bgplvm``). Adds shared/private segmentation for any number of views
and cross-view prediction (the paper's Algorithm 1)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from sklearn.utils._param_validation import StrOptions

from lvmcore import newpoints
from lvmcore.graph import knn_query
from lvmcore.models._base import REFERENCE_SCORE_CELLS
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

    def reference_score_stats(self, Y_train, random_state: int = 0, subsets=None) -> tuple[float, float]:
        """Median and MAD of the training rows' scores (at most ``REFERENCE_SCORE_CELLS``, a seeded
        subsample) for every non-empty set of observed views, or for the sets in ``subsets`` (view
        indices each: those a query is observed in; each set is a solve per row, so a query that
        lacks one of three views needs one of the seven): a row observed in some views is scored
        on those only, so its mapping score is standardised against the training rows scored on
        the same views. ``score_reference_`` maps "0,1"-style keys to [median, MAD]; returns the
        pair of the largest set."""
        views = [np.asarray(Y) for Y in Y_train]
        n = len(views[0])
        rows = np.arange(n)
        if n > REFERENCE_SCORE_CELLS:
            rng = np.random.default_rng(random_state)
            rows = np.sort(rng.choice(n, REFERENCE_SCORE_CELLS, replace=False))
        if subsets is None:
            every = range(len(views))
            subsets = [c for k in range(1, len(views) + 1) for c in itertools.combinations(every, k)]
        subsets = sorted({tuple(sorted(int(v) for v in c)) for c in subsets}, key=lambda c: (len(c), c))
        bad = [c for c in subsets if not c or not all(0 <= v < len(views) for v in c)]
        if bad:
            raise ValueError(f"subsets {bad}: each must name some of the views 0..{len(views) - 1}")
        out = {}
        for subset in subsets:
            s = self.score_samples({v: views[v][rows] for v in subset})
            med = float(np.median(s))
            mad = float(np.median(np.abs(s - med)))
            out[_subset_key(subset)] = [med, mad if mad > 0 else 1.0]
        self.score_reference_ = out
        return tuple(out[_subset_key(subsets[-1])])

    def reference_pair(self, Y_new) -> tuple[float, float]:
        """(median, MAD) of the training rows scored on the views ``Y_new`` is observed in (a dict
        {view: rows}, a list of every view, or one array: view 0), what ``mapping_score`` and
        ``map_points`` standardise by."""
        ref = getattr(self, "score_reference_", None)
        if not ref:
            raise ValueError("MRD has no reference scores; call reference_score_stats(training views)")
        key = _subset_key(self._as_observed(Y_new))
        if key not in ref:
            raise ValueError(
                f"MRD has no reference scores for rows observed in views {key} (it has {sorted(ref)}); "
                f"call reference_score_stats(training views, subsets=[({key},)])"
            )
        med, mad = ref[key]
        return med, mad

    def predict(
        self,
        observed: dict,
        target: int,
        threshold: float = 1e-3,
        max_iter: int = newpoints.MAX_ITER,
        at=None,
    ):
        """Algorithm 1 of paper 004, row by row: q(x*) = N(mu*, diag s*) from the observed views
        only (:meth:`infer`); the latent dimensions none of the observed views uses (normalised
        weight <= threshold) are not informed by them, so their means are taken from the training
        point nearest to mu* in the dimensions the observed views share with the target (those the
        observed views use, where they share none), their variances s* plus the training means'
        mean squared distance from mu* there (step 9 keeps s*; the filled mean is a draw the
        observed views say nothing about, so the interval must hold both); then the target view's
        predictive mean and variance there, the noise included. Returns (mean, var), (N*, D_target).
        ``at``: these rows' q(x*) = (mu*, S*) as :meth:`infer` (or ``map_points``) gave it, which
        is then not solved again."""
        self._check_fitted()
        V = len(self.kinds_)
        if not isinstance(target, (int, np.integer)) or not 0 <= target < V:
            raise ValueError(f"target view {target!r} out of range; this model has views 0..{V - 1}")
        mu, S = self.infer(observed, max_iter=max_iter) if at is None else (np.asarray(a, float) for a in at)
        rel = self.relevance() > threshold
        seen = sorted(dict(enumerate(observed)) if isinstance(observed, (list, tuple)) else observed)
        used = np.any(rel[seen], axis=0)
        if not np.all(used):
            shared = used & rel[int(target)]
            near = shared if shared.any() else used
            X = self.embedding_
            nn = knn_query(X[:, near], mu[:, near])[0][:, 0]
            mu, S = mu.copy(), S.copy()
            # the filled mean is a training row's, taken without information on these dimensions:
            # x*'s expected squared distance from it is s* plus the training means' mean squared
            # distance from mu* (step 9 keeps s* alone: its 95% interval then covered 75% of the
            # target's private values, which the observed views cannot inform, on the two-view toy)
            Xf = X[:, ~used]
            S[:, ~used] += Xf.var(axis=0) + (Xf.mean(axis=0) - mu[:, ~used]) ** 2
            mu[:, ~used] = Xf[nn]
        return self.predict_view(mu, S, int(target))


def _subset_key(views) -> str:
    return ",".join(str(int(v)) for v in sorted(views))
