"""kNN graphs: exactness against scikit-learn and a float64 reference, Dask inputs and clusters,
slicing, symmetrisation, Laplacian, connectivity, approximate search and bad input."""

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import laplacian as sp_laplacian
from scipy.spatial.distance import cdist
from sklearn.neighbors import NearestNeighbors

from lvmcore import graph


def _sklearn(Y, k):
    d, i = NearestNeighbors(n_neighbors=k, algorithm="brute").fit(Y).kneighbors()
    return i, d


def _stable_reference(Y, k):
    """Float64 brute force, ties by lower index (a stable sort of each row), self excluded."""
    D = cdist(Y, Y)
    np.fill_diagonal(D, np.inf)
    idx = np.array([np.lexsort((np.arange(len(Y)), row))[:k] for row in D])
    return idx, np.take_along_axis(D, idx, axis=1)


@pytest.fixture(scope="module")
def cloud():
    rng = np.random.default_rng(0)
    return rng.normal(size=(700, 6)) * np.array([5, 3, 2, 1, 1, 0.5]) + 3.0


@pytest.mark.parametrize("block_rows", [None, 64, 100, 333, 2000])
def test_exact_matches_sklearn(cloud, block_rows):
    for k in (1, 7, 15):
        idx, dist = graph.knn(cloud, k, method="exact", block_rows=block_rows)
        ref_i, ref_d = _sklearn(cloud, k)
        assert idx.dtype == np.int64 and idx.shape == (700, k)
        np.testing.assert_array_equal(idx, ref_i)
        np.testing.assert_allclose(dist, ref_d, rtol=1e-10, atol=1e-12)
        assert not np.any(idx == np.arange(700)[:, None])


def test_exact_on_dask_array_uses_its_chunks(cloud):
    ref_i, ref_d = _sklearn(cloud, 10)
    for chunks in [(50, 6), (256, 6), ((300, 1, 399), 6)]:
        Yd = da.from_array(cloud, chunks=chunks)
        idx, dist = graph.knn(Yd, 10, method="exact", block_rows=None)
        np.testing.assert_array_equal(idx, ref_i)
        np.testing.assert_allclose(dist, ref_d, rtol=1e-10, atol=1e-12)
    idx, _ = graph.knn(da.from_array(cloud, chunks=(50, 6)), 10, method="exact", block_rows=128)
    np.testing.assert_array_equal(idx, ref_i)


def test_exact_small_n_and_k_equal_n_minus_1():
    Y = np.random.default_rng(1).normal(size=(9, 2))
    idx, dist = graph.knn(Y, 8, method="exact", block_rows=4)
    ref_i, ref_d = _stable_reference(Y, 8)
    np.testing.assert_array_equal(idx, ref_i)
    np.testing.assert_allclose(dist, ref_d, rtol=1e-12)


def test_exact_with_ties_takes_lower_index_and_falls_back():
    """Integer grid points: many exact ties and duplicates at the k-th distance. The float32 pass
    cannot certify those rows, so they are redone in float64; the result is the stable order."""
    Y = np.random.default_rng(2).integers(0, 4, size=(400, 3)).astype(float)
    idx, dist = graph.knn(Y, 6, method="exact", block_rows=64)
    ref_i, ref_d = _stable_reference(Y, 6)
    np.testing.assert_array_equal(idx, ref_i)
    np.testing.assert_allclose(dist, ref_d, atol=1e-12)
    assert graph._exact_knn.last_fallback_rows > 0
    idx, dist = graph.knn(Y, 6, method="tree")  # the tree resolves the same ties the same way
    np.testing.assert_array_equal(idx, ref_i)
    np.testing.assert_allclose(dist, ref_d, atol=1e-12)
    assert graph._tree_knn.last_fallback_rows > 0


def test_exact_far_from_origin_and_tight():
    """A tight cloud far from the origin: float32 of the raw coordinates could not separate the
    neighbours; centring plus the certified float64 recomputation must."""
    rng = np.random.default_rng(3)
    Y = 1e5 + 1e-3 * rng.normal(size=(300, 4))
    idx, dist = graph.knn(Y, 5, method="exact", block_rows=70)
    ref_i, ref_d = _stable_reference(Y, 5)
    np.testing.assert_array_equal(idx, ref_i)
    np.testing.assert_allclose(dist, ref_d, rtol=1e-6)


def test_exact_on_distributed_cluster(cloud, shared_cluster):
    from distributed import Client

    local = graph.knn(cloud, 12, method="exact", block_rows=128)
    with Client(shared_cluster) as client:
        on_cluster = graph.knn(cloud, 12, method="exact", block_rows=128, client=client)
        ran = client.run(lambda dask_worker: len(dask_worker.data) >= 0)
    assert len(ran) == 2
    np.testing.assert_array_equal(on_cluster[0], local[0])
    np.testing.assert_array_equal(on_cluster[1], local[1])


def test_slice_for_smaller_k(cloud):
    idx, dist = graph.knn(cloud, 20, block_rows=256)
    for k in (1, 5, 13):
        si, sd = graph.slice_knn(idx, dist, k)
        ref_i, ref_d = graph.knn(cloud, k, block_rows=256)
        np.testing.assert_array_equal(si, ref_i)
        np.testing.assert_array_equal(sd, ref_d)
    with pytest.raises(ValueError, match="cannot slice k = 21 from a graph computed with k = 20"):
        graph.slice_knn(idx, dist, 21)


def test_union_and_mutual_adjacency():
    rng = np.random.default_rng(4)
    Y = rng.normal(size=(80, 2))
    idx, _ = graph.knn(Y, 4)
    U = graph.adjacency(idx, mode="union").toarray()
    M = graph.adjacency(idx, mode="mutual").toarray()
    listed = np.zeros((80, 80), bool)
    for i in range(80):
        for j in idx[i]:
            listed[i, j] = True
    np.testing.assert_array_equal(U, (listed | listed.T).astype(float))
    np.testing.assert_array_equal(M, (listed & listed.T).astype(float))
    assert M.sum() < U.sum()  # some neighbour relations are one-sided
    for W in (U, M):
        np.testing.assert_array_equal(W, W.T)
        assert np.all(np.diag(W) == 0) and set(np.unique(W)) <= {0.0, 1.0}
    assert sp.issparse(graph.adjacency(idx)) and graph.adjacency(idx).format == "csr"
    with pytest.raises(ValueError, match="unknown symmetrisation mode 'max'"):
        graph.adjacency(idx, mode="max")


def test_laplacian():
    idx, _ = graph.knn(np.random.default_rng(5).normal(size=(60, 3)), 5)
    W = graph.adjacency(idx)
    L = graph.laplacian(W)
    assert sp.issparse(L)
    Ld = L.toarray()
    np.testing.assert_array_equal(Ld, np.diag(W.toarray().sum(1)) - W.toarray())
    np.testing.assert_array_equal(Ld, sp_laplacian(W.toarray()))
    np.testing.assert_allclose(Ld.sum(1), 0.0)
    assert np.linalg.eigvalsh(Ld).min() > -1e-10


def test_connectivity_message():
    rng = np.random.default_rng(6)
    Y = np.vstack([rng.normal(size=(30, 2)), rng.normal(size=(12, 2)) + 100.0])
    idx, _ = graph.knn(Y, 3)
    W = graph.adjacency(idx)
    n, labels = graph.connected_components(W)
    assert n == 2 and np.bincount(labels).tolist() in ([30, 12], [12, 30])
    with pytest.raises(
        ValueError, match=r"has 2 connected components: 30 points \(e.g. point 0\), 12 points"
    ):
        graph.require_connected(W)
    idx, _ = graph.knn(Y[:30], 3)
    assert graph.require_connected(graph.adjacency(idx)) is None


def test_approx_recall():
    rng = np.random.default_rng(7)
    Z = rng.uniform(size=(1500, 2))
    Y = np.column_stack([Z, np.sin(3 * Z[:, 0]), np.cos(2 * Z[:, 1])])
    ai, ad = graph.knn(Y, 10, method="approx")
    ei, ed = graph.knn(Y, 10, method="exact")
    assert ai.shape == (1500, 10) and ai.dtype == np.int64
    assert not np.any(ai == np.arange(1500)[:, None])
    rec = graph.knn_recall(ai, ei)
    assert 0.9 <= rec <= 1.0
    hit = ai == ei
    np.testing.assert_allclose(ad[hit], ed[hit], rtol=1e-5, atol=1e-6)  # float32 inside pynndescent


def test_knn_recall_and_drop_self():
    exact = np.array([[1, 2, 3], [0, 2, 3]])
    assert graph.knn_recall(np.array([[3, 2, 9], [0, 2, 3]]), exact) == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match="shapes differ"):
        graph.knn_recall(exact[:, :2], exact)
    idx = np.array([[0, 4, 2], [3, 5, 1], [2, 0, 1]])  # row 1 lacks itself: its farthest goes
    dist = np.array([[0.0, 1, 2], [1.0, 2, 3], [0.0, 1, 2]])
    i, d = graph._drop_self(idx, dist, 2)
    np.testing.assert_array_equal(i, [[4, 2], [3, 5], [0, 1]])
    np.testing.assert_array_equal(d, [[1, 2], [1, 2], [1, 2]])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("as_dask", [False, True])
def test_bad_values(bad, as_dask):
    Y = np.random.default_rng(8).normal(size=(40, 3))
    Y[7, 1] = bad
    X = da.from_array(Y, chunks=(16, 3)) if as_dask else Y
    with pytest.raises(ValueError, match=r"NaN or inf \(first at row 7, column 1\)"):
        graph.knn(X, 5)
    if not as_dask:
        with pytest.raises(ValueError, match="NaN or inf"):
            graph.knn(X, 5, method="approx")


def test_bad_shapes_and_arguments():
    Y = np.random.default_rng(9).normal(size=(10, 3))
    with pytest.raises(ValueError, match=r"n_points = 10, k = 10; use a smaller k"):
        graph.knn(Y, 10)
    with pytest.raises(ValueError, match=r"n_points = 10, k = 10"):
        graph.knn(da.from_array(Y), 10)
    with pytest.raises(ValueError, match=r"must be 2-D .* got shape \(10,\)"):
        graph.knn(Y[:, 0], 3)
    with pytest.raises(ValueError, match=r"got shape \(2, 5, 3\)"):
        graph.knn(Y.reshape(2, 5, 3), 3)
    for k in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="k must be a positive integer"):
            graph.knn(Y, k)
    with pytest.raises(ValueError, match=r"unknown knn method 'ball'; use one of \('auto', 'tree'"):
        graph.knn(Y, 3, method="ball")
    with pytest.raises(ValueError, match="dtype=object"):
        graph.knn(np.array([[1, "a"], [2, "b"]], dtype=object), 1)
    with pytest.raises(ValueError, match="block_rows must be a positive integer"):
        graph.knn(Y, 3, block_rows=0)


@pytest.mark.parametrize("d", [2, 3, 8])
def test_tree_is_exact(d):
    """The k-d tree path against float64 brute force, ties by lower index, self excluded; also
    with duplicated points (more copies of a point than k + 1)."""
    rng = np.random.default_rng(10 + d)
    Y = rng.normal(size=(500, d))
    Y[400:420] = Y[7]  # 21 copies of point 7: its neighbours are all distance 0
    for k in (1, 5, 12):
        idx, dist = graph.knn(Y, k, method="tree")
        ref_i, ref_d = _stable_reference(Y, k)
        np.testing.assert_array_equal(idx, ref_i)
        np.testing.assert_allclose(dist, ref_d, rtol=1e-12, atol=1e-14)
        assert idx.dtype == np.int64 and not np.any(idx == np.arange(500)[:, None])


def test_auto_picks_by_dimension_size_and_memory():
    """The regimes of bench/knn.py: tree in low d, blocked exact in high d while brute force is
    affordable, pynndescent beyond; a method that does not fit the memory budget is passed over,
    and no method fitting is refused before work."""
    big = 1 << 40
    assert graph.choose_knn_method(1_000_000, 3, 15, big) == "tree"
    assert graph.choose_knn_method(10_000, graph.TREE_MAX_DIM, 15, big) == "tree"
    assert graph.choose_knn_method(50_000, 50, 15, big) == "exact"
    assert graph.choose_knn_method(100_000, 20, 15, big) == "tree"
    assert graph.choose_knn_method(1_000_000, 20, 15, big) == "approx"
    assert graph.choose_knn_method(100_000, 50, 15, big) == "approx"
    assert graph.choose_knn_method(1_000_000, 50, 15, big) == "approx"
    n = 1_000_000
    need = {m: graph._method_bytes(m, n, 50, 15) for m in ("tree", "exact", "approx")}
    assert need["tree"] < need["approx"] < need["exact"]  # float64 tree copy vs pynndescent's graph
    assert graph.choose_knn_method(n, 50, 15, need["approx"]) == "approx"
    assert graph.choose_knn_method(n, 50, 15, need["approx"] - 1) == "tree"  # approx passed over
    with pytest.raises(ValueError, match=r"1000000 x 50 points with k = 15 needs about 1.0 GiB, but 0.0 GiB"):
        graph.choose_knn_method(n, 50, 15, 1000)


def test_auto_is_exact_where_it_picks_an_exact_method(cloud):
    for Y in (cloud, np.random.default_rng(11).normal(size=(400, 40))):
        picked = graph.choose_knn_method(Y.shape[0], Y.shape[1], 9)
        assert picked == ("tree" if Y.shape[1] <= graph.TREE_EXACT_MAX_DIM else "exact")
        idx, dist = graph.knn(Y, 9)
        ref_i, ref_d = _stable_reference(Y, 9)
        np.testing.assert_array_equal(idx, ref_i)
        np.testing.assert_allclose(dist, ref_d, rtol=1e-10)


def test_approx_recall_in_high_dimension():
    """pynndescent (what auto picks for large n in high d) on data of low intrinsic dimension
    in 50-D: recall against brute force on every row."""
    rng = np.random.default_rng(12)
    Z = rng.uniform(-1, 1, size=(3000, 5))
    Y = np.sin(2 * Z) @ rng.normal(size=(5, 50)) + 0.3 * np.cos(Z) @ rng.normal(size=(5, 50))
    ai, _ = graph.knn(Y, 15, method="approx")
    ref_i, _ = _sklearn(Y, 15)
    assert graph.knn_recall(ai, ref_i) >= 0.95
