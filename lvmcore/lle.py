"""Locally linear embedding building blocks: reconstruction weights, the weight matrix, the sparse
embedding eigenproblem, and the per-point map over chunks of points used by GLLE (paper 001).

Everything per point is batched over points (stacked k x k solves), never a Python loop over
points. ``map_points`` runs such a batched function over chunks of points through the row-chunk
engine (``lvmcore.chunks``) and concatenates the results.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

#: points per internal block of the batched weight solve (bounds the (block, k, D) gather)
BLOCK_POINTS = 16384
#: largest n for which the embedding eigenproblem is solved densely under ``solver="auto"``
DENSE_MAX_N = 500
#: ARPACK settings of the sparse eigensolver (shift-invert about 0, as scikit-learn's LLE)
ARPACK_TOL = 1e-6
ARPACK_MAXITER = 1000
#: LOBPCG settings: relative residual tolerance, iteration cap and extra block vectors (a block
#: wider than the Q wanted vectors converges in fewer iterations when the bottom spectrum is tight)
LOBPCG_TOL = 1e-8
LOBPCG_MAXITER = 500
LOBPCG_EXTRA = 4
#: the sparse solver "auto" uses above DENSE_MAX_N points (bench/README.md, GLLE eigensolver)
AUTO_SPARSE = "arpack"


def neighbour_differences(Y: np.ndarray, idx: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """G[i, j] = Y[idx[i, j]] - Y[i] for the given rows (all rows by default): (n, k, D)."""
    if rows is None:
        return Y[idx] - Y[:, None, :]
    return Y[idx] - Y[rows][:, None, :]


def trace_regulariser(C: np.ndarray, reg: float) -> np.ndarray:
    """scikit-learn's barycenter regulariser per point: reg * trace(C_i), or reg where the trace is 0
    (all neighbours coincide with the point)."""
    tr = np.trace(C, axis1=-2, axis2=-1)
    return np.where(tr > 0, reg * tr, reg)


def barycenter_weights(Y: np.ndarray, idx: np.ndarray, reg: float = 1e-3, rows=None) -> np.ndarray:
    """LLE reconstruction weights (n, k): for each point, minimise w^T (C + R I) w subject to
    sum(w) = 1, with C the Gram matrix of the neighbour differences and R = reg * trace(C)
    (scikit-learn's ``barycenter_weights``). Batched over points in blocks of ``BLOCK_POINTS``."""
    n, k = idx.shape
    rows = np.arange(n) if rows is None else np.asarray(rows)
    out = np.empty((len(rows), k))
    for s in range(0, len(rows), BLOCK_POINTS):
        r = rows[s : s + BLOCK_POINTS]
        G = neighbour_differences(Y, idx[s : s + BLOCK_POINTS], r)
        C = G @ G.transpose(0, 2, 1)
        C[:, np.arange(k), np.arange(k)] += trace_regulariser(C, reg)[:, None]
        w = np.linalg.solve(C, np.ones((len(r), k, 1)))[..., 0]
        out[s : s + len(r)] = w / w.sum(axis=1, keepdims=True)
    return out


def weight_matrix(weights: np.ndarray, idx: np.ndarray) -> sp.csr_matrix:
    """Sparse (n, n) matrix with row i holding weights[i] at columns idx[i]."""
    n, k = idx.shape
    indptr = np.arange(0, n * k + 1, k)
    # copies: scipy may adopt the arrays and sum_duplicates sorts them in place
    W = sp.csr_matrix(
        (np.array(weights, dtype=np.float64).ravel(), np.array(idx).ravel(), indptr), shape=(n, n)
    )
    W.sum_duplicates()
    return W


def embedding_matrix(W: sp.spmatrix) -> sp.csr_matrix:
    """M = (I - W)^T (I - W) (paper 001 eq. 41)."""
    n = W.shape[0]
    A = sp.identity(n, format="csr") - W
    return (A.T @ A).tocsr()


def _lobpcg(M: sp.csr_matrix, q: int, random_state):
    """Bottom ``q`` eigenpairs of M orthogonal to the constant vector (M's null vector) by LOBPCG
    with a smoothed-aggregation algebraic-multigrid V-cycle as preconditioner (pyamg; the constant
    vector is its near-null space). The constraint deflates the null vector exactly, so no shift
    or factorisation of the singular M is needed; memory is O(nnz(M) + n (q + extra))."""
    import pyamg
    from scipy.sparse.linalg import lobpcg

    n = M.shape[0]
    ml = pyamg.smoothed_aggregation_solver(M, B=np.ones((n, 1)), symmetry="symmetric", coarse_solver="pinv")
    P = ml.aspreconditioner(cycle="V")
    const = np.full((n, 1), 1.0 / np.sqrt(n))
    b = min(q + LOBPCG_EXTRA, n - 2)
    X0 = np.random.default_rng(random_state).standard_normal((n, b))
    vals, vecs = lobpcg(M, X0, M=P, Y=const, tol=LOBPCG_TOL, maxiter=LOBPCG_MAXITER, largest=False)
    order = np.argsort(vals)[:q]
    return vals[order], vecs[:, order]


def embed(W: sp.spmatrix, n_components: int, *, solver: str = "auto", random_state=0):
    """Bottom eigenvectors of M = (I - W)^T (I - W) without the constant one, scaled so that
    (1/n) Y^T Y = I (paper 001 eq. 42). Rows of W must sum to one (then M 1 = 0).

    ``solver``: "dense" (eigh of M), "arpack" (sparse shift-invert Lanczos about 0 with a seeded
    start vector and SuperLU's factorisation of M), "lobpcg" (LOBPCG orthogonal to the constant
    vector, preconditioned by algebraic multigrid: ``_lobpcg``) or "auto" (dense up to
    ``DENSE_MAX_N`` points). M is never densified by the sparse solvers. Returns (Y (n, Q),
    eigenvalues (Q,))."""
    n = W.shape[0]
    if n_components + 1 >= n:
        raise ValueError(f"n_components + 1 must be < n_points ({n}), got n_components={n_components}")
    M = embedding_matrix(W)
    if solver == "auto":
        solver = "dense" if n <= DENSE_MAX_N else AUTO_SPARSE
    if solver == "lobpcg":
        vals, vecs = _lobpcg(M, n_components, random_state)
        Yemb = vecs - vecs.mean(axis=0)
        Yemb /= np.sqrt(np.mean(Yemb**2, axis=0))
        return Yemb, vals
    if solver == "dense":
        vals, vecs = np.linalg.eigh(M.toarray())
        vals, vecs = vals[: n_components + 1], vecs[:, : n_components + 1]
    elif solver == "arpack":
        from scipy.sparse.linalg import eigsh

        v0 = np.random.default_rng(random_state).uniform(-1.0, 1.0, n)
        vals, vecs = eigsh(M, n_components + 1, sigma=0.0, tol=ARPACK_TOL, maxiter=ARPACK_MAXITER, v0=v0)
        order = np.argsort(vals)
        vals, vecs = vals[order], vecs[:, order]
    else:
        raise ValueError(f"unknown eigen solver {solver!r}; use 'auto', 'dense', 'arpack' or 'lobpcg'")
    # the constant vector is M's null vector (rows of W sum to one); drop the eigenvector most
    # aligned with it rather than trusting the order when eigenvalues are nearly tied
    const = np.abs(vecs.sum(axis=0)) / np.sqrt(n)
    drop = int(np.argmax(const))
    keep = [j for j in range(n_components + 1) if j != drop]
    Yemb = vecs[:, keep] - vecs[:, keep].mean(axis=0)
    Yemb /= np.sqrt(np.mean(Yemb**2, axis=0))
    return Yemb, vals[keep]


def lle(Y, n_components: int, idx: np.ndarray, *, reg: float = 1e-3, solver: str = "auto", random_state=0):
    """Locally linear embedding from given kNN indices. Returns (embedding, weights)."""
    w = barycenter_weights(Y, idx, reg)
    emb, _ = embed(weight_matrix(w, idx), n_components, solver=solver, random_state=random_state)
    return emb, w


def match_axes(target: np.ndarray, X: np.ndarray) -> np.ndarray:
    """X's coordinates permuted and sign-flipped to best match target's (greedy on |correlation|).
    Coordinates are kept as they are (no rotation), so "the best embedding coordinate" stays an
    eigenvector of the embedding problem."""
    q = X.shape[1]
    R = np.corrcoef(target.T, X.T)[:q, q:]
    out = np.empty_like(X)
    free = list(range(q))
    for i in np.argsort(-np.max(np.abs(R), axis=1)):
        j = max(free, key=lambda c: abs(R[i, c]))
        free.remove(j)
        out[:, i] = X[:, j] * (1.0 if R[i, j] >= 0 else -1.0)
    return out


def _point_call(func, Y, idx, *blocks_and_span, **kwargs):
    *blocks, span = blocks_and_span
    return func(Y, idx, np.arange(span.start, span.stop), *blocks, **kwargs)


def map_points(func, Y: np.ndarray, idx: np.ndarray, *arrays, chunks: int | None = None, **kwargs):
    """Apply ``func(Y, idx_block, rows, *array_blocks, **kwargs)`` -> tuple of per-point arrays over
    chunks of ``chunks`` points (``lvmcore.chunks.map_chunks``: in process for None, else one task
    per chunk on the caller's Dask cluster, Y sent to each worker once) and concatenate each
    output along axis 0. The per-point computations are independent, so the chunked and
    unchunked results are identical."""
    from functools import partial

    from lvmcore.chunks import map_chunks, row_spans

    spans = row_spans(idx.shape[0], chunks)
    results = map_chunks(partial(_point_call, func), spans, shared=(Y,), sliced=(idx, *arrays), **kwargs)
    return tuple(np.concatenate([r[j] for r in results], axis=0) for j in range(len(results[0])))
