"""Cells per second and peak resident memory of mapping query cells onto a fitted reference, per
model, beside scanpy's ``tl.ingest`` (PCA + UMAP, labels by its kNN) on the same cells in the same
run, and the ratio of each model's cells/s to ingest's.

The data: the synthetic count atlas of bench.data.atlas (``--atlas``: its ``atlas.h5ad``, made by
``python -m bench.data.atlas --stages gen``: a branching trajectory, negative-binomial counts),
normalised to 10^4 counts per cell and log1p'd; a seeded half of the cells is the reference, the
other half the query. The reference's PCA (scanpy ``pp.pca``, 50 components) gives the models'
50-D input, and the query is projected by the reference's loadings (as ``embed-sweep map``
applies a stored PCA: the projection is not timed). MRD gets two views instead: the genes split
in two seeded halves, each its own reference PCA (25 components), mapped once observed in both and
once in the first alone with the second predicted (Algorithm 1, in the same chunks). Labels: the
branch crossed with the pseudotime quarter. ``tl.ingest`` gets the same cells in gene space: ``pp.pca(50)``,
``pp.neighbors``, ``tl.umap`` on the reference (their cost said apart), a first ``tl.ingest`` of
200 query cells (numba compiles UMAP's and pynndescent's functions on it: minutes, said apart), then
``tl.ingest`` of the query (timed: the anchor).

A model maps as ``embed-sweep map`` maps one chunk (tasks.results.mapping.map_cells over chunks
of ``--chunk`` cells: its per-cell transform with variances and its mapping score), then the
labels are transferred (tasks.results.mapping.transfer_labels); both are timed, and the
reference scores' median / MAD (``reference_score_stats``) apart. The reference fits are not
timed and use few iterations (``--options``; a fit's quality does not change the per-cell rule's
cost). Where a model cannot fit ``--n`` reference cells or map ``--n`` query cells in reasonable
time on one core, ``--ref-cells`` / ``--query-cells`` (JSON, per model) take a seeded subsample:
each line states the counts it measured; cells/s is never extrapolated to the cells not mapped.

    .venv/bin/python -m bench.map.throughput --atlas /tmp/atlas/atlas.h5ad --n 100000 \
        [--models ppca,bgplvm_rbf,...]

One core (bench/common.py). Peak RSS: this process's high-water mark over each step
(bench.common.reset_peak / status_mb), with the resident memory before the step beside it."""

from __future__ import annotations

import argparse
import gc
import json
import time

import numpy as np

from bench.common import pin_one_core, reset_peak, status_mb

MODELS = "ppca,bgplvm_rbf,bgplvm_linear,hgplvm_point,hgplvm_sparse,hgplvm_bayesian,glle_em,lllvm,mrd"
#: the sweep's models (tasks.registry, its default inducing points) with fewer iterations: the
#: reference fit is not what is timed (a fit stopped far short, 20 + 10 iterations, transferred
#: labels at 0.25 accuracy, so each fit still runs far enough to give a usable reference)
OPTIONS = {
    "bgplvm_rbf": {"max_iter": 100, "init_iters": 50},
    "bgplvm_linear": {"max_iter": 100, "init_iters": 50},
    "mrd": {"max_iter": 100, "init_iters": 50},
    "hgplvm_sparse": {"max_iter": 20},
    "hgplvm_bayesian": {"max_iter": 20},
    "hgplvm_point": {"max_iter": 50},
    "glle_em": {"max_iter": 3},
    "lllvm": {"max_iter": 2},
}
#: the exact point hGP-LVM is O(N^3) in its reference; LL-LVM maps a cell in about a second
REF_CELLS = {"hgplvm_point": 2000}
QUERY_CELLS = {"lllvm": 200}


def atlas(path, n, seed=0):
    """(reference genes AnnData, query genes AnnData, reference 50-D, query 50-D, reference labels,
    query labels, seconds of the preprocessing): 2n cells of the atlas, normalised and log1p'd."""
    import anndata as ad
    import scanpy as sc

    t0 = time.perf_counter()
    a = ad.read_h5ad(path)
    rows = np.random.default_rng(seed).permutation(a.n_obs)[: 2 * n]
    a = a[np.sort(rows)].copy()
    sc.pp.normalize_total(a, target_sum=1e4)
    sc.pp.log1p(a)
    quarter = np.minimum((a.obs["pseudotime"].to_numpy() * 4).astype(int), 3)
    lab = a.obs["branch"].astype(str).to_numpy() + "-" + quarter.astype(str)
    names, codes = np.unique(lab, return_inverse=True)
    a.obs["label"] = lab
    half = np.random.default_rng(seed + 1).permutation(len(lab))
    ref, qry = a[np.sort(half[:n])].copy(), a[np.sort(half[n:])].copy()
    Yr, Yq = reference_pca(ref, qry, 50)
    code_of = {s: i for i, s in enumerate(names)}
    lr = np.array([code_of[s] for s in ref.obs["label"]])
    lq = np.array([code_of[s] for s in qry.obs["label"]])
    return ref, qry, Yr, Yq, lr, lq, list(names), time.perf_counter() - t0


def reference_pca(ref, qry, comps):
    """(the reference's scores, the query projected by the reference's loadings): scanpy's
    ``pp.pca`` of ``comps`` components on ``ref`` (its entries removed again: ``tl.ingest`` makes
    its own), the query centred by the reference's mean, as ``embed-sweep map`` applies a stored
    PCA."""
    import scanpy as sc

    sc.pp.pca(ref, n_comps=comps)
    pcs = ref.varm["PCs"]
    mean = np.asarray(ref.X.mean(axis=0)).ravel()
    Yr = np.asarray(ref.obsm["X_pca"], dtype=np.float64)
    Yq = np.asarray(qry.X @ pcs - mean @ pcs, dtype=np.float64)
    del ref.obsm["X_pca"], ref.varm["PCs"], ref.uns["pca"]
    return Yr, Yq


def two_views(ref, qry, seed=0, comps=25):
    """MRD's input: the genes split in two seeded halves, each half a view of its own reference
    PCA (``comps`` components, scanpy ``pp.pca``) with the query projected by its loadings (as
    ``embed-sweep map`` applies a modality's stored PCA). Returns ([ref view a, b], [query a, b])."""
    genes = np.random.default_rng(seed + 2).permutation(ref.n_vars)
    halves = np.sort(genes[: ref.n_vars // 2]), np.sort(genes[ref.n_vars // 2 :])
    vr, vq = zip(*(reference_pca(ref[:, cols].copy(), qry[:, cols], comps) for cols in halves))
    return list(vr), list(vq)


def build(key, q, options):
    from tasks.registry import DEFAULT_DIM_VALUE, MODELS

    spec = MODELS[key]
    point = {**DEFAULT_DIM_VALUE, "latent_dim": q, "seed": 0}
    return spec.estimator_class()(**spec.constructor_args(point, options))


def measure(key, Yr, lr, Yq, lq, names, a, opts, ref_cells, query_cells, anchor):
    """One line per mapping of ``key``'s fit. MRD (``Yr`` / ``Yq`` lists of views): one fit, then
    the query mapped twice, observed in both views, and observed in view 0 alone with view 1
    predicted (Algorithm 1) as part of each chunk's work."""
    rng = np.random.default_rng(0)
    mrd = isinstance(Yr, list)
    Nr, Nq = (len(Yr[0]), len(Yq[0])) if mrd else (len(Yr), len(Yq))
    nr, nq = min(ref_cells.get(key, Nr), Nr), min(query_cells.get(key, Nq), Nq)
    rr = np.sort(rng.choice(Nr, nr, replace=False)) if nr < Nr else np.arange(Nr)
    qq = np.sort(rng.choice(Nq, nq, replace=False)) if nq < Nq else np.arange(Nq)
    est = build(key, a.latent_dim, opts.get(key, {}))
    train = [V[rr] for V in Yr] if mrd else Yr[rr]
    t0 = time.perf_counter()
    est.fit(train)
    fit = f"fit {time.perf_counter() - t0:.0f} s ({getattr(est, 'n_iter_', '?')} it.)"
    for observed, predict in [((0, 1), None), ((0,), 1)] if mrd else [(None, None)]:
        what = key
        if mrd:
            what += f" (views {list(observed)} observed" + (
                "" if predict is None else f", view {predict} predicted"
            )
            what += ")"
        query = {v: Yq[v][qq] for v in observed} if mrd else Yq[qq]
        map_one(what, est, train, query, observed, predict, lr[rr], lq[qq], names, a.chunk, anchor, fit)
    del est
    gc.collect()


def map_one(what, est, train, query, observed, predict, lr, lq, names, chunk, anchor, fit):
    """The reference scores (timed apart), then the query mapped as ``embed-sweep map`` maps its
    chunks and the labels transferred (timed together): one printed line."""
    from tasks.results.mapping import chunks, join, map_cells, rows_of, transfer_labels

    nq, nr = len(lq), len(lr)
    t0 = time.perf_counter()
    if observed is None:
        est.reference_score_stats(train)
    else:
        est.reference_score_stats(train, subsets=[tuple(observed)])
    ref_s = time.perf_counter() - t0
    before = status_mb("VmRSS")
    reset_peak()
    t0 = time.perf_counter()
    got = join([map_cells(est, rows_of(query, i, j), predict) for i, j in chunks(nq, chunk)])
    map_s = time.perf_counter() - t0
    cat, _ = transfer_labels(est.embedding_, lr, names, got["mean"])
    dt = time.perf_counter() - t0
    peak = status_mb()
    acc = float((np.asarray(cat.codes) == lq).mean())
    rate = nq / dt
    print(
        f"{what}: {rate:,.0f} cells/s ({dt:.1f} s for {nq:,} query cells onto {nr:,} reference cells; "
        f"map {map_s:.1f} s, labels {dt - map_s:.1f} s), {rate / anchor:.2f} x ingest; peak RSS "
        f"{peak:,.0f} MiB (from {before:,.0f}); label accuracy {acc:.3f}; {fit}, reference scores "
        f"{ref_s:.1f} s",
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--atlas", required=True, help="atlas.h5ad of bench.data.atlas (--stages gen)")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--latent-dim", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=2000)
    ap.add_argument("--options", default=json.dumps(OPTIONS), help="JSON {model: constructor options}")
    ap.add_argument("--ref-cells", default=json.dumps(REF_CELLS), help="JSON {model: reference cells}")
    ap.add_argument("--query-cells", default=json.dumps(QUERY_CELLS), help="JSON {model: query cells}")
    a = ap.parse_args()
    print(f"on core {pin_one_core()}")
    ref, qry, Yr, Yq, lr, lq, names, prep_s = atlas(a.atlas, a.n)
    print(
        f"data: {a.n:,} reference + {a.n:,} query cells x {ref.n_vars:,} genes, {len(names)} labels; "
        f"normalise, log1p, reference PCA(50) and query projection {prep_s:.0f} s",
        flush=True,
    )
    keys = a.models.split(",")
    views = two_views(ref, qry) if "mrd" in keys else None
    anchor = ingest(ref, qry, lq, names)
    del ref, qry
    gc.collect()
    opts, rc, qc = json.loads(a.options), json.loads(a.ref_cells), json.loads(a.query_cells)
    for key in keys:
        yr, yq = views if key == "mrd" else (Yr, Yq)
        measure(key, yr, lr, yq, lq, names, a, opts, rc, qc, anchor)


def ingest(ref, qry, lq, names) -> float:
    """scanpy's tl.ingest of ``qry`` onto ``ref`` (PCA + UMAP); its cells/s."""
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
    t0 = time.perf_counter()
    sc.pp.pca(ref, n_comps=50)
    pca_s = time.perf_counter() - t0
    sc.pp.neighbors(ref)
    nb_s = time.perf_counter() - t0 - pca_s
    sc.tl.umap(ref)
    umap_s = time.perf_counter() - t0 - pca_s - nb_s
    t0 = time.perf_counter()
    warm = qry[: min(200, qry.n_obs)].copy()
    sc.tl.ingest(warm, ref, obs="label", embedding_method=["umap", "pca"])  # numba compiles here
    warm_s = time.perf_counter() - t0
    before = status_mb("VmRSS")
    reset_peak()
    t0 = time.perf_counter()
    sc.tl.ingest(qry, ref, obs="label", embedding_method=["umap", "pca"])
    dt = time.perf_counter() - t0
    peak = status_mb()
    code_of = {s: i for i, s in enumerate(names)}
    acc = float((np.array([code_of[s] for s in qry.obs["label"]]) == lq).mean())
    n = qry.n_obs
    print(
        f"scanpy tl.ingest (PCA + UMAP): {n / dt:,.0f} cells/s ({dt:.1f} s for {n:,} query cells), "
        f"peak RSS {peak:,.0f} MiB (from {before:,.0f}), label accuracy {acc:.3f}; the reference's "
        f"pp.pca {pca_s:.0f} s, pp.neighbors {nb_s:.0f} s, tl.umap {umap_s:.0f} s; a first ingest of "
        f"{warm.n_obs} cells (numba's compilation, not timed above) {warm_s:.0f} s",
        flush=True,
    )
    return n / dt


if __name__ == "__main__":
    main()
