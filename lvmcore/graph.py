"""k-nearest-neighbour graphs by regime: scipy's k-d tree where the dimension is low, an exact
blocked search over Dask row chunks where the tree loses and brute force is affordable,
pynndescent's approximate search beyond; symmetrisation, adjacency, Laplacian and connectivity.

Shapes: N points, D features, K neighbours. Indices never contain the point itself.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import psutil
import scipy.sparse as sp
from scipy.sparse import csgraph
from scipy.spatial import cKDTree

from lvmcore.checks import check_data

__all__ = [
    "knn",
    "choose_knn_method",
    "available_memory",
    "KNN_METHODS",
    "knn_recall",
    "slice_knn",
    "adjacency",
    "laplacian",
    "connected_components",
    "require_connected",
    "DEFAULT_BLOCK_ROWS",
]

#: rows per block of the exact search; one task holds a block_rows x block_rows float32 slab
#: (64 MiB at 4096), so memory is bounded by the block size whatever N is
DEFAULT_BLOCK_ROWS = 4096

#: extra candidates kept per row beyond k, so float32 rounding rarely forces a fallback
_EXTRA = 8

#: methods of :func:`knn`; "tree" and "exact" are exact, "approx" is not
KNN_METHODS = ("auto", "tree", "exact", "approx")

#: crossovers of ``method="auto"``, measured by bench/knn.py (bench/README.md, "knn"): the k-d
#: tree beats both other methods at d = 3 and 10 for every n measured and loses to the blocked
#: search at d = 50 ...
TREE_MAX_DIM = 12
#: ... up to this dimension the tree still beats the blocked search (d = 20: 0.9 s vs 3.1 s at
#: n = 10^4, 47 s vs ~300 s at 10^5) but scales worse than pynndescent in n, so it is used there
#: only where an exact search is affordable (below)
TREE_EXACT_MAX_DIM = 20
#: ... above it the blocked exact search is used while n**2 * d stays below this (it costs about
#: n**2 * d / 1e10 seconds on 2 cores, so up to ~20 s; it ties pynndescent at n = 10^4, d = 50
#: and is ~10x slower at 10^5); beyond, pynndescent's approximate search
EXACT_MAX_WORK = 2.0e11


def _validate(Y, k):
    """Y as a finite float64 array (a dask array: its shape only; its values are checked once
    computed), and k."""
    if not (hasattr(Y, "chunks") and hasattr(Y, "compute")):
        Y = check_data(Y)
    elif len(Y.shape) != 2:
        raise ValueError(f"Y must be 2-D (points x features), got shape {Y.shape}; reshape it to (N, D)")
    n = Y.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if n < k + 1:
        raise ValueError(
            f"Expected k + 1 <= n_points, but n_points = {n}, k = {k}; use a smaller k or more points"
        )
    return Y


_KERNEL = None


def _kernel():
    """The numba tile-selection kernel, compiled on first use (numba comes with pynndescent)."""
    global _KERNEL
    if _KERNEL is None:
        from numba import njit  # numba's import and compilation cost seconds: only the exact search needs it

        @njit(nogil=True, cache=True, inline="always")
        def replace_worst(vals, idx, slot, v, i):  # pragma: no cover - jitted
            # (v, i) takes the slot of the worst of a kept set; returns the new worst and its slot
            vals[slot] = v
            idx[slot] = i
            w, slot = vals[0], 0
            for m in range(1, vals.shape[0]):
                if vals[m] > w:
                    w, slot = vals[m], m
            return w, slot

        @njit(nogil=True, cache=True)
        def tile_select(G, sqa, sqb, diag, row_i, row_v, col_i, col_v):  # pragma: no cover - jitted
            # approximate squared distances v = |a|^2 + |b|^2 - 2 a.b of one tile (float32); keep
            # the kk smallest per row (over columns) and, off the diagonal, per column (over rows)
            na, nb = G.shape
            col_w = np.full(nb, np.inf, np.float32)
            col_p = np.zeros(nb, np.int64)
            for r in range(na):
                w, p, sa = np.float32(np.inf), 0, sqa[r]
                for c in range(nb):
                    if diag and c == r:
                        continue
                    v = sa + sqb[c] - np.float32(2.0) * G[r, c]
                    if v < w:
                        w, p = replace_worst(row_v[r], row_i[r], p, v, c)
                    if not diag and v < col_w[c]:
                        col_w[c], col_p[c] = replace_worst(col_v[c], col_i[c], col_p[c], v, r)

        _KERNEL = tile_select
    return _KERNEL


def _pair_tile(A, B, kk, diag):
    """Candidates between row blocks A and B (float32, centred): for every row of A its kk nearest
    rows of B and, unless A is B (``diag``), for every row of B its kk nearest rows of A.

    One GEMM for both directions (the distance matrix is symmetric, so only tiles on and above the
    block diagonal are computed), then a single pass of the selection kernel over the tile."""
    G = A @ B.T
    sqa = np.einsum("ij,ij->i", A, A)
    sqb = np.einsum("ij,ij->i", B, B)
    row_i = np.full((A.shape[0], kk), -1, np.int64)
    row_v = np.full((A.shape[0], kk), np.inf, np.float32)
    nb = 0 if diag else B.shape[0]
    col_i = np.full((nb, kk), -1, np.int64)
    col_v = np.full((nb, kk), np.inf, np.float32)
    _kernel()(G, sqa, sqb, bool(diag), row_i, row_v, col_i, col_v)
    return row_i, row_v, col_i, col_v


def _merge_block(start, parts, offsets, Y, sq, k, kk, bound_coef, max_sq):
    """Exact k nearest of rows start..start+n from the per-tile candidates ``parts`` (one
    (local index, approx value) pair per column block, offsets giving each block's first row).

    The kk best candidates by the float32 values get exact float64 distances. Every point not among
    them has approximate squared distance >= tau (the kk-th candidate value), hence exact squared
    distance >= tau - bound, where bound covers the float32 rounding of the inputs, norms and GEMM
    (|error| <= (D + 16) 2^-23 (|a|^2 + |b|^2) for centred data). Rows where the exact k-th distance
    is not below that are recomputed by exact brute force, so the result is exact in all cases.
    """
    idx = np.concatenate([p[0] + np.where(p[0] >= 0, off, 0) for p, off in zip(parts, offsets)], axis=1)
    val = np.concatenate([p[1] for p in parts], axis=1).astype(np.float64)
    val[idx < 0] = np.inf
    n = idx.shape[0]
    kk = min(kk, idx.shape[1])
    sel = np.argpartition(val, kk - 1, axis=1)[:, :kk]
    cand = np.take_along_axis(idx, sel, axis=1)
    tau = np.max(np.take_along_axis(val, sel, axis=1), axis=1)
    rows = np.arange(start, start + n)
    Yb = Y[start : start + n]
    diff = Yb[:, None, :] - Y[np.maximum(cand, 0)]
    exact = np.einsum("ijk,ijk->ij", diff, diff)
    exact[cand < 0] = np.inf
    order = np.lexsort((cand, exact), axis=1)[:, :k]  # by distance, ties by index
    out_i = np.take_along_axis(cand, order, axis=1)
    out_d = np.take_along_axis(exact, order, axis=1)
    bound = bound_coef * (sq[start : start + n] + max_sq)
    unsure = np.flatnonzero(~(out_d[:, -1] < tau - bound))
    for r in unsure:  # near-ties at the k-th neighbour: exact float64 brute force for this row
        d2 = np.einsum("ij,ij->i", Y - Yb[r], Y - Yb[r])
        d2[rows[r]] = np.inf
        top = np.lexsort((np.arange(Y.shape[0]), d2))[:k]
        out_i[r], out_d[r] = top, d2[top]
    return out_i.astype(np.int64), np.sqrt(out_d), unsure.size


def _exact_knn(Y, k, block_rows, client=None):
    if isinstance(Y, da.Array):
        bounds = Y.chunks[0] if block_rows is None else None
        Y = Y.compute()
    else:
        bounds = None
    Y = check_data(Y)
    n, dim = Y.shape
    if bounds is None:
        b = DEFAULT_BLOCK_ROWS if block_rows is None else int(block_rows)
        if b < 1:
            raise ValueError(f"block_rows must be a positive integer, got {block_rows!r}")
        bounds = (b,) * (n // b) + ((n % b,) if n % b else ())
    Yc = np.ascontiguousarray(Y - Y.mean(axis=0))  # distances are translation invariant
    sq = np.einsum("ij,ij->i", Yc, Yc)
    kk = min(k + _EXTRA, n - 1)
    offsets = np.concatenate([[0], np.cumsum(bounds)[:-1]]).astype(np.int64)
    if client is None:  # Dask's local scheduler: the arrays stay in this process
        Y32 = da.from_array(Yc.astype(np.float32), chunks=(bounds, dim)).to_delayed().ravel()
        Yref, sqref = dask.delayed(Yc, pure=True), dask.delayed(sq, pure=True)
    else:  # on a cluster the data goes to the workers by scatter, never inside the task graph
        ends = offsets + np.asarray(bounds)
        Y32 = client.scatter(
            [np.ascontiguousarray(Yc[a:b], dtype=np.float32) for a, b in zip(offsets, ends)], hash=False
        )
        Yref = client.scatter(Yc, broadcast=True, hash=False)
        sqref = client.scatter(sq, broadcast=True, hash=False)
    nb = len(bounds)
    tile = dask.delayed(_pair_tile, pure=True)
    tiles = {(i, j): tile(Y32[i], Y32[j], kk, i == j) for i in range(nb) for j in range(i, nb)}
    merge = dask.delayed(_merge_block, pure=True, nout=3)
    coef = (dim + 16) * 2.0**-23
    max_sq = float(sq.max())
    blocks = []
    for i in range(nb):
        parts = [tiles[(i, j)][0:2] if j >= i else tiles[(j, i)][2:4] for j in range(nb)]
        blocks.append(merge(int(offsets[i]), parts, offsets, Yref, sqref, k, kk, coef, max_sq))
    out = dask.compute(
        *[(b[0], b[1], b[2]) for b in blocks], scheduler="threads" if client is None else client
    )
    idx = np.concatenate([o[0] for o in out])
    dist = np.concatenate([o[1] for o in out])
    _exact_knn.last_fallback_rows = int(sum(o[2] for o in out))
    return idx, dist


_exact_knn.last_fallback_rows = 0


def available_memory() -> int:
    """Bytes the operating system reports available: what a kNN search may use unless its caller
    says less (a Dask worker's memory limit: ``memory_bytes`` of :func:`choose_knn_method`)."""
    return int(psutil.virtual_memory().available)


def _method_bytes(method: str, n: int, d: int, k: int) -> int:
    """Peak bytes of one method on (n, d) data beyond the caller's copy (order of magnitude)."""
    out = n * (k + 2) * 16  # indices and distances with their working copies
    if method == "tree":
        return 2 * n * d * 8 + 2 * n * 8 + out  # float64 copy held by the tree, its index arrays
    if method == "exact":
        b = DEFAULT_BLOCK_ROWS
        return n * d * (8 + 4) + 3 * b * b * 4 + 3 * n * (k + _EXTRA) * 12 + out
    return n * d * 4 + n * 30 * 24 + out  # pynndescent: float32 data, its working graph


def choose_knn_method(n: int, d: int, k: int, memory_bytes: int | None = None) -> str:
    """The method ``knn(method="auto")`` uses for n points in d dimensions.

    By speed (crossovers measured in bench/knn.py): the k-d tree up to ``TREE_MAX_DIM``
    dimensions; above, an exact search while ``n**2 * d <= EXACT_MAX_WORK`` (the tree up to
    ``TREE_EXACT_MAX_DIM``, the blocked search beyond); else pynndescent. A method whose memory
    estimate does not fit ``memory_bytes`` (default: :func:`available_memory`; a caller inside a
    Dask worker passes the smaller of that and the worker's memory limit) is passed over for the
    next in that order that fits; if none fits, a ValueError says how much is needed."""
    if d <= TREE_MAX_DIM:
        order = ["tree", "exact", "approx"]
    elif float(n) * n * d <= EXACT_MAX_WORK:
        order = ["tree", "exact", "approx"] if d <= TREE_EXACT_MAX_DIM else ["exact", "tree", "approx"]
    else:
        order = ["approx", "exact", "tree"]
    budget = available_memory() if memory_bytes is None else int(memory_bytes)
    for m in order:
        if _method_bytes(m, n, d, k) <= budget:
            return m
    need = min(_method_bytes(m, n, d, k) for m in order)
    raise ValueError(
        f"a kNN graph of {n} x {d} points with k = {k} needs about {need / 2**30:.1f} GiB, but "
        f"{budget / 2**30:.1f} GiB is available; give the workers more memory or subsample the data"
    )


def _tree_knn(Y, k, n_jobs):
    """Exact kNN with scipy's cKDTree; ties at the k-th distance broken by lower index as in the
    blocked search (rows with a tie at the boundary are redone by float64 brute force)."""
    n = Y.shape[0]
    kq = min(k + 2, n)  # the point itself, k neighbours, one more to see ties at the boundary
    dist, idx = cKDTree(Y).query(Y, k=kq, workers=n_jobs)
    is_self = idx == np.arange(n)[:, None]
    lost = ~is_self.any(axis=1)  # more than kq - 1 duplicates of the point: redone below
    is_self[lost, -1] = True
    keep = ~is_self
    idx = idx[keep].reshape(n, kq - 1)
    dist = dist[keep].reshape(n, kq - 1)
    order = np.lexsort((idx, dist), axis=1)
    idx = np.take_along_axis(idx, order, axis=1)
    dist = np.take_along_axis(dist, order, axis=1)
    unsure = lost.copy()
    if kq - 1 > k:
        unsure |= dist[:, k] <= dist[:, k - 1]
    out_i, out_d = idx[:, :k].astype(np.int64), dist[:, :k].copy()
    for r in np.flatnonzero(unsure):
        d2 = np.einsum("ij,ij->i", Y - Y[r], Y - Y[r])
        d2[r] = np.inf
        top = np.lexsort((np.arange(n), d2))[:k]
        out_i[r], out_d[r] = top, np.sqrt(d2[top])
    _tree_knn.last_fallback_rows = int(unsure.sum())
    return out_i, out_d


_tree_knn.last_fallback_rows = 0


def knn(
    Y,
    k: int,
    method: str = "auto",
    *,
    block_rows: int | None = None,
    random_state=0,
    n_jobs: int = -1,
    client=None,
):
    """k nearest neighbours of every row of Y, the point itself excluded.

    Parameters
    ----------
    Y : (N, D) array or dask.array
    k : number of neighbours (k + 1 <= N)
    method : ``"auto"`` (default: :func:`choose_knn_method` picks one of the three below by N, D
        and memory; call it yourself to record the choice), ``"tree"`` (scipy ``cKDTree``, exact,
        fast in low dimension), ``"exact"`` or ``"approx"`` (pynndescent, approximate: check with
        :func:`knn_recall`).
        Exact is a blocked brute force as a Dask graph (run on ``client``, else on Dask's local
        threads): rows are split into blocks (``block_rows``, default
        ``DEFAULT_BLOCK_ROWS``, or a dask array's own row chunks); one task per pair of blocks on
        or above the diagonal does one float32 GEMM and keeps, in one pass, the best k + 8
        candidates in both directions; one task per block merges its candidates, recomputes their
        distances in float64 and certifies the result against a rounding bound (rows that cannot
        be certified, e.g. exact ties at the k-th distance, are redone by float64 brute force).
        Memory per task is about ``block_rows**2 * 4`` bytes. Ties are broken by lower index
        (also by the tree).
    block_rows : rows per block of the exact search.
    n_jobs : threads of the tree query and of pynndescent (-1: all cores).
    client : a Dask distributed client the exact search runs on (the data go to its workers by
        scatter); None: Dask's local threaded scheduler in this process. Same result either way.

    Returns
    -------
    indices : (N, k) int64, nearest first
    distances : (N, k) float64 Euclidean distances
    """
    Y = _validate(Y, k)
    if method not in KNN_METHODS:
        raise ValueError(f"unknown knn method {method!r}; use one of {KNN_METHODS}")
    if block_rows is not None and (
        isinstance(block_rows, bool) or not isinstance(block_rows, (int, np.integer)) or block_rows < 1
    ):
        raise ValueError(f"block_rows must be a positive integer, got {block_rows!r}")
    if method == "auto":
        method = choose_knn_method(Y.shape[0], Y.shape[1], int(k))
    if method == "exact":
        return _exact_knn(Y, int(k), block_rows, client)
    Yn = check_data(Y.compute()) if hasattr(Y, "compute") else Y
    if method == "tree":
        return _tree_knn(Yn, int(k), n_jobs)
    from pynndescent import NNDescent  # slow to import (numba): only the approximate search needs it

    index = NNDescent(Yn.astype(np.float32), n_neighbors=int(k) + 1, random_state=random_state, n_jobs=n_jobs)
    idx, dist = index.neighbor_graph
    return _drop_self(idx, dist.astype(np.float64), int(k))


#: entries (query rows x reference rows) of one block of :func:`knn_query`'s distance matrix
QUERY_BLOCK_ENTRIES = 1 << 22


def knn_query(Y_ref, Y_query, k: int = 1):
    """The k nearest rows of ``Y_ref`` (N, D) to each row of ``Y_query`` (n, D): exact, in float64,
    over blocks of query rows (at most ``QUERY_BLOCK_ENTRIES`` squared distances held at once, not
    an n x N matrix); ties broken by lower index. A query row equal to a reference row finds it
    (the query form of :func:`knn`, which excludes each point itself). The start of every
    out-of-sample extension: each new row begins at its nearest training row's latent point.

    Returns (indices (n, k) int64, nearest first; distances (n, k) float64)."""
    R = np.asarray(Y_ref, dtype=np.float64)
    Qy = np.asarray(Y_query, dtype=np.float64)
    if R.ndim != 2 or Qy.ndim != 2 or R.shape[1] != Qy.shape[1]:
        raise ValueError(
            f"knn_query needs two 2-D arrays with the same columns, got shapes {R.shape} and {Qy.shape}"
        )
    n_ref = R.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n_ref:
        raise ValueError(f"k must be an integer in [1, {n_ref}] (the reference rows), got {k!r}")
    sq_ref = np.einsum("ij,ij->i", R, R)
    step = max(1, QUERY_BLOCK_ENTRIES // max(n_ref, 1))
    idx = np.empty((Qy.shape[0], k), dtype=np.int64)
    dist = np.empty((Qy.shape[0], k))
    for a in range(0, Qy.shape[0], step):
        B = Qy[a : a + step]
        d2 = np.einsum("ij,ij->i", B, B)[:, None] - 2.0 * (B @ R.T) + sq_ref[None]
        if k == 1:
            top = np.argmin(d2, axis=1)[:, None]
        else:
            cand = np.argpartition(d2, k - 1, axis=1)[:, :k]
            order = np.lexsort((cand, np.take_along_axis(d2, cand, axis=1)), axis=1)
            top = np.take_along_axis(cand, order, axis=1)
        idx[a : a + step] = top
        dist[a : a + step] = np.sqrt(np.maximum(np.take_along_axis(d2, top, axis=1), 0.0))
    return idx, dist


def _drop_self(idx, dist, k):
    """Remove each row's own index from a (N, k+1) neighbour list, keeping k entries."""
    n = idx.shape[0]
    is_self = idx == np.arange(n)[:, None]
    # rows where self was not found lose their last (farthest) entry instead
    missing = ~is_self.any(axis=1)
    is_self[missing, -1] = True
    keep = ~is_self
    return idx[keep].reshape(n, k).astype(np.int64), dist[keep].reshape(n, k)


def knn_recall(approx_indices, exact_indices) -> float:
    """Fraction of true k-nearest neighbours found by an approximate search."""
    a, e = np.asarray(approx_indices), np.asarray(exact_indices)
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: approx {a.shape} vs exact {e.shape}")
    hits = sum(len(np.intersect1d(ra, re, assume_unique=True)) for ra, re in zip(a, e))
    return hits / e.size


def slice_knn(indices, distances, k: int):
    """The k-NN graph for a smaller k, from one computed at a larger k (columns are sorted)."""
    if k > indices.shape[1]:
        raise ValueError(f"cannot slice k = {k} from a graph computed with k = {indices.shape[1]}")
    return indices[:, :k], distances[:, :k]


def growth_dimension(S, samples: int = 32, hops: int = 3, seed: int = 0) -> float:
    """How a neighbour graph's balls grow: the median over a seeded sample of points of
    log(|B(hops)| / |B(1)|) / log(hops), |B(r)| the points within r hops of the point on the
    symmetric pattern ``S`` (e.g. :func:`adjacency`). Balls grow like r^d on a d-dimensional
    manifold's graph (a swiss roll's: about 2); the kNN graph of data of high intrinsic
    dimension (an atlas's PCA) is expander-like and grows faster, which is what makes a sparse
    factorisation on it fill (GLLE's eigensolves). A few sparse products with ``samples``
    columns."""
    S = sp.csr_matrix(S)
    n = S.shape[0]
    rows = np.random.default_rng(seed).choice(n, min(samples, n), replace=False)
    X = np.zeros((n, len(rows)), dtype=np.float32)
    X[rows, np.arange(len(rows))] = 1.0
    P = S.astype(np.float32)
    sizes = []
    for _ in range(hops):
        X = np.minimum(X + (P @ X), 1.0).astype(np.float32)
        sizes.append(X.sum(axis=0))
    return float(np.median(np.log(sizes[-1] / sizes[0]) / np.log(hops)))


def adjacency(indices, mode: str = "union", n: int | None = None) -> sp.csr_matrix:
    """Symmetric 0/1 adjacency from neighbour lists.

    ``mode="union"``: i ~ j if either lists the other (OR); ``"mutual"``: if both do (AND).
    """
    indices = np.asarray(indices)
    n = indices.shape[0] if n is None else n
    k = indices.shape[1]
    rows = np.repeat(np.arange(indices.shape[0]), k)
    A = sp.csr_matrix((np.ones(rows.size), (rows, indices.ravel())), shape=(n, n))
    A.data[:] = 1.0
    if mode == "union":
        W = A.maximum(A.T)
    elif mode == "mutual":
        W = A.minimum(A.T)
    else:
        raise ValueError(f"unknown symmetrisation mode {mode!r}; use 'union' or 'mutual'")
    W = sp.csr_matrix(W)
    W.setdiag(0)
    W.eliminate_zeros()
    return W


def laplacian(W) -> sp.csr_matrix:
    """Unnormalised graph Laplacian L = D - W of a symmetric adjacency W."""
    W = sp.csr_matrix(W)
    deg = np.asarray(W.sum(axis=1)).ravel()
    return sp.csr_matrix(sp.diags(deg) - W)


def connected_components(W):
    """(number of components, component label of every point) of a symmetric adjacency."""
    return csgraph.connected_components(sp.csr_matrix(W), directed=False)


def require_connected(W, what: str = "the kNN graph") -> None:
    """Raise a ValueError describing the components if W is not connected."""
    n_comp, labels = connected_components(W)
    if n_comp > 1:
        sizes = np.bincount(labels)
        order = np.argsort(-sizes)
        desc = ", ".join(
            f"{sizes[c]} points (e.g. point {int(np.flatnonzero(labels == c)[0])})" for c in order[:5]
        )
        raise ValueError(
            f"{what} has {n_comp} connected components: {desc}{' ...' if n_comp > 5 else ''}; "
            "increase k (n_neighbors) or use mode='union' so the graph is connected"
        )
