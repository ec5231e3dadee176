"""The streamed PCA of a matrix read in row blocks (after normalize_total / log1p, as
lvmcore.data.preprocess defines them), by scanpy's definitions, on the client the caller passes.

The transformed blocks Z_b (sparse stays sparse) are read from the file once and held for the
PCA's passes: where the caller passes a Dask client (the ingest task passes its worker's:
tasks.ingest.preprocessing_client), as one contiguous share of the blocks per worker held by a
Dask actor on it, so a pass over the data is one call to each worker (the share's products summed
where its blocks live; ARPACK's hundreds of products each cost one round trip per worker, not a
task per block and a gather of partial sums); else in this process. Memory: the transformed matrix
once (12 bytes per stored non-zero), spread over the workers, given back when the PCA ends. Four routes:

- ``"covariance"`` (exact): C of eq. P1 summed blockwise as a D x D array, then ``eigh``. One pass;
  O(nnz^2 / N) per row for sparse data; D^2 memory per partial sum.
- ``"lanczos"`` (exact to ``pca_tol``): block Lanczos on C with full reorthogonalisation and
  thick restarts (:func:`block_lanczos`), ``pca_block`` vectors per pass,
  C X = (Z^T (Z X) - N mu (mu^T X)) / (N - 1): one pass over the held blocks serves the whole
  block, and a sparse times a few dense columns costs much less per column than one product
  alone. Stops when every one of the k Ritz pairs has residual norm ||C v - theta v|| at most
  ``pca_tol`` theta, ARPACK's convergence test (scanpy runs ARPACK with tol = 0: machine
  precision). A residual r leaves the subspace off by about r / gap, the Ritz values by r^2 / gap.
- ``"arpack"`` (exact): ARPACK's implicitly restarted Lanczos (scipy ``eigsh``, tol = 0) on C,
  one pass over the held blocks per product: the eigenproblem scanpy's default sparse PCA solves
  (``svd_solver="arpack"``), to machine precision, one vector per pass.
- ``"randomized"``: randomised block Krylov with implicit centring (Musco and Musco 2015): the
  Krylov basis of Z_c Omega (l = k + 10 columns) over ``pca_iter`` rounds of Z_c Z_c^T, then
  Rayleigh-Ritz (the SVD of Q^T Z_c). 2 ``pca_iter`` + 3 passes of O(nnz l) (the last
  O(nnz l (pca_iter + 1))). Its accuracy grows with ``pca_iter``; components on a flat noise floor
  converge slowest; it has no residual test. (``dask.array.linalg.svd_compressed`` is this
  method without the implicit centring: on a sparse Dask array it would need the centred, dense
  matrix.)

``"auto"``: covariance when D <= :data:`COVARIANCE_MAX_D`, else lanczos.
"""

from __future__ import annotations

import logging

import numpy as np
import scipy.sparse as sp
from scipy.linalg import eigh
from scipy.sparse.linalg import LinearOperator, eigsh

from lvmcore.data.preprocess import transform_block

__all__ = ["run_pca", "median_total", "block_lanczos"]

log = logging.getLogger("lvmcore.data")

#: "auto" takes the covariance route up to this many features (a D x D float64 partial sum per
#: block: 32 MB at 2,000), block Lanczos above
COVARIANCE_MAX_D = 2000
#: block Lanczos: the basis is restarted (thick restart: the best Ritz vectors kept) when it
#: would exceed this many vectors times the components asked for (or D)
LANCZOS_BASIS = 16
#: block Lanczos: once the basis has m vectors, convergence is checked every m / LANCZOS_CHECK
#: passes (an eigensolve of the m x m projection, O(m^3), against a pass's O(nnz block))
LANCZOS_CHECK = 200
#: rows per Dask task in the streamed passes
PASS_ROWS = 8192


def _bounds(n: int, rows: int | None = None):
    """Row blocks of about ``rows``; a short tail joins the block before it (every block then has
    at least rows / 2 rows)."""
    rows = rows or PASS_ROWS
    out = [[a, min(a + rows, n)] for a in range(0, n, rows)]
    if len(out) > 1 and out[-1][1] - out[-1][0] < rows // 2:
        last = out.pop()
        out[-1][1] = last[1]
    return [tuple(x) for x in out]


def _sum(parts):
    out = parts[0].copy()
    for p in parts[1:]:
        out += p
    return out


def _read_z(matrix, a, b, settings, target, columns=None):
    z = transform_block(matrix.read(a, b), settings, target, matrix.where(), a)
    return z if columns is None else z[:, columns]  # after normalize_total: totals over every gene


def _totals(matrix, a, b):
    return np.asarray(matrix.read(a, b).sum(axis=1), dtype=np.float64).ravel()


def _moments(Z, gram: bool):
    s = np.asarray(Z.sum(axis=0)).ravel()
    sq = np.asarray((Z.multiply(Z) if sp.issparse(Z) else Z * Z).sum(axis=0)).ravel()
    out = [s, sq]
    if gram:
        G = Z.T @ Z
        out.append(G.toarray() if sp.issparse(G) else np.asarray(G))
    return np.concatenate([np.ravel(x) for x in out])


def _times(Z, W, shift):
    """Rows of Z_c W = Z W - 1 (mu^T W) (``shift`` = mu^T W)."""
    return np.asarray(Z @ W) - shift


def _t_times(Z, Qb):
    """Z_b^T Q_b (the centring correction is applied once to the sum)."""
    return np.asarray((Qb.T @ Z).T)


def _gram_times(Z, v):
    """Z_b^T (Z_b v): one block's share of Z^T Z v (v a vector, or a D x b block of vectors)."""
    return np.asarray(Z.T @ np.asarray(Z @ v))


class _Holder:
    """One share of the transformed row blocks Z_b (normalize_total / log1p applied, sparse kept
    sparse), read from the file once and held for every pass of the PCA. On a cluster each worker
    holds one share as a Dask actor: a pass is one call per worker, the blocks' products summed
    where the blocks live, so a product costs one round trip to each worker (no scheduling of a
    task per block, no partial sums moved between workers)."""

    def __init__(self, matrix, bounds, settings, target, columns=None):
        self.blocks = [_read_z(matrix, a, b, settings, target, columns) for a, b in bounds]

    def reduce(self, fn, *args):
        """sum over the blocks of fn(Z_b, *args)"""
        return _sum([fn(z, *args) for z in self.blocks])

    def reduce_rows(self, fn, rows):
        """sum over the blocks of fn(Z_b, R_b), R_b the rows of ``rows`` (this share's) for Z_b"""
        parts, i = [], 0
        for z in self.blocks:
            parts.append(fn(z, rows[i : i + z.shape[0]]))
            i += z.shape[0]
        return _sum(parts)

    def rows(self, fn, *args):
        """fn(Z_b, *args) of every block, stacked in row order"""
        return np.vstack([fn(z, *args) for z in self.blocks])

    def drop(self) -> None:
        """Let go of the blocks (their memory). On a cluster this is a call the PCA waits on: the
        actor itself leaves its worker when the scheduler has processed the release of its key,
        which is a message and may lag under load."""
        self.blocks = []


class _Blocks:
    """The transformed row blocks, split into contiguous shares: one :class:`_Holder` per worker
    of the cluster (an actor pinned to it), else one in this process. Memory: the transformed
    matrix once (12 bytes per stored non-zero), spread over the workers."""

    def __init__(self, client, matrix, settings, target, bounds, columns=None):
        self.client = client
        if client is None:
            self.spans = [(0, bounds[-1][1])]
            self.holders = [_Holder(matrix, bounds, settings, target, columns)]
            return
        workers = sorted(client.nthreads())
        groups = [g for g in np.array_split(np.arange(len(bounds)), min(len(workers), len(bounds))) if len(g)]
        self.spans = [(bounds[g[0]][0], bounds[g[-1]][1]) for g in groups]
        self._futures = [
            client.submit(
                _Holder,
                matrix,
                [bounds[i] for i in g],
                settings,
                target,
                columns,
                workers=[w],
                actor=True,
                pure=False,
            )
            for g, w in zip(groups, workers)
        ]
        self.holders = [f.result() for f in self._futures]

    def _call(self, name, args_for):
        """holder.name(*args_for(its row span)) for every holder, in parallel on a cluster"""
        calls = [getattr(h, name)(*args_for(span)) for h, span in zip(self.holders, self.spans)]
        return calls if self.client is None else [c.result() for c in calls]

    def reduce(self, fn, *args):
        """sum over the blocks of fn(Z_b, *args)"""
        return _sum(self._call("reduce", lambda span: (fn, *args)))

    def reduce_rows(self, fn, rows):
        """sum over the blocks of fn(Z_b, rows[a:b])"""
        return _sum(self._call("reduce_rows", lambda span: (fn, rows[span[0] : span[1]])))

    def rows(self, fn, *args):
        """fn(Z_b, *args) of every block, stacked in row order"""
        return np.vstack(self._call("rows", lambda span: (fn, *args)))

    def release(self):
        """Give the shares' memory back now (each holder drops its blocks; waited on), then the
        actors themselves (cancelling their keys: the workers forget them moments later)."""
        if self.client is not None:
            calls = [h.drop() for h in self.holders]
            for c in calls:
                try:
                    c.result()
                except Exception:  # a holder whose worker has left holds nothing
                    pass
            self.client.cancel(self._futures)
            self._futures = []
        self.holders = []


def median_total(matrix, client=None) -> float:
    """scanpy's ``target_sum=None``: the median of the cells' total counts (a pass of its own)."""
    n = matrix.shape[0]
    bounds = _bounds(n)
    if client is None:
        totals = [_totals(matrix, a, b) for a, b in bounds]
    else:
        nb = len(bounds)
        totals = client.gather(client.map(_totals, [matrix] * nb, *zip(*bounds), pure=False))
    return float(np.median(np.concatenate(totals)))


def _svd_flip(V: np.ndarray) -> np.ndarray:
    """Columns of V (D x k) signed so each one's largest-magnitude entry is positive
    (scikit-learn's ``svd_flip(u_based_decision=False)``)."""
    idx = np.argmax(np.abs(V), axis=0)
    signs = np.sign(V[idx, np.arange(V.shape[1])])
    signs[signs == 0] = 1.0
    return V * signs


def run_pca(matrix, settings: dict, columns=None, client=None) -> dict:
    """normalize_total / log1p / PCA of ``matrix`` (a view's matrix, e.g. a
    :class:`lvmcore.data.sources.hdf5.Matrix`) as the settings say, streamed over its row blocks on
    ``client`` (a Dask client; None: in this process); returns ``{"scores": (N, k), "components":
    (k, D), "mean", "explained_variance", "explained_variance_ratio", "target_sum", "solver"}``
    (only ``target_sum`` when there is no PCA). ``columns``: the genes the PCA uses
    (lvmcore.data.preprocess.resolve_mask; None: every gene), taken after normalize_total and
    log1p."""
    return _run_pca(client, matrix, settings, columns)


def _run_pca(client, matrix, settings, columns=None):
    n, D = matrix.shape[0], matrix.shape[1] if columns is None else len(columns)
    target = None
    if settings.get("normalize_total") == "median":
        target = median_total(matrix, client)
    elif settings.get("normalize_total") is not None:
        target = float(settings["normalize_total"])
    out = {"target_sum": target}
    k = settings.get("pca")
    if k is None:
        return out
    if k > min(n - 1, D):
        raise ValueError(
            f"{matrix.where()}: preprocess pca = {k} components needs at most min(N - 1, D) = "
            f"{min(n - 1, D)}; lower pca"
        )
    solver = settings["pca_solver"]
    if solver == "auto":
        solver = "covariance" if D <= COVARIANCE_MAX_D else "lanczos"
    gram = solver == "covariance"
    blocks = _Blocks(client, matrix, settings, target, _bounds(n), columns)
    try:
        m = blocks.reduce(_moments, gram)
        s, sq = m[:D], m[D : 2 * D]
        mu = s / n
        total_var = float(np.sum(sq - n * mu * mu) / (n - 1))
        if gram:
            C = (m[2 * D :].reshape(D, D) - n * np.outer(mu, mu)) / (n - 1)  # eq. P1
            evals, evecs = np.linalg.eigh((C + C.T) / 2)
            order = np.argsort(evals)[::-1][:k]
            ev, V = evals[order], evecs[:, order]
        elif solver == "lanczos":
            ev, V = _lanczos(blocks, mu, n, D, k, settings)
        elif solver == "arpack":
            ev, V = _arpack(blocks, mu, n, D, k, settings["pca_seed"])
        else:
            ev, V = _randomized(blocks, mu, n, D, k, settings)
        V = _svd_flip(V)
        scores = blocks.rows(_times, V, mu @ V)
    finally:
        blocks.release()
    out.update(
        scores=scores,
        components=V.T,
        mean=mu,
        explained_variance=ev,
        explained_variance_ratio=ev / total_var if total_var > 0 else np.zeros_like(ev),
        solver=solver,
    )
    return out


def _arpack(blocks, mu, n, D, k, seed):
    """The top k eigenpairs of C (eq. P1) by ARPACK's implicitly restarted Lanczos (scipy's eigsh,
    to machine precision: tol=0), C v = (Z^T (Z v) - N mu (mu^T v)) / (N - 1) one pass over the
    held blocks per product. The same eigenproblem scanpy's default sparse PCA solves."""

    def matvec(v):
        v = np.asarray(v, dtype=np.float64).ravel()
        return (blocks.reduce(_gram_times, v).ravel() - n * mu * (mu @ v)) / (n - 1)

    v0 = np.random.default_rng(seed).uniform(-1, 1, D)
    ev, V = eigsh(LinearOperator((D, D), matvec=matvec, dtype=np.float64), k=k, which="LA", v0=v0, tol=0)
    order = np.argsort(ev)[::-1]
    return ev[order], V[:, order]


def _lanczos(blocks, mu, n, D, k, settings):
    """The top k eigenpairs of C (eq. P1) by block Lanczos (:func:`block_lanczos`), each pass over
    the held blocks serving ``pca_block`` vectors: C X = (Z^T (Z X) - N mu (mu^T X)) / (N - 1)."""

    def apply(X):
        return (blocks.reduce(_gram_times, X) - n * np.outer(mu, mu @ X)) / (n - 1)

    ev, V, info = block_lanczos(
        apply,
        D,
        k,
        block=settings["pca_block"],
        tol=settings["pca_tol"],
        rng=np.random.default_rng(settings["pca_seed"]),
        max_basis=LANCZOS_BASIS * k,
    )
    log.info(
        "block Lanczos: %d passes of %d vectors, %d restarts, residual %.1e",
        info["passes"],
        settings["pca_block"],
        info["restarts"],
        info["residual"],
    )
    return ev, V


def _orthonormal_to(Q, X, rng):
    """An orthonormal basis of X's columns with span(Q) projected out (twice: one projection loses
    orthogonality to rounding where X lies mostly in span(Q)); a column with nothing left is
    replaced by a random direction, so the block keeps its width."""
    for _ in range(3):
        for _ in range(2):
            X = X - Q @ (Q.T @ X)
        X, R = np.linalg.qr(X)
        dead = np.abs(np.diag(R)) <= 1e-10 * max(1.0, float(np.abs(R).max()))
        if not dead.any():
            return X
        X[:, dead] = rng.standard_normal((X.shape[0], int(dead.sum())))
    raise np.linalg.LinAlgError("block Lanczos: no direction left outside the basis")


def _next_block(Q, P, nb, rng):
    """(X, R): P = X R with X orthonormal (P already orthogonal to Q), cut to nb columns; a
    direction P lacks (the Krylov space exhausted, or nb > rank) is filled from outside span(Q)."""
    X, R = np.linalg.qr(P)
    X = X[:, :nb]
    d = np.abs(np.diag(R))[:nb]
    if np.any(d <= 1e-12 * max(1.0, float(np.abs(R).max()))):
        X = _orthonormal_to(Q, X, rng)
    return X, R


def block_lanczos(apply, D, k, block, tol, rng, max_basis):
    """The k largest eigenpairs of a symmetric D x D operator (``apply``: a D x b block -> its
    image) by block Lanczos with full reorthogonalisation and thick restarts.

    The basis Q grows a block per product: Q_{j+1} R_j = (I - Q Q^T) C Q_j (the projection done
    twice). T = Q^T C Q is kept from those projections (its upper triangle, then symmetrised), so
    the Ritz pairs (theta, Q s) of T cost no pass; the residual of a Ritz pair is
    C Q s - theta Q s = Q_{j+1} R_j s_j (s_j: s's rows of the last block), its norm
    ||R_j s_j||, also without a pass (ARPACK's Ritz estimate). A pair is converged when that norm is
    at most ``tol`` theta (ARPACK's test); the loop stops when the k largest are. When the basis
    would exceed ``max_basis`` (or D) vectors it restarts thick: Q becomes the best Ritz vectors
    (half the room, at least k + block) with T their Ritz values, and the next block Q_{j+1},
    orthogonal to them, goes on (the coupling Q_{j+1}^T C (Q s) = R_j s_j comes back in the next
    projection). Returns (theta descending, V (D x k), {"passes", "restarts", "residual"})."""
    max_basis = int(min(D, max(max_basis, k + 2 * block)))
    Q = np.empty((D, max_basis))
    T = np.zeros((max_basis, max_basis))
    X = _orthonormal_to(Q[:, :0], rng.standard_normal((D, min(block, max_basis))), rng)
    m, passes, restarts, since_check = 0, 0, 0, 0
    while True:
        m1 = m + X.shape[1]
        Q[:, m:m1] = X
        P = apply(X)
        passes += 1
        since_check += 1
        H = Q[:, :m1].T @ P
        P -= Q[:, :m1] @ H
        H2 = Q[:, :m1].T @ P
        P -= Q[:, :m1] @ H2
        T[:m1, m:m1] = H + H2
        nb = min(block, D - m1)
        restart = m1 + nb > max_basis
        # the check (an eigensolve of T, O(m^3)) every pass while the basis is small, then every
        # m / LANCZOS_CHECK passes: its cost stays a small share of a pass over the data
        if m1 < D and not restart and (m1 < k or since_check < max(1, round(m1 / LANCZOS_CHECK))):
            X = _next_block(Q[:, :m1], P, nb, rng)[0]
            m = m1
            continue
        Tm = np.triu(T[:m1, :m1])
        keep = min(max(k + block, (max_basis - nb) // 2), max_basis - nb)  # kept by a restart
        want = min(m1, keep if restart else k)
        theta, S = eigh(Tm + np.triu(Tm, 1).T, subset_by_index=[m1 - want, m1 - 1], driver="evr")
        theta, S = theta[::-1], S[:, ::-1]
        since_check = 0
        if m1 >= D:  # the basis spans the space: the Ritz pairs are exact
            return theta[:k], Q[:, :m1] @ S[:, :k], {"passes": passes, "restarts": restarts, "residual": 0.0}
        X, R = _next_block(Q[:, :m1], P, nb, rng)
        if m1 >= k:
            res = np.linalg.norm(R @ S[m:m1, :k], axis=0)
            scale = np.maximum(np.abs(theta[:k]), np.finfo(float).eps * abs(theta[0]))
            worst = float(np.max(res / scale))
            if worst <= tol:
                info = {"passes": passes, "restarts": restarts, "residual": worst}
                return theta[:k], Q[:, :m1] @ S[:, :k], info
        if restart:  # thick restart
            Q[:, :keep] = Q[:, :m1] @ S[:, :keep]
            T[:] = 0.0
            T[np.arange(keep), np.arange(keep)] = theta[:keep]
            m = keep
            restarts += 1
        else:
            m = m1


def _randomized(blocks, mu, n, D, k, settings):
    """Randomised block Krylov (Musco and Musco 2015, Alg. 2) with implicit centring: the basis
    of [Z_c Omega, (Z_c Z_c^T) Z_c Omega, ..., (Z_c Z_c^T)^q Z_c Omega] (each block orthonormalised
    as it is made), then Rayleigh-Ritz: the SVD of Q^T Z_c. The tall factors (N x l) are gathered
    in this process (N l floats); the passes over the data run on the held blocks."""
    ell = min(k + 10, n, D)
    rng = np.random.default_rng(settings["pca_seed"])

    def times(W):  # Z_c W, N x l
        return blocks.rows(_times, W, mu @ W)

    def t_times(Q):  # Z_c^T Q = Z^T Q - mu (1^T Q), D x l
        return blocks.reduce_rows(_t_times, Q) - np.outer(mu, Q.sum(axis=0))

    W = rng.standard_normal((D, ell))
    Qs = []
    for i in range(settings["pca_iter"] + 1):
        Q, _ = np.linalg.qr(times(W))
        Qs.append(Q)
        if i < settings["pca_iter"]:
            W, _ = np.linalg.qr(t_times(Q))
    K, _ = np.linalg.qr(np.hstack(Qs))
    del Qs
    _, S, Vt = np.linalg.svd(t_times(K).T, full_matrices=False)
    ev = S[:k] ** 2 / (n - 1)
    return ev, Vt[:k].T
