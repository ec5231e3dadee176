"""hGP-LVM against the authors' code (koshi-lmd/hyperboloid_gplvm, MIT, NumPy), in the same run.

    python -m bench.hgplvm.authors [--authors PATH] [--data tree5 myeloid] [--variants point sparse bayesian]
                           [--kw '{"learning_rate": 0.1}'] [--seed 0] [--author-iters 1500]
                           [--author-bayes-iters 250]
    python -m bench.hgplvm.authors --point-steps      # the point variant's gradient step against a Cholesky

The authors' code is copied from PATH (a git directory, e.g. the mirror made by
``fetch github:koshi-lmd/hyperboloid_gplvm``, or a checkout) into a temporary directory and run
there UNMODIFIED in a subprocess: ``RiemannGD`` of ``HyperboloidGPLVM`` / ``SparseHyperboloidGPLVM``
(M = 50) / ``BayesianHyperboloidGPLVM`` (M = 50, H = 5), lengthscale 100, Q = 2, their default
learning rate and stopping rules, ``max_iters`` 1500 as in their demo (250 for the Bayesian one,
0.3-0.4 s per iteration here); ``tqdm`` (a progress bar, not installed here) is replaced by a plain
iterator in ``sys.modules``; their global NumPy RNG is seeded with --seed.  Nothing of it is kept.

Data: the depth-5 synthetic binary tree (our generator, seed --seed, 620 x 31), scored by the Pearson
correlation of hyperbolic latent distances with the Hamming distances of the node codes; the myeloid
progenitors (scanpy's krumsiek11, 640 x 11, tests/data/krumsiek11.txt), scored by Qlocal / Qglobal
(lvmcore.metrics.quality_scores, hyperbolic distances).

Ours: each variant fitted with budgets of 25, 38, 57, ... iterations (x1.5; tol = 0) until its score
reaches the authors' final score of the same variant (both Qlocal and Qglobal on the myeloid data),
then once with its defaults (convergence rule).  Printed per data set and variant: the authors'
time and final score; our time to their score (the fit time of the first budget that reaches it)
and the ratio; our converged fit's time, iterations and score.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import ROOT

MIRROR = Path("/work/.mirror/koshi-lmd+hyperboloid_gplvm/repo")

#: run inside the temporary copy of the authors' code (argv: variant, data.npy, out.json, seed, iters)
_DRIVER = r"""
import json, sys, time, types
import numpy as np
stub = types.ModuleType("tqdm")
stub.tqdm_notebook = stub.tqdm = lambda it, *a, **k: it
sys.modules["tqdm"] = stub
variant, data, out, seed, iters = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
np.random.seed(seed)
Y = np.load(data)
t0 = time.perf_counter()
if variant == "point":
    from hyperboloid_gplvm import HyperboloidGPLVM
    m = HyperboloidGPLVM(Y=Y, latent_dim=2, lengthscale=100)
elif variant == "sparse":
    from sparse_hyperboloid_gplvm import SparseHyperboloidGPLVM
    m = SparseHyperboloidGPLVM(Y=Y, latent_dim=2, lengthscale=100, num_inducing=50)
else:
    from bayesian_hyperboloid_gplvm import BayesianHyperboloidGPLVM
    m = BayesianHyperboloidGPLVM(Y=Y, latent_dim=2, lengthscale=100, num_inducing=50, sampling_num=5)
m.RiemannGD(max_iters=iters)
sec = time.perf_counter() - t0
X = m.M if variant == "bayesian" else m.X
json.dump({"seconds": sec, "X": np.asarray(X).tolist()}, open(out, "w"))
"""


def load(name, seed):
    """(Y, scorer) where scorer(L) -> tuple of scores of hyperboloid points L (N, Q+1)."""
    import jax
    from scipy.spatial.distance import cdist

    from lvmcore.manifolds.lorentz import pairwise_dist
    from lvmcore.metrics import manifold_distances, pearson_distance_correlation, quality_scores

    def hdist(L):
        with jax.enable_x64(True):
            return np.asarray(pairwise_dist(np.asarray(L), np.asarray(L)))

    if name.startswith("tree"):
        from lvmcore.data.synthetic import binary_tree

        Y, node, codes, _ = binary_tree(int(name[4:]), seed=seed)
        Dh = cdist(codes[node], codes[node], "cityblock")
        return Y, lambda L: (pearson_distance_correlation(hdist(L), Dh, "precomputed", "precomputed"),)
    Y = np.loadtxt(ROOT / "tests" / "data" / "krumsiek11.txt")[:, 1:]
    G = manifold_distances(Y, 20)
    return Y, lambda L: quality_scores(None, hdist(L), metric_x="precomputed", data_distances=G)[:2]


def run_authors(repo, variant, Y, seed, iters):
    """Fit the authors' model in a subprocess from a temporary copy; returns (seconds, points)."""
    with tempfile.TemporaryDirectory() as tmp:
        if (Path(repo) / "HEAD").exists() or str(repo).endswith(".git") or (Path(repo) / "objects").exists():
            # the code only: the snapshot may lack its large data files
            arch = subprocess.run(
                ["git", "--git-dir", str(repo), "archive", "HEAD", "--", "*.py", "LICENSE"],
                capture_output=True,
                check=True,
            )
            subprocess.run(["tar", "-x", "-C", tmp], input=arch.stdout, check=True)
        else:
            subprocess.run(["cp", "-r", f"{repo}/.", tmp], check=True)
        np.save(Path(tmp) / "_data.npy", Y)
        (Path(tmp) / "_driver.py").write_text(_DRIVER)
        out = Path(tmp) / "_out.json"
        subprocess.run(
            [sys.executable, "_driver.py", variant, "_data.npy", str(out), str(seed), str(iters)],
            cwd=tmp, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        res = json.loads(out.read_text())
    return res["seconds"], np.asarray(res["X"])


def reached(score, target):
    return all(s >= t for s, t in zip(score, target))


def ours(variant, Y, seed, score, target, converged=True, overrides=None):
    """Our time to the authors' score (budget ladder, tol = 0) and our converged fit; ``overrides``:
    constructor settings applied to every one of our fits (--kw)."""
    from lvmcore.models.hgplvm import HyperboloidGPLVM

    def fit(**kw):
        t0 = time.perf_counter()
        params = {"n_components": 2, "kappa": 100.0, "variant": variant, "random_state": seed}
        m = HyperboloidGPLVM(**{**params, **(overrides or {}), **kw}).fit(Y)
        return time.perf_counter() - t0, m

    fit(max_iter=2, tol=0)  # compile the step for this shape
    t_reach, it_reach, budget = None, None, 25
    while budget <= 3000:
        sec, m = fit(max_iter=budget, tol=0)
        if reached(score(m.lorentz_embedding_), target):
            t_reach, it_reach = sec, budget
            break
        budget = int(round(budget * 1.5))
    if not converged:
        return t_reach, it_reach, None, None, None
    sec, m = fit()
    return t_reach, it_reach, sec, m.n_iter_, score(m.lorentz_embedding_)


def fmt(s):
    return "/".join(f"{x:.3f}" for x in s)


def anchor(a):
    repo = Path(a.authors)
    if not repo.exists():
        print(
            f"authors' code not found at {repo}: fetch github:koshi-lmd/hyperboloid_gplvm or pass --authors"
        )
        return
    print(f"authors' code from {repo}; seed {a.seed}; our budgets 25, 38, ... (x1.5, tol = 0); --kw {a.kw}")
    for name in a.data:
        Y, score = load(name, a.seed)
        for variant in a.variants:
            iters = a.author_bayes_iters if variant == "bayesian" else a.author_iters
            t_auth, X = run_authors(repo, variant, Y, a.seed, iters)
            s_auth = score(X)
            t_reach, it_reach, t_conv, n_conv, s_conv = ours(
                variant, Y, a.seed, score, s_auth, converged=not a.no_converged, overrides=json.loads(a.kw)
            )
            reach = (
                f"ours to their score {t_reach:6.1f} s ({it_reach} it), {t_auth / t_reach:5.1f}x faster"
                if t_reach is not None
                else "ours never reached their score (up to 3000 it)"
            )
            conv = (
                ""
                if t_conv is None
                else f" | ours converged {t_conv:6.1f} s ({n_conv} it) score {fmt(s_conv)}"
            )
            print(
                f"{name:8s} {variant:9s} authors {t_auth:6.1f} s ({iters} it max) "
                f"score {fmt(s_auth)} | {reach}{conv}",
                flush=True,
            )


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

    jax.config.update("jax_enable_x64", True)  # this benchmark process only
    from lvmcore.data.synthetic import binary_tree
    from lvmcore.kernels.hyperbolic import he_kernel
    from lvmcore.manifolds.lorentz import expmap0
    from lvmcore.models.hgplvm import HyperboloidGPLVM
    from lvmcore.models.hgplvm.point import point_objective, point_value_and_grad
    from lvmcore.pca import pca_start

    print("point variant, gradient of eq. 4 (best of 7; ratio to one Cholesky of the same size)")
    for depth in (4, 5, 6):
        Y, *_ = binary_tree(depth, seed=0)
        n = len(Y)
        Yc = jnp.asarray(Y - Y.mean(0))
        P = pca_start(Y, 2)
        X = expmap0(jnp.asarray(P / np.max(np.linalg.norm(P, axis=1))))
        ls, lb = jnp.float64(np.log(0.1)), jnp.float64(np.log(30.0))
        K = he_kernel(X, X, 0.1, 100.0) + jnp.eye(n) / 30.0
        chol = best_ms(jax.jit(jnp.linalg.cholesky), K)
        hand = best_ms(jax.jit(lambda X: point_value_and_grad(X, ls, lb, Yc, 100.0)), X)  # noqa: B023
        auto = best_ms(
            jax.jit(jax.value_and_grad(lambda X: point_objective(X, ls, lb, Yc, 100.0))),  # noqa: B023
            X,
        )
        HyperboloidGPLVM(max_iter=2, tol=0).fit(Y)  # compile
        t0 = time.perf_counter()
        HyperboloidGPLVM(max_iter=iters, tol=0).fit(Y)
        it = 1e3 * (time.perf_counter() - t0) / iters
        print(
            f"  N={n:5d}: Cholesky {chol:7.1f} ms; hand-written value+grad {hand:7.1f} ms "
            f"({hand / chol:4.1f}x); autodiff {auto:7.1f} ms ({auto / chol:4.1f}x); "
            f"fit {it:7.1f} ms/iteration ({it / chol:4.1f}x)",
            flush=True,
        )


def chunked(iters, big):
    """The Bayesian variant's MC psi statistics map-reduced over row chunks on 1 vs 2 Dask worker
    processes, against the in-process fused step (M = 50, H = 5)."""
    from bench.common import local_client
    from lvmcore.data.synthetic import binary_tree
    from lvmcore.models.hgplvm import BayesianHyperboloidGPLVM

    Y, *_ = binary_tree(5, seed=0)
    rng = np.random.default_rng(0)
    for n in (len(Y), big):
        Yb = (
            Y
            if n == len(Y)
            else np.tile(Y, (n // len(Y) + 1, 1))[:n] + 0.01 * rng.standard_normal((n, Y.shape[1]))
        )

        def make(iters, chunks=None, Yb=Yb, client=None):
            return BayesianHyperboloidGPLVM(
                training="full",
                n_inducing=50,
                n_samples=5,
                max_iter=iters,
                tol=0,
                chunks=chunks,
                random_state=0,
            ).fit(Yb, client=client)

        t_fused, _ = per_iter(make, iters)
        res = {}
        for workers in (1, 2):
            with local_client(workers) as c:
                res[workers], _ = per_iter(lambda it: make(it, chunks=max(1, n // 4), client=c), iters)  # noqa: B023
        print(
            f"bayesian N={n}: in-process {1e3 * t_fused:.1f} ms/it; "
            f"chunked 1 worker {1e3 * res[1]:.1f} ms/it, "
            f"2 workers {1e3 * res[2]:.1f} ms/it, speed-up {res[1] / res[2]:.2f}x"
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--authors", default=str(MIRROR), help="git directory or checkout of the authors' code")
    ap.add_argument("--data", nargs="+", default=["tree5", "myeloid"])
    ap.add_argument("--variants", nargs="+", default=["point", "sparse", "bayesian"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--author-iters", type=int, default=1500)
    ap.add_argument("--author-bayes-iters", type=int, default=250)
    ap.add_argument("--kw", default="{}", help="JSON of constructor overrides for our fits")
    ap.add_argument("--no-converged", action="store_true", help="skip our converged (default) fits")
    ap.add_argument("--point-steps", action="store_true", help="only the point variant's step timings")
    ap.add_argument("--chunked", action="store_true", help="only the chunked Bayesian timings")
    ap.add_argument("--iters", type=int, default=20, help="iterations timed by --point-steps / --chunked")
    ap.add_argument("--big", type=int, default=20000, help="the larger N of --chunked")
    a = ap.parse_args()
    if a.point_steps:
        point_steps(a.iters)
    elif a.chunked:
        chunked(a.iters, a.big)
    else:
        anchor(a)


if __name__ == "__main__":
    main()
