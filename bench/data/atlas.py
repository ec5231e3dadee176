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
  latent_dim 2; ``--max-iter`` for the iterative models), its own server and cluster; each model's
  done / failed / total grid points read from the store's ``status``.

- ``scanpy_whole`` (``--whole`` only): the ``scanpy`` stage's steps, then ``pp.neighbors``
  (n_neighbors 15) and ``tl.umap``. scanpy 1.11.5's default neighbours route fails with this lock's
  scipy 1.18 above 4,096 cells (``'csr_array' object has no attribute 'getnnz'``); then the stage is
  run again in a fresh process with ``--scanpy-neighbors csr`` (the same pynndescent transformer
  and settings, its results handed back as ``csr_matrix``), the route used is printed and the
  failed try is shown but not counted.

Each stage prints one JSON line; the summary gives wall time and peak RSS per process, and the
ratios ours / scanpy for the preprocessing. Every stage's process tree (the stage, and its Dask
workers, Prefect server, ``embed-sweep`` CLI) is sampled from here every 0.2 s (psutil,
``bench.common.run_sampled``): each process's peak RSS, the peak of their summed RSS, and the
1-minute load average at the stage's start and end.

``--whole``: our whole pipeline against scanpy's on an atlas written before (``--stages gen``),
in one run: ours = ``ours`` + ``knn`` + ``sweep`` with ppca, glle_em, bgplvm_rbf and
hgplvm_bayesian at one grid point each (k = 15, latent_dim 2, seed 0), every model at its DEFAULT
budget (``--max-iter`` ignored) and the default ``--extras chosen``; scanpy = ``scanpy_whole``;
then ``compare``. The sweep builds its own kNN graph (k = 15) again from its inputs, so the
``knn`` stage is counted in ours though the sweep repeats it. Prints each model's done / total
points from the store, a markdown table per stage and the totals ours / scanpy (goal: within
3x), and writes ``whole.json`` beside the atlas.

    python -m bench.data.atlas --cells 20000 --genes 5000 --out /tmp/atlas
    python -m bench.data.atlas --cells 200000 --genes 20000 --out /tmp/atlas-full \
        --stages gen,ours,scanpy,compare
    python -m bench.data.atlas --cells 20000 --genes 5000 --out /tmp/atw20k --stages gen
    python -m bench.data.atlas --cells 20000 --genes 5000 --out /tmp/atw20k --whole
    # the full size (an atlas of 2e5 x 2e4 is at /tmp/hb/atlas/atlas.h5ad on the bench machine):
    # over an hour, GLLE's ten eigensolves alone ~56 CPU min there
    python -m bench.data.atlas --cells 200000 --genes 20000 --out /tmp/hb/atlas --whole
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

from bench.common import ROOT, local_client, module_command, run_sampled

PRE = {"normalize_total": 1e4, "log1p": True, "pca": 50}
#: the sweep of ``--whole``: one grid point per model, each at its default budget
WHOLE_MODELS = "ppca,glle_em,bgplvm_rbf,hgplvm_bayesian"
#: the stages of ``--whole``, in order (the atlas written before by ``--stages gen``)
WHOLE_STAGES = ("ours", "knn", "sweep", "scanpy_whole", "compare")
#: the side of each stage in ``--whole``'s totals
SIDE = {"ours": "ours", "knn": "ours", "sweep": "ours", "scanpy_whole": "scanpy", "scanpy": "scanpy"}
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


def _scanpy_preprocess(a, stage: str):
    """scanpy's read, normalize_total, log1p and pca, each timed; the PCA's scores and variances
    saved for ``compare``. Returns (adata, the stage's record so far, the start time)."""
    import scanpy as sc

    path = str(Path(a.out) / "atlas.h5ad")
    out = {"stage": stage}
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
    np.save(Path(a.out) / "scanpy_pca.npy", np.asarray(adata.obsm["X_pca"], dtype=np.float64))
    np.save(Path(a.out) / "scanpy_ev.npy", np.asarray(adata.uns["pca"]["variance"], dtype=np.float64))
    return adata, out, t0


def scanpy_stage(a) -> dict:
    _, out, t0 = _scanpy_preprocess(a, "scanpy")
    out["wall_s"] = time.perf_counter() - t0
    out["rss_mb"] = {"main": _rss_mb()}
    return out


def csr_transformer(n_obs: int, n_neighbors: int = 15):
    """The transformer scanpy's ``pp.neighbors`` builds by default above 4,096 cells (pynndescent
    with UMAP's ``nearest_neighbors`` settings, random_state 0), except that its results are
    ``scipy.sparse.csr_matrix``: with scipy 1.18 pynndescent hands back a ``csr_array``, on which
    scanpy 1.11.5's ``_ind_dist_shortcut`` fails (``'csr_array' object has no attribute
    'getnnz'``)."""
    import scanpy as sc
    import scipy.sparse as sp
    from pynndescent import PyNNDescentTransformer

    class CsrPyNNDescentTransformer(PyNNDescentTransformer):
        def fit_transform(self, X, y=None, **fit_params):
            return sp.csr_matrix(super().fit_transform(X, y, **fit_params))

        def transform(self, X, y=None):
            return sp.csr_matrix(super().transform(X, y))

    return CsrPyNNDescentTransformer(
        n_neighbors=n_neighbors,
        metric="euclidean",
        metric_kwds={},
        random_state=0,
        n_jobs=sc.settings.n_jobs,
        n_trees=min(64, 5 + round(n_obs**0.5 / 20.0)),
        n_iters=max(5, round(np.log2(n_obs))),
    )


def scanpy_whole(a) -> dict:
    """scanpy's whole pipeline: the ``scanpy`` stage's four steps, then ``pp.neighbors``
    (n_neighbors 15) and ``tl.umap``. ``--scanpy-neighbors default``: scanpy's own route; where it
    fails on the ``getnnz`` error the stage stops there and says ``retry`` (``main`` then runs the
    stage again in a fresh process, numba's compilations not warmed by the failed try, with
    ``--scanpy-neighbors csr``: :func:`csr_transformer`)."""
    import scanpy as sc

    adata, out, t0 = _scanpy_preprocess(a, "scanpy_whole")
    t1 = time.perf_counter()
    if a.scanpy_neighbors == "csr":
        sc.pp.neighbors(adata, n_neighbors=15, transformer=csr_transformer(adata.n_obs, 15))
        out["neighbors_route"] = "PyNNDescentTransformer returning csr_matrix"
    else:
        try:
            sc.pp.neighbors(adata, n_neighbors=15)
            out["neighbors_route"] = "default"
        except AttributeError as e:
            if "getnnz" not in str(e):
                raise
            out["neighbors_default_failed_s"] = time.perf_counter() - t1
            out["neighbors_default_error"] = str(e)[:200]
            out["retry"] = "csr"
            out["wall_s"] = time.perf_counter() - t0
            out["rss_mb"] = {"main": _rss_mb()}
            return out
    out["neighbors_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    sc.tl.umap(adata)
    out["umap_s"] = time.perf_counter() - t1
    out["wall_s"] = time.perf_counter() - t0
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
        WHOLE_MODELS if a.whole else "ppca,glle_em,bgplvm_rbf",
        "--grid",
        '{"k": [15], "latent_dim": [2], "seed": [0]}',
        # --whole: every model at its default budget
        *(
            []
            if a.whole
            else ["--options", json.dumps({m: {"max_iter": a.max_iter} for m in ("glle", "bgplvm")})]
        ),
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
        "points": store_points(out / "atlas.zarr"),
        "tail": tail,
        "rss_mb": {"largest_child": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024},
    }


def store_points(store: Path) -> dict:
    """Each model's grid points in the sweep's store: {model: {"done", "failed", "total"}} (read
    from its ``status``), or {"store": why} where the store cannot be read."""
    from tasks.store.schema import STATUS_DONE, STATUS_FAILED

    try:
        import zarr

        root = zarr.open_group(str(store), mode="r")
        keys = json.loads(root.attrs.get("groups") or "null") or list(root.group_keys())
        out = {}
        for key in keys:
            st = np.asarray(root[key]["status"][...])
            out[key] = {
                "done": int((st == STATUS_DONE).sum()),
                "failed": int((st == STATUS_FAILED).sum()),
                "total": int(st.size),
            }
        return out
    except Exception as e:  # no store: the sweep stopped before setting it up
        return {"store": f"not readable ({type(e).__name__}: {e})"}


STAGES = {
    "gen": gen,
    "ours": ours,
    "scanpy": scanpy_stage,
    "scanpy_whole": scanpy_whole,
    "compare": compare,
    "knn": knn_stage,
    "sweep": sweep,
}


def _mb(x: float) -> str:
    return f"{x:,.0f}"


def _load(r: dict) -> str:
    return f"{r['load_start'][0]:.1f} -> {r['load_end'][0]:.1f}"


def whole_summary(results: dict, runs: dict, bench_wall: float) -> list[str]:
    """``--whole``'s summary as markdown lines: one row per stage (process wall, the stage's own
    wall, the largest process's peak RSS, the peak of the summed RSS of its process tree, the load
    average), then ours against scanpy."""
    lines = [
        "| stage | side | wall s (process) | wall s (stage's own) | largest process peak RSS MB "
        "| peak of summed RSS MB (processes) | load 1-min start -> end |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    tot = {"ours": [0.0, 0.0, 0.0], "scanpy": [0.0, 0.0, 0.0]}  # process wall, own wall, peak sum
    for stage, r in runs.items():
        side = SIDE.get(stage)
        own = results.get(stage, {}).get("wall_s", float("nan"))
        tree = r["tree"]
        big = max((q["peak_mb"] for q in tree["processes"]), default=float("nan"))
        lines.append(
            f"| {stage} | {side or '-'} | {r['wall_s']:.1f} | {own:.1f} | {_mb(big)} "
            f"| {_mb(tree['peak_sum_mb'])} ({tree['peak_sum_processes']}) | {_load(r)} |"
        )
        if side:
            t = tot[side]
            t[0] += r["wall_s"]
            t[1] += own
            t[2] = max(t[2], tree["peak_sum_mb"])
    o, s = tot["ours"], tot["scanpy"]
    points = results.get("sweep", {}).get("points", {})
    done = (
        bool(points)
        and all(isinstance(v, dict) and v["done"] == v["total"] for v in points.values())
        and results.get("sweep", {}).get("rc") == 0
    )
    per_model = ", ".join(
        f"{k} {v['done']}/{v['total']}" if isinstance(v, dict) else f"{k}: {v}" for k, v in points.items()
    )
    route = results.get("scanpy_whole", {}).get("neighbors_route", "-")
    lines += [
        "",
        "| | ours | scanpy | ours / scanpy |",
        "|---|---:|---:|---:|",
        f"| total wall s (stage processes, start-up included) |"
        f" {o[0]:.1f} | {s[0]:.1f} | **{o[0] / s[0]:.2f}** |",
        f"| total wall s (the stages' own clocks) | {o[1]:.1f} | {s[1]:.1f} | {o[1] / s[1]:.2f} |",
        f"| peak of summed RSS, largest stage, MB | {_mb(o[2])} | {_mb(s[2])} | {o[2] / s[2]:.2f} |",
        f"| every point done | {'yes' if done else 'NO'} ({per_model or 'no store'}) | - | |",
        f"| scanpy's neighbors route | | {route} | |",
        "",
        f"ours / scanpy {o[0] / s[0]:.2f}x the wall time (goal: within 3x; {o[0] / s[0] / 2:.2f}x a 2x "
        f"target); bench wall time {bench_wall:.1f} s.",
    ]
    return lines


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
    p.add_argument(
        "--scanpy-neighbors",
        default="default",
        choices=["default", "csr"],
        help="scanpy_whole's pp.neighbors route: scanpy's default (retried as csr where it fails on "
        "getnnz), or a PyNNDescentTransformer returning csr_matrix",
    )
    p.add_argument("--stages", default="gen,ours,scanpy,compare,knn,sweep")
    p.add_argument(
        "--whole",
        action="store_true",
        help="our whole pipeline (ours, knn, the sweep of " + WHOLE_MODELS + " at default budgets) "
        "against scanpy's (read .. pca, neighbors, umap) on an atlas written before; ignores --stages",
    )
    p.add_argument("--stage", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.stage:
        print(json.dumps(STAGES[a.stage](a)), flush=True)
        return
    Path(a.out).mkdir(parents=True, exist_ok=True)
    stages = list(WHOLE_STAGES) if a.whole else a.stages.split(",")
    if a.whole and not (Path(a.out) / "atlas.h5ad").exists():
        sys.exit(f"--whole: no {Path(a.out) / 'atlas.h5ad'}; write it first with --stages gen")
    t0 = time.perf_counter()
    results, runs = {}, {}
    todo = [(stage, stage, ()) for stage in stages]  # (stage, the name it is recorded under, more flags)
    while todo:
        stage, name, more = todo.pop(0)
        rest, skip = [], False
        for x in sys.argv[1:]:  # every flag but --stages
            if skip or x.startswith("--stages="):
                skip = False
                continue
            if x == "--stages":
                skip = True
                continue
            rest.append(x)
        argv = module_command(__spec__.name, "--stage", stage, *rest, *more)
        r = run_sampled(argv, cwd=ROOT)  # its process tree's RSS sampled every 0.2 s
        line = [ln for ln in r["stdout"].splitlines() if ln.startswith("{")]
        if r["rc"] or not line:
            print(f"stage {stage} failed (exit {r['rc']}):\n{r['stderr'][-3000:]}", flush=True)
            break
        rec = json.loads(line[-1])
        if rec.get("retry") == "csr":  # scanpy's default neighbors route failed: a fresh process, csr
            name = f"{stage} (default neighbors: failed)"
            todo.insert(0, (stage, stage, ("--scanpy-neighbors", "csr")))
        results[name], runs[name] = rec, r
        stage = name
        rss = ", ".join(f"{k} {v:,.0f}" for k, v in results[stage]["rss_mb"].items())
        extra = {k: v for k, v in results[stage].items() if k not in ("stage", "wall_s", "rss_mb")}
        tree = r["tree"]
        procs = ", ".join(f"{q['role']} {q['peak_mb']:,.0f}" for q in tree["processes"])
        print(
            f"{stage:8s} {results[stage]['wall_s']:9.1f} s (process {r['wall_s']:.1f} s, load "
            f"{_load(r)})   peak RSS MB: {rss}   sampled: {procs}; peak of the sum "
            f"{tree['peak_sum_mb']:,.0f} ({tree['peak_sum_processes']} processes)   {json.dumps(extra)}",
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
    wall = time.perf_counter() - t0
    if a.whole and all(st in results for st in ("ours", "knn", "sweep", "scanpy_whole")):
        lines = whole_summary(results, runs, wall)
        print("\n".join(["", *lines]), flush=True)
        record = {
            "cells": a.cells,
            "genes": a.genes,
            "results": results,
            "runs": {
                k: {x: v for x, v in r.items() if x not in ("stdout", "stderr")} for k, r in runs.items()
            },
            "bench_wall_s": wall,
            "summary": lines,
        }
        (Path(a.out) / "whole.json").write_text(json.dumps(record, indent=1))
    print(f"bench wall time: {wall:.1f} s", flush=True)


if __name__ == "__main__":
    main()
