"""GLLE's eigensolver on atlas-like data of high intrinsic dimension: each of ``lvmcore.lle.embed``'s
routes ("dense", "pinned_lu", "auto") per size, its CPU s, wall s, peak RSS and accuracy.

Data (``atlas_like``): bench/data/atlas.py's generator (a branching trajectory, six gene programs,
negative-binomial counts of dispersion 2, log-normal library sizes), drawn densely in blocks for
``GENES`` genes at DENSITY non-zeros per cell, then normalize_total(1e4) + log1p + PCA(50) (the
exact covariance's eigenvectors). The 2 x 10^4-gene atlas took 1,451 s to write at 2 x 10^5 cells;
this keeps its latent construction and noise model at a tenth of the genes and lands at about the
same Levina-Bickel intrinsic dimension (printed with each row). The kNN graph is
``lvmcore.graph.knn``'s "auto" at k = 15 (cached in ``--dir``). ``roll50`` (bench/glle/scale.py's
50-D roll, intrinsic dimension ~5) is the low-dimension control.

Each (data, n, solver) runs in a fresh process (its own peak RSS, ``ru_maxrss``): the LLE weights of
the cached graph, then ``lvmcore.lle.embed`` with that solver; printed are CPU s and wall s of the
solve (they differ for a multi-threaded route, or on a loaded machine), peak RSS, the eigenvalues,
and against the first solver's vectors of the same run the largest principal angle, beside the
eigengap lambda_{q+1} - lambda_q (the same route with one more vector), plus the graph's growth
dimension (hops 1 to 3 of a seeded sample), the input that tells an expander-like graph from a
manifold's. A candidate route is measured by adding it to ``lvmcore.lle.SOLVERS``.

    python -m bench.glle.atlas 20000 50000 100000 200000 --dir /tmp/gdata
    python -m bench.glle.atlas 100000 --data roll50 --dir /tmp/gdata
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

from bench.common import ROOT, module_command

GENES = 2000
DENSITY = 0.5  # non-zeros per cell over genes: Levina-Bickel ~18 at 2 x 10^4 cells (the atlas: 16.4)
K = 15
Q = 2


def atlas_like(n: int, seed: int = 0, genes: int = GENES) -> np.ndarray:
    """(n, 50) PCA scores of bench/data/atlas.py's synthetic atlas at ``genes`` genes (see the
    module docstring): same programs, loadings, base rates (shifted to DENSITY non-zeros per cell),
    library sizes and NB(mu, 2) counts, drawn densely per block of 4,096 cells."""
    from bench.data.atlas import latent_atlas, programs

    rng = np.random.default_rng(seed)
    r = 2.0
    t, branch, state, size, load, base, offset = latent_atlas(rng, n, genes, DENSITY * genes, r)
    X = np.empty((n, genes), dtype=np.float32)
    for a in range(0, n, 4096):
        b = min(a + 4096, n)
        mu = size[a:b, None] * np.exp(offset + base + programs(t[a:b], branch[a:b], state[a:b]) @ load)
        c = rng.poisson(rng.gamma(r, mu / r)).astype(np.float64)
        c *= 1e4 / np.maximum(c.sum(axis=1, keepdims=True), 1.0)
        X[a:b] = np.log1p(c)
    mean = X.mean(axis=0, dtype=np.float64)
    C = np.zeros((genes, genes))
    for a in range(0, n, 16384):
        Xb = X[a : a + 16384].astype(np.float64) - mean
        C += Xb.T @ Xb
    _, V = np.linalg.eigh(C)
    V = V[:, ::-1][:, :50]
    out = np.empty((n, 50))
    for a in range(0, n, 16384):
        out[a : a + 16384] = (X[a : a + 16384].astype(np.float64) - mean) @ V
    return out


def levina_bickel(Y: np.ndarray, k: int = K, sample: int = 5000, seed: int = 0) -> float:
    """Levina-Bickel MLE of the intrinsic dimension from the k nearest neighbours of a seeded
    sample of points (exact distances), averaged as MacKay and Ghahramani do (inverse of the mean
    inverse)."""
    from sklearn.neighbors import NearestNeighbors

    rows = np.random.default_rng(seed).choice(len(Y), min(sample, len(Y)), replace=False)
    d = NearestNeighbors(n_neighbors=k + 1).fit(Y).kneighbors(Y[rows])[0][:, 1:]
    inv = np.mean(np.log(d[:, -1:] / d[:, :-1]), axis=1)
    return float(1.0 / np.mean(inv))


def data(kind: str, n: int, folder: str):
    """(Y, idx) cached in ``folder``: atlas-like or roll50 data and its k = 15 kNN graph."""
    from bench.glle.scale import roll
    from lvmcore.graph import knn

    yp, ip = (os.path.join(folder, f"{x}_{kind}_{n}.npy") for x in ("Y", "idx"))
    if os.path.exists(ip):
        return np.load(yp), np.load(ip)
    Y = atlas_like(n) if kind == "atlas" else roll("roll50", n)[0]
    idx = knn(Y, K)[0]
    np.save(yp, Y)
    np.save(ip, idx)
    return Y, idx


def solve(kind: str, n: int, solver: str, folder: str, out: str) -> None:
    """One solver in this process: Q + 1 vectors (the eigengap's), written to ``out``."""
    from lvmcore import lle

    Y, idx = data(kind, n, folder)
    W = lle.weight_matrix(lle.barycenter_weights(Y, idx), idx)
    c0, t0 = time.process_time(), time.perf_counter()
    emb, vals = lle.embed(W, Q + 1, solver=solver)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    np.save(out, emb)
    print(
        json.dumps(
            {
                "cpu_s": cpu,
                "wall_s": wall,
                "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                "vals": vals.tolist(),
            }
        )
    )


def angle(A: np.ndarray, B: np.ndarray) -> float:
    """Largest principal angle (rad) between the column spaces of A and B."""
    qa, qb = np.linalg.qr(A)[0], np.linalg.qr(B)[0]
    s = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return float(np.arccos(np.clip(s.min(), -1.0, 1.0)))


def row(kind: str, n: int, solvers, folder: str) -> None:
    from lvmcore import lle
    from lvmcore.graph import growth_dimension

    t0 = time.perf_counter()
    Y, idx = data(kind, n, folder)
    made = time.perf_counter() - t0
    W = lle.weight_matrix(lle.barycenter_weights(Y, idx), idx)
    c0 = time.process_time()
    dim = growth_dimension(lle.weight_pattern(W))
    dim_s = time.process_time() - c0
    ref = None
    res = {
        "data": kind,
        "n": n,
        "data_s": round(made, 1),
        "levina_bickel": round(levina_bickel(Y), 2),
        "graph_dimension": round(dim, 2),
        "graph_dimension_cpu_s": round(dim_s, 2),
        "auto": lle.resolve_solver("auto", n),
    }
    for s in solvers:
        out = os.path.join(folder, f"emb_{kind}_{n}_{s}.npy")
        p = subprocess.run(
            module_command("bench.glle.atlas", "--one", kind, str(n), s, "--dir", folder, "--out", out),
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if p.returncode:
            res[s] = {"error": p.stderr[-500:]}
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        emb = np.load(out)
        r["gap"] = r["vals"][Q] - r["vals"][Q - 1]
        if ref is None:
            ref = emb
        else:
            r["angle_rad"] = angle(ref[:, :Q], emb[:, :Q])
        res[s] = r
    print(json.dumps(res), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ns", nargs="*", type=int)
    p.add_argument("--data", default="atlas", choices=("atlas", "roll50"))
    p.add_argument("--solvers", nargs="+", default=["pinned_lu"])
    p.add_argument("--dir", default="/tmp/gdata")
    p.add_argument("--one", nargs=3)
    p.add_argument("--out")
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    if a.one:
        solve(a.one[0], int(a.one[1]), a.one[2], a.dir, a.out)
        return
    for n in a.ns:
        row(a.data, n, a.solvers, a.dir)


if __name__ == "__main__":
    sys.exit(main())
