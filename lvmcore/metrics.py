"""Embedding quality metrics.

Every function takes the data ``Y`` (N, D) and/or an embedding ``X`` (N, Q). Where a geometry
other than Euclidean applies (hyperbolic embeddings), pass a precomputed (N, N) distance matrix
with ``metric="precomputed"``.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components, shortest_path
from scipy.spatial.distance import pdist, squareform

__all__ = [
    "trustworthiness",
    "continuity",
    "knn_accuracy",
    "distance_correlation",
    "pearson_distance_correlation",
    "shepard_goodness",
    "procrustes_disparity",
    "pairwise_distances",
    "unfolding",
    "neighbour_ranks",
    "average_ranks",
    "manifold_distances",
    "coranking_qnx",
    "quality_scores",
]


def _as2d(A, name):
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {A.shape}")
    if not np.all(np.isfinite(A)):
        raise ValueError(f"{name} contains NaN or inf; metrics need finite coordinates")
    return A


def pairwise_distances(A, metric: str = "euclidean") -> np.ndarray:
    """Full (N, N) distance matrix; ``metric="precomputed"`` returns A checked as square."""
    A = _as2d(A, "A")
    if metric == "precomputed":
        if A.shape[0] != A.shape[1]:
            raise ValueError(f"a precomputed distance matrix must be square, got {A.shape}")
        return A
    return squareform(pdist(A, metric=metric))


def _knn_stable(D, k):
    """Indices of the k nearest (self excluded) per row, ordered as a stable argsort would order
    them (ties by index), without sorting whole rows: partition, then fix the rows with ties at
    the k-th distance."""
    D = D.copy()
    np.fill_diagonal(D, np.inf)
    kth = np.partition(D, k - 1, axis=1)[:, k - 1]
    idx = np.argpartition(D, k - 1, axis=1)[:, :k]
    tied = np.flatnonzero(np.sum(D <= kth[:, None], axis=1) > k)
    for i in tied:  # rare for continuous data, common for codes
        idx[i] = np.argsort(D[i], kind="stable")[:k]
    vals = np.take_along_axis(D, idx, axis=1)
    order = np.lexsort((idx, vals), axis=1)
    return np.take_along_axis(idx, order, axis=1)


def _rank_of(D, j_cols):
    """Stable-argsort rank (1 = nearest, self excluded) of point j_cols[i, c] in row i's order:
    1 + #{l != i : D[i, l] < D[i, j]} + #{l != i, l < j : D[i, l] == D[i, j]}.

    One (N, N) comparison per column of ``j_cols``: O(N^2 k) time, O(N^2) memory."""
    n, k = j_cols.shape
    D = D.copy()
    np.fill_diagonal(D, np.inf)  # self never counts: distances to other points are finite
    rows = np.arange(n)
    cols = np.arange(n)[None, :]
    ranks = np.empty((n, k), dtype=np.int64)
    for c in range(k):
        j = j_cols[:, c]
        dij = D[rows, j][:, None]
        less = np.count_nonzero(D < dij, axis=1)
        eq = np.count_nonzero((D == dij) & (cols < j[:, None]), axis=1)
        ranks[:, c] = 1 + less + eq
    return ranks


def neighbour_ranks(D) -> np.ndarray:
    """(N, N) int32 matrix R of ranks from an (N, N) distance matrix: R[i, j] is the rank of j in
    row i's stable order (1 = nearest, ties by index, self excluded; R[i, i] = 0), the rank
    ``trustworthiness`` uses. One row sort per point: compute it once for data distances that many
    embeddings are compared against, and pass it as ``data_ranks``."""
    D = np.array(D, dtype=np.float64)
    n = D.shape[0]
    if D.shape != (n, n):
        raise ValueError(f"D must be a square distance matrix, got shape {D.shape}")
    np.fill_diagonal(D, -np.inf)  # self sorts first and gets rank 0
    order = np.argsort(D, axis=1, kind="stable")
    R = np.empty((n, n), dtype=np.int32)
    np.put_along_axis(R, order, np.arange(n, dtype=np.int32)[None, :], axis=1)
    return R


def _nearest_by_rank(R, k):
    """The k nearest per row (self excluded), nearest first, read from a ``neighbour_ranks`` matrix:
    each row is a permutation of 0..N-1, so the entries ranked 0..k are self and the k nearest."""
    idx = np.argpartition(R, k, axis=1)[:, : k + 1]
    order = np.argsort(np.take_along_axis(R, idx, axis=1), axis=1)
    return np.take_along_axis(idx, order, axis=1)[:, 1:]


def _check_ranks(R, n, name):
    if np.shape(R) != (n, n):
        raise ValueError(f"{name} must have shape ({n}, {n}), got {np.shape(R)}")
    return np.asarray(R)


def trustworthiness(
    Y,
    X,
    n_neighbors: int = 5,
    metric: str = "euclidean",
    metric_x: str | None = None,
    data_ranks=None,
    embedding_ranks=None,
):
    """Trustworthiness (Venna & Kaski): penalises points that are neighbours in X but not in Y.

    T(k) = 1 - 2 / (N k (2N - 3k - 1)) * sum_i sum_{j in U_k(i)} (r(i, j) - k), where U_k(i) are
    the embedding neighbours of i that are not data neighbours and r the rank in the data space.
    ``metric`` applies to Y, ``metric_x`` (default ``metric`` unless that is precomputed) to X.
    ``data_ranks``: ``neighbour_ranks`` of Y's distances, when several X are scored against one Y;
    ``embedding_ranks``: those of X's, when the embedding's ranks serve other scores too (the
    neighbours are then read from them instead of a partition of X's distances).
    """
    n = np.asarray(Y).shape[0]
    k = int(n_neighbors)
    if not 1 <= k < n / 2:
        raise ValueError(f"n_neighbors must be in [1, N/2) = [1, {n / 2}), got {n_neighbors}")
    mx = metric_x or ("euclidean" if metric == "precomputed" else metric)
    Dx = pairwise_distances(X, mx)
    if Dx.shape[0] != n:
        raise ValueError(f"Y has {n} points but X has {Dx.shape[0]}")
    if embedding_ranks is None:
        nn_x = _knn_stable(Dx, k)
    else:
        nn_x = _nearest_by_rank(_check_ranks(embedding_ranks, n, "embedding_ranks"), k)
    if data_ranks is None:
        r = _rank_of(pairwise_distances(Y, metric), nn_x) - k
    else:
        r = np.take_along_axis(_check_ranks(data_ranks, n, "data_ranks"), nn_x, axis=1).astype(np.int64) - k
    penalty = np.sum(np.clip(r, 0, None))
    return float(1.0 - 2.0 / (n * k * (2.0 * n - 3.0 * k - 1.0)) * penalty)


def continuity(
    Y,
    X,
    n_neighbors: int = 5,
    metric: str = "euclidean",
    metric_x: str | None = None,
    data_ranks=None,
    embedding_ranks=None,
):
    """Continuity: trustworthiness with the roles of data and embedding swapped (and so of their
    precomputed ranks)."""
    mx = metric_x or ("euclidean" if metric == "precomputed" else metric)
    return trustworthiness(
        X, Y, n_neighbors, metric=mx, metric_x=metric, data_ranks=embedding_ranks, embedding_ranks=data_ranks
    )


def knn_accuracy(X, labels, n_neighbors: int = 1, n_splits: int = 5, random_state=0, metric="euclidean"):
    """Mean accuracy of a k-NN classifier on the embedding, stratified ``n_splits``-fold CV.

    With ``metric="precomputed"`` X is an (N, N) distance matrix.
    """
    # sklearn's model_selection and neighbors cost about 1 s to import: only this score needs them
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.neighbors import KNeighborsClassifier

    X = _as2d(X, "X")
    labels = np.asarray(labels)
    if labels.shape[0] != X.shape[0]:
        raise ValueError(f"labels has {labels.shape[0]} entries but X has {X.shape[0]} rows")
    counts = np.unique(labels, return_counts=True)[1]
    splits = int(min(n_splits, counts.min()))
    if splits < 2:
        raise ValueError("knn_accuracy needs at least 2 samples of every class")
    cv = StratifiedKFold(n_splits=splits, shuffle=True, random_state=random_state)
    clf = KNeighborsClassifier(n_neighbors=n_neighbors, metric=metric)
    return float(np.mean(cross_val_score(clf, X, labels, cv=cv)))


def average_ranks(x) -> np.ndarray:
    """Ranks 1..n of a 1-D array, ties given their average rank: scipy's ``rankdata(x)``
    (method "average") with an unstable argsort, which is exact here because tied values share
    one average whatever their order, and 2-3x faster on millions of values."""
    x = np.asarray(x).ravel()
    if np.isnan(x).any():
        raise ValueError("average_ranks: x contains NaN, which has no rank")
    if x.size == 0:
        return np.empty(0)
    order = np.argsort(x)
    xs = x[order]
    new = np.empty(x.size, dtype=bool)
    new[0] = True
    np.not_equal(xs[1:], xs[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], x.size)
    avg = (starts + ends + 1) / 2.0
    ranks = np.empty(x.size)
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def _double_centre(D):
    return D - D.mean(axis=0, keepdims=True) - D.mean(axis=1, keepdims=True) + D.mean()


def distance_correlation(A, B, metric_a: str = "euclidean", metric_b: str = "euclidean") -> float:
    """Szekely's (biased, V-statistic) distance correlation between two point sets.

    dCor^2 = dCov^2(A, B) / sqrt(dVar^2(A) dVar^2(B)) from double-centred distance matrices.
    Either side may be a precomputed distance matrix (e.g. hyperbolic distances).
    """
    a = _double_centre(pairwise_distances(A, metric_a))
    b = _double_centre(pairwise_distances(B, metric_b))
    if a.shape != b.shape:
        raise ValueError(f"point counts differ: {a.shape[0]} vs {b.shape[0]}")
    dcov2 = np.mean(a * b)
    dvar = np.sqrt(np.mean(a * a) * np.mean(b * b))
    if dvar <= 0:
        return 0.0
    return float(np.sqrt(max(dcov2, 0.0) / dvar))


def _upper(D):
    iu = np.triu_indices(D.shape[0], k=1)
    return D[iu]


def pearson_distance_correlation(A, B, metric_a="euclidean", metric_b="euclidean") -> float:
    """Pearson correlation of pairwise distances over pairs i < j (paper 002's Table 2 score)."""
    from scipy import stats  # imported here: scipy.stats costs 0.4 s in every process that imports metrics

    return float(
        stats.pearsonr(_upper(pairwise_distances(A, metric_a)), _upper(pairwise_distances(B, metric_b)))[0]
    )


def shepard_goodness(Y, X, metric_y="euclidean", metric_x="euclidean") -> float:
    """Shepard goodness: Spearman correlation of pairwise distances in data and embedding."""
    from scipy import stats  # 0.4 s to import (see pearson_distance_correlation)

    return float(
        stats.spearmanr(_upper(pairwise_distances(Y, metric_y)), _upper(pairwise_distances(X, metric_x)))[0]
    )


def procrustes_disparity(truth, X) -> float:
    """Procrustes disparity (sum of squared differences after optimal translation, scaling,
    rotation/reflection, both sides normalised to unit Frobenius norm) of X against truth.

    Columns are zero-padded to the wider of the two, as scipy's ``procrustes`` requires equal shapes.
    """
    T = _as2d(truth, "truth")
    X = _as2d(X, "X")
    if T.shape[0] != X.shape[0]:
        raise ValueError(f"truth has {T.shape[0]} points but X has {X.shape[0]}")
    q = max(T.shape[1], X.shape[1])
    T = np.pad(T, ((0, 0), (0, q - T.shape[1])))
    X = np.pad(X, ((0, 0), (0, q - X.shape[1])))
    T = T - T.mean(0)
    X = X - X.mean(0)
    nt, nx = np.linalg.norm(T), np.linalg.norm(X)
    if nt == 0 or nx == 0:
        raise ValueError("procrustes_disparity needs non-constant coordinates")
    T, X = T / nt, X / nx
    U, s, Vt = np.linalg.svd(T.T @ X)
    return float(1.0 - np.sum(s) ** 2)


#: directions x points scored at once by ``unfolding``
_UNFOLD_ENTRIES = 1 << 22


def unfolding(X, t, n_angles: int = 720, rotate: bool = True) -> float:
    """How well the embedding X (N, Q) unfolds a manifold parameter t (N,): the largest |Spearman|
    correlation of t with a coordinate of X.

    LLE-type embeddings are defined only up to an orthogonal transform (the cost tr(X^T M X) and
    the constraint X^T X = I are both invariant to X -> X R), so with ``rotate=True`` (default) the
    coordinate is any unit direction of X, not only an axis: the maximum is taken over the axes,
    ``n_angles`` directions (a step of pi / n_angles) in every plane of two axes, and the
    least-squares direction of rank(t) on X. For Q <= 2 this is the maximum over all directions to
    the grid's step. ``rotate=False`` gives the axis-only measure (max over the columns).
    """
    X = _as2d(X, "X")
    t = np.asarray(t, dtype=float).ravel()
    if t.shape[0] != X.shape[0]:
        raise ValueError(f"t has {t.shape[0]} values but X has {X.shape[0]} points")
    if not np.all(np.isfinite(t)):
        raise ValueError("t contains NaN or inf; unfolding needs a finite manifold parameter")
    if int(n_angles) != n_angles or n_angles < 1:
        raise ValueError(f"n_angles must be a positive integer, got {n_angles!r}")
    from scipy import stats  # 0.4 s to import (see pearson_distance_correlation)

    r = stats.rankdata(t)
    r -= r.mean()
    nr = np.linalg.norm(r)

    def best(V):  # largest |Spearman| of t with the columns of V
        R = stats.rankdata(V, axis=0)
        R -= R.mean(axis=0)
        den = np.linalg.norm(R, axis=0) * nr
        if not np.all(den > 0):
            raise ValueError("unfolding needs a non-constant t and non-constant coordinates of X")
        return float(np.max(np.abs(R.T @ r) / den))

    Xc = X - X.mean(axis=0)
    out = best(Xc)
    q = X.shape[1]
    if rotate and q > 1:
        th = np.arange(int(n_angles)) * (np.pi / n_angles)
        cs = np.stack([np.cos(th), np.sin(th)])
        # one plane and a block of directions at a time: memory about _UNFOLD_ENTRIES x 8 bytes per
        # copy that rankdata makes (n = 100,000 with all 720 directions at once peaked at 4.5 GB)
        step = max(1, _UNFOLD_ENTRIES // X.shape[0])
        for a in range(q):
            for b in range(a + 1, q):
                for s in range(0, cs.shape[1], step):
                    out = max(out, best(Xc[:, [a, b]] @ cs[:, s : s + step]))
        w, *_ = np.linalg.lstsq(Xc, r, rcond=None)
        out = max(out, best((Xc @ w)[:, None]))
    return out


def manifold_distances(Y, n_neighbors: int = 20) -> np.ndarray:
    """Geodesic data distances of Poincare maps' quality scores (Klimovskaia et al. 2020): shortest
    paths (Dijkstra) on the ``n_neighbors``-NN graph of the rows of Y (self excluded, edge weights
    Euclidean, symmetrised by the larger entry); if the graph falls apart, its components are
    joined one edge at a time at the closest pair of points in different components. (N, N)."""
    from sklearn.neighbors import kneighbors_graph  # 0.7 s to import: only this distance needs it

    Y = _as2d(Y, "Y")
    n = Y.shape[0]
    k = int(n_neighbors)
    if not 1 <= k < n:
        raise ValueError(f"n_neighbors must be in [1, N) = [1, {n}), got {n_neighbors}; use fewer neighbours")
    G = kneighbors_graph(Y, k, mode="distance", include_self=False)
    G = G.maximum(G.T).tolil()
    ncomp, lab = connected_components(G, directed=False)
    if ncomp > 1:
        D = squareform(pdist(Y))
        while ncomp > 1:
            # closest pair between component 0 and the rest
            a, b = np.flatnonzero(lab == 0), np.flatnonzero(lab != 0)
            sub = D[np.ix_(a, b)]
            i, j = np.unravel_index(np.argmin(sub), sub.shape)
            w = max(sub[i, j], np.finfo(float).tiny)  # a zero weight would read as "no edge"
            G[a[i], b[j]] = G[b[j], a[i]] = w
            ncomp, lab = connected_components(G, directed=False)
    return shortest_path(csr_matrix(G), method="D", directed=False)


def coranking_qnx(D_high, D_low, ranks_high=None, ranks_low=None) -> np.ndarray:
    """Q_NX(K), K = 1..N-1 (Lee & Verleysen 2009), from two (N, N) distance matrices: the share of
    K-nearest neighbourhoods kept, Q_NX(K) = #{(i, j): rank_high(i, j) <= K and rank_low(i, j) <= K}
    / (K N), ranks as in :func:`neighbour_ranks` (1 = nearest, self excluded). The co-ranking matrix
    is counted with one bincount and summed by two cumulative sums: O(N^2) time and memory.
    ``ranks_high`` / ``ranks_low``: those ranks, where the caller already has them."""
    Rh = neighbour_ranks(D_high) if ranks_high is None else np.asarray(ranks_high)
    Rl = neighbour_ranks(D_low) if ranks_low is None else np.asarray(ranks_low)
    n = Rh.shape[0]
    if Rl.shape != Rh.shape:
        raise ValueError(f"D_high is {Rh.shape} but D_low is {Rl.shape}; both must cover the same points")
    off = ~np.eye(n, dtype=bool)
    flat = (Rh[off].astype(np.int64) - 1) * (n - 1) + (Rl[off].astype(np.int64) - 1)
    Q = np.bincount(flat, minlength=(n - 1) ** 2).reshape(n - 1, n - 1)
    C = np.cumsum(np.cumsum(Q, axis=0), axis=1)
    K = np.arange(1, n)
    return np.diagonal(C) / (K * float(n))


def quality_scores(
    Y,
    X,
    metric_x: str = "euclidean",
    n_neighbors: int = 20,
    data_distances=None,
    data_ranks=None,
    embedding_ranks=None,
):
    """Qlocal, Qglobal and K_max of Poincare maps (Klimovskaia et al. 2020, supplement eqs. 2-8).

    Data distances are :func:`manifold_distances` of Y (or ``data_distances``, an (N, N) matrix,
    when many embeddings share one data set); embedding distances are Euclidean, or X is an (N, N)
    precomputed matrix (``metric_x="precomputed"``, e.g. hyperbolic distances). With
    LCMC(K) = Q_NX(K) - K / (N - 1), K_max is the first argmax (0-based index into K = 1..N-1);
    Qlocal is the mean of Q_NX over indices 0..K_max and Qglobal over K_max..N-2 (both include
    K_max). ``data_ranks`` / ``embedding_ranks``: :func:`neighbour_ranks` of the two distance
    matrices, where the caller shares them between scores. Returns (qlocal, qglobal, k_max)."""
    Dh = data_distances if data_distances is not None else manifold_distances(Y, n_neighbors)
    Dh = pairwise_distances(Dh, "precomputed")
    Dl = pairwise_distances(X, metric_x)
    if Dl.shape != Dh.shape:
        raise ValueError(f"the data have {Dh.shape[0]} points but the embedding has {Dl.shape[0]}")
    if not np.all(np.isfinite(Dh)):
        raise ValueError("data distances contain inf or NaN; pass finite geodesic distances")
    qnx = coranking_qnx(Dh, Dl, data_ranks, embedding_ranks)
    m = len(qnx)
    k_max = int(np.argmax(qnx - np.arange(1, m + 1) / m))
    return float(np.mean(qnx[: k_max + 1])), float(np.mean(qnx[k_max:])), k_max
