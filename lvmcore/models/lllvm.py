"""LL-LVM: the locally linear latent variable model (paper 000, appendices B and C) fitted by
variational EM with learned (or fixed) alpha, beta and learned gamma.

Model (N points y_i in R^D, latent x_i in R^Q, local maps C_i in R^{D x Q}, symmetric 0/1 graph
eta with Laplacian L):

* prior on x: N(0, ((alpha I + 2 L) kron I_Q)^{-1})  (eqs. 13-17)
* prior on C: each of the D rows of C = [C_1 .. C_N] is N(0, (beta (eps_c I + 2 L kron I_Q))^{-1})
  (eqs. 19-21 with U^{-1} = beta I)
* likelihood (eq. 23 with V^{-1} = gamma I), with the paper's normaliser (eq. 31/73):
  log p(y | x, C) = -eps_y/2 sum_i |y_i|^2 - gamma/2 S(x, C) - N D/2 log 2 pi
                    + D/2 log|eps_y I + 2 gamma L|,
  S = sum_i sum_j eta_ij |(y_j - y_i) - C_i (x_j - x_i)|^2.
  (As in the paper this is the quadratic form of eq. 24 with f of eq. 28, not e' Sigma_y e; it is
  what makes the E-steps of eqs. 50-57 and 64-71 exact coordinate ascent of the bound. This
  density is not normalised in y: it integrates to exp(-(f - e' Sigma_y e) / 2) < 1, a deficit
  that depends on x, C and the graph.)
* ``likelihood="gaussian"``: the normalised N(y | Sigma_y e, Sigma_y), Sigma_y^{-1} =
  (eps_y I + 2 gamma L) kron I_D, e_i = gamma sum_j eta_ij (C_i + C_j)(x_i - x_j) (paper 003 eq. 5,
  and what the authors' code computes): the quadratic forms in x and in C become
  gamma^2 <e~' (Lt kron I) e~> with the dense Lt = (eps_y I + 2 gamma L)^{-1}, so q(x) and q(C) have
  dense precisions (dense solver only); see the "gaussian likelihood" section below.

Variational posterior q(x) q(C), q(x) = N(mu_x, Sigma_x), q(C) = MN(mu_C, I_D, Sigma_C) (every
row of C shares the covariance Sigma_C, so <C_i^T C_i> = D Sigma_C^(ii) + <C_i>^T <C_i>; the paper's
eq. 57 drops the factor D).

The bound F (computed every iteration) is
  F = <log p(y | x, C)> - KL(q(x) || p(x)) - KL(q(C) || p(C)),
and every update below maximises F exactly in its argument, so F never decreases.
M-step: beta in closed form; alpha and gamma by 1-D root finding of dF/dtheta, which needs
log|a I + 2 b L| and tr((a I + 2 b L)^{-1}): from the eigenvalues of L (dense solver) or from a
sparse Cholesky with selected inversion (sparse solver, no eigendecomposition).

Shapes: N points, D observed dims, Q latent dims, E undirected edges (i < j), M new points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
from scipy.optimize import brentq

from lvmcore.checks import check_data as _check_Y
from lvmcore.linalg import NumericalError, chol_solve, jitter_cholesky, logdet_from_chol
from lvmcore.sparse_chol import BlockTridiagonal, LevelStructure

__all__ = [
    "LLLVM",
    "LLGraph",
    "QX",
    "QC",
    "Theta",
    "prepare_graph",
    "update_qx",
    "update_qc",
    "expected_S",
    "update_alpha",
    "update_beta",
    "update_gamma",
    "elbo",
    "lllvm_fit",
    "transform_points",
    "reconstruct",
]

LOG2PI = np.log(2.0 * np.pi)
_potri = sla.get_lapack_funcs("potri", dtype=np.float64)
#: problems with N <= this many points use the dense solver under solver="auto"
AUTO_DENSE_MAX_N = 200
_LIKELIHOODS = ("quadratic", "gaussian")
#: relative tolerance of the 1-D root finding for alpha and gamma
ROOT_RTOL = 1e-10
#: evaluations of the alpha and gamma M-step equations (secant steps in log space, each a
#: factorisation on the sparse path) before falling back to Brent's method
ROOT_MAX_EVALS = 30
#: coordinate-ascent sweeps of the out-of-sample E-step for (x*, C*)
OOS_SWEEPS = 50


# --------------------------------------------------------------------------- containers
@dataclass
class LLGraph:
    """Graph quantities shared by every update. ``ei, ej``: undirected edges i < j (E,);
    ``deg``: degrees (N,); ``inc``: (N, E) incidence with ones at (ei, e) and (ej, e);
    ``omega``: eigenvalues of L (dense solver) or None; ``ls``: level structure (sparse solver)."""

    W: sp.csr_matrix
    ei: np.ndarray
    ej: np.ndarray
    deg: np.ndarray
    inc: sp.csr_matrix
    solver: str
    omega: np.ndarray | None = None
    ls: LevelStructure | None = None
    lap_eye: BlockTridiagonal | None = None  # sparse solver: I and 2 L in level-block form
    lap_2L: BlockTridiagonal | None = None
    chunks: int | None = None  # points per chunk of the edge sums (None: in process)
    likelihood: str = "quadratic"  # "quadratic" (paper 000 eqs. 42-71) or "gaussian" (paper 003 eq. 5)
    eigvec: np.ndarray | None = None  # eigenvectors of L (dense solver, gaussian likelihood)

    @property
    def n(self) -> int:
        return self.W.shape[0]


@dataclass
class QX:
    """q(x): ``mean`` (N, Q); ``cov`` (N, Q, Q) = Sigma_x^(ii); ``cov_edge`` (E, Q, Q) = Sigma_x^(ij)
    for (ei, ej); ``logdet_prec`` = log|Sigma_x^{-1}|; ``full``: the whole (N Q, N Q) Sigma_x, kept by
    the gaussian likelihood."""

    mean: np.ndarray
    cov: np.ndarray
    cov_edge: np.ndarray
    logdet_prec: float
    full: np.ndarray | None = None


@dataclass
class QC:
    """q(C): ``mean`` (N, D, Q) = <C_i>; ``cov`` (N, Q, Q) and ``cov_edge`` (E, Q, Q): blocks of the
    row covariance Sigma_C; ``logdet_prec`` = log|Sigma_C^{-1}| (one row); ``full``: the whole
    (N Q, N Q) row covariance, kept by the gaussian likelihood."""

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


def prepare_graph(W, solver: str, chunks: int | None = None, likelihood: str = "quadratic") -> LLGraph:
    """Shared graph quantities for a symmetric 0/1 adjacency W and solver 'dense' | 'sparse'; ``chunks``
    (points per chunk) runs the per-point edge sums as Dask tasks. ``likelihood="gaussian"`` needs
    the dense solver (its precisions are dense)."""
    if likelihood not in _LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {_LIKELIHOODS}, got {likelihood!r}")
    if likelihood == "gaussian" and solver != "dense":
        raise ValueError(
            "likelihood='gaussian' couples every pair of points through (eps_y I + 2 gamma L)^{-1}: its "
            "precisions are dense, so it needs solver='dense'"
        )
    W = sp.csr_matrix(W, dtype=np.float64)
    n = W.shape[0]
    coo = sp.triu(W, k=1).tocoo()
    ei, ej = coo.row.astype(np.int64), coo.col.astype(np.int64)
    E = len(ei)
    inc = sp.csr_matrix((np.ones(2 * E), (np.concatenate([ei, ej]), np.tile(np.arange(E), 2))), shape=(n, E))
    deg = np.asarray(W.sum(axis=1)).ravel()
    g = LLGraph(W=W, ei=ei, ej=ej, deg=deg, inc=inc, solver=solver, chunks=chunks, likelihood=likelihood)
    if solver == "dense":
        L = np.diag(deg) - W.toarray()
        if likelihood == "gaussian":
            om, g.eigvec = np.linalg.eigh(L)
            g.omega = np.clip(om, 0.0, None)
        else:
            g.omega = np.clip(np.linalg.eigvalsh(L), 0.0, None)
    else:
        g.ls = LevelStructure(W)
        if not (np.array_equal(g.ls.ei, ei) and np.array_equal(g.ls.ej, ej)):
            raise RuntimeError("edge order of the level structure differs from the graph's")
        g.lap_eye = BlockTridiagonal.assemble(g.ls, np.ones((n, 1, 1)), np.zeros((E, 1, 1)))
        g.lap_2L = BlockTridiagonal.assemble(g.ls, 2.0 * deg[:, None, None], np.full((E, 1, 1), -2.0))
    return g


# --------------------------------------------------------------------------- Gaussian solves
def _inverse_from_chol(Lc: np.ndarray, name: str, context: str) -> np.ndarray:
    """A^{-1} from the lower Cholesky factor of A (LAPACK potri: about a third of the flops of
    solving against the identity)."""
    Z, info = _potri(Lc, lower=1)
    if info != 0:
        raise NumericalError(f"inverting {name} failed (potri info {info})", name=name, context=context)
    return np.tril(Z) + np.tril(Z, -1).T


def _gaussian(g: LLGraph, point_blocks, edge_blocks, rhs, name: str, context: str):
    """Moments of N(P^{-1} rhs, P^{-1}) for the block-sparse precision P given by its point and edge
    blocks. Returns mean (N Q, R), covariance point blocks (N, Q, Q), edge blocks (E, Q, Q),
    log|P|."""
    n, Q = point_blocks.shape[0], point_blocks.shape[-1]
    if g.solver == "dense":
        P = np.zeros((n, Q, n, Q))
        idx = np.arange(n)
        P[idx, :, idx, :] = point_blocks
        P[g.ei, :, g.ej, :] = edge_blocks
        P[g.ej, :, g.ei, :] = np.swapaxes(edge_blocks, 1, 2)
        P = P.reshape(n * Q, n * Q)
        Lc = jitter_cholesky(P, name=name, context=context)
        S = _inverse_from_chol(Lc, name, context).reshape(n, Q, n, Q)
        mean = chol_solve(Lc, rhs)
        return mean, S[idx, :, idx, :], S[g.ei, :, g.ej, :], float(logdet_from_chol(Lc))
    M = BlockTridiagonal.assemble(g.ls, point_blocks, edge_blocks)
    M.factor(name=name, context=context)
    mean = M.solve(rhs)
    Z = M.selected_inverse()
    return mean, Z.point_blocks(), Z.edge_blocks(), M.logdet()


#: (a, b) -> (log-det, trace) results kept per graph on the sparse path: the M-step's last
#: evaluation is usually at the returned alpha (gamma), so the bound's log-det costs nothing
_LAP_MEMO_SIZE = 8


def _lap(g: LLGraph, a: float, b: float, *, trace: bool = True):
    """log|a I + 2 b L| and (if ``trace``) tr((a I + 2 b L)^{-1}), else None."""
    if g.solver == "dense":
        lam = a + 2.0 * b * g.omega
        return float(np.sum(np.log(lam))), (float(np.sum(1.0 / lam)) if trace else None)
    memo = g.__dict__.setdefault("_lap_memo", {})
    hit = memo.get((a, b))
    if hit is not None and (hit[1] is not None or not trace):
        return hit[0], (hit[1] if trace else None)
    M = g.lap_eye.combine(a, g.lap_2L, b).factor(name="a I + 2 b L")
    tr = float(np.sum(M.selected_inverse().point_blocks())) if trace else None
    if len(memo) >= _LAP_MEMO_SIZE:
        memo.pop(next(iter(memo)))
    memo[(a, b)] = (M.logdet(), tr)
    return memo[(a, b)]


def _log_secant(psi, x0: float, lo: float, hi: float):
    """Root of ``psi``, decreasing in u = log x with slope in [-1, 0), inside (lo, hi), from x0.

    The M-step equations for alpha and gamma take this form (see their docstrings): each
    evaluation is a factorisation on the sparse path, so the steps are secant steps in log x
    (the first with slope -1, exact where the trace is dominated by one power of x), safeguarded
    by bisection of the sign-change bracket. Returns the last point at which ``psi`` was evaluated
    once the next step would move x by less than ``ROOT_RTOL`` relative (so the bound reuses its
    memoised log-det), or None if ``psi`` is not finite or that does not happen in
    ``ROOT_MAX_EVALS`` evaluations.
    """
    ulo = np.log(lo) if lo > 0 else -np.inf
    uhi = np.log(hi) if np.isfinite(hi) else np.inf
    u = float(np.log(x0))
    prev = None
    for _ in range(ROOT_MAX_EVALS):
        f = psi(float(np.exp(u)))
        if not np.isfinite(f):
            return None
        if f > 0:
            ulo = max(ulo, u)
        else:
            uhi = min(uhi, u)
        slope = -1.0
        if prev is not None and u != prev[0]:
            slope = (f - prev[1]) / (u - prev[0])
            if not slope < 0:
                slope = -1.0
        step = -f / slope
        if abs(step) <= ROOT_RTOL:
            return float(np.exp(u))
        prev = (u, f)
        u_new = u + step
        if not ulo < u_new < uhi:  # outside the bracket: bisect it (or jump by e where open)
            if np.isfinite(ulo) and np.isfinite(uhi):
                u_new = 0.5 * (ulo + uhi)
            else:
                u_new = u + (1.0 if f > 0 else -1.0)
        u = u_new
    return None


def _lap_cached(g: LLGraph, a: float) -> float:
    """log|a I + 2 L| for a fixed a (eps_c), computed once per graph."""
    cache = g.__dict__.setdefault("_logdet_cache", {})
    if a not in cache:
        cache[a] = _lap(g, a, 1.0, trace=False)[0]
    return cache[a]


# --------------------------------------------------------------------------- moments
def _ctc(qc: QC) -> np.ndarray:
    """<C_i^T C_i> (N, Q, Q) = D Sigma_C^(ii) + <C_i>^T <C_i>."""
    D = qc.mean.shape[1]
    return D * qc.cov + np.einsum("ndq,ndr->nqr", qc.mean, qc.mean)


# Per-point statistics are sums over edges; each is computed per chunk of edges (grouped by the row
# chunk of their first end point) and reduced, so with ``chunks`` set they run as Dask tasks.
def _scatter(n, ei, ej, vi, vj):
    out = np.zeros((n,) + vi.shape[1:])
    np.add.at(out, ei, vi)
    np.add.at(out, ej, vj)
    return out


def _qx_stats(Y, ei, ej, n, M, Cmean, sl):
    """Chunk of edges sl -> (sum_j eta_ij (M_i + M_j) (N, Q, Q), b / gamma (N, Q))."""
    i, j = ei[sl], ej[sl]
    Msum = M[i] + M[j]
    v = np.einsum("edq,ed->eq", Cmean[i] + Cmean[j], Y[i] - Y[j])  # (C_i + C_j)^T (y_i - y_j)
    return _scatter(n, i, j, Msum, Msum), _scatter(n, i, j, v, -v)


def _qc_stats(Y, ei, ej, n, mean, cov, cov_edge, sl):
    """Chunk of edges sl -> (<Gamma_i^{-1}> (N, Q, Q), <H_i> (N, D, Q))."""
    i, j = ei[sl], ej[sl]
    Sij = cov_edge[sl]
    dm = mean[j] - mean[i]
    Exx = cov[i] + cov[j] - Sij - np.swapaxes(Sij, 1, 2) + np.einsum("eq,er->eqr", dm, dm)
    h = np.einsum("ed,eq->edq", Y[j] - Y[i], dm)
    return _scatter(n, i, j, Exx, Exx), _scatter(n, i, j, h, h)


def _S_stats(Y, ei, ej, xmean, xcov, xcov_edge, M, Cmean, sl):
    """Chunk of edges sl -> (contribution to <S>,)."""
    i, j = ei[sl], ej[sl]
    dy = Y[j] - Y[i]
    dm = xmean[j] - xmean[i]
    Sij = xcov_edge[sl]
    Exx = xcov[i] + xcov[j] - Sij - np.swapaxes(Sij, 1, 2) + np.einsum("eq,er->eqr", dm, dm)
    lin = np.einsum("ed,edq,eq->", dy, Cmean[i] + Cmean[j], dm)
    quad = np.einsum("eqr,erq->", M[i] + M[j], Exx)
    return (np.array(2.0 * np.sum(dy * dy) - 2.0 * lin + quad),)


def _edge_reduce(g: LLGraph, fn, *args):
    """sum over edge chunks of fn(*args, slice) (a tuple of arrays). ``g.chunks`` (points per chunk)
    None: one call in process; else one dask.delayed task per chunk, run by dask.compute (on the
    cluster when called inside a Dask worker task)."""
    E = len(g.ei)
    if g.chunks is None or g.chunks >= g.n:
        return fn(*args, slice(0, E))
    import dask

    starts = np.searchsorted(g.ei, np.arange(0, g.n, int(g.chunks)))
    ends = np.append(starts[1:], E)
    parts = dask.compute(*[dask.delayed(fn)(*args, slice(int(a), int(b))) for a, b in zip(starts, ends)])
    return tuple(np.sum([p[t] for p in parts], axis=0) for t in range(len(parts[0])))


# --------------------------------------------------------------------------- gaussian likelihood
# p(y | x, C) = N(y | Sigma_y e, Sigma_y), Sigma_y^{-1} = (eps_y I + 2 gamma L) kron I_D (paper 003 eq. 5
# and the authors' code): the quadratic form in x or C is gamma^2 e~' (Lt kron I) e~ with
# Lt = (eps_y I + 2 gamma L)^{-1} and e = gamma e~, e~_i = sum_j eta_ij (C_i + C_j)(x_i - x_j). For one
# output row c (N, per latent coordinate r) and latent column x_r:
#   e~ = sum_r F(c_r) x_r = sum_r G_r(x) c_r,
#   F(c) = diag((Dg + W) c) - diag(c) W - W diag(c),  G_r(x) = diag(L x_r) + diag(x_r) W - W diag(x_r),
# so every expectation below is a sum of Hadamard products of the second moments
# K_rs = sum_d <c_dr c_ds'> (q(C)) and S_rs = <x_r x_s'> (q(x)) with Lt and the sparse W, L.
def _rmul(X, A):
    """X @ A for dense X and sparse A (as a dense array)."""
    return np.asarray((A.T @ X.T).T)


def _split(M, Q, r, s):
    return M[r::Q, s::Q]


def _lap_inverse(g: LLGraph, a: float, b: float) -> np.ndarray:
    """(a I + 2 b L)^{-1} from the eigendecomposition of L (dense)."""
    V = g.eigvec
    return (V / (a + 2.0 * b * g.omega)) @ V.T


def _symmetric_blocks(n: int, Q: int, block) -> np.ndarray:
    """The symmetric (n Q, n Q) point-major matrix whose (r, s) component block is ``block(r, s)``
    (n, n), computed for r <= s; the (s, r) block is its transpose."""
    out = np.empty((n * Q, n * Q))
    for r in range(Q):
        for s in range(r, Q):
            A = block(r, s)
            out[r::Q, s::Q] = A
            if s != r:
                out[s::Q, r::Q] = A.T
    return out


def gauss_x_quad(g: LLGraph, K: np.ndarray, Lt: np.ndarray) -> np.ndarray:
    """sum_d <F(c_dr)' Lt F(c_ds)> over q(C), as the (N Q, N Q) matrix with (i r, j s) entries, for the
    second moment K (N Q, N Q) = D Sigma_C + mu_C' mu_C (point-major)."""
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


def gauss_c_quad(g: LLGraph, S: np.ndarray, Lt: np.ndarray) -> np.ndarray:
    """<G_r(x)' Lt G_s(x)> over q(x), as the (N Q, N Q) matrix, for S = Sigma_x + mu_x mu_x'."""
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


def gauss_e_moment(g: LLGraph, K: np.ndarray, S: np.ndarray) -> np.ndarray:
    """R = sum_d <e~_d e~_d'> (N, N) under q(x) q(C) (independent factors)."""
    n, Q = g.n, S.shape[0] // g.n
    W = g.W
    U = sp.diags(g.deg) + W
    R = np.zeros((n, n))
    for r in range(Q):
        for s in range(Q):
            Kr, Sr = _split(K, Q, r, s), _split(S, Q, r, s)
            UK = np.asarray(U @ Kr)
            KU = _rmul(Kr, U)
            SW = _rmul(Sr, W)
            WS = np.asarray(W @ Sr)
            R += (
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
    return R


def _second_moment_c(qc: QC) -> np.ndarray:
    """K = D Sigma_C + mu_C' mu_C (N Q, N Q), point-major."""
    n, D, Q = qc.mean.shape
    Mu = np.swapaxes(qc.mean, 0, 1).reshape(D, n * Q)
    return D * qc.full + Mu.T @ Mu


def _second_moment_x(qx: QX) -> np.ndarray:
    m = qx.mean.ravel()
    return qx.full + np.outer(m, m)


def _dense_gaussian(g: LLGraph, P: np.ndarray, rhs, name: str, context: str):
    """mean, full covariance, its point and edge blocks and log|P| for a dense precision P."""
    n = g.n
    Q = P.shape[0] // n
    P = 0.5 * (P + P.T)
    Lc = jitter_cholesky(P, name=name, context=context)
    Sfull = _inverse_from_chol(Lc, name, context)
    mean = chol_solve(Lc, rhs)
    S4 = Sfull.reshape(n, Q, n, Q)
    idx = np.arange(n)
    return mean, Sfull, S4[idx, :, idx, :], S4[g.ei, :, g.ej, :], float(logdet_from_chol(Lc))


def _b_tilde(Y, g: LLGraph, qc: QC) -> np.ndarray:
    """<b> / gamma (N, Q): b_i = gamma sum_j eta_ij <C_i + C_j>'(y_i - y_j) (the x-linear term y'e)."""
    n = g.n
    i, j = g.ei, g.ej
    v = np.einsum("edq,ed->eq", qc.mean[i] + qc.mean[j], Y[i] - Y[j])
    return _scatter(n, i, j, v, -v)


def _update_qx_gauss(Y, g: LLGraph, qc: QC, th: Theta, context: str) -> QX:
    n, Q = qc.cov.shape[0], qc.cov.shape[-1]
    Lt = _lap_inverse(g, th.eps_y, th.gamma)
    P = th.gamma**2 * gauss_x_quad(g, _second_moment_c(qc), Lt)
    P += np.kron(th.alpha * np.eye(n) + 2.0 * (np.diag(g.deg) - g.W.toarray()), np.eye(Q))
    rhs = th.gamma * _b_tilde(Y, g, qc).reshape(n * Q, 1)
    mean, full, cov, cov_e, ld = _dense_gaussian(g, P, rhs, "precision of q(x)", context)
    return QX(mean=mean.reshape(n, Q), cov=cov, cov_edge=cov_e, logdet_prec=ld, full=full)


def _update_qc_gauss(Y, g: LLGraph, qx: QX, th: Theta, context: str) -> QC:
    n, Q = qx.mean.shape
    D = Y.shape[1]
    i, j = g.ei, g.ej
    h = np.einsum("ed,eq->edq", Y[j] - Y[i], qx.mean[j] - qx.mean[i])
    H = _scatter(n, i, j, h, h)  # <H_i> (N, D, Q)
    Lt = _lap_inverse(g, th.eps_y, th.gamma)
    full_x = qx.full if qx.full is not None else np.zeros((n * Q, n * Q))
    S = full_x + np.outer(qx.mean.ravel(), qx.mean.ravel())
    P = th.gamma**2 * gauss_c_quad(g, S, Lt)
    P += th.beta * np.kron(th.eps_c * np.eye(n) + 2.0 * (np.diag(g.deg) - g.W.toarray()), np.eye(Q))
    rhs = th.gamma * np.swapaxes(H, 1, 2).reshape(n * Q, D)
    mean, full, cov, cov_e, ld = _dense_gaussian(g, P, rhs, "precision of q(C)", context)
    return QC(
        mean=np.swapaxes(mean.reshape(n, Q, D), 1, 2), cov=cov, cov_edge=cov_e, logdet_prec=ld, full=full
    )


def _gauss_lik_stats(Y, g: LLGraph, qx: QX, qc: QC):
    """(tr(Y'LY), mu_x' <b>/gamma, r_k = (V' R V)_kk): the gamma-independent parts of <log p(y|x,C)>.
    Cached for the last (qx, qc) pair (the gamma update and the bound use the same one)."""
    last = g.__dict__.get("_gauss_stats")
    if last is not None and last[0] is qx and last[1] is qc and last[2] is Y:
        return last[3]
    trYLY = float(np.sum((Y[g.ei] - Y[g.ej]) ** 2))
    lin = float(np.sum(qx.mean * _b_tilde(Y, g, qc)))
    R = gauss_e_moment(g, _second_moment_c(qc), _second_moment_x(qx))
    V = g.eigvec
    rk = np.einsum("ik,ik->k", V, R @ V)
    g.__dict__["_gauss_stats"] = (qx, qc, Y, (trYLY, lin, rk))
    return trYLY, lin, rk


def _gauss_loglik(Y, g: LLGraph, th: Theta, stats, gamma=None) -> float:
    n, D = Y.shape
    gam = th.gamma if gamma is None else gamma
    trYLY, lin, rk = stats
    lam = th.eps_y + 2.0 * gam * g.omega
    return float(
        -0.5 * th.eps_y * np.sum(Y * Y)
        - gam * trYLY
        + gam * lin
        - 0.5 * gam**2 * np.sum(rk / lam)
        - 0.5 * n * D * LOG2PI
        + 0.5 * D * np.sum(np.log(lam))
    )


def _update_gamma_gauss(Y, g: LLGraph, qx: QX, qc: QC, th: Theta) -> float:
    """argmax_gamma <log p(y | x, C)>: concave in gamma (log-det concave, -gamma^2 r / (eps + 2 gamma w)
    concave); root of its derivative by Brent's method after bracketing."""
    D = Y.shape[1]
    trYLY, lin, rk = _gauss_lik_stats(Y, g, qx, qc)
    om, eps = g.omega, th.eps_y

    def grad(gam):
        lam = eps + 2.0 * gam * om
        return D * np.sum(om / lam) - trYLY + lin - np.sum(rk * gam * (eps + gam * om) / lam**2)

    lo = hi = max(th.gamma, 1e-12)
    if grad(hi) > 0:  # grow the bracket upwards
        while grad(hi) > 0:
            lo, hi = hi, 2.0 * hi
            if hi > 1e300:
                raise ValueError(
                    "the gamma update has no finite maximiser (the expected log-likelihood grows)"
                )
    else:  # shrink downwards; grad -> D sum_k w_k / eps_y > 0 as gamma -> 0 for tr(Y'LY) fixed
        while grad(lo) <= 0:
            lo, hi = lo / 2.0, lo
            if lo < 1e-300:
                return float(hi)
    return float(brentq(grad, lo, hi, rtol=ROOT_RTOL, xtol=1e-300))


def update_qx(Y, g: LLGraph, qc: QC, th: Theta, context: str = "") -> QX:
    """q(x) of eqs. 50-57: precision <A^{-1}> + Pi^{-1}, mean from <b>."""
    if g.likelihood == "gaussian":
        return _update_qx_gauss(Y, g, qc, th, context)
    n, Q = qc.cov.shape[0], qc.cov.shape[-1]
    M = _ctc(qc)
    eye = np.eye(Q)
    Mpt, b = _edge_reduce(g, _qx_stats, Y, g.ei, g.ej, n, M, qc.mean)
    point = th.gamma * Mpt + (th.alpha + 2.0 * g.deg)[:, None, None] * eye
    edge = -th.gamma * (M[g.ei] + M[g.ej]) - 2.0 * eye
    rhs = th.gamma * b.reshape(n * Q, 1)
    mean, cov, cov_e, ld = _gaussian(g, point, edge, rhs, "precision of q(x)", context)
    return QX(mean=mean.reshape(n, Q), cov=cov, cov_edge=cov_e, logdet_prec=ld)


def update_qc(Y, g: LLGraph, qx: QX, th: Theta, context: str = "") -> QC:
    """q(C) of eqs. 64-71: row precision gamma <Gamma^{-1}> + beta (eps_c I + 2 L kron I)."""
    if g.likelihood == "gaussian":
        return _update_qc_gauss(Y, g, qx, th, context)
    n, Q = qx.mean.shape
    D = Y.shape[1]
    eye = np.eye(Q)
    Gam, H = _edge_reduce(g, _qc_stats, Y, g.ei, g.ej, n, qx.mean, qx.cov, qx.cov_edge)
    point = th.gamma * Gam + (th.beta * (th.eps_c + 2.0 * g.deg))[:, None, None] * eye
    edge = np.broadcast_to(-2.0 * th.beta * eye, (len(g.ei), Q, Q))
    rhs = th.gamma * np.swapaxes(H, 1, 2).reshape(n * Q, D)
    mean, cov, cov_e, ld = _gaussian(g, point, np.ascontiguousarray(edge), rhs, "precision of q(C)", context)
    return QC(mean=np.swapaxes(mean.reshape(n, Q, D), 1, 2), cov=cov, cov_edge=cov_e, logdet_prec=ld)


def expected_S(Y, g: LLGraph, qx: QX, qc: QC) -> float:
    """<S> = sum_i sum_j eta_ij <|(y_j - y_i) - C_i (x_j - x_i)|^2> under q(x) q(C)."""
    (S,) = _edge_reduce(g, _S_stats, Y, g.ei, g.ej, qx.mean, qx.cov, qx.cov_edge, _ctc(qc), qc.mean)
    return float(S)


def _lap_quad_blocks(g: LLGraph, cov, cov_edge) -> float:
    """tr((L kron I) Sigma) from the diagonal and edge covariance blocks."""
    tr_pt = np.trace(cov, axis1=1, axis2=2)
    return float(np.sum(g.deg * tr_pt) - 2.0 * np.sum(np.trace(cov_edge, axis1=1, axis2=2)))


def _lap_quad_mean(g: LLGraph, m) -> float:
    """tr(m^T (L kron I) m) for per-point rows m (N, ...) = sum_edges |m_i - m_j|^2."""
    d = m[g.ei] - m[g.ej]
    return float(np.sum(d * d))


# --------------------------------------------------------------------------- M-step
def _x_stat(qx: QX) -> float:
    return float(np.sum(np.trace(qx.cov, axis1=1, axis2=2)) + np.sum(qx.mean**2))


def _root(grad, lo: float, hi: float, *, from_below: bool) -> float:
    """Root of a decreasing ``grad`` with grad(lo) >= 0 >= grad(hi) known analytically.

    The root lies close to the analytic end (``lo`` when ``from_below``, else ``hi``), so the bracket
    is grown geometrically from that end before Brent's method; this needs far fewer evaluations
    (each one a factorisation on the sparse path) than bracketing [lo, hi] directly.
    """
    if from_below:
        a, b = lo, min(lo * 1.05, hi)
        while b < hi and grad(b) > 0:
            a, b = b, min(2.0 * b, hi)
    else:
        a, b = max(hi / 1.05, lo), hi
        while a > lo and grad(a) < 0:
            a, b = max(a / 2.0, lo), a
    if grad(b) >= 0:  # numerically at the end of the interval
        return b
    return float(brentq(grad, a, b, rtol=ROOT_RTOL, xtol=1e-300))


def update_alpha(g: LLGraph, qx: QX, a0: float | None = None) -> float:
    """argmax_alpha Q/2 log|alpha I + 2L| - alpha/2 (tr Sigma_x + |mu_x|^2)  (eq. 79).

    ``a0``: a starting guess (EM passes the current alpha); it changes how fast, not where, the
    root is found."""
    n, Q = qx.mean.shape
    c = _x_stat(qx)

    def grad(a):
        return 0.5 * Q * _lap(g, a, 1.0)[1] - 0.5 * c

    # tr((aI+2L)^{-1}) lies between 1/a and n/a, so log(Q tr) - log(c) falls in log a with slope
    # in [-1, 0); solve it by safeguarded secant steps in log a, else bracket in [Q/c, Q n/c]
    lo, hi = Q / c, Q * n / c
    start = a0 if a0 is not None and lo < a0 < hi else lo
    a = _log_secant(lambda a: np.log(Q * _lap(g, a, 1.0)[1]) - np.log(c), start, lo, hi)
    if a is not None:
        return a
    return _root(grad, lo, hi, from_below=True)


def update_beta(g: LLGraph, qc: QC, th: Theta) -> float:
    """beta^{-1} = (1 / (N Q)) tr[(eps_c I + 2 L kron I)(Sigma_C + mu_C^T mu_C / D)]  (closed form)."""
    n, D, Q = qc.mean.shape
    tr_cov = th.eps_c * np.sum(np.trace(qc.cov, axis1=1, axis2=2)) + 2.0 * _lap_quad_blocks(
        g, qc.cov, qc.cov_edge
    )
    tr_mean = th.eps_c * np.sum(qc.mean**2) + 2.0 * _lap_quad_mean(g, qc.mean)
    return float(n * Q / (tr_cov + tr_mean / D))


def update_gamma(Y, g: LLGraph, qx: QX, qc: QC, th: Theta) -> float:
    """argmax_gamma D/2 log|eps_y I + 2 gamma L| - gamma/2 <S>  (eq. 72-73)."""
    if g.likelihood == "gaussian":
        return _update_gamma_gauss(Y, g, qx, qc, th)
    n, D = Y.shape
    S = expected_S(Y, g, qx, qc)

    def grad(gam):
        tr = _lap(g, th.eps_y, gam)[1]
        return 0.5 * D / gam * (n - th.eps_y * tr) - 0.5 * S

    # n - eps_y tr = n - 1 - u(gamma), u = sum_{omega>0} eps_y / (eps_y + 2 gamma omega) >= 0, for a
    # connected graph: the root solves log(D (n - 1 - u)) - log(gamma S) = 0, falling in log gamma
    # with slope in (-1, 0); safeguarded secant steps in log gamma from the current gamma, else bracket
    hi = D * (n - 1) / S

    def psi(gam):
        f = D * (n - th.eps_y * _lap(g, th.eps_y, gam)[1])
        return np.log(f) - np.log(gam * S) if f > 0 else np.inf

    gam = _log_secant(psi, th.gamma if 0 < th.gamma < hi else hi, 0.0, hi)
    if gam is not None:
        return gam
    return _root(grad, 0.0, hi, from_below=False)


# --------------------------------------------------------------------------- bound
def elbo(Y, g: LLGraph, qx: QX, qc: QC, th: Theta, *, terms: bool = False):
    """The variational lower bound F (see the module docstring); ``terms=True`` also returns the
    parts (expected log-likelihood, -KL(q(x)||p(x)), -KL(q(C)||p(C)))."""
    n, D = Y.shape
    Q = qx.mean.shape[1]
    nQ = n * Q
    if g.likelihood == "gaussian":
        loglik = _gauss_loglik(Y, g, th, _gauss_lik_stats(Y, g, qx, qc))
    else:
        S = expected_S(Y, g, qx, qc)
        ld_y, _ = _lap(g, th.eps_y, th.gamma, trace=False)
        loglik = -0.5 * th.eps_y * np.sum(Y * Y) - 0.5 * n * D * LOG2PI + 0.5 * D * ld_y - 0.5 * th.gamma * S
    ld_x, _ = _lap(g, th.alpha, 1.0, trace=False)
    tr_x = th.alpha * np.sum(np.trace(qx.cov, axis1=1, axis2=2)) + 2.0 * _lap_quad_blocks(
        g, qx.cov, qx.cov_edge
    )
    mq_x = th.alpha * np.sum(qx.mean**2) + 2.0 * _lap_quad_mean(g, qx.mean)
    neg_kl_x = 0.5 * (Q * ld_x - qx.logdet_prec - tr_x - mq_x + nQ)
    ld_c = _lap_cached(g, th.eps_c)
    tr_c = th.beta * (
        th.eps_c * np.sum(np.trace(qc.cov, axis1=1, axis2=2)) + 2.0 * _lap_quad_blocks(g, qc.cov, qc.cov_edge)
    )
    mq_c = th.beta * (th.eps_c * np.sum(qc.mean**2) + 2.0 * _lap_quad_mean(g, qc.mean))
    neg_kl_c = 0.5 * D * (nQ * np.log(th.beta) + Q * ld_c - qc.logdet_prec - tr_c + nQ) - 0.5 * mq_c
    F = float(loglik + neg_kl_x + neg_kl_c)
    if terms:
        return F, (float(loglik), float(neg_kl_x), float(neg_kl_c))
    return F


# --------------------------------------------------------------------------- EM driver
def spectral_init(W, Q: int, rng) -> np.ndarray:
    """Laplacian eigenmaps start: the Q eigenvectors of L after the constant one, each scaled to unit
    variance, plus 1e-3 N(0, 1) noise from ``rng`` (so seeds give different starts)."""
    from scipy.sparse.linalg import eigsh

    W = sp.csr_matrix(W)
    n = W.shape[0]
    L = sp.diags(np.asarray(W.sum(1)).ravel()) - W
    if n <= 2000:
        _, V = np.linalg.eigh(L.toarray())
    else:
        v0 = np.random.default_rng(0).standard_normal(n)
        _, V = eigsh(sp.csc_matrix(L), k=Q + 1, sigma=-1e-6, which="LM", v0=v0)
    V = V[:, 1 : Q + 1]
    V = V / V.std(axis=0)
    return V + 1e-3 * rng.standard_normal(V.shape)


def lllvm_fit(
    Y,
    W,
    *,
    n_components: int = 2,
    solver: str = "dense",
    max_iter: int = 50,
    tol: float = 0.0,
    eps_c: float = 1e-3,
    eps_y: float = 1e-3,
    alpha0: float = 1e-3,
    beta0: float = 1.0,
    gamma0: float = 1.0,
    init: str = "random_c",
    learn_alpha: bool = True,
    learn_beta: bool = True,
    chunks: int | None = None,
    random_state=None,
    callback=None,
    likelihood: str = "quadratic",
):
    """Variational EM. Each iteration: q(x), q(C), then gamma, beta, alpha, then the bound.

    ``init="random_c"`` starts from q(C) with N(0, 1) means and identity covariance (as the authors'
    code does); ``"random_x"`` from N(0, 1) latent means. ``likelihood``: "quadratic" (paper 000's
    appendix: sparse precisions) or "gaussian" (the normalised N(y | Sigma_y e, Sigma_y) of paper 003
    eq. 5 and of the authors' code: dense precisions, dense solver only).

    Returns (qx, qc, theta, graph, trace) with ``trace`` the bound after every iteration. Stops when
    the relative change of the bound falls below ``tol``.
    """
    Y = np.asarray(Y, dtype=np.float64)
    n, D = Y.shape
    Q = int(n_components)
    g = prepare_graph(W, solver, chunks, likelihood)
    th = Theta(alpha=float(alpha0), beta=float(beta0), gamma=float(gamma0), eps_c=eps_c, eps_y=eps_y)
    rng = np.random.default_rng(random_state)
    E = len(g.ei)
    if init == "random_c":  # the authors' start: <C> ~ N(0, 1) entries, Sigma_C = I
        qc = QC(
            mean=rng.standard_normal((n, D, Q)),
            cov=np.broadcast_to(np.eye(Q), (n, Q, Q)).copy(),
            cov_edge=np.zeros((E, Q, Q)),
            logdet_prec=0.0,
            full=np.eye(n * Q) if likelihood == "gaussian" else None,
        )
    elif init in ("random_x", "spectral"):  # point-mass q(x): N(0, 1) draws or Laplacian eigenmaps
        mean0 = rng.standard_normal((n, Q)) if init == "random_x" else spectral_init(W, Q, rng)
        qx = QX(
            mean=mean0,
            cov=np.zeros((n, Q, Q)),
            cov_edge=np.zeros((E, Q, Q)),
            logdet_prec=0.0,
            full=np.zeros((n * Q, n * Q)) if likelihood == "gaussian" else None,
        )
        qc = update_qc(Y, g, qx, th, "initialisation")
    else:
        raise ValueError(f"init must be 'random_c', 'random_x' or 'spectral', got {init!r}")
    trace = []
    for it in range(int(max_iter)):
        ctx = f"EM iteration {it}"
        qx = update_qx(Y, g, qc, th, ctx)
        qc = update_qc(Y, g, qx, th, ctx)
        th.gamma = update_gamma(Y, g, qx, qc, th)
        if learn_beta:
            th.beta = update_beta(g, qc, th)
        if learn_alpha:
            th.alpha = update_alpha(g, qx, th.alpha)
        F = elbo(Y, g, qx, qc, th)
        trace.append(F)
        if callback is not None:
            callback(it, qx, qc, th, F)
        if it > 0 and tol > 0 and abs(F - trace[-2]) <= tol * abs(F):
            break
    return qx, qc, th, g, np.asarray(trace)


# --------------------------------------------------------------------------- out of sample
def transform_points(Y, qx: QX, qc: QC, th: Theta, Ynew, nbr, *, sweeps: int = OOS_SWEEPS):
    """E-step for new points with the training posterior and theta frozen.

    ``nbr`` (M, k): training neighbours of each new point (the new point joins the graph with these
    edges; the training graph is unchanged). Coordinate ascent over q(x*) and q(C*) (independent
    across new points). Returns mean (M, Q), cov (M, Q, Q), C mean (M, D, Q), C cov (M, Q, Q).
    """
    Y = np.asarray(Y, dtype=np.float64)
    Ynew = np.asarray(Ynew, dtype=np.float64)
    m, k = nbr.shape
    D = Y.shape[1]
    Q = qx.mean.shape[1]
    eye = np.eye(Q)
    Mtr = _ctc(qc)  # (N, Q, Q)
    mu_j = qx.mean[nbr]  # (M, k, Q)
    S_j = qx.cov[nbr]  # (M, k, Q, Q)
    Cj = qc.mean[nbr]  # (M, k, D, Q)
    Mj = Mtr[nbr]
    a = Y[nbr] - Ynew[:, None, :]  # y_j - y*  (M, k, D)
    # x-independent pieces of q(x*)
    P_fix = (th.alpha + 2.0 * k) * eye + th.gamma * Mj.sum(1)
    h_fix = 2.0 * mu_j.sum(1) + th.gamma * (
        np.einsum("mkdq,mkd->mq", Cj, -a) + np.einsum("mkqr,mkr->mq", Mj, mu_j)
    )
    PC = None
    mx = mu_j.mean(1)
    Sx = np.zeros((m, Q, Q))
    Cs = np.zeros((m, D, Q))
    SC = np.zeros((m, Q, Q))
    for _ in range(int(sweeps)):
        # q(C*): precision gamma Gamma* + beta (eps_c + 2k) I, shared by the D rows
        dm = mu_j - mx[:, None, :]  # <x_j - x*>
        Gam = S_j.sum(1) + k * Sx + np.einsum("mkq,mkr->mqr", dm, dm)
        PC = th.gamma * Gam + th.beta * (th.eps_c + 2.0 * k) * eye
        Hs = np.einsum("mkd,mkq->mdq", a, dm)
        rhs = th.gamma * Hs + 2.0 * th.beta * Cj.sum(1)  # (M, D, Q)
        Lc = np.linalg.cholesky(PC)
        SC = np.linalg.solve(PC, np.broadcast_to(eye, PC.shape))
        Cs = np.swapaxes(np.linalg.solve(PC, np.swapaxes(rhs, 1, 2)), 1, 2)
        del Lc
        Ms = D * SC + np.einsum("mdq,mdr->mqr", Cs, Cs)
        # q(x*)
        P = P_fix + th.gamma * k * Ms
        h = h_fix + th.gamma * (-np.einsum("mdq,mkd->mq", Cs, a) + np.einsum("mqr,mkr->mq", Ms, mu_j))
        mx_new = np.linalg.solve(P, h[..., None])[..., 0]
        Sx = np.linalg.solve(P, np.broadcast_to(eye, P.shape))
        done = np.max(np.abs(mx_new - mx)) <= 1e-12 * (1.0 + np.max(np.abs(mx_new)))
        mx = mx_new
        if done:
            break
    return mx, Sx, Cs, SC


def reconstruct(Y, qx: QX, qc: QC, X, k: int):
    """Section 4.2 reconstruction: y* = mean over the k training points nearest to x* in latent
    space of y_i + <C_i> (x* - <x_i>)."""
    X = np.asarray(X, dtype=np.float64)
    d2 = np.sum(X**2, 1)[:, None] + np.sum(qx.mean**2, 1)[None, :] - 2.0 * X @ qx.mean.T
    nb = np.argsort(d2, axis=1)[:, :k]
    diff = X[:, None, :] - qx.mean[nb]  # (M, k, Q)
    return np.mean(Y[nb] + np.einsum("mkdq,mkq->mkd", qc.mean[nb], diff), axis=1)


# --------------------------------------------------------------------------- estimator
_SOLVERS = ("auto", "dense", "sparse")
_INITS = ("random_c", "random_x", "spectral")


class LLLVM:
    """Locally linear latent variable model (variational EM over q(x), q(C); alpha, beta, gamma
    learned). See the module docstring for the model and the bound.

    Parameters
    ----------
    n_components : latent dimension Q (< D)
    n_neighbors : k of the kNN graph (union-symmetrised; the point itself is not counted)
    solver : "dense" (Cholesky of the full N Q x N Q precisions), "sparse" (block-tridiagonal
        Cholesky in BFS level order with selected inversion), or "auto" (dense for
        N <= AUTO_DENSE_MAX_N)
    max_iter, tol : EM iterations and relative bound change to stop at (0: run max_iter)
    epsilon_c, epsilon_y : the small fixed precisions of the C prior and of the y likelihood
    standardize : centre Y and divide it by its largest absolute entry before fitting (the authors'
        preprocessing; the priors' unit graph weights make the fit scale-dependent). ``elbo_`` is
        then the bound of the scaled data; ``Y_train_`` holds the scaled data.
    chunks : points per chunk for the per-point sufficient statistics (edge sums), run as Dask tasks
        and reduced; None computes them in process. The factorisations are not chunked.
    init : "random_c" (q(C) means N(0, 1), covariance I: the authors' start), "random_x" (latent means
        N(0, 1)) or "spectral" (Laplacian eigenmaps plus 1e-3 noise)
    random_state : seed of the random start
    likelihood : "quadratic" (paper 000 appendix B/C: the quadratic form of eq. 24 with f of eq. 28 and
        the normaliser of eq. 31; sparse precisions, both solvers) or "gaussian" (the normalised
        N(y | Sigma_y e, Sigma_y) of paper 003 eq. 5 and of the authors' code; its precisions are
        dense, so the dense solver only; no ``transform``). The quadratic density integrates to
        exp(-(f - e' Sigma_y e) / 2) < 1, a graph-dependent deficit, so only the gaussian bound is a
        bound on a normalised evidence (compare graphs with it).
    alpha : None (learned in the M-step, the default) or a fixed value (the authors' code fixes 1e-3)
    beta : None (learned, the default) or a fixed value (paper 003 and the authors' code have no beta:
        U = I, i.e. beta = 1)
    """

    def __init__(
        self,
        *,
        n_components: int = 2,
        n_neighbors: int = 10,
        solver: str = "auto",
        max_iter: int = 50,
        tol: float = 1e-6,
        epsilon_c: float = 1e-3,
        epsilon_y: float = 1e-3,
        standardize: bool = True,
        chunks: int | None = None,
        init: str = "random_c",
        random_state=None,
        likelihood: str = "quadratic",
        alpha: float | None = None,
        beta: float | None = None,
    ):
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.solver = solver
        self.max_iter = max_iter
        self.tol = tol
        self.epsilon_c = epsilon_c
        self.epsilon_y = epsilon_y
        self.standardize = standardize
        self.chunks = chunks
        self.init = init
        self.random_state = random_state
        self.likelihood = likelihood
        self.alpha = alpha
        self.beta = beta

    def get_params(self) -> dict:
        keys = (
            "n_components",
            "n_neighbors",
            "solver",
            "max_iter",
            "tol",
            "epsilon_c",
            "epsilon_y",
            "standardize",
        )
        return {k: getattr(self, k) for k in keys + ("random_state", "init", "likelihood", "alpha", "beta")}

    # ------------------------------------------------------------------ checks
    def _check_params(self, n, D):
        for name in ("n_components", "n_neighbors", "max_iter"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.init not in _INITS:
            raise ValueError(f"init must be one of {_INITS}, got {self.init!r}")
        if self.solver not in _SOLVERS:
            raise ValueError(f"solver must be one of {_SOLVERS}, got {self.solver!r}")
        if self.likelihood not in _LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {_LIKELIHOODS}, got {self.likelihood!r}")
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if v is not None and not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be None (learned) or a positive finite number, got {v!r}")
        if self.likelihood == "gaussian" and self.solver == "sparse":
            raise ValueError("likelihood='gaussian' has dense precisions: use solver='dense' or 'auto'")
        for name in ("epsilon_c", "epsilon_y"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")
        if self.chunks is not None and (
            isinstance(self.chunks, bool) or not isinstance(self.chunks, (int, np.integer)) or self.chunks < 1
        ):
            raise ValueError(
                f"chunks must be None or a positive integer (points per chunk), got {self.chunks!r}"
            )
        if not (np.isfinite(self.tol) and self.tol >= 0):
            raise ValueError(f"tol must be >= 0, got {self.tol!r}")
        if self.n_components >= D:
            raise ValueError(
                f"Expected n_components < n_features, but n_components = {self.n_components}, "
                f"n_features = {D}; choose a smaller n_components"
            )
        if self.n_neighbors >= n:
            raise ValueError(
                f"Expected n_neighbors < n_samples, but n_samples = {n}, n_neighbors = {self.n_neighbors}; "
                "use a smaller n_neighbors"
            )

    def _graph(self, Y, graph) -> sp.csr_matrix:
        from lvmcore import graph as lg

        n = Y.shape[0]
        k = int(self.n_neighbors)
        if graph is None:
            idx, _ = lg.knn(Y, k)
            W = lg.adjacency(idx, mode="union")
        elif sp.issparse(graph):
            W = sp.csr_matrix(graph, dtype=np.float64)
            if W.shape != (n, n):
                raise ValueError(f"graph adjacency must be ({n}, {n}) for {n} points, got {W.shape}")
            if abs(W - W.T).max() > 0:
                raise ValueError("graph adjacency must be symmetric; symmetrise it with W.maximum(W.T)")
            W.setdiag(0)
            W.eliminate_zeros()
            W.data[:] = 1.0
        else:
            idx = np.asarray(graph)
            if idx.ndim != 2 or idx.shape[0] != n or not np.issubdtype(idx.dtype, np.integer):
                raise ValueError(
                    f"graph must be None, a sparse adjacency or an int array (N, k) of neighbour "
                    f"indices with N = {n}; got {type(graph).__name__} of shape {getattr(idx, 'shape', None)}"
                )
            if idx.shape[1] < k:
                raise ValueError(
                    f"graph has {idx.shape[1]} neighbours per point but n_neighbors = {k}; "
                    "compute the kNN graph with at least n_neighbors columns"
                )
            if idx.min() < 0 or idx.max() >= n:
                raise ValueError(f"graph indices must lie in [0, {n - 1}]")
            W = lg.adjacency(idx[:, :k], mode="union")
        lg.require_connected(W)
        return W

    # ------------------------------------------------------------------ fit
    def fit(self, Y, graph=None):
        Y = _check_Y(Y)
        n, D = Y.shape
        self._check_params(n, D)
        W = self._graph(Y, graph)
        if self.standardize:  # the authors' preprocessing: centre, divide by the largest |entry|
            self.center_ = Y.mean(axis=0)
            self.scale_ = float(np.abs(Y - self.center_).max()) or 1.0
        else:
            self.center_, self.scale_ = np.zeros(D), 1.0
        Y = (Y - self.center_) / self.scale_
        solver = self.solver
        if solver == "auto":
            solver = "dense" if n <= AUTO_DENSE_MAX_N or self.likelihood == "gaussian" else "sparse"
        qx, qc, th, g, trace = lllvm_fit(
            Y,
            W,
            n_components=int(self.n_components),
            solver=solver,
            max_iter=int(self.max_iter),
            tol=float(self.tol),
            eps_c=float(self.epsilon_c),
            eps_y=float(self.epsilon_y),
            chunks=self.chunks,
            init=self.init,
            random_state=self.random_state,
            likelihood=self.likelihood,
            alpha0=1e-3 if self.alpha is None else float(self.alpha),
            learn_alpha=self.alpha is None,
            beta0=1.0 if self.beta is None else float(self.beta),
            learn_beta=self.beta is None,
        )
        self.Y_train_ = Y
        self.adjacency_ = W
        self.solver_ = solver
        self.qx_, self.qc_, self.theta_ = qx, qc, th
        self.embedding_ = qx.mean
        self.embedding_var_ = qx.cov
        self.C_ = qc.mean
        self.alpha_, self.beta_, self.gamma_ = th.alpha, th.beta, th.gamma
        self.elbo_trace_ = trace
        self.elbo_ = float(trace[-1])
        self.n_iter_ = len(trace)
        return self

    def _check_fitted(self):
        if not hasattr(self, "embedding_"):
            raise ValueError("this LLLVM instance is not fitted yet; call fit(Y) first")

    def transform(self, Y_new, return_var: bool = False):
        """Posterior mean of x* for new points: each joins the training graph with edges to its
        n_neighbors nearest training points; E-step for (x*, C*) with everything else frozen."""
        self._check_fitted()
        if self.likelihood == "gaussian":
            raise NotImplementedError(
                "transform is the local out-of-sample E-step of the quadratic likelihood; under "
                "likelihood='gaussian' a new point couples to every training point through "
                "(eps_y I + 2 gamma L)^{-1}, which is not implemented"
            )
        Ytr = self.Y_train_
        Y_new = _check_Y(Y_new, "Y_new")
        if Y_new.shape[1] != Ytr.shape[1]:
            raise ValueError(f"Y_new has {Y_new.shape[1]} features, the model was fitted on {Ytr.shape[1]}")
        Y_new = (Y_new - self.center_) / self.scale_
        d2 = np.sum(Y_new**2, 1)[:, None] + np.sum(Ytr**2, 1)[None, :] - 2.0 * Y_new @ Ytr.T
        nbr = np.argsort(d2, axis=1)[:, : int(self.n_neighbors)]
        mx, Sx, _, _ = transform_points(Ytr, self.qx_, self.qc_, self.theta_, Y_new, nbr)
        return (mx, Sx) if return_var else mx

    def inverse_transform(self, X):
        """Reconstruction of section 4.2 from the n_neighbors nearest training latents."""
        self._check_fitted()
        X = _check_Y(X, "X")
        if X.shape[1] != self.embedding_.shape[1]:
            raise ValueError(
                f"X has {X.shape[1]} columns, the latent dimension is {self.embedding_.shape[1]}"
            )
        Yhat = reconstruct(self.Y_train_, self.qx_, self.qc_, X, int(self.n_neighbors))
        return Yhat * self.scale_ + self.center_

    def score(self, Y, graph=None) -> float:
        """The final lower bound of a fit with this estimator's settings on (Y, graph): compare
        hypothesised graphs (or k) by it (paper section 4.1). Does not change this estimator."""
        return LLLVM(**self.get_params()).fit(Y, graph).elbo_
