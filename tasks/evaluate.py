"""Evaluate one fitted grid point: neighbourhood preservation, label accuracy, agreement with
the true latent coordinates. Hyperbolic embeddings are compared by hyperbolic distances."""

from __future__ import annotations

import functools

import numpy as np
from scipy.spatial.distance import pdist, squareform

from lvmcore import metrics
from tasks.inputs import load_data
from tasks.registry import MODELS
from tasks.store import PointResult

#: pairwise metrics are O(N^2): above this many points they use a fixed random subset
MAX_EVAL_POINTS = 2000
EVAL_NEIGHBORS = 10
#: seed of the evaluation subset (the same rows for every grid point of a sweep)
EVAL_SEED = 0


def eval_subset_attrs(n: int) -> dict:
    """What the result store records about the evaluation subset of an n-point sweep: how many
    rows every metric is computed on, drawn how."""
    return {
        "eval_points": int(min(n, MAX_EVAL_POINTS)),
        "eval_subset": "all points"
        if n <= MAX_EVAL_POINTS
        else f"uniform without replacement, seed {EVAL_SEED}",
    }


def poincare_distances(P) -> np.ndarray:
    """Hyperbolic distances between points of the Poincare ball:
    d(u, v) = arccosh(1 + 2 |u - v|^2 / ((1 - |u|^2)(1 - |v|^2)))."""
    P = np.asarray(P, dtype=np.float64)
    sq = np.sum(P**2, axis=1)
    den = np.clip(1.0 - sq, 1e-15, None)
    d2 = squareform(pdist(P, "sqeuclidean"))
    return np.arccosh(1.0 + 2.0 * d2 / np.outer(den, den))


@functools.lru_cache(maxsize=2)
def _reference(data_path: str, fingerprint, seed: int):
    """Per-data-set quantities every grid point shares, computed once per worker process: the
    evaluation subset, data distances, the ranks of the data's pairwise distances (Shepard) and
    the truth's distances."""
    data = load_data(data_path)
    n = data["Y"].shape[0]
    sel = np.arange(n)
    if n > MAX_EVAL_POINTS:
        sel = np.sort(np.random.default_rng(seed).choice(n, MAX_EVAL_POINTS, replace=False))
    DY = squareform(pdist(data["Y"][sel]))
    iu = np.triu_indices(len(sel), k=1)
    nranks_y = metrics.neighbour_ranks(DY)
    rank_y = metrics.average_ranks(DY[iu])
    DT = None
    if data["truth"] is not None:
        DT = squareform(pdist(data["truth"][sel], data["truth_metric"]))
    return sel, DY, nranks_y, iu, rank_y, DT


@functools.lru_cache(maxsize=2)
def _geodesics(data_path: str, fingerprint, seed: int) -> np.ndarray:
    """Data-side distances of Qlocal / Qglobal: 20-NN graph geodesics of the evaluation subset."""
    sel = _reference(data_path, fingerprint, seed)[0]
    return metrics.manifold_distances(load_data(data_path)["Y"][sel], min(20, len(sel) - 1))


def evaluate_point(res: PointResult, data_path: str, seed: int = EVAL_SEED) -> PointResult:
    if res.status != "done":
        return res
    spec = MODELS[res.key]
    data = load_data(data_path)
    sel, DY, nranks_y, iu, rank_y, DT = _reference(str(data_path), data["fingerprint"], seed)
    Xs = res.embedding[sel]
    DX = poincare_distances(Xs) if spec.hyperbolic else squareform(pdist(Xs))
    k = min(EVAL_NEIGHBORS, max(1, len(sel) // 2 - 1))
    m = res.metrics
    pre = {"metric": "precomputed", "metric_x": "precomputed"}
    try:
        m["trustworthiness"] = metrics.trustworthiness(DY, DX, n_neighbors=k, data_ranks=nranks_y, **pre)
        m["continuity"] = metrics.continuity(DY, DX, n_neighbors=k, **pre)
        # Shepard goodness = Spearman of pairwise distances, with the data side ranked once
        m["shepard_goodness"] = float(np.corrcoef(rank_y, metrics.average_ranks(DX[iu]))[0, 1])
        geo = _geodesics(str(data_path), data["fingerprint"], seed)
        m["qlocal"], m["qglobal"], _ = metrics.quality_scores(
            None, DX, metric_x="precomputed", data_distances=geo
        )
        if data["label"] is not None:
            m["knn_accuracy"] = metrics.knn_accuracy(
                DX, data["label"][sel], n_neighbors=1, metric="precomputed"
            )
        if DT is not None:
            m["distance_correlation"] = metrics.distance_correlation(DT, DX, "precomputed", "precomputed")
            m["pearson_distance_correlation"] = float(np.corrcoef(DT[iu], DX[iu])[0, 1])
            if data["truth_metric"] == "euclidean" and not spec.hyperbolic:
                m["procrustes_disparity"] = metrics.procrustes_disparity(data["truth"][sel], Xs)
    except Exception as e:  # a metric that cannot be computed is recorded, the fit is kept
        res.error = f"evaluation: {type(e).__name__}: {e}"
    return res
