"""The paper's likelihood at scale: a per-point factorised variational family (``solver="factorised"``).

q(x) = prod_i N(x_i; m_i, S_i), q(C) = prod_i MN(C_i; M_i, I_D, V_i). Under the full-covariance q of
the dense solver both precisions couple every pair of points through Lt = (eps_y I + 2 gamma L)^{-1};
here every expectation of paper 000 eqs. 29-31 needs Lt only (a) applied to vectors (a sparse
factorisation of eps_y I + 2 gamma L) and (b) on pairs of points at graph distance <= 2 (selected
inversion). The bound stays a true lower bound on log p(y) (it is the paper's bound restricted to a
smaller family), and both E-steps are exact coordinate ascent in that family.

Bookkeeping. e~_i = sum_{k,b} J[i,k,b] C_k x_b (eq. 30) with, for each centre k and its closed
neighbourhood N[k] = {k} + neighbours (local index 0 = k, size n = deg_k + 1),
  J^(k)[i, b] = J[i, k, b] = [[deg_k, -1'], [-1, I]]   (rows i, columns b, both in N[k]),
  K^(b)[i, k] = J[i, k, b] = [[deg_b, 1'], [-1, -I]]   (rows i, columns k, both in N[b]).
Then, with independent zero-mean C_k - M_k (row covariance V_k) and x_b - m_b (covariance S_b),
  sum_d <e~_d' Lt e~_d> = sum_d e~_d(M, m)' Lt e~_d(M, m) + sum_k <Lt_N[k], R^(k)>,
  R^(k) = D U_k V_k U_k' + sum_d W_kd S_k W_kd' + D J^(k) diag(tr V_k S_b)_b J^(k)'
with U_k = J^(k) m_N[k] (u_ik = d e~_i / d C_k) and W_kd = K^(k) M_N[k],d (d e~_i / d x_k): the three
covariance terms (V; S; V and S) of the quartic expectation, each local to one closed neighbourhood.
The x precision is gamma^2 [A(M)' (Lt kron I_D) A(M) + D sum_k (J' Lt J)^(k) kron V_k] +
(alpha I + 2 L) kron I_Q and the C row precision gamma^2 [G(m)' Lt G(m) + sum_b (K' Lt K)^(b) kron S_b]
+ beta (eps_c I + 2 L) kron I_Q (eqs. 50-57, 64-71 with the other factor's covariances per point).
The mean-field optimum in the family has means solving the full system (preconditioned CG, applied
matrix-free) and covariances the inverses of the diagonal blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import splu

from lvmcore.linalg import NumericalError
from lvmcore.sparse_chol import BlockTridiagonal

from .operators import LOG2PI, QC, QX, LLGraph, Theta

#: relative residual at which the CG solves of the E-steps stop (warm-started from the last means)
CG_RTOL = 1e-8
#: CG iterations per E-step at most (each is one solve with eps_y I + 2 gamma L)
CG_MAXITER = 1000
#: Lt factorisations kept per graph (one per gamma visited by the gamma search)
_LT_MEMO = 3


# --------------------------------------------------------------------------- graph structures
@dataclass
class Group:
    """Centres of one closed-neighbourhood size n: ``centres`` (G,), ``nb`` (G, n) with the centre
    first, ``pos`` (G, n, n) indices of the pairs into the distance-2 pattern, ``scat`` the (N, G n)
    0/1 matrix that sums rows over nb."""

    centres: np.ndarray
    nb: np.ndarray
    pos: np.ndarray
    scat: sp.csr_matrix
    J: np.ndarray
    K: np.ndarray


@dataclass
class Local:
    """Closed neighbourhoods grouped by size, the distance-<=2 pattern (``pr``, ``pc``) and where each
    pattern entry lies in the level blocks of a selected inverse (``slices``: per lower level, its
    (level difference, entries, rows, columns)); ``memo``: Lt factors per (eps, gamma); ``prec``:
    the E-steps' preconditioner factors."""

    groups: list
    pr: np.ndarray
    pc: np.ndarray
    slices: dict
    sinc: sp.csr_matrix
    lap: sp.csr_matrix
    memo: dict
    prec: dict


def local_structure(g: LLGraph) -> Local:
    """Closed neighbourhoods and the distance-<=2 pattern of the graph (built once per fit)."""
    n = g.n
    W = g.W
    A = (W + sp.identity(n, format="csr")).tocsr()
    A.data[:] = 1.0
    P2 = (A @ A).tocsr()
    P2.sort_indices()
    pr = np.repeat(np.arange(n), np.diff(P2.indptr)).astype(np.int64)
    pc = P2.indices.astype(np.int64)
    keys = pr * n + pc
    deg = np.diff(W.indptr)
    groups = []
    for d in np.unique(deg):
        cen = np.flatnonzero(deg == d)
        nbrs = np.stack([W.indices[W.indptr[k] : W.indptr[k + 1]] for k in cen]).astype(np.int64)
        nb = np.concatenate([cen[:, None], nbrs], axis=1)
        m = d + 1
        pos = np.searchsorted(keys, nb[:, :, None] * n + nb[:, None, :])
        G = len(cen)
        scat = sp.csr_matrix((np.ones(G * m), (nb.ravel(), np.arange(G * m))), shape=(n, G * m))
        J = np.eye(m)
        J[0, 0], J[0, 1:], J[1:, 0] = d, -1.0, -1.0
        K = -np.eye(m)
        K[0, 0], K[0, 1:], K[1:, 0] = d, 1.0, -1.0
        groups.append(Group(centres=cen, nb=nb, pos=pos, scat=scat, J=J, K=K))
    # where each pattern entry (a, b) sits in the selected inverse: level(a) - level(b) in {0, 1, 2}
    ls = g.ls
    lr, lc = ls.level[pr], ls.level[pc]
    flip = lr < lc
    a = np.where(flip, pc, pr)
    b = np.where(flip, pr, pc)
    diff = np.abs(lr - lc)
    if diff.max(initial=0) > 2:
        raise RuntimeError("a distance-2 pair spans more than two BFS levels")
    lb = ls.level[b]
    order = np.lexsort((lb, diff))
    key = diff[order] * (ls.n_levels + 1) + lb[order]
    bounds = np.flatnonzero(np.diff(key)) + 1
    slices = {}  # by the lower level, the order in which a selected inverse comes (selected_levels)
    for part in np.split(order, bounds):
        if len(part):
            entry = (int(diff[part[0]]), part, ls.local[a[part]], ls.local[b[part]])
            slices.setdefault(int(lb[part[0]]), []).append(entry)
    E = len(g.ei)
    sinc = sp.csr_matrix(
        (np.concatenate([np.ones(E), -np.ones(E)]), (np.concatenate([g.ei, g.ej]), np.tile(np.arange(E), 2))),
        shape=(n, E),
    )
    lap = (sp.diags(g.deg) - W).tocsr()
    return Local(groups=groups, pr=pr, pc=pc, slices=slices, sinc=sinc, lap=lap, memo={}, prec={})


# --------------------------------------------------------------------------- Lt = (eps I + 2 gamma L)^{-1}
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


# --------------------------------------------------------------------------- e~ and its adjoints
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


# --------------------------------------------------------------------------- CG
def pcg(apply, b, x0, prec, project=None, rtol: float = CG_RTOL, maxiter: int = CG_MAXITER):
    """Preconditioned CG from x0; ``project`` keeps iterates in a subspace the operator preserves.
    Every step lowers the energy norm of the error, so a truncated solve still raises the bound."""
    proj = project if project is not None else (lambda v: v)
    x = proj(np.array(x0, dtype=np.float64))
    r = proj(b - apply(x))
    z = proj(prec(r))
    p = z.copy()
    rz = float(np.vdot(r, z))
    bn = float(np.linalg.norm(b)) or 1.0
    it = 0
    while it < maxiter and np.linalg.norm(r) > rtol * bn:
        Ap = apply(p)
        pAp = float(np.vdot(p, Ap))
        if not pAp > 0:
            raise NumericalError("CG met a non-positive curvature", name="factorised precision", context="")
        a = rz / pAp
        x += a * p
        r -= a * Ap
        z = proj(prec(r))
        rz_new = float(np.vdot(r, z))
        p = z + (rz_new / rz) * p
        rz = rz_new
        it += 1
    return x, it


def _graph_blocks_csc(g: LLGraph, point: np.ndarray, edge: np.ndarray) -> sp.csc_matrix:
    """The (N Q, N Q) point-major sparse matrix with point blocks (N, Q, Q) and edge blocks (E, Q, Q)."""
    n, Q = g.n, point.shape[-1]
    a, b = np.meshgrid(np.arange(Q), np.arange(Q), indexing="ij")
    a, b = a.ravel(), b.ravel()
    ei, ej, pts = g.ei[:, None], g.ej[:, None], np.arange(n)[:, None]
    rows = np.concatenate([(ei * Q + a).ravel(), (ej * Q + b).ravel(), (pts * Q + a).ravel()])
    cols = np.concatenate([(ej * Q + b).ravel(), (ei * Q + a).ravel(), (pts * Q + b).ravel()])
    vals = np.concatenate([edge.reshape(-1), edge.reshape(-1), point.reshape(-1)])
    return sp.csc_matrix((vals, (rows, cols)), shape=(n * Q, n * Q))


#: a preconditioner factor is reused by later E-steps of the same factor until a CG solve needs more
#: than this many iterations or it is this many E-steps old (staleness costs CG steps, not accuracy)
PREC_MAX_CG = 25
PREC_MAX_AGE = 5


def _cached_lu(g: LLGraph, key: str, build, name: str, context: str):
    """The cached SuperLU factor of the ``key`` preconditioner, rebuilt by ``build()`` when stale."""
    hit = g.local.prec.get(key)
    if hit is not None and hit["cg"] <= PREC_MAX_CG and hit["age"] < PREC_MAX_AGE:
        hit["age"] += 1
        return hit
    hit = {"lu": _lu(build(), name, context), "cg": 0, "age": 0}
    g.local.prec[key] = hit
    return hit


def _lu(A, name: str, context: str):
    try:  # symmetric positive definite: symmetric ordering, no pivoting
        return splu(A, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0, options={"SymmetricMode": True})
    except RuntimeError as exc:  # exactly singular: cannot happen for these SPD matrices
        raise NumericalError(
            f"factorising the preconditioner of {name} failed: {exc}", name=name, context=context
        ) from exc


def _center(v):
    """Remove the common translation (the exact eigenvector of the x precision with eigenvalue alpha)."""
    return v - v.mean(axis=0, keepdims=True)


def _blocks_inv(P):
    P = 0.5 * (P + np.swapaxes(P, 1, 2))
    Lc = np.linalg.cholesky(P)
    inv = np.linalg.inv(P)
    return 0.5 * (inv + np.swapaxes(inv, 1, 2)), 2.0 * float(
        np.sum(np.log(np.diagonal(Lc, axis1=1, axis2=2)))
    )


# --------------------------------------------------------------------------- E-steps
def x_system(Y, g: LLGraph, qc: QC, th: Theta):
    """The x precision given q(C) as (apply, diagonal blocks (N, Q, Q), linear term b (N, Q))."""
    n, D, Q = qc.mean.shape
    M, V = qc.mean, qc.cov
    lt = lt_at(g, th.eps_y, th.gamma)
    gam2 = th.gamma**2
    diag = np.zeros((n, Q, Q))
    Ts = []
    for grp in g.local.groups:
        Lk = lt.vals[grp.pos]
        T = np.einsum("ia,gij,jb->gab", grp.J, Lk, grp.J, optimize=True)
        B = np.einsum("ik,gkdq->gidq", grp.K, M[grp.nb])
        diag[grp.centres] += np.einsum("gij,gidq,gjdr->gqr", Lk, B, B, optimize=True)
        td = np.diagonal(T, axis1=1, axis2=2)  # (G, n)
        contrib = D * td[:, :, None, None] * V[grp.centres][:, None]
        diag += np.asarray(grp.scat @ contrib.reshape(-1, Q * Q)).reshape(n, Q, Q)
        Ts.append(T)
    diag = gam2 * diag + (th.alpha + 2.0 * g.deg)[:, None, None] * np.eye(Q)
    lap = g.local.lap

    def apply(v):
        out = etilde_adj_x(g, M, lt.solve(etilde(g, M, v)))
        for grp, T in zip(g.local.groups, Ts):
            loc = np.einsum("gab,gbq,gqr->gar", T, v[grp.nb], V[grp.centres], optimize=True)
            out += D * np.asarray(grp.scat @ loc.reshape(-1, Q))
        return gam2 * out + th.alpha * v + 2.0 * np.asarray(lap @ v)

    return apply, diag, th.gamma * etilde_adj_x(g, M, Y)


def update_qx(Y, g: LLGraph, qc: QC, th: Theta, x0=None, context: str = ""):
    """q(x) given q(C): means solve the full system, covariances the inverse diagonal blocks."""
    n, D, Q = qc.mean.shape
    M, V = qc.mean, qc.cov
    apply, diag, b = x_system(Y, g, qc, th)
    cov, ld = _blocks_inv(diag)
    # preconditioner: the graph-sparse x precision of the f-term form (eq. 28) with <C_i'C_i>, plus the
    # prior: spectrally close to the likelihood term (both ~ gamma L <C'C>), factorised by SuperLU
    eye = np.eye(Q)

    def build():
        Mc = D * V + np.einsum("ndq,ndr->nqr", M, M)
        Ms = Mc[g.ei] + Mc[g.ej]
        pt = np.asarray(g.inc @ Ms.reshape(len(g.ei), -1)).reshape(n, Q, Q)
        point = th.gamma * pt + (th.alpha + 2.0 * g.deg)[:, None, None] * eye
        return _graph_blocks_csc(g, point, -th.gamma * Ms - 2.0 * eye)

    pre = _cached_lu(g, "x", build, "precision of q(x)", context)
    start = np.zeros((n, Q)) if x0 is None else x0
    mean, it = pcg(apply, b, start, lambda r: pre["lu"].solve(r.reshape(-1)).reshape(n, Q), _center)
    pre["cg"] = it
    E = len(g.ei)
    qx = QX(mean=mean, cov=cov, cov_edge=np.zeros((E, Q, Q)), logdet_prec=ld)
    qx.cg_iters = it
    return qx


def c_system(Y, g: LLGraph, qx: QX, th: Theta):
    """The C row precision given q(x) as (apply on (N, D, Q), diagonal blocks (N, Q, Q), b (N, D, Q))."""
    n, Q = qx.mean.shape
    D = Y.shape[1]
    m, S = qx.mean, qx.cov
    lt = lt_at(g, th.eps_y, th.gamma)
    gam2 = th.gamma**2
    diag = np.zeros((n, Q, Q))
    Rs = []
    for grp in g.local.groups:
        Lk = lt.vals[grp.pos]
        U = np.einsum("ik,gkq->giq", grp.J, m[grp.nb])
        diag[grp.centres] += np.einsum("gij,giq,gjr->gqr", Lk, U, U, optimize=True)
        R = np.einsum("ia,gij,jb->gab", grp.K, Lk, grp.K, optimize=True)
        rd = np.diagonal(R, axis1=1, axis2=2)
        contrib = rd[:, :, None, None] * S[grp.centres][:, None]
        diag += np.asarray(grp.scat @ contrib.reshape(-1, Q * Q)).reshape(n, Q, Q)
        Rs.append(R)
    diag = gam2 * diag + (th.beta * (th.eps_c + 2.0 * g.deg))[:, None, None] * np.eye(Q)
    lap = g.local.lap

    def apply(c):
        out = etilde_adj_c(g, m, lt.solve(etilde(g, c, m)))
        for grp, R in zip(g.local.groups, Rs):
            loc = np.einsum("gkl,gldq,gqr->gkdr", R, c[grp.nb], S[grp.centres], optimize=True)
            out += np.asarray(grp.scat @ loc.reshape(-1, D * Q)).reshape(n, D, Q)
        Lc = np.asarray(lap @ c.reshape(n, D * Q)).reshape(n, D, Q)
        return gam2 * out + th.beta * (th.eps_c * c + 2.0 * Lc)

    return apply, diag, th.gamma * etilde_adj_c(g, m, Y)


def update_qc(Y, g: LLGraph, qx: QX, th: Theta, c0=None, context: str = ""):
    """q(C) given q(x): row means solve the full system (one per output row), covariances the
    inverse diagonal blocks (shared by the D rows)."""
    n, Q = qx.mean.shape
    D = Y.shape[1]
    m, S = qx.mean, qx.cov
    apply, diag, b = c_system(Y, g, qx, th)
    cov, ld = _blocks_inv(diag)
    # preconditioner: the graph-sparse C precision of the f-term form (eq. 28) with <(x_j - x_i)(.)'>
    # (per-point covariances), plus the prior; one SuperLU factor shared by the D rows
    eye = np.eye(Q)

    def build():
        i, j = g.ei, g.ej
        dm = m[j] - m[i]
        Exx = S[i] + S[j] + np.einsum("eq,er->eqr", dm, dm)
        gam_pt = np.asarray(g.inc @ Exx.reshape(len(i), -1)).reshape(n, Q, Q)
        point = th.gamma * gam_pt + (th.beta * (th.eps_c + 2.0 * g.deg))[:, None, None] * eye
        return _graph_blocks_csc(g, point, np.broadcast_to(-2.0 * th.beta * eye, (len(i), Q, Q)))

    pre = _cached_lu(g, "c", build, "precision of q(C)", context)

    def prec(r):
        z = pre["lu"].solve(np.ascontiguousarray(np.swapaxes(r, 1, 2).reshape(n * Q, D)))
        return np.swapaxes(z.reshape(n, Q, D), 1, 2)

    mean, it = pcg(apply, b, prec(b) if c0 is None else c0, prec)
    pre["cg"] = it
    E = len(g.ei)
    qc = QC(mean=mean, cov=cov, cov_edge=np.zeros((E, Q, Q)), logdet_prec=ld)
    qc.cg_iters = it
    return qc


# --------------------------------------------------------------------------- out of sample
#: new points per enlarged graph in ``transform_points``
OOS_BATCH = 2000


def transform_points(Y, g: LLGraph, qx: QX, qc: QC, th: Theta, Ynew, nbr, *, sweeps: int = 50):
    """Out-of-sample E-step in the factorised family (paper 000 section 4.2): the new points of a
    batch join the training graph with edges to their training neighbours ``nbr`` (M, k); the training
    factors and theta stay frozen; q(x*_i) and q(C*_i) per new point by coordinate ascent (CG on the new
    points' block of each system). Returns mean (M, Q), cov (M, Q, Q), C mean (M, D, Q), C cov."""
    outs = [
        _transform_batch(Y, g, qx, qc, th, Ynew[a : a + OOS_BATCH], nbr[a : a + OOS_BATCH], sweeps)
        for a in range(0, len(Ynew), OOS_BATCH)
    ]
    return tuple(np.concatenate([o[t] for o in outs]) for t in range(4))


def _restricted_solve(apply, b, fixed, new, diag_inv, x0):
    """Means of the new rows with the others held at ``fixed``: CG on Lambda_nn v = b_n - Lambda_nt f_t."""
    full = fixed.copy()
    full[new] = 0.0
    rhs = (b - apply(full))[new]

    def op(v):
        z = np.zeros_like(fixed)
        z[new] = v
        return apply(z)[new]

    def prec(r):
        return np.einsum("nqr,n...r->n...q", diag_inv, r)

    return pcg(op, rhs, x0, prec)[0]


def _transform_batch(Y, g, qx, qc, th, Ynew, nbr, sweeps):
    from .operators import prepare_graph

    n, D, Q = qc.mean.shape
    m, k = nbr.shape
    N = n + m
    extra = sp.csr_matrix((np.ones(m * k), (np.repeat(np.arange(n, N), k), nbr.ravel())), shape=(N, N))
    W = (sp.block_diag([g.W, sp.csr_matrix((m, m))]).tocsr() + extra + extra.T).tocsr()
    W.data[:] = 1.0
    ga = prepare_graph(W, "factorised")
    Ya = np.vstack([Y, Ynew])
    new = np.arange(n, N)
    mx = np.vstack([qx.mean, qx.mean[nbr].mean(axis=1)])
    Sx = np.concatenate([qx.cov, np.zeros((m, Q, Q))])
    Cm = np.concatenate([qc.mean, qc.mean[nbr].mean(axis=1)])
    SC = np.concatenate([qc.cov, np.broadcast_to(np.eye(Q), (m, Q, Q))])
    E = len(ga.ei)
    for _ in range(int(sweeps)):
        qxa = QX(mean=mx, cov=Sx, cov_edge=np.zeros((E, Q, Q)), logdet_prec=0.0)
        apply, diag, b = c_system(Ya, ga, qxa, th)
        dinv = np.linalg.inv(diag[new])
        Cm = Cm.copy()
        Cm[new] = _restricted_solve(apply, b, Cm, new, dinv, Cm[new])
        SC = np.concatenate([qc.cov, dinv])
        qca = QC(mean=Cm, cov=SC, cov_edge=np.zeros((E, Q, Q)), logdet_prec=0.0)
        apply, diag, b = x_system(Ya, ga, qca, th)
        dinv = np.linalg.inv(diag[new])
        xn = _restricted_solve(apply, b, mx, new, dinv, mx[new])
        done = np.max(np.abs(xn - mx[new])) <= 1e-10 * (1.0 + np.max(np.abs(xn)))
        mx = mx.copy()
        mx[new] = xn
        Sx = np.concatenate([qx.cov, dinv])
        if done:
            break
    sym = lambda A: 0.5 * (A + np.swapaxes(A, 1, 2))  # noqa: E731
    return mx[new], sym(Sx[new]), Cm[new], sym(SC[new])


# --------------------------------------------------------------------------- likelihood and gamma
@dataclass
class FactStats:
    """gamma-independent parts of <log p(y | x, C)>: ``yy`` = |y|^2, ``trYLY`` = tr(Y'LY), ``lin`` =
    <y' e~>, ``e`` = e~(M, m) (N, D), ``R`` the local covariance weights R^(k) per group."""

    yy: float
    trYLY: float
    lin: float
    e: np.ndarray
    R: list


def lik_stats(Y, g: LLGraph, qx: QX, qc: QC) -> FactStats:
    n, D, Q = qc.mean.shape
    m, S, M, V = qx.mean, qx.cov, qc.mean, qc.cov
    e = etilde(g, M, m)
    Rs = []
    for grp in g.local.groups:
        U = np.einsum("ik,gkq->giq", grp.J, m[grp.nb])
        B = np.einsum("ik,gkdq->gidq", grp.K, M[grp.nb])
        Vc, Sc = V[grp.centres], S[grp.centres]
        R = D * np.einsum("giq,gqr,gjr->gij", U, Vc, U, optimize=True)
        R += np.einsum("gidq,gqr,gjdr->gij", B, Sc, B, optimize=True)
        tau = np.einsum("gqr,gbrq->gb", Vc, S[grp.nb])
        R += D * np.einsum("ia,ga,ja->gij", grp.J, tau, grp.J, optimize=True)
        Rs.append(R)
    return FactStats(
        yy=float(np.sum(Y * Y)),
        trYLY=float(np.sum((Y[g.ei] - Y[g.ej]) ** 2)),
        lin=float(np.sum(Y * e)),
        e=e,
        R=Rs,
    )


def expected_quad(g: LLGraph, st: FactStats, lt: LtAt) -> float:
    """sum_d <e~_d' Lt e~_d> under q(x) q(C)."""
    r = float(np.sum(st.e * lt.solve(st.e)))
    for grp, R in zip(g.local.groups, st.R):
        r += float(np.sum(lt.vals[grp.pos] * R))
    return r


def gauss_loglik(Y, g: LLGraph, th: Theta, st: FactStats, gamma: float | None = None) -> float:
    """<log N(y | Sigma_y e, Sigma_y)> (eqs. 29-31) under the factorised q at ``gamma``."""
    n, D = Y.shape
    gam = th.gamma if gamma is None else float(gamma)
    lt = lt_at(g, th.eps_y, gam)
    return float(
        -0.5 * th.eps_y * st.yy
        - gam * st.trYLY
        + gam * st.lin
        - 0.5 * gam**2 * expected_quad(g, st, lt)
        - 0.5 * n * D * LOG2PI
        + 0.5 * D * lt.logdet
    )


#: the gamma step: central-difference step in log gamma, Newton steps per EM iteration at most, and
#: the step length in log gamma below which it stops
GAMMA_H = 0.02
GAMMA_STEPS = 3
GAMMA_STOP = 1e-2


def update_gamma(Y, g: LLGraph, th: Theta, st: FactStats) -> float:
    """A partial M-step for gamma (generalised EM): safeguarded Newton steps in u = log gamma on the
    exact bound (derivatives by central differences of exact values, each one factorisation and
    selected inversion), until a step is shorter than ``GAMMA_STOP`` or after ``GAMMA_STEPS``.
    <log p(y | x, C)> is concave in gamma, hence unimodal in u; a step that does not raise the bound
    is halved, so the bound never decreases. Over EM iterations gamma reaches the stationary point."""

    def f(u):
        return gauss_loglik(Y, g, th, st, float(np.exp(u)))

    u = float(np.log(th.gamma))
    fu = f(u)
    for _ in range(GAMMA_STEPS):
        h = GAMMA_H
        fp, fm = f(u + h), f(u - h)
        d1, d2 = (fp - fm) / (2 * h), (fp - 2 * fu + fm) / h**2
        if d2 < 0:
            step = float(np.clip(-d1 / d2, -1.0, 1.0))
        else:  # not concave in u here: move to the better neighbour's side
            step = 1.0 if fp > fm else -1.0
        best = max((fu, u), (fp, u + h), (fm, u - h))
        for _ in range(4):  # else keep the best of u, u +- h
            fn = f(u + step)
            if fn >= best[0]:
                best = (fn, u + step)
                break
            step *= 0.5
        moved = abs(best[1] - u)
        u, fu = best[1], best[0]
        if moved < GAMMA_STOP:
            break
    return float(np.exp(u))
