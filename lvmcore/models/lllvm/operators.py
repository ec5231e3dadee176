"""Graph operators of LL-LVM (paper 000 appendix B): the Laplacian L of the symmetric 0/1 graph eta,
the prior and likelihood precisions built from it, and the variational state containers.

Precisions built from L (eps fixed, a and b scalars):
  x prior   (alpha I + 2 L) kron I_Q                           (eqs. 13-17)
  C prior   beta (eps_c O + 2 L) kron I_Q, one per output row   (eqs. 19-21, U^{-1} = beta I)
  y         Sigma_y^{-1} = (eps_y O + 2 gamma L) kron I_D       (eqs. 25, 29-33)
where O = I (the paper, ``epsilon_form="identity"``) or O = 1 1^T (the authors' code,
``epsilon_form="ones"``: eps only penalises the mean). On the dense solver every one of them is
diagonal in the eigenbasis V of L: eigenvalues o_k + 2 b w_k, with o = eps (identity) or
o = (n eps, 0, ..., 0) (ones, the constant eigenvector first).

e-operators (paper 000 eq. 30, paper 003 eq. 5): e = gamma e~, e~_i = sum_j eta_ij (C_i + C_j)(x_i - x_j).
For one output row c (N, per latent coordinate r) and latent column x_r,
  e~ = sum_r F(c_r) x_r = sum_r G_r(x) c_r,
  F(c) = diag((Dg + W) c) - diag(c) W - W diag(c),  G_r(x) = diag(L x_r) + diag(x_r) W - W diag(x_r),
so the expectations the E-steps and the bound need are sums of Hadamard products of the second
moments K_rs = sum_d <c_dr c_ds'> (q(C)) and S_rs = <x_r x_s'> (q(x)) with Lt = (eps_y O + 2 gamma L)^{-1}
and the sparse W, L (``x_quad``, ``c_quad``, ``e_moment``). 1' e~ = 0 for every x and C, which is why
the ``ones`` form leaves only the pseudo-inverse part of Lt.

Shapes: N points, D observed dims, Q latent dims, E undirected edges (i < j).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from lvmcore.graph import available_memory
from lvmcore.linalg import NumericalError, chol_solve, jitter_cholesky, logdet_from_chol
from lvmcore.sparse_chol import BlockTridiagonal, LevelStructure

from .local import Local, local_structure

LOG2PI = np.log(2.0 * np.pi)
LIKELIHOODS = ("gaussian", "quadratic")
EPSILON_FORMS = ("identity", "ones")
SOLVERS = ("dense", "sparse", "factorised")
_potri = sla.get_lapack_funcs("potri", dtype=np.float64)
#: (a, b) -> (log-det, trace) results kept per graph on the sparse path
_LAP_MEMO_SIZE = 8
#: Lt factorisations kept per graph on the factorised path (one per gamma visited by the gamma search)
_LT_MEMO = 3
#: level-block matrices a sparse or factorised fit holds at least: I and 2 L as assembled, and one
#: factor of their combination eps I + 2 b L (the memoised factors and selected inverses come on top)
LEVEL_COPIES_MIN = 3


# --------------------------------------------------------------------------- containers
@dataclass
class LLGraph:
    """Graph quantities shared by every update. ``ei, ej``: undirected edges i < j (E,);
    ``deg``: degrees (N,); ``inc``: (N, E) incidence; ``omega``, ``eigvec``: eigen-decomposition of L
    (dense solver); ``ls``, ``lap_eye``, ``lap_2L``: level structure and I, 2L in level-block form
    (sparse and factorised solvers); ``lap_memo``: (a, b) -> (log|aI + 2bL|, tr inverse) on the level
    path; ``local``: closed neighbourhoods and the distance-2 pattern (factorised solver)."""

    W: sp.csr_matrix
    ei: np.ndarray
    ej: np.ndarray
    deg: np.ndarray
    inc: sp.csr_matrix
    solver: str
    likelihood: str = "gaussian"
    epsilon_form: str = "identity"
    omega: np.ndarray | None = None
    eigvec: np.ndarray | None = None
    ls: LevelStructure | None = None
    lap_eye: BlockTridiagonal | None = None
    lap_2L: BlockTridiagonal | None = None
    chunks: int | None = None
    #: the Dask client the chunked edge sums run on (passed by the caller); None: local threads
    client: object = field(default=None, compare=False, repr=False)
    lap_memo: dict = field(default_factory=dict)
    local: Local | None = None

    @property
    def n(self) -> int:
        return self.W.shape[0]

    def offset(self, eps: float) -> np.ndarray:
        """Eigenvalues of eps O in the eigenbasis of L (dense solver): eps (identity) or
        (n eps, 0, ...) (ones; the constant eigenvector is first)."""
        if self.epsilon_form == "identity":
            return np.full(self.n, float(eps))
        o = np.zeros(self.n)
        o[0] = self.n * float(eps)
        return o

    def laplacian(self) -> np.ndarray:
        return np.diag(self.deg) - self.W.toarray()

    def eps_matrix(self, eps: float) -> np.ndarray:
        """eps O as a dense (N, N) matrix."""
        if self.epsilon_form == "identity":
            return float(eps) * np.eye(self.n)
        return np.full((self.n, self.n), float(eps))


@dataclass
class QX:
    """q(x): ``mean`` (N, Q); ``cov`` (N, Q, Q) = Sigma_x^(ii); ``cov_edge`` (E, Q, Q) = Sigma_x^(ij)
    for (ei, ej); ``logdet_prec`` = log|Sigma_x^{-1}|; ``full``: the (N Q, N Q) Sigma_x (dense solver);
    ``alpha``: the x prior's precision this q(x) was computed with (full-covariance solvers)."""

    mean: np.ndarray
    cov: np.ndarray
    cov_edge: np.ndarray
    logdet_prec: float
    full: np.ndarray | None = None
    alpha: float | None = None


@dataclass
class QC:
    """q(C) = MN(mu_C, I_D, Sigma_C): ``mean`` (N, D, Q) = <C_i>; ``cov`` (N, Q, Q), ``cov_edge``
    (E, Q, Q): blocks of the row covariance Sigma_C; ``logdet_prec`` = log|Sigma_C^{-1}| (one row);
    ``full``: the (N Q, N Q) Sigma_C (dense solver)."""

    mean: np.ndarray
    cov: np.ndarray
    cov_edge: np.ndarray
    logdet_prec: float
    full: np.ndarray | None = None


@dataclass
class Theta:
    alpha: float
    beta: float
    gamma: float
    eps_c: float
    eps_y: float


def prepare_graph(
    W,
    solver: str,
    chunks: int | None = None,
    likelihood: str = "gaussian",
    epsilon_form: str = "identity",
    client=None,
    memory_bytes: int | None = None,
) -> LLGraph:
    """Shared graph quantities for a symmetric 0/1 adjacency W and solver 'dense' | 'sparse' |
    'factorised' (the paper's likelihood with per-point factorised q, ``local.py``);
    ``chunks`` (points per chunk) runs the per-point edge sums of the quadratic variant as Dask tasks,
    on ``client``'s cluster where one is given. ``memory_bytes``: what the fit may use
    (``check_level_memory``; default the memory available)."""
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
    if epsilon_form not in EPSILON_FORMS:
        raise ValueError(f"epsilon_form must be one of {EPSILON_FORMS}, got {epsilon_form!r}")
    if likelihood == "quadratic" and epsilon_form != "identity":
        raise ValueError(
            "likelihood='quadratic' is defined with epsilon_form='identity' only (paper 000 eq. 24)"
        )
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if solver == "factorised" and (likelihood != "gaussian" or epsilon_form != "identity"):
        raise ValueError(
            f"solver='factorised' fits the paper's model (likelihood='gaussian', epsilon_form='identity') "
            f"only, got likelihood={likelihood!r}, epsilon_form={epsilon_form!r}: eps 1 1^T is dense and "
            "not a sparse factorisation; use solver='dense' for it (or solver='sparse' for 'quadratic')"
        )
    if solver == "sparse" and (likelihood == "gaussian" or epsilon_form == "ones"):
        raise ValueError(
            f"likelihood={likelihood!r}, epsilon_form={epsilon_form!r} couples every pair of points "
            "through (eps_y O + 2 gamma L)^{-1}: its full-covariance precisions are dense, so it needs "
            "solver='dense' (exact) or solver='factorised' (per-point factorised q, gaussian/identity)"
        )
    W = sp.csr_matrix(W, dtype=np.float64)
    n = W.shape[0]
    coo = sp.triu(W, k=1).tocoo()
    ei, ej = coo.row.astype(np.int64), coo.col.astype(np.int64)
    E = len(ei)
    inc = sp.csr_matrix((np.ones(2 * E), (np.concatenate([ei, ej]), np.tile(np.arange(E), 2))), shape=(n, E))
    deg = np.asarray(W.sum(axis=1)).ravel()
    g = LLGraph(
        W=W,
        ei=ei,
        ej=ej,
        deg=deg,
        inc=inc,
        solver=solver,
        chunks=chunks,
        client=client,
        likelihood=likelihood,
        epsilon_form=epsilon_form,
    )
    if solver == "dense":
        om, V = np.linalg.eigh(np.diag(deg) - W.toarray())
        om = np.clip(om, 0.0, None)
        om[0] = 0.0  # connected graph: one zero eigenvalue, the constant vector
        V[:, 0] = np.sign(V[:, 0].sum()) / np.sqrt(n)
        g.omega, g.eigvec = om, V
    else:
        g.ls = LevelStructure(W)
        check_level_memory(g.ls, solver, memory_bytes)
        if not (np.array_equal(g.ls.ei, ei) and np.array_equal(g.ls.ej, ej)):
            raise RuntimeError("edge order of the level structure differs from the graph's")
        g.lap_eye = BlockTridiagonal.assemble(g.ls, np.ones((n, 1, 1)), np.zeros((E, 1, 1)))
        g.lap_2L = BlockTridiagonal.assemble(g.ls, 2.0 * deg[:, None, None], np.full((E, 1, 1), -2.0))
        if solver == "factorised":
            g.local = local_structure(W, deg, ei, ej, g.ls)
    return g


def level_bytes(ls: LevelStructure) -> int:
    """Bytes of one level-block matrix on ``ls`` with 1 x 1 point blocks (a Laplacian's): its
    diagonal and sub-diagonal level blocks, dense."""
    s = ls.sizes.astype(np.int64)
    return int(8 * (np.sum(s * s) + np.sum(s[1:] * s[:-1])))


def check_level_memory(ls: LevelStructure, solver: str, budget: int | None = None) -> None:
    """Refuse, before any block is assembled, a graph whose breadth-first levels are so wide that
    the level-block matrices (``LEVEL_COPIES_MIN`` of ``level_bytes``) exceed ``budget`` (default:
    what the system has available; a caller inside a Dask worker passes its memory limit). A
    manifold's kNN graph has levels of about N^(1 - 1/d)
    points; an expander-like one (data of high intrinsic dimension: an atlas's PCA) a few levels
    of thousands, where the blocks grow like N^2."""
    need = LEVEL_COPIES_MIN * level_bytes(ls)
    budget = available_memory() if budget is None else int(budget)
    if need > budget:
        s = ls.sizes
        raise ValueError(
            f"solver={solver!r}: the neighbour graph's breadth-first levels are up to {int(s.max()):,} of "
            f"its {ls.n:,} points wide ({ls.n_levels} levels; an expander-like graph, as data of high "
            f"intrinsic dimension give), so the fit's level blocks need at least {need / 1e9:.1f} GB, "
            f"above the {budget / 1e9:.1f} GB available; fit fewer points or fewer neighbours "
            "(n_neighbors), or a model whose cost does not follow the graph's levels (the GP-LVMs)"
        )


# --------------------------------------------------------------------------- Laplacian functions
def lap_logdet_trace(g: LLGraph, a: float, b: float, *, trace: bool = True):
    """log|a I + 2 b L| and (if ``trace``) tr((a I + 2 b L)^{-1}), else None. Dense: eigenvalues;
    sparse: level-block Cholesky with selected inversion (memoised per (a, b))."""
    if g.solver == "dense":
        lam = a + 2.0 * b * g.omega
        return float(np.sum(np.log(lam))), (float(np.sum(1.0 / lam)) if trace else None)
    hit = g.lap_memo.get((a, b))
    if hit is not None and (hit[1] is not None or not trace):
        return hit[0], (hit[1] if trace else None)
    M = g.lap_eye.combine(a, g.lap_2L, b).factor(
        name="a I + 2 b L", rebuild=lambda: g.lap_eye.combine(a, g.lap_2L, b)
    )
    tr = float(np.sum(M.selected_inverse().point_blocks())) if trace else None
    if len(g.lap_memo) >= _LAP_MEMO_SIZE:
        g.lap_memo.pop(next(iter(g.lap_memo)))
    g.lap_memo[(a, b)] = (M.logdet(), tr)
    return g.lap_memo[(a, b)]


def eps_lap_logdet(g: LLGraph, eps: float, b: float) -> float:
    """log|eps O + 2 b L| for either epsilon form (the C prior with b = 1, Sigma_y^{-1} with b = gamma)."""
    if g.epsilon_form == "identity":
        return lap_logdet_trace(g, eps, b, trace=False)[0]
    return float(np.sum(np.log(g.offset(eps) + 2.0 * b * g.omega)))


def eps_lap_inverse(g: LLGraph, eps: float, b: float) -> np.ndarray:
    """Lt = (eps O + 2 b L)^{-1} (dense, from the eigen-decomposition of L)."""
    V = g.eigvec
    return (V / (g.offset(eps) + 2.0 * b * g.omega)) @ V.T


def eps_lap_matrix(g: LLGraph, eps: float) -> np.ndarray:
    """eps O + 2 L as a dense (N, N) matrix (the C prior's graph precision)."""
    return g.eps_matrix(eps) + 2.0 * g.laplacian()


@dataclass
class LtAt:
    """eps_y I + 2 gamma L factorised: ``solve``, ``logdet`` and ``vals``, Lt on the pattern entries."""

    gamma: float
    M: BlockTridiagonal
    logdet: float
    vals: np.ndarray

    def solve(self, b: np.ndarray) -> np.ndarray:
        return self.M.solve(b)


def lt_at(g: LLGraph, eps: float, gamma: float) -> LtAt:
    """Factorise eps I + 2 gamma L on the BFS levels and select Lt on every distance-<=2 pair."""
    loc = g.local
    hit = loc.memo.get((eps, gamma))
    if hit is not None:
        return hit
    if len(loc.memo) >= _LT_MEMO:  # before the new factor: one factor fewer held at once
        loc.memo.pop(next(iter(loc.memo)))
    M = g.lap_eye.combine(eps, g.lap_2L, gamma).factor(
        name="eps_y I + 2 gamma L", rebuild=lambda: g.lap_eye.combine(eps, g.lap_2L, gamma)
    )
    vals = np.empty(len(loc.pr))
    for lv, *blocks in M.selected_levels(second=True):  # level by level: no whole inverse held
        for diff, part, la_loc, lb_loc in loc.slices.get(lv, ()):
            vals[part] = blocks[diff][la_loc, lb_loc]
    out = LtAt(gamma=gamma, M=M, logdet=M.logdet(), vals=vals)
    loc.memo[(eps, gamma)] = out
    return out


# --------------------------------------------------------------------------- Gaussian moments
def inverse_from_chol(Lc: np.ndarray, name: str, context: str) -> np.ndarray:
    """A^{-1} from the lower Cholesky factor of A (LAPACK potri). The full covariance is a model
    quantity here (every expectation of the dense model contracts it), not a solve."""
    Z, info = _potri(Lc, lower=1)
    if info != 0:
        raise NumericalError(f"inverting {name} failed (potri info {info})", name=name, context=context)
    Z = np.tril(Z)  # potri fills the lower triangle only
    d = Z.diagonal().copy()
    Z += Z.T
    Z[np.diag_indices_from(Z)] = d
    return Z


def block_gaussian(g: LLGraph, point_blocks, edge_blocks, rhs, name: str, context: str):
    """Moments of N(P^{-1} rhs, P^{-1}) for the block-sparse precision P given by its point and edge
    blocks: mean (N Q, R), covariance point blocks (N, Q, Q), edge blocks (E, Q, Q), log|P|."""
    n, Q = point_blocks.shape[0], point_blocks.shape[-1]
    if g.solver == "dense":
        P = np.zeros((n, Q, n, Q))
        idx = np.arange(n)
        P[idx, :, idx, :] = point_blocks
        P[g.ei, :, g.ej, :] = edge_blocks
        P[g.ej, :, g.ei, :] = np.swapaxes(edge_blocks, 1, 2)
        P = P.reshape(n * Q, n * Q)
        Lc = jitter_cholesky(P, name=name, context=context)
        S = inverse_from_chol(Lc, name, context).reshape(n, Q, n, Q)
        mean = chol_solve(Lc, rhs)
        return mean, S[idx, :, idx, :], S[g.ei, :, g.ej, :], float(logdet_from_chol(Lc))
    M = BlockTridiagonal.assemble(g.ls, point_blocks, edge_blocks)
    M.factor(
        name=name, context=context, rebuild=lambda: BlockTridiagonal.assemble(g.ls, point_blocks, edge_blocks)
    )
    mean = M.solve(rhs)
    Z = M.selected_inverse()
    return mean, Z.point_blocks(), Z.edge_blocks(), M.logdet()


def dense_gaussian(g: LLGraph, P: np.ndarray, rhs, name: str, context: str):
    """mean, full covariance, its point and edge blocks and log|P| for a dense precision P."""
    n = g.n
    Q = P.shape[0] // n
    P = 0.5 * (P + P.T)
    Lc = jitter_cholesky(P, name=name, context=context)
    Sfull = inverse_from_chol(Lc, name, context)
    mean = chol_solve(Lc, rhs)
    S4 = Sfull.reshape(n, Q, n, Q)
    idx = np.arange(n)
    return mean, Sfull, S4[idx, :, idx, :], S4[g.ei, :, g.ej, :], float(logdet_from_chol(Lc))


def second_moment_c(qc: QC) -> np.ndarray:
    """K = D Sigma_C + mu_C' mu_C (N Q, N Q), point-major."""
    n, D, Q = qc.mean.shape
    Mu = np.swapaxes(qc.mean, 0, 1).reshape(D, n * Q)
    return D * qc.full + Mu.T @ Mu


def second_moment_x(qx: QX) -> np.ndarray:
    """S = Sigma_x + mu_x mu_x' (N Q, N Q), point-major."""
    m = qx.mean.ravel()
    return qx.full + np.outer(m, m)


def ctc(qc: QC) -> np.ndarray:
    """<C_i^T C_i> (N, Q, Q) = D Sigma_C^(ii) + <C_i>^T <C_i>."""
    D = qc.mean.shape[1]
    return D * qc.cov + np.einsum("ndq,ndr->nqr", qc.mean, qc.mean)


# --------------------------------------------------------------------------- e-operators
def _rmul(X, A):
    """X @ A for dense X and sparse A (as a dense array)."""
    return np.asarray((A.T @ X.T).T)


def _split(M, Q, r, s):
    return M[r::Q, s::Q]


def _symmetric_blocks(n: int, Q: int, block) -> np.ndarray:
    """The symmetric (n Q, n Q) point-major matrix whose (r, s) component block is ``block(r, s)``."""
    out = np.empty((n * Q, n * Q))
    for r in range(Q):
        for s in range(r, Q):
            A = block(r, s)
            out[r::Q, s::Q] = A
            if s != r:
                out[s::Q, r::Q] = A.T
    return out


def x_quad(g: LLGraph, K: np.ndarray, Lt: np.ndarray) -> np.ndarray:
    """sum_d <F(c_dr)' Lt F(c_ds)> over q(C) as the (N Q, N Q) matrix, for K = D Sigma_C + mu_C' mu_C."""
    n, Q = g.n, K.shape[0] // g.n
    W = g.W
    U = sp.diags(g.deg) + W
    LW = _rmul(Lt, W)
    WL, WLW = LW.T, np.asarray(W @ LW)

    def block(r, s):
        Kr = _split(K, Q, r, s)
        UK = np.asarray(U @ Kr)
        KU = _rmul(Kr, U)
        return (
            Lt * _rmul(UK, U)
            - _rmul(Lt * UK, W)
            - LW * UK
            - WL * KU
            + _rmul(WL * Kr, W)
            + WLW * Kr
            - np.asarray(W @ (Lt * KU))
            + _rmul(np.asarray(W @ (Lt * Kr)), W)
            + np.asarray(W @ (LW * Kr))
        )

    return _symmetric_blocks(n, Q, block)


def c_quad(g: LLGraph, S: np.ndarray, Lt: np.ndarray) -> np.ndarray:
    """<G_r(x)' Lt G_s(x)> over q(x) as the (N Q, N Q) matrix, for S = Sigma_x + mu_x mu_x'."""
    n, Q = g.n, S.shape[0] // g.n
    W = g.W
    Lsp = sp.diags(g.deg) - W
    LW = _rmul(Lt, W)
    WL, WLW = LW.T, np.asarray(W @ LW)

    def block(r, s):
        Sr = _split(S, Q, r, s)
        LS = np.asarray(Lsp @ Sr)
        SL = _rmul(Sr, Lsp)
        return (
            Lt * _rmul(LS, Lsp)
            + _rmul(Lt * LS, W)
            - LW * LS
            + np.asarray(W @ (Lt * SL))
            + _rmul(np.asarray(W @ (Lt * Sr)), W)
            - np.asarray(W @ (LW * Sr))
            - WL * SL
            - _rmul(WL * Sr, W)
            + WLW * Sr
        )

    return _symmetric_blocks(n, Q, block)


def e_moment(g: LLGraph, K: np.ndarray, S: np.ndarray) -> np.ndarray:
    """R = sum_d <e~_d e~_d'> (N, N) under q(x) q(C) (independent factors)."""
    n, Q = g.n, S.shape[0] // g.n
    W = g.W
    U = sp.diags(g.deg) + W
    R = np.zeros((n, n))
    for r in range(Q):
        for s in range(r, Q):  # the (s, r) term is the transpose of the (r, s) term
            Kr, Sr = _split(K, Q, r, s), _split(S, Q, r, s)
            UK = np.asarray(U @ Kr)
            KU = _rmul(Kr, U)
            SW = _rmul(Sr, W)
            WS = np.asarray(W @ Sr)
            T = (
                _rmul(UK, U) * Sr
                - UK * SW
                - _rmul(UK * Sr, W)
                - KU * WS
                + Kr * _rmul(WS, W)
                + _rmul(Kr * WS, W)
                - np.asarray(W @ (KU * Sr))
                + np.asarray(W @ (Kr * SW))
                + _rmul(np.asarray(W @ (Kr * Sr)), W)
            )
            R += T if s == r else T + T.T
    return R


# --------------------------------------------------------------------------- e~ and its adjoints (factorised)
def etilde(g: LLGraph, C: np.ndarray, x: np.ndarray) -> np.ndarray:
    """e~ (N, D): e~_i = sum_j eta_ij (C_i + C_j)(x_i - x_j) (eq. 30 without gamma)."""
    i, j = g.ei, g.ej
    v = np.einsum("edq,eq->ed", C[i] + C[j], x[i] - x[j])
    return np.asarray(g.local.sinc @ v)


def etilde_adj_x(g: LLGraph, C: np.ndarray, z: np.ndarray) -> np.ndarray:
    """A(C)' z (N, Q) for z (N, D): the gradient of sum(z * e~(C, x)) in x."""
    i, j = g.ei, g.ej
    w = np.einsum("edq,ed->eq", C[i] + C[j], z[i] - z[j])
    return np.asarray(g.local.sinc @ w)


def etilde_adj_c(g: LLGraph, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """G(x)' z (N, D, Q) for z (N, D): the gradient of sum(z * e~(C, x)) in C."""
    i, j = g.ei, g.ej
    E = len(i)
    h = np.einsum("ed,eq->edq", z[i] - z[j], x[i] - x[j]).reshape(E, -1)
    return np.asarray(g.inc @ h).reshape((g.n,) + z.shape[1:] + x.shape[1:])


# --------------------------------------------------------------------------- edge sums
def scatter(n, ei, ej, vi, vj):
    out = np.zeros((n,) + vi.shape[1:])
    np.add.at(out, ei, vi)
    np.add.at(out, ej, vj)
    return out


def edge_reduce(g: LLGraph, fn, *args):
    """sum over edge chunks of fn(*args, slice) (a tuple of arrays). ``g.chunks`` None: one call in
    process; else one task per chunk of points through lvmcore.chunks.map_chunks, the row-chunk
    engine the GLLE and psi computations use (edges are sorted by their first point)."""
    from lvmcore.chunks import map_chunks  # imports jax (seconds): only the chunked quadratic path needs it

    E = len(g.ei)
    if g.chunks is None or g.chunks >= g.n:
        return fn(*args, slice(0, E))
    starts = np.searchsorted(g.ei, np.arange(0, g.n, int(g.chunks)))
    ends = np.append(starts[1:], E)
    parts = map_chunks(fn, [(int(a), int(b)) for a, b in zip(starts, ends)], client=g.client, shared=args)
    return tuple(np.sum([p[t] for p in parts], axis=0) for t in range(len(parts[0])))


def b_tilde(Y, g: LLGraph, Cmean) -> np.ndarray:
    """<b> / gamma (N, Q): b_i = gamma sum_j eta_ij <C_i + C_j>'(y_i - y_j), the x-linear term y'e."""
    i, j = g.ei, g.ej
    v = np.einsum("edq,ed->eq", Cmean[i] + Cmean[j], Y[i] - Y[j])
    return scatter(g.n, i, j, v, -v)


def h_stat(Y, g: LLGraph, xmean) -> np.ndarray:
    """<H_i> (N, D, Q) = sum_j eta_ij (y_j - y_i)(<x_j> - <x_i>)', the C-linear term y'e / gamma."""
    i, j = g.ei, g.ej
    h = np.einsum("ed,eq->edq", Y[j] - Y[i], xmean[j] - xmean[i])
    return scatter(g.n, i, j, h, h)


def lap_quad_blocks(g: LLGraph, cov, cov_edge) -> float:
    """tr((L kron I) Sigma) from the diagonal and edge covariance blocks."""
    tr_pt = np.trace(cov, axis1=1, axis2=2)
    return float(np.sum(g.deg * tr_pt) - 2.0 * np.sum(np.trace(cov_edge, axis1=1, axis2=2)))


def lap_quad_mean(g: LLGraph, m) -> float:
    """tr(m^T (L kron I) m) for per-point rows m (N, ...) = sum_edges |m_i - m_j|^2."""
    d = m[g.ei] - m[g.ej]
    return float(np.sum(d * d))


def c_prior_quad(g: LLGraph, qc: QC, eps_c: float) -> tuple[float, float]:
    """(tr((eps_c O + 2 L) kron I Sigma_C), sum_d mu_C,d' ((eps_c O + 2 L) kron I) mu_C,d): the two
    traces of the C prior that the bound and the beta update need (beta excluded)."""
    tr_cov = eps_c * float(np.sum(np.trace(qc.cov, axis1=1, axis2=2))) + 2.0 * lap_quad_blocks(
        g, qc.cov, qc.cov_edge
    )
    tr_mean = eps_c * float(np.sum(qc.mean**2)) + 2.0 * lap_quad_mean(g, qc.mean)
    if g.epsilon_form == "ones":  # eps 1 1^T in place of eps I: the sums over all pairs of points
        n, D, Q = qc.mean.shape
        F4 = qc.full.reshape(n, Q, n, Q)
        tr_cov += eps_c * float(np.einsum("iqjq->", F4) - np.sum(np.trace(qc.cov, axis1=1, axis2=2)))
        tr_mean += eps_c * float(np.sum(qc.mean.sum(axis=0) ** 2) - np.sum(qc.mean**2))
    return tr_cov, tr_mean
