"""k-nearest-neighbour graphs: exact blocked search over Dask row chunks, approximate search
with pynndescent, symmetrisation, adjacency, Laplacian and connectivity.

Shapes: N points, D features, K neighbours. Indices never contain the point itself.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components as _cc

__all__ = [
    "knn",
    "knn_recall",
    "slice_knn",
    "adjacency",
    "laplacian",
    "connected_components",
    "require_connected",
    "DEFAULT_BLOCK_ROWS",
]

#: query rows per block of the exact search; memory per block is about
#: block_rows * N * 8 bytes for the distance slab
DEFAULT_BLOCK_ROWS = 2048


def _validate(Y, k):
    if hasattr(Y, "chunks") and hasattr(Y, "compute"):  # dask array: check shape only
        shape = Y.shape
    else:
        Y = np.asarray(Y)
        shape = Y.shape
        if Y.dtype == object:
            raise ValueError("Y must be a numeric array, got dtype=object")
    if len(shape) != 2:
        raise ValueError(f"Y must be 2-D (points x features), got shape {shape}; reshape it to (N, D)")
    n = shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if n < k + 1:
        raise ValueError(
            f"Expected k + 1 <= n_points, but n_points = {n}, k = {k}; use a smaller k or more points"
        )
    return Y


def _block_topk(Yb, Y, start, k, sq_all):
    """Exact top-k of the rows Yb (global offset ``start``) against all rows Y, self excluded.

    Squared distances by the expansion |a|^2 + |b|^2 - 2 a.b (one GEMM per block), partial
    selection with argpartition, then an exact recomputation of the selected distances so the
    returned values carry no cancellation error.
    """
    nb = Yb.shape[0]
    sq_b = np.einsum("ij,ij->i", Yb, Yb)
    d2 = sq_b[:, None] + sq_all[None, :] - 2.0 * (Yb @ Y.T)
    rows = np.arange(nb)
    d2[rows, start + rows] = np.inf  # exclude the point itself
    # take a few extra candidates so that rounding in the expansion cannot drop a true neighbour
    kk = min(k + 8, Y.shape[0] - 1)
    cand = np.argpartition(d2, kk - 1, axis=1)[:, :kk]
    diff = Yb[:, None, :] - Y[cand]
    exact = np.sqrt(np.einsum("ijk,ijk->ij", diff, diff))
    exact[cand == (start + rows)[:, None]] = np.inf
    order = np.lexsort((cand, exact), axis=1)[:, :k]  # by distance, ties by index
    idx = np.take_along_axis(cand, order, axis=1)
    dist = np.take_along_axis(exact, order, axis=1)
    return idx.astype(np.int64), dist


def _exact_knn(Y, k, block_rows):
    import dask.array as da

    if isinstance(Y, da.Array):
        Yd = Y.rechunk((block_rows, -1)).astype(np.float64)
        Yfull = Yd.compute()  # the reference side must be whole; query blocks stay chunked
    else:
        Yfull = np.ascontiguousarray(Y, dtype=np.float64)
        Yd = da.from_array(Yfull, chunks=(block_rows, -1))
    sq_all = np.einsum("ij,ij->i", Yfull, Yfull)
    offsets = np.cumsum((0,) + Yd.chunks[0][:-1])

    def block(yb, block_info=None):
        start = int(offsets[block_info[0]["chunk-location"][0]])
        idx, dist = _block_topk(yb, Yfull, start, k, sq_all)
        return np.concatenate([idx.astype(np.float64), dist], axis=1)

    out = Yd.map_blocks(block, chunks=(Yd.chunks[0], (2 * k,)), dtype=np.float64).compute()
    return out[:, :k].astype(np.int64), out[:, k:]


def knn(Y, k: int, method: str = "exact", *, block_rows: int = DEFAULT_BLOCK_ROWS, random_state=0):
    """k nearest neighbours of every row of Y, the point itself excluded.

    Parameters
    ----------
    Y : (N, D) array or dask.array
    k : number of neighbours (k + 1 <= N)
    method : ``"exact"`` (blocked brute force: query rows in blocks of ``block_rows`` as a Dask
        array, each block one GEMM against all points plus a partial sort; memory bounded by
        ``block_rows * N``) or ``"approx"`` (pynndescent).

    Returns
    -------
    indices : (N, k) int64, nearest first
    distances : (N, k) float64 Euclidean distances
    """
    Y = _validate(Y, k)
    if not hasattr(Y, "compute"):
        Y = np.asarray(Y, dtype=np.float64)
        if not np.all(np.isfinite(Y)):
            bad = np.argwhere(~np.isfinite(Y))[0]
            raise ValueError(
                f"Y contains NaN or inf (first at row {bad[0]}, column {bad[1]}); "
                "remove or impute those values first"
            )
    if method == "exact":
        return _exact_knn(Y, int(k), int(block_rows))
    if method == "approx":
        from pynndescent import NNDescent

        Yn = np.asarray(Y.compute() if hasattr(Y, "compute") else Y, dtype=np.float32)
        index = NNDescent(Yn, n_neighbors=int(k) + 1, random_state=random_state, n_jobs=1)
        idx, dist = index.neighbor_graph
        return _drop_self(idx, dist.astype(np.float64), int(k))
    raise ValueError(f"unknown knn method {method!r}; use 'exact' or 'approx'")


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
    return _cc(sp.csr_matrix(W), directed=False)


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
