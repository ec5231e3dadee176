"""MRD on the paper-004 toy data (section 5.1): ours against GPy 1.15's MRD on the same views,
linear-ARD kernels, Q = 8, M = 30. Prints fit time (ratio to GPy), normalised ARD weights per view,
the segmentation they imply (threshold 1e-3), learned noise variances (truth 0.01), and our
cross-view prediction error (view 1 from noisy view 0, Algorithm 1) on the shared-signal columns.

    python bench/mrd_toy.py [--seed 0]"""

import os

for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(v, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def segment(rel, thr=1e-3):
    on = rel > thr
    shared = [q for q in range(rel.shape[1]) if on[:, q].all()]
    private = {
        v: [q for q in range(rel.shape[1]) if on[v, q] and on[:, q].sum() == 1] for v in range(len(rel))
    }
    return shared, private


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import GPy

    from lvmcore.data.synthetic import mrd_toy
    from lvmcore.models.mrd import MRD

    views, _ = mrd_toy(100, seed=a.seed)
    views = [Y - Y.mean(0) for Y in views]
    np.set_printoptions(precision=4, suppress=True)

    t0 = time.perf_counter()
    ours = MRD(8, 30, "linear", random_state=a.seed, max_iter=1000).fit(views)
    t_ours = time.perf_counter() - t0

    # GPy initialises from numpy's global random state; seed it so its run is repeatable
    np.random.seed(a.seed)  # noqa: NPY002
    t0 = time.perf_counter()
    g = GPy.models.MRD(
        views, input_dim=8, num_inducing=30, kernel=[GPy.kern.Linear(8, ARD=True) for _ in views]
    )
    # GPy's default L-BFGS-B stops at the initial point on this model ("Converged" after 0.1 s,
    # bound -1169); SCG, GPy's usual choice for GP-LVMs, does optimise it
    try:
        g.optimize("scg", messages=False, max_iters=1000)
        gpy_error = None
    except np.linalg.LinAlgError as e:  # GPy's own Cholesky can fail mid-run
        gpy_error = f"{type(e).__name__}: {e}"
    t_gpy = time.perf_counter() - t0
    w_gpy = np.stack([b.kern.input_sensitivity() for b in g.bgplvms])
    rel_gpy = w_gpy / w_gpy.max(axis=1, keepdims=True)
    noise_gpy = [float(np.asarray(b.likelihood.variance).ravel()[0]) for b in g.bgplvms]

    rng = np.random.default_rng(3)
    Y0 = views[0][::5] + 0.1 * rng.standard_normal(views[0][::5].shape)
    mean, _ = ours.predict({0: Y0}, target=1)
    rmse = np.sqrt(np.mean((mean[:, 10:] - views[1][::5, 10:]) ** 2))

    print(f"fit time: ours {t_ours:.1f} s, GPy {t_gpy:.1f} s, GPy/ours {t_gpy / t_ours:.1f}")
    if gpy_error:
        print(f"GPy's optimisation stopped with {gpy_error}; its numbers below are where it stopped")
    print(f"bound: ours {ours.elbo_:.2f}, GPy {float(np.asarray(g.log_likelihood()).ravel()[0]):.2f}")
    print("normalised ARD weights, ours:\n", ours.relevance())
    print("normalised ARD weights, GPy:\n", rel_gpy)
    print("segmentation (shared, private), ours:", segment(ours.relevance()))
    print("segmentation (shared, private), GPy: ", segment(rel_gpy))
    print(f"noise variances: ours {ours.noise_variance_}, GPy {np.array(noise_gpy)} (truth 0.01)")
    print(
        f"ours, view 1 from noisy view 0, shared-signal columns: RMSE {rmse:.3f} "
        f"(their spread {views[1][:, 10:].std():.3f}, noise 0.1)"
    )


if __name__ == "__main__":
    main()
