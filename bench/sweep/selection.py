"""Selection study: is a model's bound a usable criterion across a sweep dimension?

For each (data set, model, dimension) below, every grid point is fitted and evaluated exactly as a
sweep does (tasks.fit.fit_point, tasks.evaluate.evaluate_point), then, per seed, the Spearman rank
correlation across the dimension's values is taken between

- the bound (``elbo``) and the ground-truth metric (distance correlation of the embedding's
  distances with the true latent distances: (arc length, height) on the Swiss roll, Hamming
  distances on the binary tree),
- the label-free trustworthiness/continuity (their mean, 10 neighbours) and the same metric,
- the label-free geodesic agreement (tasks.results.geodesic_agreement: Spearman of embedding
  distances with the data's 10-NN-graph shortest paths) and the same metric.

Printed: the mean over seeds of both correlations, and the ground-truth metric of the setting each
criterion picks against the best reachable one. About 5 minutes on one core.

    python -m bench.sweep.selection [--quick]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from lvmcore.data import ingest, load
from tasks.evaluate import evaluate_point
from tasks.fit import fit_point
from tasks.knn import build_graph
from tasks.registry import MODELS
from tasks.results.selection import geodesic_agreement

SEEDS = (0, 1)
#: (data set, options, model key, dimension, values, fixed point, model options)
STUDIES = [
    ("swiss_roll", {"n": 300, "seed": 0}, "glle_em", "k", [5, 7, 10, 14, 20], {"latent_dim": 2}, {}),
    ("swiss_roll", {"n": 300, "seed": 0}, "glle_direct", "k", [5, 7, 10, 14, 20], {"latent_dim": 2}, {}),
    ("s_curve", {"n": 300, "seed": 0}, "glle_em", "k", [5, 7, 10, 14, 20], {"latent_dim": 2}, {}),
    ("swiss_roll", {"n": 300, "seed": 0}, "ppca", "latent_dim", [1, 2], {}, {}),
    (
        "s_curve",
        {"n": 200, "seed": 0},
        "bgplvm_rbf",
        "latent_dim",
        [1, 2, 3, 4],
        {},
        {"max_iter": 300, "n_inducing": 20},
    ),
    ("mrd_toy", {"n": 100, "seed": 0}, "mrd", "latent_dim", [2, 4, 6, 8], {}, {"kernel": "linear"}),
    (
        "binary_tree",
        {"depth": 4, "seed": 0},
        "hgplvm_point",
        "kappa",
        [3.0, 10.0, 30.0, 100.0],
        {"latent_dim": 2},
        {"max_iter": 300},
    ),
    (
        "binary_tree",
        {"depth": 4, "seed": 0},
        "hgplvm_bayesian",
        "kappa",
        [3.0, 10.0, 30.0, 100.0],
        {"latent_dim": 2},
        {"max_iter": 300},
    ),
]


def _rho(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or np.ptp(a[ok]) == 0 or np.ptp(b[ok]) == 0:
        return float("nan")
    return float(spearmanr(a[ok], b[ok])[0])


def _truth_metric(name: str, data_path, res) -> float:
    """The ground-truth metric: the sweep's distance correlation with the true latent distances,
    except on the Swiss roll, whose stored truth (t, height) is not isometric to the manifold (arc
    length grows as t^2 / 2): there the true distances are those of (arc length, height)."""
    if name != "swiss_roll":
        return res.metrics.get("distance_correlation", np.nan)
    from scipy.spatial.distance import pdist, squareform

    from lvmcore.metrics import distance_correlation
    from tasks.inputs import load_data

    t, h = load_data(str(data_path))["truth"].T
    arc = 0.5 * (t * np.sqrt(1 + t**2) + np.arcsinh(t))
    DT = squareform(pdist(np.column_stack([arc, h])))
    return distance_correlation(DT, squareform(pdist(res.embedding)), "precomputed", "precomputed")


def _mean(values) -> float:
    v = np.asarray(values, float)
    return float(v[np.isfinite(v)].mean()) if np.isfinite(v).any() else float("nan")


def run(studies, seeds, work: Path) -> list[dict]:
    rows = []
    for name, opts, key, dim, values, fixed, mopts in studies:
        data_path = work / f"{name}-{abs(hash(str(opts)))}.zarr"
        if not data_path.exists():
            ingest(load(name, **opts), data_path)
        graph = None
        if dim == "k" or key.startswith(("glle", "lllvm")):
            kmax = max(values) if dim == "k" else fixed.get("k", 10)
            graph = build_graph(str(data_path), kmax, str(work / f"{data_path.stem}-g{kmax}.zarr"))
        t0 = time.perf_counter()
        per_seed = []
        for seed in seeds:
            elbo, qual, geo, truth = [], [], [], []
            for v in values:
                point = {**fixed, dim: v, "seed": seed}
                res = evaluate_point(
                    fit_point(key, mopts, str(data_path), graph, (0,), point), str(data_path)
                )
                m = res.metrics
                elbo.append(res.elbo if res.status == "done" else np.nan)
                qual.append(0.5 * (m.get("trustworthiness", np.nan) + m.get("continuity", np.nan)))
                truth.append(_truth_metric(name, data_path, res) if res.status == "done" else np.nan)
                geo.append(
                    geodesic_agreement(data_path, res.embedding, MODELS[key].hyperbolic)
                    if res.status == "done"
                    else np.nan
                )
            per_seed.append((np.array(elbo), np.array(qual), np.array(geo), np.array(truth)))
        rb, rq, rg = (_mean([_rho(c[i], c[3]) for c in per_seed]) for i in range(3))

        pick_bound, pick_qual, pick_geo = (
            np.mean([c[3][np.nanargmax(c[i])] for c in per_seed]) for i in range(3)
        )
        best = np.mean([np.nanmax(c[3]) for c in per_seed])
        bound_means = np.nanmean([c[0] for c in per_seed], axis=0)
        rows.append(
            {
                "data": name,
                "model": key,
                "dim": dim,
                "values": values,
                "rho_bound": rb,
                "rho_quality": rq,
                "rho_geodesic": rg,
                "truth_geodesic_pick": pick_geo,
                "truth_bound_pick": pick_bound,
                "truth_quality_pick": pick_qual,
                "truth_best": best,
                "bound_by_value": bound_means,
                "seconds": time.perf_counter() - t0,
            }
        )
        r = rows[-1]
        print(
            f"| {name} | {key} | {dim} {values} | {rb:+.2f} | {rq:+.2f} | {rg:+.2f} | {pick_bound:.3f} | "
            f"{pick_qual:.3f} | {pick_geo:.3f} | {best:.3f} | {' '.join(f'{b:.4g}' for b in bound_means)} | "
            f"{r['seconds']:.0f} s |",
            flush=True,
        )
    return rows


def main():
    quick = "--quick" in sys.argv
    print(
        "| data | model | dimension (values) | rho(bound, truth) | rho(T&C, truth) | rho(geodesic, truth) "
        "| truth at bound's pick | at T&C's | at geodesic's | best truth | bound per value (mean over seeds) "
        "| time |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        run(STUDIES[:2] if quick else STUDIES, SEEDS, Path(tmp))


if __name__ == "__main__":
    main()
