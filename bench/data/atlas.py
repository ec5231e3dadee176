"""A synthetic single-cell atlas through the pipeline, stage by stage, beside scanpy (issue 33).

The atlas: negative-binomial counts (dispersion 2) over a branching trajectory (a trunk splitting
into two branches; six gene programs: trunk, two branches, a cycle, pseudotime, a cell state),
gene base rates log-normal and shifted so a cell has about ``--nnz`` non-zero genes, library size
log-normal. Written as a sparse (CSR) .h5ad in blocks: no cells x genes dense matrix is ever held.

Stages, each in a fresh process (its own peak RSS; the Dask workers' peaks read on the workers):

- ``gen``: write the atlas.
- ``ours``: describe (the plan: obs read, the file hashed) and the ingest task on a 2-worker
  LocalCluster (one thread each), as the sweep runs it: normalize_total(1e4) + log1p + PCA(50)
  streamed over the file's row blocks on the cluster (``--solver``: auto = arpack above 2,000
  genes), written to data.zarr.
- ``scanpy``: ``sc.read_h5ad``, ``pp.normalize_total(target_sum=1e4)``, ``pp.log1p``,
  ``pp.pca(n_comps=50, mask_var=None)`` (scanpy's defaults: ARPACK on the implicitly centred
  sparse matrix, in the file's float32; ``--scanpy-dtype float64``: X cast to float64 after
  the read, for its float64 answer), each timed; the anchor.
- ``compare``: the largest principal angle between the two 50-D score subspaces and the relative
  difference of the explained variances.
- ``knn``: the sweep's kNN graph (tasks.knn.build_graph, k = 15) on the ingested data.
- ``sweep``: ``embed-sweep run`` on the ingested data with ppca, glle_em, bgplvm_rbf (k = 15,
  latent_dim 2; ``--max-iter`` for the iterative models), its own server and cluster.

Each stage prints one JSON line; the summary gives wall time and peak RSS per process, and the
ratios ours / scanpy for the preprocessing.

    python -m bench.data.atlas --cells 20000 --genes 5000 --out /tmp/atlas
    python -m bench.data.atlas --cells 200000 --genes 20000 --out /tmp/atlas-full \
        --stages gen,ours,scanpy,compare
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import ROOT, local_client, module_command

PRE = {"normalize_total": 1e4, "log1p": True, "pca": 50}
BLOCK = 2000


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def programs(t, branch, state):
    return np.column_stack(
        [
            np.clip(1 - t / 0.3, 0, 1),
            np.where(branch == 1, np.clip((t - 0.3) / 0.7, 0, 1), 0),
            np.where(branch == 2, np.clip((t - 0.3) / 0.7, 0, 1), 0),
            np.sin(2 * np.pi * t),
            t,
            state,
        ]
    )


def _nonzero_counts(rng, mu, r):
    """Counts of NB(mean mu, dispersion r) conditioned on being positive (one per entry of mu,
    float64). mu > 2: Poisson(Gamma(r, mu / r)) draws, zeros drawn again (each is kept with
    probability above 3/4). mu <= 2: inversion of the conditional CDF with one uniform, the pmf by
    its recurrence P(k + 1) = P(k) (k + r) / (k + 1) * mu / (r + mu) (ratio below 1/2: a few
    dozen steps)."""
    out = np.empty(len(mu), dtype=np.float64)
    big = mu > 2
    todo = np.flatnonzero(big)
    while len(todo):
        c = rng.poisson(rng.gamma(r, mu[todo] / r))
        out[todo] = c
        todo = todo[c == 0]
    idx = np.flatnonzero(~big)
    m = mu[idx]
    p = m / (r + m)
    p0 = (1 - p) ** r
    u = p0 + rng.random(len(idx)) * (1 - p0)  # uniform over the positive counts' share of the CDF
    pk = p0 * r * p  # P(1)
    cdf = p0 + pk
    k = np.ones(len(idx))
    live = np.flatnonzero(u >= cdf)
    for _ in range(200):  # P(count > 200 | mu <= 2) < 1e-55
        if not len(live):
            break
        k[live] += 1
        pk[live] *= (k[live] - 1 + r) / k[live] * p[live]
        cdf[live] += pk[live]
        live = live[u[live] >= cdf[live]]
    out[idx] = k
    return out


def latent_atlas(rng, n: int, genes: int, nnz: float, r: float = 2.0):
    """The atlas's latent construction for n cells and ``genes`` genes, drawn from ``rng`` in this
    order: pseudotime t, branch, a cell-state score, library sizes, the six programmes' loadings and
    the genes' base rates; then the base-rate shift (bisection on a 300-cell pilot) that gives about
    ``nnz`` non-zeros per cell under NB(mu, r). Returns (t, branch, state, size, load, base, offset)."""
    t = rng.uniform(0, 1, n)
    branch = np.where(t < 0.3, 0, rng.integers(1, 3, n))
    state = rng.normal(size=n)
    size = rng.lognormal(0, 0.3, n)
    load = rng.normal(0, 1.2, (6, genes)) * (rng.uniform(size=(6, genes)) < 0.3)
    base = rng.normal(0, 1.5, genes)
    pilot = rng.choice(n, min(n, 300), replace=False)
    mu_pilot = size[pilot, None] * np.exp(base + programs(t[pilot], branch[pilot], state[pilot]) @ load)

    def nnz_per_cell(offset):
        return float(np.mean(np.sum(1 - np.square(r / (r + np.exp(offset) * mu_pilot)), axis=1)))

    lo, hi = -20.0, 10.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if nnz_per_cell(mid) < nnz else (lo, mid)
    return t, branch, state, size, load, base, (lo + hi) / 2


def gen(a) -> dict:
    """The atlas, written in row blocks of BLOCK cells straight into a CSR .h5ad. Per block only
    the zero / non-zero pattern is drawn densely (float32: the NB zero probability
    (r / (r + mu))^r against one uniform per entry); the values of the ~7% non-zero entries are
    then drawn from the NB conditioned on being positive (:func:`_nonzero_counts`), with mu in
    float64: together, NB(mu, r) counts entry by entry."""
    import anndata as ad
    import h5py
    import pandas as pd

    t0 = time.perf_counter()
    rng = np.random.default_rng(a.seed)
    N, G, r = a.cells, a.genes, 2.0
    t, branch, state, size, load, base, offset = latent_atlas(rng, N, G, a.nnz, r)
    # log mu = [programs, 1, log size] @ [load; base + offset; 1]: one matrix product per block
    L = np.vstack([load, base + offset, np.ones(G)])
    L32 = L.astype(np.float32)
    obs = pd.DataFrame(
        {"pseudotime": t, "branch": pd.Categorical(np.array(["trunk", "branch1", "branch2"])[branch])},
        index=[f"cell{i}" for i in range(N)],
    )
    var = pd.DataFrame(index=[f"gene{j}" for j in range(G)])
    path = Path(a.out) / "atlas.h5ad"
    ad.AnnData(obs=obs, var=var).write_h5ad(path)
    nnz = 0
    indptr = np.zeros(N + 1, dtype=np.int64)
    buf_q = np.empty((min(BLOCK, N), G), dtype=np.float32)
    buf_u, buf_hit = np.empty_like(buf_q), np.empty(buf_q.shape, dtype=bool)
    with h5py.File(path, "r+") as f:
        if "X" in f:
            del f["X"]
        X = f.create_group("X")
        X.attrs.update(
            {"encoding-type": "csr_matrix", "encoding-version": "0.1.0", "shape": np.array([N, G])}
        )
        data = X.create_dataset("data", (0,), dtype=np.float32, maxshape=(None,), chunks=(1 << 18,))
        indices = X.create_dataset("indices", (0,), dtype=np.int32, maxshape=(None,), chunks=(1 << 18,))
        for a0 in range(0, N, BLOCK):
            b0 = min(a0 + BLOCK, N)
            P = np.column_stack(
                [programs(t[a0:b0], branch[a0:b0], state[a0:b0]), np.ones(b0 - a0), np.log(size[a0:b0])]
            )
            nb = b0 - a0
            q, u, hit = buf_q[:nb], buf_u[:nb], buf_hit[:nb]  # reused: no page faults per block
            np.matmul(P.astype(np.float32), L32, out=q)  # log mu
            np.exp(q, out=q)
            np.add(q, np.float32(r), out=q)
            np.divide(np.float32(r), q, out=q)  # r / (r + mu)
            np.square(q, out=q)  # P(count = 0), r = 2
            rng.random(out=u, dtype=np.float32)
            np.greater_equal(u, q, out=hit)
            rows, cols = np.nonzero(hit)  # row-major: CSR order
            mu = np.exp(np.einsum("ij,ji->i", P[rows], L[:, cols]))
            counts = _nonzero_counts(rng, mu, r).astype(np.float32)
            k = len(rows)
            data.resize((nnz + k,))
            indices.resize((nnz + k,))
            data[nnz:] = counts
            indices[nnz:] = cols.astype(np.int32)
            indptr[a0 + 1 : b0 + 1] = nnz + np.cumsum(np.bincount(rows, minlength=b0 - a0))
            nnz += k
        # int32 offsets where they fit, as scipy makes them (scikit-learn wants indices and indptr alike)
        X.create_dataset("indptr", data=indptr.astype(np.int32 if nnz < 2**31 else np.int64))
    return {
        "stage": "gen",
        "wall_s": time.perf_counter() - t0,
        "rss_mb": {"main": _rss_mb()},
        "nnz_per_cell": nnz / N,
        "file_mb": path.stat().st_size / 2**20,
    }


def ours(a) -> dict:
    from lvmcore.data import describe
    from tasks.ingest import ingest_dataset

    path = str(Path(a.out) / "atlas.h5ad")
    pre = dict(PRE, pca_solver=a.solver)
    spec = {"path": path, "preprocess": pre}
    data_path = str(Path(a.out) / "data.zarr")
    import shutil

    for old in ("data.zarr", "graph.zarr"):  # measure the work, never a reuse of an earlier run's
        shutil.rmtree(Path(a.out) / old, ignore_errors=True)
    t0 = time.perf_counter()
    fp = describe(path, preprocess=pre)["fingerprint"]
    t_plan = time.perf_counter() - t0
    with local_client(2) as client:
        t1 = time.perf_counter()
        client.submit(ingest_dataset, spec, data_path, fp, pure=False).result()
        t_ingest = time.perf_counter() - t1
        workers = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    import xarray as xr

    ds = xr.open_zarr(data_path, consolidated=False)
    rec = json.loads(ds.attrs["preprocess"])["X"]
    np.save(Path(a.out) / "ours_ev.npy", np.asarray(rec["explained_variance"]))
    rss = {"main": _rss_mb(), **{f"worker{i}": v for i, v in enumerate(workers.values())}}
    return {
        "stage": "ours",
        "wall_s": t_plan + t_ingest,
        "plan_s": t_plan,
        "ingest_preprocess_s": t_ingest,
        "solver": rec["solver"],
        "rss_mb": rss,
    }


def scanpy_stage(a) -> dict:
    import scanpy as sc

    path = str(Path(a.out) / "atlas.h5ad")
    out = {"stage": "scanpy"}
    t0 = time.perf_counter()
    adata = sc.read_h5ad(path)
    if a.scanpy_dtype == "float64":  # scanpy computes in X's dtype (pp.pca's dtype casts its result)
        adata.X = adata.X.astype(np.float64)
    out["read_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    sc.pp.normalize_total(adata, target_sum=1e4)
    out["normalize_total_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    sc.pp.log1p(adata)
    out["log1p_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    sc.pp.pca(adata, n_comps=50, mask_var=None, dtype=a.scanpy_dtype)
    out["pca_s"] = time.perf_counter() - t1
    out["wall_s"] = time.perf_counter() - t0
    np.save(Path(a.out) / "scanpy_pca.npy", np.asarray(adata.obsm["X_pca"], dtype=np.float64))
    np.save(Path(a.out) / "scanpy_ev.npy", np.asarray(adata.uns["pca"]["variance"], dtype=np.float64))
    out["rss_mb"] = {"main": _rss_mb()}
    return out


def compare(a) -> dict:
    import xarray as xr
    from scipy.linalg import subspace_angles

    Y = xr.open_zarr(Path(a.out) / "data.zarr", consolidated=False)["Y"].values
    S = np.load(Path(a.out) / "scanpy_pca.npy")
    ang = subspace_angles(Y, S)
    ev_o, ev_s = np.load(Path(a.out) / "ours_ev.npy"), np.load(Path(a.out) / "scanpy_ev.npy")
    top = {q: float(subspace_angles(Y[:, :q], S[:, :q]).max()) for q in (10, 20, 30, 40, 50)}
    return {
        "stage": "compare",
        "max_angle_50": float(ang.max()),
        "max_angle_top_q": top,
        "ev_rel_max": float(np.max(np.abs(ev_o / ev_s - 1))),
        "wall_s": 0.0,
        "rss_mb": {"main": _rss_mb()},
    }


def knn_stage(a) -> dict:
    from tasks.knn import build_graph

    t0 = time.perf_counter()
    build_graph(str(Path(a.out) / "data.zarr"), 15, str(Path(a.out) / "graph.zarr"), "auto")
    return {"stage": "knn", "wall_s": time.perf_counter() - t0, "rss_mb": {"main": _rss_mb()}}


def sweep(a) -> dict:
    out = Path(a.out) / "sweep"
    cmd = [
        str(ROOT / ".venv" / "bin" / "embed-sweep"),
        "run",
        "--dataset",
        str(Path(a.out) / "data.zarr"),
        "--models",
        "ppca,glle_em,bgplvm_rbf",
        "--grid",
        '{"k": [15], "latent_dim": [2], "seed": [0]}',
        "--options",
        json.dumps({"glle": {"max_iter": a.max_iter}, "bgplvm": {"max_iter": a.max_iter}}),
        "--out",
        str(out),
        "--store",
        "atlas.zarr",
        "--no-report",
        "--replace",
    ]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    tail = (p.stdout + p.stderr).strip().splitlines()[-6:]
    return {
        "stage": "sweep",
        "wall_s": wall,
        "rc": p.returncode,
        "tail": tail,
        "rss_mb": {"largest_child": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024},
    }


STAGES = {
    "gen": gen,
    "ours": ours,
    "scanpy": scanpy_stage,
    "compare": compare,
    "knn": knn_stage,
    "sweep": sweep,
}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", type=int, default=200_000)
    p.add_argument("--genes", type=int, default=20_000)
    p.add_argument("--nnz", type=float, default=1500, help="non-zero genes per cell (about)")
    p.add_argument("--out", default="/tmp/atlas")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--solver", default="auto", choices=["auto", "covariance", "lanczos", "arpack", "randomized"]
    )
    p.add_argument(
        "--scanpy-dtype",
        default="float32",
        help="scanpy's pp.pca dtype (its default float32; float64 to compare)",
    )
    p.add_argument("--max-iter", type=int, default=100, help="glle_em and bgplvm_rbf iterations in the sweep")
    p.add_argument("--stages", default="gen,ours,scanpy,compare,knn,sweep")
    p.add_argument("--stage", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.stage:
        print(json.dumps(STAGES[a.stage](a)), flush=True)
        return
    Path(a.out).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = {}
    for stage in a.stages.split(","):
        rest, skip = [], False
        for x in sys.argv[1:]:  # every flag but --stages
            if skip or x.startswith("--stages="):
                skip = False
                continue
            if x == "--stages":
                skip = True
                continue
            rest.append(x)
        argv = module_command(__spec__.name, "--stage", stage, *rest)
        r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.returncode or not line:
            print(f"stage {stage} failed (exit {r.returncode}):\n{r.stderr[-3000:]}", flush=True)
            break
        results[stage] = json.loads(line[-1])
        rss = ", ".join(f"{k} {v:,.0f}" for k, v in results[stage]["rss_mb"].items())
        extra = {k: v for k, v in results[stage].items() if k not in ("stage", "wall_s", "rss_mb")}
        print(
            f"{stage:8s} {results[stage]['wall_s']:9.1f} s   peak RSS MB: {rss}   {json.dumps(extra)}",
            flush=True,
        )
    if "ours" in results and "scanpy" in results:
        o, s = results["ours"], results["scanpy"]
        s_pre = s["normalize_total_s"] + s["log1p_s"] + s["pca_s"]
        print(
            f"preprocessing time ours / scanpy: {o['ingest_preprocess_s'] / s_pre:.2f} (scanpy without its "
            f"read: {s_pre:.1f} s; with: {s['wall_s']:.1f} s; ours {o['ingest_preprocess_s']:.1f} s + plan "
            f"{o['plan_s']:.1f} s); largest process peak RSS ours / scanpy: "
            f"{max(o['rss_mb'].values()) / s['rss_mb']['main']:.2f}"
        )
    print(f"bench wall time: {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
