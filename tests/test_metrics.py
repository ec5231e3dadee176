"""Embedding metrics against independent references."""

import numpy as np
import pytest
from scipy.spatial import procrustes
from scipy.spatial.distance import pdist, squareform
from scipy.stats import spearmanr
from sklearn.manifold import trustworthiness as sk_trustworthiness

from lvmcore import metrics


@pytest.fixture
def pair():
    rng = np.random.default_rng(0)
    Y = rng.normal(size=(150, 6))
    X = Y[:, :2] @ rng.normal(size=(2, 2)) + 0.3 * rng.normal(size=(150, 2))
    return Y, X


@pytest.mark.parametrize("k", [1, 5, 12])
def test_trustworthiness_matches_sklearn(pair, k):
    Y, X = pair
    ours = metrics.trustworthiness(Y, X, n_neighbors=k)
    assert ours == pytest.approx(sk_trustworthiness(Y, X, n_neighbors=k), abs=1e-12)
    assert ours < 0.99  # a noisy projection is not perfectly trustworthy


def test_trustworthiness_precomputed_and_perfect(pair):
    Y, X = pair
    Dy = squareform(pdist(Y))
    assert metrics.trustworthiness(Dy, X, 5, metric="precomputed") == pytest.approx(
        sk_trustworthiness(Y, X, n_neighbors=5), abs=1e-12
    )
    assert metrics.trustworthiness(Y, 3.0 * Y + 1.0, 7) == pytest.approx(1.0)


def test_continuity_is_swapped_trustworthiness(pair):
    Y, X = pair
    for k in (3, 10):
        ref = sk_trustworthiness(X, Y, n_neighbors=k)
        assert metrics.continuity(Y, X, k) == pytest.approx(ref, abs=1e-12)
    assert metrics.continuity(Y, X, 5) != pytest.approx(metrics.trustworthiness(Y, X, 5), abs=1e-6)


def test_trustworthiness_ties_follow_stable_order():
    """Integer data with many tied distances: our rank rule is a stable argsort of each row."""
    rng = np.random.default_rng(1)
    Y = rng.integers(0, 3, size=(60, 4)).astype(float)
    X = rng.integers(0, 3, size=(60, 2)).astype(float)
    k = 4
    n = len(Y)
    Dy, Dx = squareform(pdist(Y)), squareform(pdist(X))
    penalty = 0
    for i in range(n):  # slow reference: full stable sorts per row
        oy = [j for j in np.argsort(Dy[i], kind="stable") if j != i]
        ox = [j for j in np.argsort(Dx[i], kind="stable") if j != i]
        rank = {j: r + 1 for r, j in enumerate(oy)}
        penalty += sum(max(rank[j] - k, 0) for j in ox[:k])
    ref = 1 - 2.0 / (n * k * (2 * n - 3 * k - 1)) * penalty
    assert metrics.trustworthiness(Y, X, k) == pytest.approx(ref, abs=1e-12)
    # the same with the data side's ranks computed once (as the sweep's evaluation does)
    R = metrics.neighbour_ranks(Dy)
    for i in range(n):
        oy = [j for j in np.argsort(Dy[i], kind="stable") if j != i]
        assert R[i, i] == 0 and [R[i, j] for j in oy] == list(range(1, n))
    got = metrics.trustworthiness(Dy, Dx, k, metric="precomputed", metric_x="precomputed", data_ranks=R)
    assert got == pytest.approx(ref, abs=1e-12)
    with pytest.raises(ValueError, match=r"data_ranks must have shape \(60, 60\)"):
        metrics.trustworthiness(Y, X, k, data_ranks=R[:-1])
    # and with both sides' ranks, as evaluate_point shares the embedding's between the scores:
    # the neighbours read from the ranks are the stable order's, ties included
    Rx = metrics.neighbour_ranks(Dx)
    both = {"metric": "precomputed", "metric_x": "precomputed", "data_ranks": R, "embedding_ranks": Rx}
    assert metrics.trustworthiness(Dy, Dx, k, **both) == pytest.approx(ref, abs=1e-12)
    assert metrics.continuity(Dy, Dx, k, **both) == metrics.continuity(Y, X, k)
    with pytest.raises(ValueError, match=r"embedding_ranks must have shape \(60, 60\)"):
        metrics.trustworthiness(Y, X, k, embedding_ranks=Rx[:, :-1])


def test_average_ranks_equal_scipy_rankdata():
    from scipy.stats import rankdata

    rng = np.random.default_rng(2)
    ints = rng.integers(0, 40, size=5000).astype(float)  # many ties
    for x in (rng.normal(size=5000), ints, np.ones(7), np.arange(1.0)):
        np.testing.assert_array_equal(metrics.average_ranks(x), rankdata(x))
    x = np.array([3.0, np.inf, 1.0, np.inf, -np.inf])  # infinities rank like scipy's
    np.testing.assert_array_equal(metrics.average_ranks(x), rankdata(x))
    with pytest.raises(ValueError, match="contains NaN"):
        metrics.average_ranks([1.0, np.nan])


def test_knn_accuracy_matches_manual_cv():
    from sklearn.model_selection import StratifiedKFold
    from sklearn.neighbors import KNeighborsClassifier

    rng = np.random.default_rng(2)
    labels = np.repeat(np.arange(3), 30)
    X = rng.normal(size=(90, 2)) + 1.2 * labels[:, None]
    for k in (1, 3):
        accs = []
        for tr, te in StratifiedKFold(5, shuffle=True, random_state=7).split(X, labels):
            clf = KNeighborsClassifier(n_neighbors=k).fit(X[tr], labels[tr])
            accs.append(np.mean(clf.predict(X[te]) == labels[te]))
        ours = metrics.knn_accuracy(X, labels, n_neighbors=k, n_splits=5, random_state=7)
        assert ours == pytest.approx(np.mean(accs), abs=1e-12)
        assert 0.5 < ours < 1.0
    with pytest.raises(ValueError, match="labels has 10 entries"):
        metrics.knn_accuracy(X, labels[:10])


def _dcor_loop(A, B):
    """Direct O(n^2) double loop for Szekely's (V-statistic) distance correlation."""
    n = len(A)
    a = np.array([[np.linalg.norm(A[i] - A[j]) for j in range(n)] for i in range(n)])
    b = np.array([[np.linalg.norm(B[i] - B[j]) for j in range(n)] for i in range(n)])
    ra, rb = a.mean(1), b.mean(1)
    ma, mb = a.mean(), b.mean()
    sab = saa = sbb = 0.0
    for i in range(n):
        for j in range(n):
            Aij = a[i, j] - ra[i] - ra[j] + ma
            Bij = b[i, j] - rb[i] - rb[j] + mb
            sab += Aij * Bij
            saa += Aij * Aij
            sbb += Bij * Bij
    return np.sqrt(sab / np.sqrt(saa * sbb))


def test_distance_correlation_matches_loop_and_dcor(pair):
    import dcor  # here, not at collection: its import recompiles a numba function each time (8-9 CPU s)

    Y, X = pair
    Y, X = Y[:50], X[:50]
    ours = metrics.distance_correlation(Y, X)
    assert ours == pytest.approx(_dcor_loop(Y, X), abs=1e-12)
    assert ours == pytest.approx(dcor.distance_correlation(Y, X), abs=1e-10)
    # precomputed (e.g. hyperbolic) distances on one side give the same number
    pre = metrics.distance_correlation(squareform(pdist(Y)), X, metric_a="precomputed")
    assert pre == pytest.approx(ours)
    rng = np.random.default_rng(3)
    assert metrics.distance_correlation(Y, rng.normal(size=(50, 2))) < ours


def test_shepard_goodness_matches_spearmanr(pair):
    Y, X = pair
    ref = spearmanr(pdist(Y), pdist(X))[0]
    assert metrics.shepard_goodness(Y, X) == pytest.approx(ref, abs=1e-12)
    assert metrics.shepard_goodness(Y, X, metric_y="cityblock") == pytest.approx(
        spearmanr(pdist(Y, "cityblock"), pdist(X))[0], abs=1e-12
    )


def test_pearson_distance_correlation(pair):
    Y, X = pair
    assert metrics.pearson_distance_correlation(Y, X) == pytest.approx(
        np.corrcoef(pdist(Y), pdist(X))[0, 1], abs=1e-12
    )


def test_procrustes_matches_scipy(pair):
    Y, X = pair
    T = Y[:, :2]
    assert metrics.procrustes_disparity(T, X) == pytest.approx(procrustes(T, X)[2], abs=1e-12)
    # rotated, scaled, shifted copy: disparity 0
    c, s = np.cos(0.7), np.sin(0.7)
    moved = 3 * T @ np.array([[c, -s], [s, c]]) + 5
    assert metrics.procrustes_disparity(T, moved) == pytest.approx(0, abs=1e-12)
    # wider embedding is compared after zero-padding the truth, as scipy needs equal shapes
    X3 = np.column_stack([X, 0.1 * Y[:, 3]])
    assert metrics.procrustes_disparity(T, X3) == pytest.approx(
        procrustes(np.column_stack([T, np.zeros(len(T))]), X3)[2], abs=1e-12
    )


def test_metric_bad_input(pair):
    Y, X = pair
    Xn = X.copy()
    Xn[3, 1] = np.nan
    for fn in (metrics.trustworthiness, metrics.shepard_goodness, metrics.distance_correlation):
        with pytest.raises(ValueError, match="NaN or inf"):
            fn(Y, Xn)
    with pytest.raises(ValueError, match="must be 2-D"):
        metrics.procrustes_disparity(Y[:, 0], X)
    with pytest.raises(ValueError, match="n_neighbors must be in"):
        metrics.trustworthiness(Y, X, n_neighbors=75)
    with pytest.raises(ValueError, match="150 points but X has 100"):
        metrics.trustworthiness(Y, X[:100])
    with pytest.raises(ValueError, match="square"):
        metrics.trustworthiness(Y, X, metric="precomputed")


def test_unfolding_is_rotation_invariant_and_matches_a_direction_search():
    """The rotation-invariant unfolding score equals a brute-force search over 3,600 directions
    (to the grid's step), is unchanged by rotating the embedding, and the axis-only score is
    scipy's best-column Spearman."""
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 3, 400)
    X = np.column_stack([np.cos(t) + 0.05 * rng.normal(size=400), rng.normal(size=400)])
    th = np.linspace(0, np.pi, 3600, endpoint=False)
    brute = max(abs(spearmanr(X @ [np.cos(a), np.sin(a)], t).statistic) for a in th)
    assert metrics.unfolding(X, t) == pytest.approx(brute, abs=2e-3)
    for ang in (0.3, 0.8, 1.2):
        R = np.array([[np.cos(ang), -np.sin(ang)], [np.sin(ang), np.cos(ang)]])
        XR = X @ R
        assert metrics.unfolding(XR, t) == pytest.approx(brute, abs=2e-3)
        axis = max(abs(spearmanr(XR[:, j], t).statistic) for j in range(2))
        assert metrics.unfolding(XR, t, rotate=False) == pytest.approx(axis, abs=1e-12)
    assert metrics.unfolding(X @ np.array([[1, 1], [1, -1]]) / 2**0.5, t, rotate=False) < 0.8
    with pytest.raises(ValueError, match="t has 399 values"):
        metrics.unfolding(X, t[:-1])
    with pytest.raises(ValueError, match="n_angles must be a positive integer"):
        metrics.unfolding(X, t, n_angles=0)


# ---------------------------------------------------------------- Qlocal / Qglobal (Poincare maps)
def _slow_qnx(Dh, Dl):
    """Loop reference: ranks by a per-row stable argsort (self first), co-ranking counts, Q_NX."""
    n = len(Dh)

    def ranks(D):
        R = np.zeros((n, n), dtype=int)
        for i in range(n):
            row = np.array(D[i], dtype=float)
            row[i] = -np.inf
            for pos, j in enumerate(np.argsort(row, kind="stable")):
                R[i, j] = pos
        return R

    Rh, Rl = ranks(Dh), ranks(Dl)
    Q = np.zeros((n - 1, n - 1))
    for i in range(n):
        for j in range(n):
            if i != j:
                Q[Rh[i, j] - 1, Rl[i, j] - 1] += 1
    return np.array([Q[:K, :K].sum() / (K * n) for K in range(1, n)])


def _slow_geodesic(Y, k):
    """Loop reference for the 20-NN graph geodesics: dense max-symmetrised graph, Floyd-Warshall."""
    n = len(Y)
    D = squareform(pdist(Y))
    W = np.full((n, n), np.inf)
    np.fill_diagonal(W, 0.0)
    for i in range(n):
        order = [j for j in np.argsort(D[i], kind="stable") if j != i][:k]
        for j in order:
            W[i, j] = W[j, i] = D[i, j]
    for m in range(n):
        W = np.minimum(W, W[:, m : m + 1] + W[m : m + 1, :])
    return W


def test_coranking_qnx_matches_loop():
    rng = np.random.default_rng(3)
    Y = rng.normal(size=(40, 5))
    X = Y[:, :2] + 0.5 * rng.normal(size=(40, 2))
    Dh, Dl = squareform(pdist(Y)), squareform(pdist(X))
    ref = _slow_qnx(Dh, Dl)
    np.testing.assert_allclose(metrics.coranking_qnx(Dh, Dl), ref, rtol=0, atol=1e-12)
    assert ref[-1] == pytest.approx(1.0) and ref[0] < 0.9  # Q_NX(N-1) = 1; a noisy map loses neighbours
    ql, qg, k_max = metrics.quality_scores(Dh, Dl, metric_x="precomputed", data_distances=Dh)
    lcmc = ref - np.arange(1, 40) / 39
    k_ref = int(np.argmax(lcmc))
    assert k_max == k_ref
    assert ql == pytest.approx(ref[: k_ref + 1].mean()) and qg == pytest.approx(ref[k_ref:].mean())
    R = {"data_ranks": metrics.neighbour_ranks(Dh), "embedding_ranks": metrics.neighbour_ranks(Dl)}
    assert metrics.quality_scores(None, Dl, "precomputed", data_distances=Dh, **R) == (ql, qg, k_max)


def test_manifold_distances_match_floyd_warshall_and_join_components():
    rng = np.random.default_rng(1)
    Y = rng.normal(size=(60, 3))
    np.testing.assert_allclose(metrics.manifold_distances(Y, 6), _slow_geodesic(Y, 6), atol=1e-12)
    # two far clusters: the 5-NN graph splits; joined at the closest pair, distances stay finite
    Y2 = np.vstack([rng.normal(size=(20, 2)), rng.normal(size=(20, 2)) + 50.0])
    D = metrics.manifold_distances(Y2, 5)
    assert np.all(np.isfinite(D))
    gap = squareform(pdist(Y2))[:20, 20:].min()
    assert D[:20, 20:].min() == pytest.approx(gap)


def test_quality_scores_reproduce_published_pca_on_myeloid():
    """Poincare maps' table: 2-D PCA of the (centred) myeloid progenitors, Qlocal 0.73, Qglobal 0.91,
    K_max 29 (data: scanpy's krumsiek11, 640 x 11)."""
    from pathlib import Path

    Y = np.loadtxt(Path(__file__).parent / "data" / "krumsiek11.txt")[:, 1:]
    assert Y.shape == (640, 11)
    Yc = Y - Y.mean(0)
    U, s, _ = np.linalg.svd(Yc, full_matrices=False)
    ql, qg, k_max = metrics.quality_scores(Y, U[:, :2] * s[:2])
    assert round(ql, 2) == 0.73 and round(qg, 2) == 0.91 and k_max == 29


def test_quality_scores_bad_input():
    Y = np.random.default_rng(0).normal(size=(30, 3))
    with pytest.raises(ValueError, match="n_neighbors"):
        metrics.quality_scores(Y, Y[:, :2], n_neighbors=30)
    with pytest.raises(ValueError, match="points"):
        metrics.quality_scores(Y, Y[:20, :2])
