"""Seconds per LL-LVM EM iteration, dense vs sparse solver, on the authors' Swiss roll.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/lllvm.py [--sizes 500 1000 ...]
        [--dense-max 2000] [--iters 3] [--k 10]

Each fit runs ``--iters`` EM iterations after the one-off setup (graph ordering / eigenvalues), the
time per iteration is the mean over them. Timings on a shared machine are noisy: read the ratios
(sparse/dense at equal n; time per iteration relative to the smallest n, divided by n / n_min),
which are measured in the same run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from lvmcore.data.synthetic import lllvm_swiss_roll
from lvmcore.graph import adjacency, knn
from lvmcore.models.lllvm import lllvm_fit


def per_iteration(Y, W, solver: str, iters: int) -> tuple[float, float]:
    """(setup seconds, seconds per EM iteration)."""
    stamps = []
    t0 = time.perf_counter()
    lllvm_fit(
        Y,
        W,
        solver=solver,
        max_iter=iters,
        random_state=0,
        callback=lambda *a: stamps.append(time.perf_counter()),
    )
    first = stamps[0] - t0
    per = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else first
    return first - per, per


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000, 4000, 8000, 16000])
    ap.add_argument("--dense-max", type=int, default=2000, help="largest n for the dense solver")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--k", type=int, default=10)
    args = ap.parse_args(argv)
    rows = []
    print(f"LL-LVM EM, Swiss roll, Q = 2, k = {args.k}, {args.iters} iterations per fit")
    print(
        f"{'n':>7} {'dense s/it':>11} {'sparse s/it':>12} {'sparse/dense':>13} {'sparse setup s':>15} "
        f"{'sparse s/it per n (rel)':>24}"
    )
    anchor = None
    for n in args.sizes:
        Y, _, _ = lllvm_swiss_roll(n, 0)
        Y = (Y - Y.mean(0)) / np.abs(Y - Y.mean(0)).max()
        idx, _ = knn(Y, args.k)
        W = adjacency(idx)
        d = per_iteration(Y, W, "dense", args.iters)[1] if n <= args.dense_max else float("nan")
        setup, s = per_iteration(Y, W, "sparse", args.iters)
        if anchor is None:
            anchor = s / n
        rel = (s / n) / anchor
        rows.append((n, d, s, s / d, setup, rel))
        print(f"{n:>7} {d:>11.3f} {s:>12.3f} {s / d:>13.3f} {setup:>15.3f} {rel:>24.2f}", flush=True)
    return rows


if __name__ == "__main__":
    main()
