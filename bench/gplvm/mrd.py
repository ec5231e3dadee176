"""MRD on the paper-004 toy data (section 5.1): ours against GPy 1.15's MRD on the same views,
linear-ARD kernels, Q = 8, M = 30. Prints fit time (ratio to GPy), normalised ARD weights per view,
the segmentation they imply (threshold 1e-3), learned noise variances (truth 0.01), and the
cross-view prediction error (view 1 from noisy view 0) on the shared-signal columns: ours by
Algorithm 1, ours without its completion step, and GPy's (InferenceX on view 0, then predict).

    python -m bench.gplvm.mrd [--seed 0]

Runs on one CPU core (``bench/common.py``: XLA's thread pool follows the process's affinity), so that
the fit times compare one core with one core."""


import argparse
import time

import numpy as np

from bench.common import pin_one_core


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
    print(f"on core {pin_one_core()}")
    import GPy

    from lvmcore.data.synthetic import mrd_toy
    from lvmcore.models.mrd import MRD

    views, _ = mrd_toy(100, seed=a.seed)
    views = [Y - Y.mean(0) for Y in views]
    np.set_printoptions(precision=4, suppress=True)

    t0 = time.perf_counter()
    ours = MRD(n_components=8, n_inducing=30, kernel="linear", random_state=a.seed, max_iter=1000).fit(views)
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

    def rmse_of(pred):  # (shared-signal columns, private-signal columns) of view 1
        err = pred - views[1][::5]
        return np.sqrt(np.mean(err[:, 10:] ** 2)), np.sqrt(np.mean(err[:, :10] ** 2))

    rmse = rmse_of(mean)
    # GPy's nearest equivalent: q(x*) from view 0 by its InferenceX on view 0's sub-model, then
    # view 1's predictive mean at q(x*) (GPy has no step 2 of Algorithm 1, the completion of the
    # dimensions view 0 cannot inform from the nearest training point)
    np.random.seed(a.seed)  # noqa: NPY002
    xs, _ = g.bgplvms[0].infer_newX(Y0)
    gmean = np.asarray(g.predict(xs, Yindex=1)[0])
    rmse_gpy = rmse_of(gmean)
    # ours without the completion step (q(x*) straight into view 1), the like-for-like comparison
    mu, S = ours.infer({0: Y0})
    plain = ours.predict_view(mu, S, 1)[0]
    rmse_plain = rmse_of(np.asarray(plain))

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
        f"view 1 from noisy view 0, RMSE on its shared-signal / private-signal columns (spreads "
        f"{views[1][:, 10:].std():.3f} / {views[1][:, :10].std():.3f}, noise 0.1): ours (Algorithm 1) "
        f"{rmse[0]:.3f} / {rmse[1]:.3f}, ours without the completion step {rmse_plain[0]:.3f} / "
        f"{rmse_plain[1]:.3f}, GPy (InferenceX, then predict) {rmse_gpy[0]:.3f} / {rmse_gpy[1]:.3f}"
    )


if __name__ == "__main__":
    main()
