"""GLLE at scale: the covariance-scale study and the embedding eigensolver.

1. Covariance scale (paper 001 section VI-C) on the four manifolds, 5,000 points, k = 10. For each
   dataset, variant and a in (0.01, 0.1, 1, 5, 10): mean / min |Spearman| of the best embedding
   coordinate (any direction: ``lvmcore.metrics.unfolding``) with the manifold parameter over 5
   generations, and the mean Procrustes disparity of the generations to the LLE embedding.

       python bench/glle_scale.py

2. Eigensolver of the embedding (``lvmcore.lle.embed``, Q = 2) on a 3-D swiss roll, k = 10, at
   each n given: M = (I - W)^T (I - W) from the LLE weights is built once and saved; each solver
   then runs in a fresh process (its own peak RSS, an address-space cap so that a solver that
   does not fit fails instead of swapping, and a time cap) and reports wall time, the peak RSS
   above the process's RSS after loading M, the eigenvalues, max_j ||M v_j - lambda_j v_j|| (unit
   v_j) and the largest principal angle of its subspace to the first solver's.

       python bench/glle_scale.py eigen 10000 100000 1000000 [solver ...]
"""

import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
from scipy.spatial import procrustes

from lvmcore.data import synthetic as S
from lvmcore.metrics import unfolding
from lvmcore.models.glle import GLLE

SCALES = (0.01, 0.1, 1, 5, 10)


def main():
    print("dataset method " + " ".join(f"a={a:<5g}" for a in SCALES))
    for name in ("s_curve", "swiss_roll", "swiss_hole", "severed_bowl"):
        Y, lat = getattr(S, name)(5000, seed=0)
        for method in ("em", "direct"):
            m = GLLE(n_components=2, n_neighbors=10, method=method, random_state=0).fit(Y)
            cells = []
            for a in SCALES:
                G = m.sample(5, random_state=1, cov_scale=a)
                r = [unfolding(g, lat[:, 0]) for g in G]
                d = [procrustes(m.lle_embedding_, g)[2] for g in G]
                cells.append(f"{np.mean(r):.3f}/{np.min(r):.3f}/{np.mean(d):.3f}")
            print(name, method, " ".join(cells), flush=True)


# --------------------------------------------------------------------------- eigensolver
#: solvers compared: lvmcore.lle.embed's names, plus the variant with SuperLU ordering the
#: symmetric pattern (MMD on M + M^T) in place of eigsh's default column ordering (COLAMD)
SOLVERS = ("arpack", "arpack_mmd", "lobpcg")
CAP_GB = 6
CAP_S = 600


def _solve(path, solver, out):
    import scipy.sparse as sp
    from scipy.sparse.linalg import LinearOperator, eigsh, splu

    from lvmcore import lle

    resource.setrlimit(resource.RLIMIT_AS, (CAP_GB << 30, CAP_GB << 30))
    d = np.load(path)
    M = sp.csr_matrix((d["data"], d["indices"], d["indptr"]), shape=tuple(d["shape"]))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    if solver == "arpack_mmd":
        n = M.shape[0]
        lu = splu(M.tocsc(), permc_spec="MMD_AT_PLUS_A", options={"SymmetricMode": True})
        op = LinearOperator(M.shape, matvec=lu.solve, dtype=np.float64)
        v0 = np.random.default_rng(0).uniform(-1.0, 1.0, n)
        vals, vecs = eigsh(M, 3, sigma=0.0, OPinv=op, tol=lle.ARPACK_TOL, maxiter=lle.ARPACK_MAXITER, v0=v0)
        o = np.argsort(vals)
        vals, vecs = vals[o][1:], vecs[:, o][:, 1:]
    elif solver == "arpack":
        from scipy.sparse.linalg import eigsh

        v0 = np.random.default_rng(0).uniform(-1.0, 1.0, M.shape[0])
        vals, vecs = eigsh(M, 3, sigma=0.0, tol=lle.ARPACK_TOL, maxiter=lle.ARPACK_MAXITER, v0=v0)
        o = np.argsort(vals)
        vals, vecs = vals[o][1:], vecs[:, o][:, 1:]
    else:
        vals, vecs = lle._lobpcg(M, 2, 0)
    wall = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    vecs = vecs / np.linalg.norm(vecs, axis=0)
    res = np.linalg.norm(M @ vecs - vecs * vals, axis=0)
    np.save(out, vecs)
    print(json.dumps({"wall_s": wall, "rss_mb": (rss - rss0) / 1024, "vals": vals.tolist(),
                      "residual": float(res.max())}))


def eigen(ns, solvers=SOLVERS):
    from scipy.linalg import subspace_angles
    from scipy.spatial import cKDTree
    from sklearn.datasets import make_swiss_roll

    from lvmcore.lle import barycenter_weights, embedding_matrix, weight_matrix

    tmp = tempfile.mkdtemp(prefix="glle_eigen_")
    print("n solver wall_s peak_rss_above_M_MB residual max_angle_to_first eigenvalues", flush=True)
    for n in ns:
        Y, _ = make_swiss_roll(n, random_state=0)
        idx = cKDTree(Y).query(Y, k=11)[1][:, 1:]
        M = embedding_matrix(weight_matrix(barycenter_weights(Y, idx), idx))
        path = os.path.join(tmp, f"M{n}.npz")
        np.savez(path, data=M.data, indices=M.indices, indptr=M.indptr, shape=M.shape)
        del M, Y, idx
        first = None
        for solver in solvers:
            out = os.path.join(tmp, f"v{n}_{solver}.npy")
            try:
                r = subprocess.run(
                    [sys.executable, __file__, "_solve", path, solver, out],
                    capture_output=True, text=True, timeout=CAP_S,
                )
            except subprocess.TimeoutExpired:
                print(n, solver, f"> {CAP_S} s (stopped)", flush=True)
                continue
            if r.returncode != 0:
                err = (r.stderr.strip().splitlines() or ["?"])[-1]
                print(n, solver, f"failed (rc {r.returncode}): {err[:120]}", flush=True)
                continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            V = np.load(out)
            ang = float(np.max(subspace_angles(first, V))) if first is not None else 0.0
            first = V if first is None else first
            print(n, solver, f"{d['wall_s']:.2f} {d['rss_mb']:.0f} {d['residual']:.2e} {ang:.2e}",
                  " ".join(f"{v:.4e}" for v in d["vals"]), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_solve":
        _solve(*sys.argv[2:5])
    elif len(sys.argv) > 1 and sys.argv[1] == "eigen":
        args = sys.argv[2:]
        picked = tuple(a for a in args if not a.isdigit()) or SOLVERS
        eigen([int(a) for a in args if a.isdigit()], picked)
    else:
        main()
