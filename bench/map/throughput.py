"""Cells per second and peak resident memory of mapping query cells onto a fitted reference, per
model (tasks.results.mapping.map_cells in chunks of ``--chunk`` cells: what each Dask task of the
flow embed-sweep-map runs), beside scanpy's ``tl.ingest`` (PCA + UMAP, labels by its kNN) on the
same data in the same run. The data: ``--n`` reference and ``--n`` query cells drawn from one
Gaussian mixture of 10 clusters in 50 dimensions (the width of a PCA representation), labels the
clusters. The model fits are not timed (the sweep's); the reference scores' median / MAD are.

    .venv/bin/python -m bench.map.throughput [--n 100000] [--models ppca,bgplvm_rbf]

One core (bench/common.py): the fits, the maps and ingest each run on it. Peak RSS is this
process's high-water mark over each step (bench.common.reset_peak / status_mb)."""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.common import pin_one_core, reset_peak, status_mb


def mixture(n, d=50, k=10, seed=0):
    """``n`` reference and ``n`` query cells of one mixture (the same clusters), with their labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(k, d))
    scales = rng.uniform(0.5, 1.5, size=(k, d))
    lab = rng.integers(0, k, 2 * n)
    Y = centres[lab] + rng.normal(size=(2 * n, d)) * scales[lab]
    return Y[:n], lab[:n], Y[n:], lab[n:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--models", default="ppca,bgplvm_rbf")
    ap.add_argument("--latent-dim", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=2000)
    ap.add_argument("--options", default='{"bgplvm_rbf": {"n_inducing": 50, "max_iter": 200}}')
    a = ap.parse_args()
    print(f"on core {pin_one_core()}")
    import json

    from tasks.registry import MODELS
    from tasks.results.mapping import chunks, join, map_cells, transfer_labels

    Yr, lr, Yq, lq = mixture(a.n)
    opts = json.loads(a.options)
    for key in a.models.split(","):
        spec = MODELS[key]
        est = spec.estimator_class()(
            **spec.constructor_args({"latent_dim": a.latent_dim, "seed": 0}, opts.get(key, {}))
        )
        t0 = time.perf_counter()
        est.fit(Yr)
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        est.reference_score_stats(Yr)
        ref_s = time.perf_counter() - t0
        reset_peak()
        t0 = time.perf_counter()
        got = join([map_cells(est, Yq[i:j]) for i, j in chunks(len(Yq), a.chunk)])
        cat, _ = transfer_labels(est.embedding_, lr, [str(c) for c in range(10)], got["mean"])
        dt = time.perf_counter() - t0
        acc = float((np.asarray(cat).astype(int) == lq).mean())
        print(
            f"{key}: {a.n / dt:,.0f} cells/s ({dt:.1f} s for {a.n:,} query cells, labels included), "
            f"peak RSS {status_mb():,.0f} MiB, label accuracy {acc:.3f}; fit {fit_s:.1f} s, reference "
            f"scores {ref_s:.1f} s",
            flush=True,
        )
    ingest(Yr, lr, Yq, lq, a.n)


def ingest(Yr, lr, Yq, lq, n):
    import anndata as ad
    import pandas as pd
    import scanpy as sc
    import scipy.sparse as sp

    if not hasattr(sp.csr_array, "getnnz"):  # scanpy 1.11's neighbours call it; SciPy 1.18 dropped it
        sp.csr_array.getnnz = lambda self, axis=None: self._getnnz(axis=axis)
    import pynndescent.rp_trees as rpt

    make_forest = rpt.make_forest

    def forest(data, n_neighbors, n_trees, *rest):  # scanpy 1.11's ingest passes pynndescent 0.5's
        if n_trees is None:  # n_search_trees, None by default: NNDescent's own default count
            n_trees = min(64, 5 + int(round(data.shape[0] ** 0.5 / 20.0)))
        return make_forest(data, n_neighbors, n_trees, *rest)

    rpt.make_forest = forest

    ref = ad.AnnData(Yr.astype(np.float32), obs=pd.DataFrame({"label": pd.Categorical(lr.astype(str))}))
    qry = ad.AnnData(Yq.astype(np.float32))
    t0 = time.perf_counter()
    sc.pp.pca(ref, n_comps=30)
    sc.pp.neighbors(ref)
    sc.tl.umap(ref)
    prep = time.perf_counter() - t0
    reset_peak()
    t0 = time.perf_counter()
    sc.tl.ingest(qry, ref, obs="label", embedding_method=["umap", "pca"])
    dt = time.perf_counter() - t0
    acc = float((qry.obs["label"].astype(int).to_numpy() == lq).mean())
    print(
        f"scanpy tl.ingest (PCA + UMAP): {n / dt:,.0f} cells/s ({dt:.1f} s), "
        f"peak RSS {status_mb():,.0f} MiB, "
        f"label accuracy {acc:.3f}; the reference's PCA + neighbours + UMAP {prep:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
