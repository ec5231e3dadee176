"""hGP-LVM timings (paper 002): fit time of each variant on the depth-5 synthetic binary tree
(620 points, kappa = 100, Q = 2), and the Bayesian variant's time per iteration (M = 50, H = 5)
with its Monte-Carlo psi statistics map-reduced over row chunks on 1 vs 2 Dask worker processes,
against the in-process fused step in the same run.

    python bench/hgplvm.py [--iters 300] [--big 20000]
"""

import os

for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(v, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def per_iter(make, iters):
    make(2)  # compile
    t0 = time.perf_counter()
    m = make(iters)
    return (time.perf_counter() - t0) / iters, m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--big", type=int, default=20000)
    a = ap.parse_args()
    from _cluster import local_client

    from lvmcore.data.synthetic import binary_tree
    from lvmcore.models.hgplvm import HyperboloidGPLVM

    Y, *_ = binary_tree(5, seed=0)
    print(f"depth-5 tree, N={len(Y)}, {a.iters} iterations")
    for variant in ("point", "sparse", "bayesian"):
        HyperboloidGPLVM(2, 100.0, variant=variant, max_iter=2, tol=0).fit(Y)  # compile
        t0 = time.perf_counter()
        HyperboloidGPLVM(2, 100.0, variant=variant, n_inducing=50, max_iter=a.iters, tol=0).fit(Y)
        sec = time.perf_counter() - t0
        print(f"  {variant:9s} fit {sec:7.2f} s  ({1e3 * sec / a.iters:6.1f} ms/iteration)")

    rng = np.random.default_rng(0)
    for n in (len(Y), a.big):
        Yb = (
            Y
            if n == len(Y)
            else np.tile(Y, (n // len(Y) + 1, 1))[:n] + 0.01 * rng.standard_normal((n, Y.shape[1]))
        )

        def make(iters, chunks=None, Yb=Yb):
            return HyperboloidGPLVM(
                2, 100.0, variant="bayesian", n_inducing=50, n_samples=5, max_iter=iters, tol=0, chunks=chunks
            ).fit(Yb)

        iters = 20
        t_fused, _ = per_iter(make, iters)
        res = {}
        for workers in (1, 2):
            with local_client(workers):
                res[workers], _ = per_iter(lambda it: make(it, chunks=max(1, n // 4)), iters)  # noqa: B023
        print(
            f"bayesian N={n}: in-process {1e3 * t_fused:.1f} ms/it; "
            f"chunked 1 worker {1e3 * res[1]:.1f} ms/it, "
            f"2 workers {1e3 * res[2]:.1f} ms/it, speed-up {res[1] / res[2]:.2f}x"
        )


if __name__ == "__main__":
    main()
