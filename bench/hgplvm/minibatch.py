"""Minibatch Bayesian hyperboloid GP-LVM (lvmcore.models.hgplvm.minibatch) against the full-batch fit.

    python -m bench.hgplvm.minibatch tree [--depth 5] [--seeds 0 1 2]      # SBT, paper 002 section 5.1
    python -m bench.hgplvm.minibatch roll --n 100000 [--anchor]            # 3-D swiss roll, Q = 2
    python -m bench.hgplvm.minibatch one --n N --method svi|full [...]      # one fit in this process

Every fit runs in its own process (``one``), so its peak RSS (/proc/self/status VmHWM) is its own;
the line it prints has the wall time and CPU seconds of the fit, the bound per point (the
full-batch fit: its last collapsed-bound MC estimate; the minibatch fit: ``elbo_``, an unbiased MC
estimate over all points, with its standard error per point), the steps, whether the plateau rule
stopped it, and the peak RSS before and after the fit.
``tree``: SBT of the given depth (bench/hgplvm/tree.py's generator and score: Pearson correlation of
hyperbolic latent distances with Hamming distances of the node codes), kappa = 100, Q = 2, the
full-batch Bayesian fit (``BayesianHyperboloidGPLVM(training="full")``, defaults) as the anchor, its
time and score beside the minibatch fit's in the same run. ``roll``: the minibatch fit at --n (and
the full-batch one with --anchor, at most --anchor-iter iterations).
"""


import argparse
import json
import subprocess
import time

import numpy as np

from bench.common import ROOT, module_command, status_mb


def one(a):
    """One fit in this process; prints one JSON line."""
    import jax
    from scipy.spatial.distance import cdist

    from lvmcore.data.synthetic import binary_tree, swiss_roll
    from lvmcore.manifolds.lorentz import pairwise_dist
    from lvmcore.metrics import pearson_distance_correlation
    from lvmcore.models.hgplvm import BayesianHyperboloidGPLVM

    if a.data == "tree":
        Y, node, codes, _ = binary_tree(a.depth, seed=a.seed)
    else:
        Y, _ = swiss_roll(a.n, seed=a.seed)
    rss0 = status_mb()
    kw = dict(n_components=2, kappa=a.kappa, random_state=a.seed)
    if a.method == "full":
        m = BayesianHyperboloidGPLVM(training="full", max_iter=a.max_iter, **kw)
    else:
        m = BayesianHyperboloidGPLVM(
            training="minibatch",
            max_iter=a.max_iter,
            batch_size=a.batch,
            local_iter=a.local_iter,
            n_inducing=a.m,
            **kw,
        )
    t0, c0 = time.perf_counter(), time.process_time()
    m.fit(Y)
    sec, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = Y.shape[0]
    out = {
        "data": a.data if a.data == "roll" else f"tree{a.depth}",
        "n": n,
        "seed": a.seed,
        "method": a.method,
        "seconds": round(sec, 1),
        "cpu_s": round(cpu, 1),
        "bound_per_point": m.elbo_ / n,
        "se_per_point": getattr(m, "elbo_se_", float("nan")) / n,
        "steps": int(m.n_iter_),
        "converged": bool(m.converged_),
        "M": int(m.inducing_.shape[0]),
        "rss_before_mb": round(rss0),
        "rss_peak_mb": round(status_mb()),
        "loadavg": open("/proc/loadavg").read().split()[0],
    }
    if a.data == "tree":
        L = m.lorentz_embedding_
        with jax.enable_x64(True):
            D = np.asarray(pairwise_dist(L, L))
        Dh = cdist(codes[node], codes[node], "cityblock")
        out["pearson"] = float(pearson_distance_correlation(D, Dh, "precomputed", "precomputed"))
    print(json.dumps(out), flush=True)


def run_one(args):
    cmd = module_command(__spec__.name, "one", *map(str, args))
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        print(p.stderr[-2000:], flush=True)
        return None
    line = p.stdout.strip().splitlines()[-1]
    print(line, flush=True)
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["tree", "roll", "one"])
    ap.add_argument("--data", default="roll", choices=["roll", "tree"])
    ap.add_argument("--method", default="svi", choices=["svi", "full"])
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--kappa", type=float, default=100.0)
    ap.add_argument("--max-iter", type=int, default=3000)
    ap.add_argument("--anchor-iter", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--local-iter", type=int, default=50)
    ap.add_argument("--m", default="auto")
    ap.add_argument("--anchor", action="store_true")
    a = ap.parse_args()
    if a.m != "auto":
        a.m = int(a.m)
    if a.mode == "one":
        one(a)
        return
    common = ["--kappa", a.kappa, "--local-iter", a.local_iter, "--m", a.m]
    if a.mode == "tree":
        rows = []
        for s in a.seeds:
            base = ["--data", "tree", "--depth", a.depth, "--seed", s, *common]
            full = run_one([*base, "--method", "full", "--max-iter", a.anchor_iter])
            svi = run_one([*base, "--method", "svi", "--max-iter", a.max_iter, "--batch", min(a.batch, 100)])
            rows.append((full, svi))
        for k in ("pearson", "bound_per_point", "cpu_s"):
            f = [r[0][k] for r in rows if r[0] and r[1]]
            s = [r[1][k] for r in rows if r[0] and r[1]]
            print(f"{k}: full {np.mean(f):.4f}  minibatch {np.mean(s):.4f}  (seeds {a.seeds})")
        return
    base = ["--data", "roll", "--n", a.n, "--seed", a.seed, *common]
    run_one([*base, "--method", "svi", "--max-iter", a.max_iter, "--batch", a.batch])
    if a.anchor:
        run_one([*base, "--method", "full", "--max-iter", a.anchor_iter])


if __name__ == "__main__":
    main()
