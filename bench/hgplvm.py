"""hGP-LVM timings (paper 002): fit time of each variant on the depth-5 synthetic binary tree
(620 points, kappa = 100, Q = 2), and the Bayesian variant's time per iteration (M = 50, H = 5)
with its Monte-Carlo psi statistics map-reduced over row chunks on 1 vs 2 Dask worker processes,
against the in-process fused step in the same run.

    python bench/hgplvm.py [--iters 300] [--big 20000]
    python bench/hgplvm.py --point-only [--iters 100]

The point variant's gradient step (eq. 4) is also timed on its own at N = 300, 620, 1260 (depths
4-6): the hand-written gradient (one host Cholesky + inverse, ``point_value_and_grad``) against
autodiff of ``point_objective``, both as ratios to one jitted Cholesky of the same N x N matrix
(the anchor, measured in the same run), and a whole fit's time per iteration.
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


def best_ms(f, *args, reps=7):
    import jax

    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return 1e3 * min(ts)


def point_steps(iters):
    import jax
    import jax.numpy as jnp

    from lvmcore.data.synthetic import binary_tree
    from lvmcore.manifolds.lorentz import expmap0
    from lvmcore.models.hgplvm import (
        HyperboloidGPLVM,
        _kern,
        _pca,
        point_objective,
        point_value_and_grad,
    )

    print("point variant, gradient of eq. 4 (best of 7; ratio to one Cholesky of the same size)")
    for depth in (4, 5, 6):
        Y, *_ = binary_tree(depth, seed=0)
        n = len(Y)
        Yc = jnp.asarray(Y - Y.mean(0))
        P = _pca(Y, 2)
        X = expmap0(jnp.asarray(P / np.max(np.linalg.norm(P, axis=1))))
        ls, lb = jnp.float64(np.log(0.1)), jnp.float64(np.log(30.0))
        K = _kern(X, X, 0.1, 100.0) + jnp.eye(n) / 30.0
        chol = best_ms(jax.jit(jnp.linalg.cholesky), K)
        hand = best_ms(jax.jit(lambda X: point_value_and_grad(X, ls, lb, Yc, 100.0)), X)  # noqa: B023
        auto = best_ms(
            jax.jit(jax.value_and_grad(lambda X: point_objective(X, ls, lb, Yc, 100.0))),  # noqa: B023
            X,
        )
        HyperboloidGPLVM(2, 100.0, max_iter=2, tol=0).fit(Y)  # compile
        t0 = time.perf_counter()
        HyperboloidGPLVM(2, 100.0, max_iter=iters, tol=0).fit(Y)
        it = 1e3 * (time.perf_counter() - t0) / iters
        print(
            f"  N={n:5d}: Cholesky {chol:7.1f} ms; hand-written value+grad {hand:7.1f} ms "
            f"({hand / chol:4.1f}x); autodiff {auto:7.1f} ms ({auto / chol:4.1f}x); "
            f"fit {it:7.1f} ms/iteration ({it / chol:4.1f}x)",
            flush=True,
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--big", type=int, default=20000)
    ap.add_argument("--point-only", action="store_true", help="only the point variant's step timings")
    a = ap.parse_args()
    point_steps(min(a.iters, 100))
    if a.point_only:
        return
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
