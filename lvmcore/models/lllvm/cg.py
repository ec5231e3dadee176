"""The linear algebra of the factorised solver's E-steps: preconditioned CG for the means (applied
matrix-free), the SuperLU preconditioners it reuses across E-steps, and the per-point block inverses
that are the factorised covariances.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import splu

from lvmcore.linalg import NumericalError

from .operators import LLGraph

#: relative residual at which the CG solves of the E-steps stop (warm-started from the last means)
CG_RTOL = 1e-8
#: CG iterations per E-step at most (each is one solve with eps_y I + 2 gamma L)
CG_MAXITER = 1000


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


def graph_blocks_csc(g: LLGraph, point: np.ndarray, edge: np.ndarray) -> sp.csc_matrix:
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


def cached_lu(g: LLGraph, key: str, build, name: str, context: str):
    """The cached SuperLU factor of the ``key`` preconditioner, rebuilt by ``build()`` when stale."""
    hit = g.local.prec.get(key)
    if hit is not None and hit["cg"] <= PREC_MAX_CG and hit["age"] < PREC_MAX_AGE:
        hit["age"] += 1
        return hit
    hit = {"lu": _lu(build(), name, context), "cg": 0, "age": 0}
    g.local.prec[key] = hit
    return hit


def spd_lu(A, name: str, context: str = ""):
    """SuperLU factor of a sparse symmetric positive definite matrix A (symmetric fill-reducing
    ordering, no pivoting; ``.solve`` applies A^{-1}), as the preconditioners are factorised."""
    return _lu(sp.csc_matrix(A), name, context)


def _lu(A, name: str, context: str):
    try:  # symmetric positive definite: symmetric ordering, no pivoting
        return splu(A, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0, options={"SymmetricMode": True})
    except RuntimeError as exc:  # exactly singular: cannot happen for these SPD matrices
        raise NumericalError(
            f"factorising the preconditioner of {name} failed: {exc}", name=name, context=context
        ) from exc


def inverse_blocks(P):
    """Inverses (symmetrised) of the SPD blocks P (N, Q, Q) and the sum of their log-determinants
    (the covariances of a factorised q from the diagonal blocks of its precision)."""
    P = 0.5 * (P + np.swapaxes(P, 1, 2))
    Lc = np.linalg.cholesky(P)
    inv = np.linalg.inv(P)
    return 0.5 * (inv + np.swapaxes(inv, 1, 2)), 2.0 * float(
        np.sum(np.log(np.diagonal(Lc, axis1=1, axis2=2)))
    )
