"""Sparse Cholesky and selected inversion for graph-structured precision matrices.

A precision matrix whose nonzero pattern is a graph's adjacency (plus the diagonal), with a dense
Q x Q block per point and per edge, becomes **block tridiagonal** once the points are ordered by
breadth-first-search levels from a pseudo-peripheral point: an edge joins points in the same level
or in adjacent levels (the Cuthill-McKee property). This ordering is the fill-reducing step: the
Cholesky factor of a block-tridiagonal matrix has no fill outside the diagonal and first
sub-diagonal level blocks, so all work is dense BLAS-3 on level blocks (size s_l * Q), costing
sum_l (s_l Q)^3 instead of (N Q)^3.

From the factor we get the log-determinant (twice the sum of log diagonals), solves, and the
**selected inverse**: the diagonal and first sub-diagonal level blocks of the inverse, which contain
every covariance block on the diagonal and on a graph edge (the Takahashi recurrence for a block
bidiagonal factor: with G_l = L_{l+1,l} L_ll^{-1},
Z_{l+1,l} = -Z_{l+1,l+1} G_l and Z_ll = (L_ll L_ll^T)^{-1} + G_l^T Z_{l+1,l+1} G_l).

Shapes: N points, Q size of a point block, E undirected edges (i < j).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, shortest_path

from lvmcore.linalg import NumericalError, jitter_schedule

_potrf = sla.get_lapack_funcs("potrf", dtype=np.float64)
_potri = sla.get_lapack_funcs("potri", dtype=np.float64)
_trtrs = sla.get_lapack_funcs("trtrs", dtype=np.float64)
_syrk = sla.get_blas_funcs("syrk", dtype=np.float64)

__all__ = ["LevelStructure", "level_structure", "BlockTridiagonal"]


def _bfs_levels(W: sp.csr_matrix, source: int) -> np.ndarray:
    d = shortest_path(W, method="D", unweighted=True, directed=False, indices=source)
    return d


def _pseudo_peripheral(W: sp.csr_matrix, start: int = 0, sweeps: int = 4) -> tuple[int, np.ndarray]:
    """A point of (near) maximal eccentricity by repeated BFS (George-Liu), and its BFS levels."""
    src = start
    d = _bfs_levels(W, src)
    if not np.all(np.isfinite(d)):
        raise ValueError("the graph is not connected; a block-tridiagonal ordering needs one component")
    ecc = d.max()
    for _ in range(sweeps):
        far = np.flatnonzero(d == d.max())
        deg = np.diff(W.indptr)[far]
        cand = int(far[np.argmin(deg)])
        dc = _bfs_levels(W, cand)
        if dc.max() <= ecc:
            break
        src, d, ecc = cand, dc, dc.max()
    return src, d


class LevelStructure:
    """BFS level ordering of a connected graph: ``perm`` (new -> old), ``level`` and ``pos`` per
    point, ``ptr`` level boundaries in the new order (length n_levels + 1)."""

    def __init__(self, W):
        W = sp.csr_matrix(W)
        n = W.shape[0]
        _, d = _pseudo_peripheral(W)
        level = d.astype(np.int64)
        # within a level keep BFS discovery order (keeps neighbours close, like Cuthill-McKee)
        order = breadth_first_order(W, int(np.argmin(d)), directed=False, return_predecessors=False)
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)
        perm = np.lexsort((rank, level))
        self.n = n
        self.perm = perm
        self.level = level
        self.pos = np.empty(n, dtype=np.int64)
        self.pos[perm] = np.arange(n)
        counts = np.bincount(level)
        self.ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.n_levels = len(counts)
        self.local = self.pos - self.ptr[level]  # position inside the point's level
        coo = sp.triu(W, k=1).tocoo()
        self.ei, self.ej = coo.row.astype(np.int64), coo.col.astype(np.int64)
        if np.any(np.abs(level[self.ei] - level[self.ej]) > 1):  # cannot happen for BFS levels
            raise RuntimeError("BFS levels violated: an edge spans more than one level")
        # per-level index sets, computed once: points, edges inside the level, edges to the level
        # above (oriented so that r is in this level and c in the previous one)
        ei, ej = self.ei, self.ej
        flip = level[ei] < level[ej]
        self.edge_flip = flip
        r = np.where(flip, ej, ei)
        c = np.where(flip, ei, ej)
        lr, lc = level[r], level[c]
        e_order = np.argsort(lr, kind="stable")
        e_ptr = np.searchsorted(lr[e_order], np.arange(self.n_levels + 1))
        self.level_points, self.level_same, self.level_down = [], [], []
        for lv in range(self.n_levels):
            self.level_points.append(perm[self.ptr[lv] : self.ptr[lv + 1]])
            es = e_order[e_ptr[lv] : e_ptr[lv + 1]]
            self.level_same.append(es[lc[es] == lv])
            self.level_down.append(es[lc[es] == lv - 1])
        self.edge_r, self.edge_c = r, c

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.ptr)


def level_structure(W) -> LevelStructure:
    """BFS level structure of a connected symmetric adjacency W."""
    return LevelStructure(W)


class BlockTridiagonal:
    """A symmetric matrix over N points with Q x Q point blocks, stored as level blocks.

    ``diag[l]``: (s_l Q, s_l Q) dense; ``sub[l]``: (s_{l+1} Q, s_l Q) dense, the block below the
    diagonal. Point i's rows are ``local[i] * Q + (0..Q-1)`` inside its level ``level[i]``.
    """

    def __init__(self, ls: LevelStructure, Q: int):
        self.ls, self.Q = ls, int(Q)
        sz = ls.sizes * self.Q
        self.diag = [np.zeros((s, s)) for s in sz]
        self.sub = [np.zeros((sz[lv + 1], sz[lv])) for lv in range(ls.n_levels - 1)]
        self._factor = None

    # ----------------------------------------------------------------- assembly
    @classmethod
    def assemble(cls, ls: LevelStructure, point_blocks: np.ndarray, edge_blocks: np.ndarray):
        """Matrix with block (i, i) = point_blocks[i] (N, Q, Q) and (i, j) = edge_blocks[e] (E, Q, Q)
        for the structure's edges (i, j) = (ei[e], ej[e]), i < j; block (j, i) is its transpose."""
        Q = point_blocks.shape[-1]
        M = cls(ls, Q)
        loc = ls.local
        r, c = ls.edge_r, ls.edge_c
        # block (r, c) with level(r) >= level(c): edge_blocks[e] or its transpose
        B = np.where(ls.edge_flip[:, None, None], np.swapaxes(edge_blocks, 1, 2), edge_blocks)
        for lv in range(ls.n_levels):
            pts = ls.level_points[lv]
            s = len(pts)
            D = M.diag[lv].reshape(s, Q, s, Q)
            D[loc[pts], :, loc[pts], :] = point_blocks[pts]
            same = ls.level_same[lv]
            if len(same):
                D[loc[r[same]], :, loc[c[same]], :] = B[same]
                D[loc[c[same]], :, loc[r[same]], :] = np.swapaxes(B[same], 1, 2)
            down = ls.level_down[lv]
            if len(down):
                S = M.sub[lv - 1].reshape(s, Q, ls.sizes[lv - 1], Q)
                S[loc[r[down]], :, loc[c[down]], :] = B[down]
        return M

    def combine(self, a: float, other: BlockTridiagonal, b: float) -> BlockTridiagonal:
        """a * self + b * other (same structure), a new unfactored matrix."""
        M = BlockTridiagonal.__new__(BlockTridiagonal)
        M.ls, M.Q, M._factor = self.ls, self.Q, None
        M.diag = [a * x + b * y for x, y in zip(self.diag, other.diag)]
        M.sub = [a * x + b * y for x, y in zip(self.sub, other.sub)]
        return M

    def to_sparse(self) -> sp.csr_matrix:
        """The matrix in the original point order (for error reports and tests)."""
        ls, Q = self.ls, self.Q
        off = np.concatenate([[0], np.cumsum(ls.sizes * Q)])
        blocks = [[None] * ls.n_levels for _ in range(ls.n_levels)]
        for lv in range(ls.n_levels):
            blocks[lv][lv] = sp.csr_matrix(self.diag[lv])
            if lv + 1 < ls.n_levels:
                blocks[lv + 1][lv] = sp.csr_matrix(self.sub[lv])
                blocks[lv][lv + 1] = sp.csr_matrix(self.sub[lv].T)
        A = sp.bmat(blocks, format="csr")
        del off
        idx = (ls.pos[:, None] * Q + np.arange(Q)).ravel()  # old dof -> new dof
        return A[idx][:, idx]

    # ------------------------------------------------------------ factorisation
    def _try_factor(self, shift: float, inplace: bool = False):
        """(diagonal factor blocks, sub-diagonal factor blocks) of self + shift I. ``inplace``: the
        factor overwrites the matrix's blocks (each level block is symmetric and C-ordered, so its
        transpose is the Fortran-ordered array LAPACK factors in place), and the matrix is lost.
        In place the factor reads each block's upper triangle, the copying factor its lower: the
        same numbers where the blocks are exactly symmetric (``combine`` of the graph Laplacians);
        where the caller's point blocks are symmetric only to round-off, the two differ by it."""
        Ld, Ls = [], []
        prev = None
        for lv, D in enumerate(self.diag):
            S = D.T if inplace else D.copy(order="F")
            if shift:
                S[np.diag_indices_from(S)] += shift
            if prev is not None:  # lower triangle of S - prev prev^T (all potrf reads)
                S = _syrk(-1.0, prev, beta=1.0, c=S, lower=1, overwrite_c=1)
            Lkk, info = _potrf(S, lower=1, clean=1, overwrite_a=1)
            if info != 0:
                raise np.linalg.LinAlgError(f"level block {lv} is not positive definite")
            Ld.append(Lkk)
            if lv < len(self.sub):
                # L_{l+1,l} = B_l L_ll^{-T}, i.e. its transpose solves L_ll X = B_l^T
                X, info = _trtrs(Lkk, self.sub[lv].T, lower=1, overwrite_b=int(inplace))
                prev = X.T
                Ls.append(prev)
        return Ld, Ls

    def factor(self, *, name: str = "precision", context: str = "", rebuild=None):
        """Block Cholesky; retried with escalating jitter (lvmcore.linalg's schedule) on failure.

        ``rebuild``: a function that returns this matrix anew. Given it, the factor overwrites the
        matrix's blocks instead of copying them, so the factorisation holds one set of level blocks
        instead of two (at 10^5 points of a 2-D manifold a set is 0.7 GB per point-block entry); a
        retry starts from ``rebuild()``. The matrix is consumed: only the factor's methods (solve,
        logdet, selected inverse) remain."""
        for D in self.diag:
            if not np.all(np.isfinite(D)):
                raise NumericalError(
                    f"{name} has non-finite entries{' at ' + context if context else ''}",
                    name=name,
                    context=context,
                    matrix=self.to_sparse(),
                )
        scale = np.mean([np.mean(np.abs(np.diag(D))) for D in self.diag])
        shifts = jitter_schedule(scale=scale)
        inplace = rebuild is not None and all(D.flags.c_contiguous for D in self.diag)
        for attempt, shift in enumerate(shifts):
            if inplace and attempt:
                fresh = rebuild()
                self.diag, self.sub = fresh.diag, fresh.sub
            try:
                Ld, Ls = self._try_factor(shift, inplace)
            except np.linalg.LinAlgError:
                continue
            self._factor = (Ld, Ls)
            self.jitter_ = shift
            if inplace:  # the blocks now hold the factor
                self.diag = self.sub = None
            return self
        raise NumericalError(
            f"{name} is not positive definite even with jitter {shifts[-1]:.3g}"
            f"{' at ' + context if context else ''}",
            name=name,
            context=context,
            matrix=(rebuild() if inplace else self).to_sparse(),
        )

    def logdet(self) -> float:
        Ld, _ = self._factor
        return float(2.0 * sum(np.sum(np.log(np.diag(L))) for L in Ld))

    def _to_levels(self, b: np.ndarray) -> list[np.ndarray]:
        ls, Q = self.ls, self.Q
        b = b.reshape(ls.n, Q, -1)[ls.perm].reshape(ls.n * Q, -1)
        off = ls.ptr * Q
        return [b[off[lv] : off[lv + 1]] for lv in range(ls.n_levels)]

    def _from_levels(self, parts: list[np.ndarray]) -> np.ndarray:
        ls, Q = self.ls, self.Q
        x = np.concatenate(parts, axis=0).reshape(ls.n, Q, -1)
        return x[ls.pos].reshape(ls.n * Q, -1)

    def solve(self, b: np.ndarray) -> np.ndarray:
        """A^{-1} b for b of shape (N Q,) or (N Q, R) in the original point-major order."""
        Ld, Ls = self._factor
        vec = b.ndim == 1
        parts = self._to_levels(np.asarray(b, dtype=np.float64).reshape(b.shape[0], -1))
        z = []
        for lv, L in enumerate(Ld):  # forward: L z = b
            r = parts[lv] if lv == 0 else parts[lv] - Ls[lv - 1] @ z[lv - 1]
            z.append(sla.solve_triangular(L, r, lower=True, check_finite=False))
        x = [None] * len(Ld)
        for lv in range(len(Ld) - 1, -1, -1):  # backward: L^T x = z
            r = z[lv] if lv == len(Ld) - 1 else z[lv] - Ls[lv].T @ x[lv + 1]
            x[lv] = sla.solve_triangular(Ld[lv], r, lower=True, trans="T", check_finite=False)
        out = self._from_levels(x)
        return out.ravel() if vec else out

    def selected_inverse(self, *, second: bool = False):
        """Diagonal and sub-diagonal level blocks of A^{-1} (a BlockTridiagonal of the inverse).

        ``second``: also the second sub-diagonal blocks ``Z.sub2[l]`` = Z_{l+2,l} (s_{l+2} Q, s_l Q),
        from the same recurrence Z_{jl} = -Z_{j,l+1} G_l (j > l): they hold every pair of points at
        graph distance 2 whose BFS levels differ by 2."""
        nl = len(self._factor[0])
        Z = BlockTridiagonal.__new__(BlockTridiagonal)
        Z.ls, Z.Q, Z._factor = self.ls, self.Q, None
        Z.diag, Z.sub = [None] * nl, [None] * (nl - 1)
        Z.sub2 = [None] * max(nl - 2, 0) if second else None
        for lv, zd, zs, zs2 in self.selected_levels(second=second):
            Z.diag[lv] = zd
            if zs is not None:
                Z.sub[lv] = zs
            if zs2 is not None:
                Z.sub2[lv] = zs2
        return Z

    def selected_levels(self, *, second: bool = False):
        """The selected inverse level by level, from the last level to the first: yields
        (l, Z_ll, Z_{l+1,l}, Z_{l+2,l}), None where level l has no such block (``second`` False: the
        last is always None). The recurrence needs only the previous level's blocks, so a caller
        that takes what it needs from each level holds two levels at a time instead of a copy of
        the factor's size (Takahashi: with G_l = L_{l+1,l} L_ll^{-1}, Z_{l+1,l} = -Z_{l+1,l+1} G_l,
        Z_{l+2,l} = -Z_{l+2,l+1} G_l, Z_ll = (L_ll L_ll^T)^{-1} + G_l^T Z_{l+1,l+1} G_l)."""
        Ld, Ls = self._factor
        nl = len(Ld)

        def inv_llt(L):  # (L L^T)^{-1} from the lower triangle potri fills (L's upper part is 0)
            Zi, _ = _potri(L, lower=1)
            Zi += Zi.T
            Zi[np.diag_indices_from(Zi)] *= 0.5
            return Zi

        zd, zs_above = inv_llt(Ld[nl - 1]), None
        yield nl - 1, zd, None, None
        for lv in range(nl - 2, -1, -1):
            Gt, _ = _trtrs(Ld[lv], Ls[lv].T, lower=1, trans=1)  # G = L_{l+1,l} L_ll^{-1}
            G = Gt.T
            zs = -zd @ G
            zs2 = -zs_above @ G if second and zs_above is not None else None
            Zd = inv_llt(Ld[lv]) - G.T @ zs
            zd = 0.5 * (Zd + Zd.T)
            yield lv, zd, zs, zs2
            zs_above = zs

    # ---------------------------------------------------------------- extraction
    def point_blocks(self) -> np.ndarray:
        """(N, Q, Q) diagonal point blocks in the original order."""
        ls, Q = self.ls, self.Q
        out = np.empty((ls.n, Q, Q))
        for lv in range(ls.n_levels):
            pts = ls.level_points[lv]
            s = len(pts)
            D = self.diag[lv].reshape(s, Q, s, Q)
            out[pts] = D[ls.local[pts], :, ls.local[pts], :]
        return out

    def edge_blocks(self) -> np.ndarray:
        """(E, Q, Q) blocks (ei[e], ej[e]) for the structure's edges."""
        ls, Q = self.ls, self.Q
        loc, r, c = ls.local, ls.edge_r, ls.edge_c
        out = np.empty((len(ls.ei), Q, Q))  # block (r, c) first, transposed where flipped
        for lv in range(ls.n_levels):
            s = ls.sizes[lv]
            D = self.diag[lv].reshape(s, Q, s, Q)
            same = ls.level_same[lv]
            out[same] = D[loc[r[same]], :, loc[c[same]], :]
            down = ls.level_down[lv]
            if len(down):
                S = self.sub[lv - 1].reshape(s, Q, ls.sizes[lv - 1], Q)
                out[down] = S[loc[r[down]], :, loc[c[down]], :]
        flip = ls.edge_flip
        out[flip] = np.swapaxes(out[flip], 1, 2)
        return out
