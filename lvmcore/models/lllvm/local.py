"""The graph structures of the per-point factorised variational family (``solver="factorised"``):
closed neighbourhoods grouped by size and the distance-<=2 pattern on which it needs Lt.

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

from lvmcore.sparse_chol import LevelStructure


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


def local_structure(
    W: sp.csr_matrix, degree: np.ndarray, ei: np.ndarray, ej: np.ndarray, ls: LevelStructure
) -> Local:
    """Closed neighbourhoods and the distance-<=2 pattern of the graph (built once per fit): W the
    (N, N) 0/1 adjacency, ``degree`` its degrees (N,), ``ei``, ``ej`` its edges i < j (E,), ``ls``
    its BFS level structure."""
    n = W.shape[0]
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
    E = len(ei)
    sinc = sp.csr_matrix(
        (np.concatenate([np.ones(E), -np.ones(E)]), (np.concatenate([ei, ej]), np.tile(np.arange(E), 2))),
        shape=(n, E),
    )
    lap = (sp.diags(degree) - W).tocsr()
    return Local(groups=groups, pr=pr, pc=pc, slices=slices, sinc=sinc, lap=lap, memo={}, prec={})
