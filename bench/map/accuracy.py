"""Mapping new cells onto a fitted model, on scanpy's pbmc68k_reduced (X_pca, 700 cells, label
bulk_labels), as `embed-sweep map` does it (tasks.results.mapping: the model's per-cell transform,
its mapping score, 15-NN distance-weighted label transfer):

- label transfer over 5 stratified 80/20 splits: the mapped 20%'s accuracy against the same
  model's when those cells are fitted with the reference (the same 15-NN transfer from the other
  80%'s embedding);
- cells of a kind the reference lacks: one bulk_labels category left out of the reference, its
  cells and the other categories' held-out 20% mapped; the AUROC of -mapping score (low = new),
  on split seed 0, or on seeds 0 .. N-1 with ``--novel-splits N`` (mean, sd and the lowest: one
  split's figure moves by up to 0.05 with the split).

MRD's cross-view prediction is bench.map.predict (pbmc68k_reduced has one view).

    .venv/bin/python -m bench.map.accuracy [--models ppca,bgplvm_rbf] [--splits 5] [--novel-splits 5]

Models are built as the sweep builds them (tasks.registry: the key's fixed options) at latent_dim 5,
seed 0 and the sweep's default k (10) and kappa (100), with ``--options`` JSON on top."""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from bench.common import pin_one_core

LEAVE_OUT = ("CD19+ B", "CD34+")


def pbmc():
    import anndata as ad
    import scanpy as sc

    a = ad.read_h5ad(os.path.join(os.path.dirname(sc.__file__), "datasets", "10x_pbmc68k_reduced.h5ad"))
    return a.obsm["X_pca"].astype(np.float64), a.obs["bulk_labels"]


def split(labels, seed, frac=0.8, leave_out=None):
    rng = np.random.default_rng(seed)
    ref, qry = [], []
    for cat in labels.cat.categories:
        rows = rng.permutation(np.flatnonzero((labels == cat).to_numpy()))
        if cat == leave_out:
            qry += rows.tolist()
            continue
        cut = int(round(frac * len(rows)))
        ref += rows[:cut].tolist()
        qry += rows[cut:].tolist()
    return np.sort(ref), np.sort(qry)


def build(key, q, options):
    from tasks.registry import DEFAULT_DIM_VALUE, MODELS

    spec = MODELS[key]
    point = {**DEFAULT_DIM_VALUE, "latent_dim": q, "seed": 0}
    return spec.estimator_class()(**spec.constructor_args(point, options.get(key, {})))


def auroc(score_new, score_kept):
    """P(a new cell scores below a kept one) (ties: one half): the AUROC of -score."""
    from scipy.stats import mannwhitneyu

    u = mannwhitneyu(score_kept, score_new).statistic
    return float(u / (len(score_new) * len(score_kept)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="ppca,bgplvm_rbf")
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--latent-dim", type=int, default=5)
    ap.add_argument("--options", default="{}")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: labels, novel")
    ap.add_argument(
        "--novel-splits",
        type=int,
        default=1,
        help="split seeds of the left-out-category AUROC (0 .. N-1; mean and sd printed above 1)",
    )
    a = ap.parse_args()
    print(f"on core {pin_one_core()}")
    from tasks.results.mapping import map_cells, transfer_labels

    Y, labels = pbmc()
    names, codes, truth = list(labels.cat.categories), labels.cat.codes.to_numpy(), labels.to_numpy()
    opts = json.loads(a.options)
    skip = set(a.skip.split(","))
    for key in a.models.split(","):
        if "labels" not in skip:
            diffs = []
            for s in range(a.splits):
                ref, qry = split(labels, s)
                t0 = time.perf_counter()
                est = build(key, a.latent_dim, opts).fit(Y[ref])
                est.reference_score_stats(Y[ref])
                got = map_cells(est, Y[qry])
                cat, _ = transfer_labels(est.embedding_, codes[ref], names, got["mean"])
                mapped = float((np.asarray(cat) == truth[qry]).mean())
                full = build(key, a.latent_dim, opts).fit(Y)
                cat, _ = transfer_labels(full.embedding_[ref], codes[ref], names, full.embedding_[qry])
                fitted = float((np.asarray(cat) == truth[qry]).mean())
                diffs.append(mapped - fitted)
                print(
                    f"{key} split {s}: mapped {mapped:.3f}, fitted with the reference {fitted:.3f} "
                    f"({time.perf_counter() - t0:.1f} s)",
                    flush=True,
                )
            print(f"{key}: mean(mapped - fitted) over {a.splits} splits = {np.mean(diffs):+.4f}", flush=True)
        if "novel" not in skip:
            for cat in LEAVE_OUT:
                aucs = []
                for s in range(a.novel_splits):
                    ref, qry = split(labels, s, leave_out=cat)
                    est = build(key, a.latent_dim, opts).fit(Y[ref])
                    est.reference_score_stats(Y[ref])
                    got = map_cells(est, Y[qry])
                    new = truth[qry] == cat
                    aucs.append(auroc(got["score"][new], got["score"][~new]))
                    var = got["var"].sum(axis=1) if got["var"] is not None else None
                    var_auc = auroc(-var[new], -var[~new]) if var is not None else float("nan")
                    print(
                        f"{key} leaving out {cat}, split {s}: AUROC mapping score {aucs[-1]:.3f} "
                        f"(variance: {var_auc:.3f})",
                        flush=True,
                    )
                if len(aucs) > 1:
                    print(
                        f"{key} leaving out {cat}: AUROC mean {np.mean(aucs):.3f}, "
                        f"sd {np.std(aucs, ddof=1):.3f}, min {min(aucs):.3f} over {len(aucs)} splits",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
