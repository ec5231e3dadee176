"""Evaluate one fitted grid point: neighbourhood preservation, label accuracy, agreement with
the true latent coordinates. Hyperbolic embeddings are compared by hyperbolic distances."""

from __future__ import annotations

import functools

import numpy as np
import xarray as xr
from scipy.spatial.distance import pdist, squareform

from lvmcore import metrics
from lvmcore.checks import MISSING_LABEL
from tasks.inputs import load_data
from tasks.registry import MODELS
from tasks.store import PointResult

#: pairwise metrics are O(N^2): above this many points they use a fixed random subset
MAX_EVAL_POINTS = 2000
EVAL_NEIGHBORS = 10
#: seed of the evaluation subset (the same rows for every grid point of a sweep)
EVAL_SEED = 0
#: a label class keeps at least this many members in a stratified evaluation subset (all it has if fewer)
MIN_PER_CLASS = 10


def read_labels(data_path: str):
    """The ingested data's label codes (None without labels), read alone (not the data)."""
    ds = xr.open_zarr(data_path, consolidated=False)
    return ds["label"].values if "label" in ds else None


def eval_subset_attrs(n: int, labels=None) -> dict:
    """What the result store records about the evaluation subset of an n-point sweep: how many
    rows every metric is computed on, drawn how."""
    how = "stratified by label" if labels is not None else "uniform"
    return {
        "eval_points": int(min(n, MAX_EVAL_POINTS)),
        "eval_subset": "all points"
        if n <= MAX_EVAL_POINTS
        else f"{how} without replacement, seed {EVAL_SEED}",
    }


def eval_subset(n: int, labels=None, size: int = MAX_EVAL_POINTS, seed: int = EVAL_SEED) -> np.ndarray:
    """Sorted rows of the evaluation subset: all n if n <= size; else ``size`` rows drawn without
    replacement, stratified by label where there are labels (missing ones a stratum of their own):
    each class gets its share of ``size``, at least ``MIN_PER_CLASS`` (or all its members), so a
    rare class keeps enough members for the label metrics."""
    if n <= size:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    if labels is None:
        return np.sort(rng.choice(n, size, replace=False))
    labels = np.asarray(labels)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    take = np.minimum(counts, np.maximum(MIN_PER_CLASS, np.floor(size * counts / n).astype(int)))
    while take.sum() > size:  # the guaranteed minimums pushed it over: trim the largest shares
        take[np.argmax(take - np.minimum(counts, MIN_PER_CLASS))] -= 1
    spare = counts - take
    extra = size - int(take.sum())
    if extra > 0:  # rounding left rows over: drawn from the members not yet taken, in proportion
        pool = np.repeat(np.arange(len(classes)), spare)
        take += np.bincount(rng.choice(pool, extra, replace=False), minlength=len(classes))
    rows = [rng.choice(np.flatnonzero(inverse == c), int(t), replace=False) for c, t in enumerate(take)]
    return np.sort(np.concatenate(rows))


def knn_rows(lab) -> np.ndarray:
    """The evaluation rows ``knn_accuracy`` uses, of their labels ``lab``: labelled points of classes
    with at least two labelled members there (stratified cross-validation needs two of a class; a
    rare cell type with one member in the subset is left out, as an unlabelled point is)."""
    lab = np.asarray(lab)
    keep = lab != MISSING_LABEL
    classes, counts = np.unique(lab[keep], return_counts=True)
    return keep & ~np.isin(lab, classes[counts < 2])


def label_notes(labels, sel, names=None) -> tuple[bool, list[str]]:
    """Whether ``knn_accuracy`` can be computed on the evaluation rows ``sel`` and what to tell the
    user once per sweep: points without a label (``MISSING_LABEL``) and classes with a single
    labelled member in the subset are left out of it (:func:`knn_rows`) and named; fewer than two
    classes left leave it undefined. ``names``: category names by code."""
    if labels is None:
        return False, []
    lab = np.asarray(labels)[sel]
    notes = []
    missing = int(np.sum(lab == MISSING_LABEL))
    if missing:
        notes.append(f"{missing} of {len(lab)} evaluated points have no label: left out of knn_accuracy")
    keep = knn_rows(lab)
    single = np.setdiff1d(lab[lab != MISSING_LABEL], lab[keep]).tolist()  # classes knn_rows leaves out
    if single:
        shown = [names[c] if names is not None and 0 <= c < len(names) else c for c in single]
        notes.append(
            f"label class(es) {shown[:5]}{' and more' if len(shown) > 5 else ''} have a single labelled "
            f"point among the evaluated ones ({len(single)} in all): left out of knn_accuracy "
            "(cross-validation needs two of a class)"
        )
    left = len(np.unique(lab[keep]))
    if left < 2:
        notes.append(
            f"knn_accuracy cannot be computed: {left} label class(es) with two or more labelled points "
            "(it needs two); it is NaN at every grid point"
        )
        return False, notes
    return True, notes


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
    sel = eval_subset(data["Y"].shape[0], data["label"], seed=seed)
    DY = squareform(pdist(data["Y"][sel]))
    iu = np.triu_indices(len(sel), k=1)
    nranks_y = metrics.neighbour_ranks(DY)
    rank_y = metrics.average_ranks(DY[iu])
    DT = None
    if data["truth"] is not None:
        DT = squareform(pdist(data["truth"][sel], data["truth_metric"]))
    return sel, DY, nranks_y, iu, rank_y, DT


@functools.lru_cache(maxsize=2)
def _geodesics(data_path: str, fingerprint, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Data-side distances of Qlocal / Qglobal: 20-NN graph geodesics of the evaluation subset,
    and their neighbour ranks."""
    sel = _reference(data_path, fingerprint, seed)[0]
    geo = metrics.manifold_distances(load_data(data_path)["Y"][sel], min(20, len(sel) - 1))
    return geo, metrics.neighbour_ranks(geo)


def graph_labels(res: PointResult):
    """The connected component of every row where the point's graph model was fitted per
    component of its neighbour graph (``n_components_graph`` > 1; the labels are its model's
    ``graph_labels_``, lvmcore.models.components), else None."""
    if float(np.asarray(res.extras.get("n_components_graph", 1))) <= 1 or not res.model:
        return None
    labels = res.model[0].get("graph_labels_")
    return None if labels is None else np.asarray(labels, dtype=np.int64)


#: a component needs this many evaluated rows for its metrics (trustworthiness needs 1 <= k < n / 2)
MIN_COMPONENT_ROWS = 4


def component_weights(labels) -> tuple[list, np.ndarray]:
    """(rows of each component with at least ``MIN_COMPONENT_ROWS`` evaluated rows, weights n_c / N
    over those components): how the metrics of a graph in several pieces are averaged."""
    parts = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    parts = [r for r in parts if len(r) >= MIN_COMPONENT_ROWS]
    sizes = np.array([len(r) for r in parts], dtype=np.float64)
    return parts, sizes / sizes.sum() if len(parts) else sizes


def weighted_metrics(per_component: list[dict], weights) -> dict:
    """Each metric's mean over components, weighted by ``weights`` (n_c / N), over the components
    where it is defined (the weights of those renormalised); NaN where none has it."""
    out = {}
    for name in dict.fromkeys(n for m in per_component for n in m):
        vals = np.array([m.get(name, np.nan) for m in per_component], dtype=np.float64)
        ok = np.isfinite(vals)
        out[name] = float(np.sum(weights[ok] * vals[ok]) / np.sum(weights[ok])) if ok.any() else float("nan")
    return out


def point_metrics(m: dict, DY, DX, Xs, nranks_y, rank_y, iu, geodesics, lab, DT, truth, euclidean_truth):
    """The metrics of one embedding ``Xs`` (its distances ``DX``), written into ``m`` one by one
    (those computed before a failure are kept), on evaluation rows whose data distances are ``DY``
    (neighbour ranks ``nranks_y``, ranked upper triangle ``rank_y`` at ``iu``), data geodesics and
    their ranks from ``geodesics()``, labels ``lab`` (a callable; None: no knn_accuracy), truth
    distances ``DT`` and truth coordinates ``truth`` (procrustes where ``euclidean_truth``)."""
    k = min(EVAL_NEIGHBORS, max(1, len(DX) // 2 - 1))
    # the embedding's neighbour ranks (one row sort) serve trustworthiness, continuity and the
    # co-ranking; the data side's are computed once per worker (_reference, _geodesics)
    nranks_x = metrics.neighbour_ranks(DX)
    ranks = {"data_ranks": nranks_y, "embedding_ranks": nranks_x}
    pre = {"metric": "precomputed", "metric_x": "precomputed", **ranks}
    m["trustworthiness"] = metrics.trustworthiness(DY, DX, n_neighbors=k, **pre)
    m["continuity"] = metrics.continuity(DY, DX, n_neighbors=k, **pre)
    # Shepard goodness = Spearman of pairwise distances, with the data side ranked once
    m["shepard_goodness"] = float(np.corrcoef(rank_y, metrics.average_ranks(DX[iu]))[0, 1])
    geo, nranks_geo = geodesics()
    m["qlocal"], m["qglobal"], _ = metrics.quality_scores(
        None, DX, "precomputed", data_distances=geo, data_ranks=nranks_geo, embedding_ranks=nranks_x
    )
    lab = lab()
    if lab is not None:
        keep = knn_rows(lab)  # an unlabelled point is no class; a class of one cannot be held out
        m["knn_accuracy"] = metrics.knn_accuracy(
            DX[np.ix_(keep, keep)], lab[keep], n_neighbors=1, metric="precomputed"
        )
    if DT is not None:
        m["distance_correlation"] = metrics.distance_correlation(DT, DX, "precomputed", "precomputed")
        m["pearson_distance_correlation"] = float(np.corrcoef(DT[iu], DX[iu])[0, 1])
        if euclidean_truth:
            m["procrustes_disparity"] = metrics.procrustes_disparity(truth, Xs)


def component_metrics(Y_sel, DY, DX, Xs, labels, lab, DT, truth, euclidean_truth) -> dict:
    """The metrics within each connected component of the model's neighbour graph (``labels`` of
    the evaluation rows), averaged with weights n_c / N (:func:`component_weights`): the layout
    of the components is arbitrary, so no distance between two components means anything. The
    data side (ranks, 20-NN geodesics) is computed within each component too."""
    parts, weights = component_weights(labels)
    per = []
    for r in parts:
        ix = np.ix_(r, r)
        dy, iu = DY[ix], np.triu_indices(len(r), k=1)

        def geodesics(r=r):
            geo = metrics.manifold_distances(Y_sel[r], min(20, len(r) - 1))
            return geo, metrics.neighbour_ranks(geo)

        def lab_of(r=r):
            return None if lab is None or not knn_rows(lab[r]).any() else lab[r]

        per.append({})
        try:
            point_metrics(
                per[-1], dy, DX[ix], Xs[r], metrics.neighbour_ranks(dy), metrics.average_ranks(dy[iu]), iu,
                geodesics, lab_of, None if DT is None else DT[ix], None if truth is None else truth[r],
                euclidean_truth,
            )  # fmt: skip
        except ValueError:  # a metric undefined on this component: it and those after it left out
            pass
    return weighted_metrics(per, weights)


def evaluate_point(res: PointResult, data_path: str, seed: int = EVAL_SEED) -> PointResult:
    """The metrics of a finished grid point on the evaluation subset; where its graph model was
    fitted per connected component (:func:`graph_labels`), within components, weighted by size
    (:func:`component_metrics`)."""
    if res.status != "done":
        return res
    spec = MODELS[res.key]
    data = load_data(data_path)
    sel, DY, nranks_y, iu, rank_y, DT = _reference(str(data_path), data["fingerprint"], seed)
    Xs = res.embedding[sel]
    DX = poincare_distances(Xs) if spec.hyperbolic else squareform(pdist(Xs))
    truth = None if data["truth"] is None else data["truth"][sel]
    euclidean_truth = data["truth_metric"] == "euclidean" and not spec.hyperbolic
    labels = graph_labels(res)

    def lab():  # the evaluated rows' labels where knn_accuracy is defined, else None (it stays NaN)
        return np.asarray(data["label"])[sel] if label_notes(data["label"], sel)[0] else None

    try:
        if labels is not None:
            res.metrics.update(
                component_metrics(data["Y"][sel], DY, DX, Xs, labels[sel], lab(), DT, truth, euclidean_truth)
            )
        else:
            geodesics = functools.partial(_geodesics, str(data_path), data["fingerprint"], seed)
            point_metrics(
                res.metrics, DY, DX, Xs, nranks_y, rank_y, iu, geodesics, lab, DT, truth, euclidean_truth
            )
    except Exception as e:  # a metric that cannot be computed is recorded, the fit is kept
        res.error = f"evaluation: {type(e).__name__}: {e}"
    return res
