"""Paper 002 section 5.1 (Table 2): synthetic binary trees, and the myeloid progenitors; kappa = 100, Q = 2.

    python -m bench.hgplvm.tree [--data 4 5 6 myeloid] [--seeds 10] [--first-seed 0]
                                [--variants point sparse bayesian] [--max-iter N]
                                [--out bench/hgplvm/tree.csv] [--append] [--no-pca]
                                [--kw '{"noise": "ppca"}'] [--trace] [--label int]
    python -m bench.hgplvm.tree --summary bench/hgplvm/tree.csv     # markdown table from the rows

Trees (depth 4, 5, 6; our generator, seed = the run's seed): per seed and variant, the Pearson
correlation between pairwise hyperbolic latent distances and pairwise Hamming distances of the
node codes (the Table's score in the authors' notebook) and Szekely's distance correlation beside
it. Myeloid progenitors (scanpy's krumsiek11, 640 x 11, tests/data/krumsiek11.txt; the seed only
drives the fit): Qlocal / Qglobal of Poincare maps (lvmcore.metrics.quality_scores, hyperbolic
distances). 2-D PCA (Euclidean distances) is scored beside them. Every row has the fit time and
the iterations run; the fits use the constructor's defaults (convergence rule, at most --max-iter
iterations, default the constructor's) except kappa = 100, Q = 2. Paper row (hGP-LVM, trees):
0.816, 0.909, 0.849; published on the myeloid data: PCA 0.73 / 0.91, Poincare maps 0.77 / 0.93,
t-SNE 0.82 / 0.91, ForceAtlas2 0.82 / 0.93, UMAP 0.79 / 0.78."""

import argparse
import csv
import json
import os
import time

import numpy as np
from scipy.spatial.distance import cdist

from bench.common import ROOT

PAPER = {"4": 0.816, "5": 0.909, "6": 0.849}
COLUMNS = ["data", "seed", "method", "pearson", "dcor", "qlocal", "qglobal", "seconds", "n_iter"]


def summary(path):
    """Markdown table (mean +- sd over seeds, n seeds) per data set and method from the CSV rows."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    order = ["pca", "point", "point-r1", "point-r0.3", "point-r0.3-lr0.1", "sparse", "bayesian"]
    order += ["bayesian-ppca", "bayesian-warm", "point-int", "sparse-int", "sparse-int-10k", "sparse-10k"]
    order += [m for m in dict.fromkeys(r["method"] for r in rows) if m not in order]  # the rest, as written
    print("| data | method | seeds | Pearson | dcor | Qlocal | Qglobal | fit s | iterations | paper |")
    print("|---|---|---:|---|---|---|---|---:|---:|---:|")

    def ms(vals):
        v = np.array([float(x) for x in vals if x != ""])
        if not len(v):
            return ""
        return f"{v.mean():.3f} +- {v.std(ddof=1 if len(v) > 1 else 0):.3f}"

    for data in sorted({r["data"] for r in rows}, key=lambda d: (not d.isdigit(), d)):
        for name in order:
            r = [x for x in rows if x["data"] == data and x["method"] == name]
            if not r:
                continue
            label = "PCA (2-D)" if name == "pca" else name
            sec = np.array([float(x["seconds"]) for x in r])
            its = np.array([float(x["n_iter"]) for x in r])
            fit = "" if name == "pca" else f"{sec.mean():.1f}"
            it = "" if name == "pca" else f"{its.mean():.0f}"
            paper = f"{PAPER[data]:.3f}" if name == "point" and data in PAPER else ""
            cols = [ms(x[c] for x in r) for c in ("pearson", "dcor", "qlocal", "qglobal")]
            print(f"| {data} | {label} | {len(r)} | " + " | ".join(cols) + f" | {fit} | {it} | {paper} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", nargs="+", default=["4", "5", "6", "myeloid"])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--append", action="store_true", help="append rows to --out (no header)")
    ap.add_argument("--no-pca", action="store_true", help="skip the PCA rows")
    ap.add_argument("--summary", default=None, help="print the markdown table of this CSV and exit")
    ap.add_argument("--variants", nargs="+", default=["point", "sparse", "bayesian"])
    ap.add_argument("--max-iter", type=int, default=None, help="default: the constructor's")
    ap.add_argument("--out", default="bench/hgplvm/tree.csv")
    ap.add_argument("--kw", default="{}", help='JSON of constructor overrides, e.g. \'{"noise": "ppca"}\'')
    ap.add_argument("--label", default="", help="suffix for the method names in the rows (point-LABEL)")
    ap.add_argument("--trace", action="store_true", help="print score, sigma, beta, radius, S every 100 it")
    a = ap.parse_args()
    if a.summary:
        summary(a.summary)
        return
    import jax

    from lvmcore.data.synthetic import binary_tree
    from lvmcore.manifolds.lorentz import pairwise_dist
    from lvmcore.metrics import (
        distance_correlation,
        manifold_distances,
        pearson_distance_correlation,
        quality_scores,
    )
    from lvmcore.models.hgplvm import BayesianHyperboloidGPLVM, HyperboloidGPLVM
    from lvmcore.models.hgplvm.objectives import renorm

    kw = json.loads(a.kw)

    new = not (a.append and os.path.exists(a.out))
    with open(a.out, "a" if a.append else "w", newline="") as fh:
        w = csv.writer(fh)
        if new:
            w.writerow(COLUMNS)
        for data in a.data:
            if data == "myeloid":
                Y = np.loadtxt(ROOT / "tests" / "data" / "krumsiek11.txt")[:, 1:]
                G = manifold_distances(Y, 20)
            for seed in range(a.first_seed, a.first_seed + a.seeds):
                if data != "myeloid":
                    Y, node, codes, _ = binary_tree(int(data), seed=seed)
                    Dh = cdist(codes[node], codes[node], "cityblock")
                Yc = Y - Y.mean(0)
                U, s, _ = np.linalg.svd(Yc, full_matrices=False)
                P = U[:, :2] * s[:2]
                res = (
                    []
                    if a.no_pca or (data == "myeloid" and seed != a.first_seed)
                    else [("pca", cdist(P, P), 0.0, 0)]
                )
                monitor = None
                if a.trace and data != "myeloid":

                    def monitor(it, st, Dh=Dh):
                        if it % 100 == 0:
                            X = np.asarray(renorm(st["X"]))
                            with jax.enable_x64(True):
                                sc = pearson_distance_correlation(
                                    np.asarray(pairwise_dist(X, X)), Dh, "precomputed", "precomputed"
                                )
                            hyp = np.exp(np.asarray(st["hyp"]))
                            S = np.exp(np.asarray(st["log_S"])) if st["log_S"] is not None else np.zeros(1)
                            r = np.arccosh(np.maximum(X[:, 0], 1.0)).max()
                            print(
                                f"  it {it} pearson {sc:.3f} sigma {hyp[0]:.3g} beta {hyp[1]:.3g} "
                                f"rmax {r:.2f} median S {np.median(S):.3g}",
                                flush=True,
                            )

                for variant in a.variants:
                    t0 = time.perf_counter()
                    params = dict(n_components=2, kappa=100.0)
                    if variant == "bayesian":  # the Bayesian model's one entry, full-batch
                        cls, params["training"] = BayesianHyperboloidGPLVM, "full"
                    else:
                        cls, params["variant"] = HyperboloidGPLVM, variant
                    if a.max_iter is not None:
                        params["max_iter"] = a.max_iter
                    params["random_state"] = seed
                    m = cls(**{**params, **kw}).fit(Y, callback=monitor)
                    sec = time.perf_counter() - t0
                    L = m.lorentz_embedding_
                    with jax.enable_x64(True):
                        D = np.asarray(pairwise_dist(L, L))
                    res.append((f"{variant}-{a.label}" if a.label else variant, D, sec, m.n_iter_))
                for name, D, sec, its in res:
                    pr = dc = ql = qg = ""
                    if data == "myeloid":
                        ql, qg, _ = quality_scores(None, D, metric_x="precomputed", data_distances=G)
                        ql, qg = f"{ql:.4f}", f"{qg:.4f}"
                    else:
                        pr = f"{pearson_distance_correlation(D, Dh, 'precomputed', 'precomputed'):.4f}"
                        dc = f"{distance_correlation(D, Dh, 'precomputed', 'precomputed'):.4f}"
                    w.writerow([data, seed, name, pr, dc, ql, qg, f"{sec:.1f}", its])
                    fh.flush()
                    print(
                        f"{data:8s} seed {seed} {name:9s} pearson {pr:6s} dcor {dc:6s} "
                        f"Qlocal {ql:6s} Qglobal {qg:6s} {sec:6.1f} s {its} it",
                        flush=True,
                    )
    summary(a.out)


if __name__ == "__main__":
    main()
