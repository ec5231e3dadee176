"""Issue 36, item 1: every registered model is invariant to the data's scale. For data c Y the fit
is the fit of Y (the same embedding up to the model's symmetries) and the bound, a density of Y,
moves by the log-Jacobian: elbo(c Y) = elbo(Y) - N D log c (GLLE's direct sampling: its bound is a
density of the pure-number weights, the same for every c). Each model runs a fixed number of steps
(``tol`` 0 where it has one) on N = 60 points at c = 1e-6, 1 and 1e6."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from scipy.spatial import procrustes

from lvmcore.data import load
from tasks.evaluate import poincare_distances
from tasks.registry import MODELS

N = 60
SCALES = (1e-6, 1e6)
#: the models whose bound is not a density of Y (its change with c is 0, not -N D log c)
BOUND_OF_WEIGHTS = ("glle_direct",)
#: models whose likelihood integrates a flat-prior constant mean per column out (the point hGP-LVM's
#: restricted likelihood, mean="integrated"): a density of the N - 1 contrasts of each column, so
#: the bound moves by -(N - 1) D log c
RESTRICTED = ("hgplvm_point",)
#: a fixed, small number of steps per model (the point is the same path at every scale)
STEPS = {"lllvm": 5, "bgplvm": 10, "bgplvm_svi": 10, "mrd": 10, "hgplvm": 10, "glle": 30}
#: models known not to be scale-free yet, each with its measured error (a strict xfail: the mark
#: must go once the model passes); none today
NOT_YET: dict[str, str] = {}


def _data(key):
    if MODELS[key].multiview:
        ds = load("mrd_toy", n=N, seed=0)
        return [ds[v].values for v in ds.attrs["views"]]
    return load("swiss_roll", n=N, seed=0)["Y"].values


def _estimator(key):
    spec = MODELS[key]
    cls = spec.estimator_class()
    params = inspect.signature(cls).parameters
    args = dict(spec.fixed)
    args["n_components"] = 2
    args["random_state"] = 0
    if "k" in spec.dims:
        args["n_neighbors"] = 8
    if "kappa" in spec.dims:
        args["kappa"] = 10.0
    if "max_iter" in params:
        args["max_iter"] = STEPS.get(spec.family, 10)
    if "tol" in params:
        args["tol"] = 0.0
    if "n_inducing" in params:
        args["n_inducing"] = 10
    if "init_iters" in params:
        args["init_iters"] = 0
    if "batch_size" in params:
        args["batch_size"] = N // 2
    return cls(**args)


def _fit(key, c):
    Y = _data(key)
    Y = [c * y for y in Y] if isinstance(Y, list) else c * Y
    m = _estimator(key).fit(Y)
    nd = sum(y.size for y in Y) if isinstance(Y, list) else Y.size
    return m, nd


def _params():
    out = []
    for key in MODELS:
        marks = [pytest.mark.xfail(strict=True, reason=NOT_YET[key])] if key in NOT_YET else []
        out.append(pytest.param(key, marks=marks, id=key))
    return out


@pytest.mark.parametrize("key", _params())
def test_fit_at_any_scale_is_the_fit_of_unit_data_and_the_bound_moves_by_the_log_jacobian(key):
    ref, nd = _fit(key, 1.0)
    for c in SCALES:
        m, _ = _fit(key, c)
        values = nd - (nd // N if key in RESTRICTED else 0)  # the data values the bound is a density of
        shift = 0.0 if key in BOUND_OF_WEIGHTS else -values * np.log(c)
        # the bound: the shift is up to 1e4 nats; agreement to 1e-6 of the bound's size
        tol = 1e-6 * max(1.0, abs(ref.elbo_), abs(shift))
        assert abs((m.elbo_ - shift) - ref.elbo_) <= tol, (
            f"{key} c={c:g}: bound {m.elbo_:.6f}, expected {ref.elbo_ + shift:.6f} "
            f"(unit-scale bound {ref.elbo_:.6f} shifted by {shift:.3f}); "
            f"off by {m.elbo_ - shift - ref.elbo_:.4g}"
        )
        if MODELS[key].hyperbolic:  # isometries of the disc: compare hyperbolic distances
            a, b = poincare_distances(ref.embedding_), poincare_distances(m.embedding_)
            err = np.max(np.abs(a - b)) / max(np.max(a), 1e-12)
            assert err <= 1e-5, f"{key} c={c:g}: hyperbolic distances differ by {err:.3g} (relative)"
        else:  # rotation, reflection, translation and (for the latent scale) overall size
            disparity = procrustes(ref.embedding_, m.embedding_)[2]
            assert disparity <= 1e-8, f"{key} c={c:g}: Procrustes disparity {disparity:.3g}"
