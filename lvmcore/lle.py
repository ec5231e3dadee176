"""Locally linear embedding building blocks: reconstruction weights, the weight matrix, the sparse
embedding eigenproblem, and the per-point map over chunks of points used by GLLE (paper 001).

Everything per point is batched over points (stacked k x k solves), never a Python loop over
points. ``map_points`` runs such a batched function over chunks of points through the row-chunk
engine (``lvmcore.chunks``) and concatenates the results.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pymetis
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import LinearOperator, eigsh, splu

#: points per internal block of the batched weight solve (bounds the (block, k, D) gather)
BLOCK_POINTS = 16384
#: largest n for which the embedding eigenproblem is solved densely under ``solver="auto"``
DENSE_MAX_N = 500
#: relative tolerance of the Lanczos iteration on M^+ (ARPACK's ``tol``: a Ritz value's residual
#: over the value); on the swiss roll its vectors agree with tol = 0 (machine precision) to 1e-14
#: rad at 2,500 and 10^5 points, at no extra cost (bench/README.md, GLLE eigensolver, session 3)
LANCZOS_TOL = 1e-12
LANCZOS_MAXITER = 1000


def lanczos_basis(q: int, n: int) -> int:
    """Lanczos basis size for q wanted vectors of an n-point problem: 2q + 2, not ARPACK's default
    of 20. M^+'s top eigenvalues are far apart, so a short basis, restarted, converges to the same
    tolerance in fewer products, each two pinned solves (bench/README.md, "GLLE at scale")."""
    return min(n, 2 * q + 2)


#: the pinned point is moved when its entry of the left null vector u is below this times
#: max|u| (the pinned system A_pp is singular when u_p = 0, ill-conditioned when it is small)
PIN_MIN_RATIO = 1e-6
#: SuperLU's pivot threshold: 0 keeps every nonzero diagonal pivot (static pivoting), so the
#: factor has the structure of the symmetrised pattern under the ordering for every draw of the
#: weights on one graph. Threshold partial pivoting (0.1, the setting of session 3) swaps rows
#: where a sampled weight exceeds ten times the diagonal: on GLLE's generations at a = 10 of the
#: 50-D roll it made 8,391 off-diagonal pivots at 10^5 points and 4.3x the stored entries
#: (bench/README.md, "GLLE at 10^6 in 50-D"); at 10^6 that no longer fits a worker
PIVOT_THRESHOLD = 0.0
#: every pinned solve is refined (x += LU^-1 (b - A_pp x)) while its relative residual is above
#: REFINE_TOL and the last step at least halved it, at most REFINE_MAXITER steps (LAPACK's rule)
REFINE_TOL = 1e-12
REFINE_MAXITER = 5
#: a static-pivot factor whose refined test solves stay above this relative residual is replaced
#: by a threshold-pivoting one (FALLBACK_PIVOT_THRESHOLD)
ACCEPT_RESIDUAL = 1e-9
FALLBACK_PIVOT_THRESHOLD = 0.1
#: the solver "auto" uses above DENSE_MAX_N points (bench/README.md, GLLE eigensolver, session 3)
AUTO_SPARSE = "pinned_lu"
SOLVERS = ("auto", "dense", "pinned_lu")


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


def weight_pattern(W: sp.spmatrix) -> sp.csr_matrix:
    """The undirected neighbour graph of W: the structure of W + W^T without the diagonal (stored
    zeros count as edges, so every draw of the weights on one graph has the same pattern)."""
    W = sp.csr_matrix(W)
    S = sp.csr_matrix((np.ones(W.nnz), W.indices, W.indptr), shape=W.shape)
    S = (S + S.T).tocsr()
    S.setdiag(0)
    S.eliminate_zeros()
    return S


def check_connected(S: sp.spmatrix) -> None:
    """Refuse a neighbour graph (``weight_pattern``) with several connected components: M's null
    space then has more than the constant vector, and the bottom eigenvectors are arbitrary
    mixtures of component indicators (for every solver)."""
    n_comp, _ = connected_components(S, directed=False)
    if n_comp > 1:
        raise ValueError(
            f"the neighbour graph has {n_comp} connected components, so the LLE embedding is not "
            "defined (M = (I - W)^T (I - W) has a null space of that dimension); raise n_neighbors "
            "or embed each component separately"
        )


def fill_reducing_order(W: sp.spmatrix) -> np.ndarray:
    """METIS nested-dissection ordering (pymetis) of the symmetrised pattern of I - W: the
    elimination order of the pinned LU (``embed``). It depends on the neighbour graph only, so one
    ordering serves every eigenproblem on the same graph (LLE's and each GLLE generation's).
    Refuses a graph with several connected components (``check_connected``)."""
    S = weight_pattern(W)
    check_connected(S)
    perm = pymetis.nested_dissection(pymetis.CSRAdjacency(S.indptr, S.indices))[0]
    return np.asarray(perm, dtype=np.int64)


class _PinnedFactor:
    """SuperLU factor of A_pp (A = I - W without the row and column of the pinned point, in the
    ordering's coordinates) with refined solves. ``pivot``: SuperLU's diagonal pivot threshold."""

    def __init__(self, App: sp.csc_matrix, pivot: float):
        self.App = App
        self.lu = splu(App, permc_spec="NATURAL", diag_pivot_thresh=pivot, options={"SymmetricMode": True})
        self.residual = 0.0  # largest relative residual of a refined solve so far

    def solve(self, b, trans=False):
        op = self.App.T if trans else self.App
        t = "T" if trans else "N"
        x = self.lu.solve(b, trans=t)
        nb = np.linalg.norm(b)
        if nb == 0.0:
            return x
        r = b - op @ x
        rel = np.linalg.norm(r) / nb
        for _ in range(REFINE_MAXITER):
            if rel <= REFINE_TOL:
                break
            x_new = x + self.lu.solve(r, trans=t)
            r_new = b - op @ x_new
            rel_new = np.linalg.norm(r_new) / nb
            if rel_new > 0.5 * rel:
                if rel_new < rel:
                    x, rel = x_new, rel_new
                break
            x, r, rel = x_new, r_new, rel_new
        self.residual = max(self.residual, rel)
        return x


def _closed_class(A: sp.csr_matrix) -> np.ndarray:
    """Mask of the points where the left null vector u of A = I - W can be nonzero. u = W^T u
    passes weight from each point to its neighbours, so u vanishes on every point from which the
    directed neighbour graph (i -> the neighbours of i) leads out of its strongly connected
    component: u lives on the closed component(s), the whole graph when it is strongly connected
    (a swiss roll), 32 of 700 cells of pbmc68k_reduced's 20-D PCA at k = 10 (hubs). A pin outside
    them makes A_pp singular."""
    P = sp.csr_matrix((np.ones(A.nnz), A.indices, A.indptr), shape=A.shape)  # stored zeros are edges
    _, label = connected_components(P, directed=True, connection="strong")
    src, dst = P.nonzero()
    leaving = np.unique(label[src][label[src] != label[dst]])
    return ~np.isin(label, leaving)


def _pinned_lu(W: sp.spmatrix, q: int, order: np.ndarray, random_state, pin_ratio: float = PIN_MIN_RATIO):
    """Bottom ``q`` right singular vectors of A = I - W orthogonal to the constant vector (= M's
    bottom eigenvectors) by Lanczos on M^+ applied through a sparse LU of A, never forming M.

    A is singular: A 1 = 0 and A^T u = 0 for a left null vector u. Removing the row and column of
    one point p (A_pp, nonsingular when u_p != 0 and the graph is connected) gives, for b orthogonal
    to 1, M^+ b = P1 A^+ A^+T b as two pinned solves: z = A^+T b is the solution of
    A_pp^T z_p = b_p, z_p = 0 with its u component removed (the dropped equation is implied by
    1^T b = 0), and x = A^+ z the solution of A_pp x_p = z_p, x_p = 0, centred (the dropped equation
    is implied by u^T z = 0). u itself is one more solve. Working with A rather than M keeps the
    accuracy of the singular vectors at eps ||A|| / gap(sigma) instead of eps ||M|| / gap(lambda):
    at 10^6 points M's bottom eigenvalues (6.5e-15, 6.1e-14) are near ||M|| eps (~3e-15).

    The factor keeps the diagonal pivots (``PIVOT_THRESHOLD`` = 0: its fill is the symmetric
    pattern's, the same for every draw of the weights) and each solve is refined
    (``_PinnedFactor.solve``); if the refined u solve or a random test solve stays above
    ``ACCEPT_RESIDUAL``, the factor is redone with threshold partial pivoting.

    ``order``: ``fill_reducing_order(W)``; p is the last point in it on which u can be nonzero
    (:func:`_closed_class`; the last point overall when the neighbour graph is strongly
    connected), so the ordering stays close to a nested dissection of A_pp. Returns (eigenvalues
    ||A v||^2 (q,), unit vectors (n, q))."""
    n = W.shape[0]
    A = (sp.identity(n, format="csr") - W).tocsr()[order][:, order]  # the ordering's coordinates
    test = np.random.default_rng(random_state).standard_normal(n - 1)

    def factor(A, pin):
        keep = np.ones(n, dtype=bool)
        keep[pin] = False
        rhs = -A[[pin]][:, keep].toarray().ravel()
        App = A[keep][:, keep].tocsc()
        for pivot in (PIVOT_THRESHOLD, FALLBACK_PIVOT_THRESHOLD):
            lu = _PinnedFactor(App, pivot)
            u = np.empty(n)
            u[pin] = 1.0
            u[keep] = lu.solve(rhs, trans=True)  # A^T u = 0, u_p = 1
            lu.solve(test)
            if lu.residual <= ACCEPT_RESIDUAL or pivot == FALLBACK_PIVOT_THRESHOLD:
                return keep, lu, u
            del lu  # one factor in memory at a time

    keep, lu, u = factor(A, int(np.flatnonzero(_closed_class(A))[-1]))
    if 1.0 < pin_ratio * np.max(np.abs(u)):
        pin = int(np.argmax(np.abs(u)))
        del keep, lu, u  # one factor in memory at a time
        keep, lu, u = factor(A, pin)
    del A
    u /= np.linalg.norm(u)

    def apply(b):
        b = b - b.mean()
        z = np.zeros(n)
        z[keep] = lu.solve(b[keep], trans=True)
        z -= (u @ z) * u
        x = np.zeros(n)
        x[keep] = lu.solve(z[keep])
        return x - x.mean()

    op = LinearOperator((n, n), matvec=apply, dtype=np.float64)
    v0 = np.random.default_rng(random_state).uniform(-1.0, 1.0, n)
    _, vecs = eigsh(
        op, q, which="LA", v0=v0, ncv=lanczos_basis(q, n), tol=LANCZOS_TOL, maxiter=LANCZOS_MAXITER
    )
    vecs /= np.linalg.norm(vecs, axis=0)
    out = np.empty((n, q))
    out[order] = vecs
    vals = np.sum((out - W @ out) ** 2, axis=0)
    o = np.argsort(vals)
    return vals[o], out[:, o]


def resolve_solver(solver: str, n: int) -> str:
    """The solver ``embed`` runs for ``solver`` at n points ("auto": dense up to DENSE_MAX_N)."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown eigen solver {solver!r}; use one of {', '.join(map(repr, SOLVERS))}")
    if solver == "auto":
        return "dense" if n <= DENSE_MAX_N else AUTO_SPARSE
    return solver


def embed(W: sp.spmatrix, n_components: int, *, solver: str = "auto", random_state=0, order=None):
    """Bottom eigenvectors of M = (I - W)^T (I - W) without the constant one, scaled so that
    (1/n) Y^T Y = I (paper 001 eq. 42). Rows of W must sum to one (then M 1 = 0).

    ``solver``: "dense" (eigh of M; the reference at small n), "pinned_lu" (Lanczos on M^+ through
    a sparse LU of I - W with one point pinned and a METIS ordering: ``_pinned_lu``; M is never
    formed) or "auto" (dense up to ``DENSE_MAX_N`` points, else pinned_lu). ``order``: a
    ``fill_reducing_order(W)`` computed before for the same neighbour graph (else computed here).
    Returns (Y (n, Q), eigenvalues (Q,))."""
    n = W.shape[0]
    solver = resolve_solver(solver, n)
    if n_components + 1 >= n:
        raise ValueError(f"n_components + 1 must be < n_points ({n}), got n_components={n_components}")
    if solver == "pinned_lu":
        if order is None:
            order = fill_reducing_order(W)
        elif len(order) != n:
            raise ValueError(f"order has {len(order)} entries for {n} points; pass fill_reducing_order(W)")
        vals, vecs = _pinned_lu(W, n_components, order, random_state)
        Yemb = vecs - vecs.mean(axis=0)
        Yemb /= np.sqrt(np.mean(Yemb**2, axis=0))
        return Yemb, vals
    check_connected(weight_pattern(W))
    vals, vecs = np.linalg.eigh(embedding_matrix(W).toarray())
    vals, vecs = vals[: n_components + 1], vecs[:, : n_components + 1]
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
    per chunk, on the Dask cluster of a ``client=`` keyword if given (Y sent to each worker once),
    else on Dask's local scheduler) and concatenate each
    output along axis 0. The per-point computations are independent, so the chunked and
    unchunked results are identical."""
    # lvmcore.chunks imports jax (seconds): only GLLE's per-point work needs it
    from lvmcore.chunks import map_chunks, row_spans

    spans = row_spans(idx.shape[0], chunks)
    results = map_chunks(partial(_point_call, func), spans, shared=(Y,), sliced=(idx, *arrays), **kwargs)
    return tuple(np.concatenate([r[j] for r in results], axis=0) for j in range(len(results[0])))
