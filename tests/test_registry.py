"""The registry's facts about each model (tasks/registry.py) against what the estimator produces
when the sweep fits it (tasks.fit.fit_point, on an ingested store and kNN graph): posterior
variances where ``has_variance`` says so and only there, every registered extra output, points in
the Poincare ball for ``hyperbolic`` models, and a bound wherever ``bound_comparable`` lets the
bound rank fits. A flag that drifts from its model fails here."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.fit import fit_point
from tasks.ingest import ingest_dataset
from tasks.knn import build_graph
from tasks.registry import MODELS, SWEEP_DIMS

#: small settings per family (the sweep's options), enough for every output to exist
OPTIONS = {
    "ppca": {},
    "lllvm": {"max_iter": 3},
    "glle": {"max_iter": 5},
    "bgplvm": {"n_inducing": 5, "max_iter": 4, "init_iters": 2},
    "bgplvm_svi": {"n_inducing": 5, "max_iter": 3, "batch_size": 16},
    "mrd": {"n_inducing": 5, "max_iter": 4, "init_iters": 2},
    "hgplvm": {"max_iter": 5},
}
POINT = {"k": 6, "latent_dim": 2, "kappa": 100.0, "seed": 0}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """(data path, graph path) of one single-view and one multi-view data set."""
    root = tmp_path_factory.mktemp("registry")
    out = {}
    sets = {"single": {"name": "swiss_roll", "n": 40, "seed": 3}, "views": {"name": "mrd_toy", "n": 40}}
    for name, ds in sets.items():
        data = ingest_dataset(ds, str(root / f"{name}.zarr"))
        out[name] = (data, build_graph(data, POINT["k"], str(root / f"{name}-graph.zarr")))
    return out


def test_every_model_family_has_test_settings():
    assert {s.family for s in MODELS.values()} == set(OPTIONS)


@pytest.mark.parametrize("key", sorted(k for k, s in MODELS.items() if s.available()))
def test_registry_flags_match_what_the_fitted_model_produces(key, inputs):
    spec = MODELS[key]
    data, graph = inputs["views" if spec.multiview else "single"]
    point = {d: POINT[d] for d in spec.dims}
    res = fit_point(key, OPTIONS[spec.family], data, graph, (0,) * len(spec.dims), point, n_generations=1)
    assert res.status == "done", res.error
    n, q = res.embedding.shape
    assert q == POINT["latent_dim"]

    # has_variance: positive (N, Q) marginal variances exactly when the registry says so
    if spec.has_variance:
        assert res.embedding_var is not None and res.embedding_var.shape == (n, q)
        assert np.all(np.isfinite(res.embedding_var)) and np.all(res.embedding_var > 0)
    else:
        assert res.embedding_var is None, f"{key} returns variances; set has_variance=True"

    # extras: every registered output is produced, with the registered number of trailing dims
    assert set(res.extras) == set(spec.extras)
    for name, dims in spec.extras.items():
        assert np.asarray(res.extras[name]).ndim == len(dims), name
        assert np.all(np.isfinite(res.extras[name])), name

    # hyperbolic: the embedding is in the Poincare ball (distances there are hyperbolic)
    radius = np.linalg.norm(res.embedding, axis=1)
    if spec.hyperbolic:
        assert np.all(radius < 1)

    # bound_comparable: only sweep dimensions of this model; where the bound ranks fits it is a
    # finite number, the last entry of the fit's own trace
    assert set(spec.bound_comparable) <= set(spec.dims) & set(SWEEP_DIMS)
    if spec.bound_comparable:
        assert np.isfinite(res.elbo) and res.elbo == res.elbo_trace[-1]


def test_sweep_defaults_yield_to_options_and_fixed_values_do_not():
    """A spec's ``defaults`` (MRD's 100 inducing inputs) reach the estimator unless a model option
    sets the parameter; ``fixed`` values and grid dimensions win over both."""
    mrd = MODELS["mrd"]
    point = {"latent_dim": 3, "seed": 1}
    assert mrd.constructor_args(point, {})["n_inducing"] == 100
    assert mrd.estimator_class()().n_inducing != 100  # the estimator's own default is another
    got = mrd.constructor_args(point, {"n_inducing": 20, "n_components": 7})
    assert got["n_inducing"] == 20 and got["n_components"] == 3 and got["random_state"] == 1
    assert MODELS["bgplvm_linear"].constructor_args(point, {})["kernel"] == "linear"
