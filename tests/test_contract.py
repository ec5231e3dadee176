"""The one estimator contract (lvmcore/models/_base.py), checked the same way over every estimator,
in the spirit of scikit-learn's ``check_estimator``: keyword-only constructors that only store
their arguments, ``clone`` and ``get_params`` / ``set_params`` round trips, every parameter rule
declared and enforced with the parameter named, ``NotFittedError`` before ``fit``, no mutation of
the caller's arrays, the shapes and meaning of the fitted attributes, and a ``transform`` that
leaves the fitted state as it was.

A new estimator joins with one ``Case`` line in ``CASES``."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from dataclasses import dataclass, field

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils._param_validation import generate_invalid_param_val, make_constraint

from lvmcore.data import synthetic as S


@dataclass(frozen=True)
class Case:
    name: str  # the class's name in lvmcore.models
    params: dict  # small, fast settings
    data: str = "single"  # "single": fit(Y); "views": fit([Y1, Y2])
    uses_graph: bool = False
    #: a method (name, args) that needs a fitted model; transform is checked when the class has one
    needs_fit: tuple = ()
    fit_kw: dict = field(default_factory=dict)


CASES = [
    Case("PPCA", {"n_components": 2}),
    Case(
        "GLLE", {"n_components": 2, "n_neighbors": 6, "max_iter": 5}, uses_graph=True, needs_fit=("sample", 1)
    ),
    Case(
        "BayesianGPLVM",
        {"n_components": 2, "n_inducing": 5, "max_iter": 4, "init_iters": 2, "random_state": 0},
    ),
    Case(
        "MRD",
        {"n_components": 3, "n_inducing": 5, "kernel": ["rbf", "linear"], "max_iter": 4, "init_iters": 2},
        data="views",
        needs_fit=("segment",),
    ),
    Case(
        "StochasticBayesianGPLVM",
        {
            "n_components": 2,
            "n_inducing": 5,
            "batch_size": 10,
            "max_iter": 3,
            "init_epochs": 1,
            "random_state": 0,
        },
    ),
    Case("LLLVM", {"n_components": 2, "n_neighbors": 6, "max_iter": 3}, uses_graph=True),
    Case("HyperboloidGPLVM", {"n_components": 2, "variant": "sparse", "max_iter": 5, "random_state": 0}),
    Case(
        "BayesianHyperboloidGPLVM",
        {
            "training": "minibatch",
            "n_inducing": 5,
            "batch_size": 10,
            "max_iter": 3,
            "local_iter": 2,
            "random_state": 0,
        },
    ),
]


def _estimator(case: Case):
    import lvmcore.models

    return getattr(lvmcore.models, case.name)(**case.params)


def _data(case: Case):
    Y, _ = S.swiss_roll(40, seed=3)
    if case.data == "views":
        return [Y, np.column_stack([Y[:, :2] ** 2, Y[:, 2]])]
    return Y


def _snapshot(obj):
    return {k: copy.deepcopy(v) for k, v in vars(obj).items()}


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if sp.issparse(a) or sp.issparse(b):
        return sp.issparse(a) and sp.issparse(b) and a.shape == b.shape and (a != b).nnz == 0
    if dataclasses.is_dataclass(a) and not isinstance(a, type):  # e.g. LL-LVM's posterior factors
        return type(a) is type(b) and _same(vars(a), vars(b))
    try:
        return bool(a == b)
    except Exception:  # objects without equality (e.g. a fitted scikit-learn helper): same identity
        return a is b


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c.name)
def fitted(request):
    case = request.param
    data = _data(case)
    before = copy.deepcopy(data)
    est = _estimator(case)
    out = est.fit(data, **case.fit_kw)
    return case, est, out, data, before


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_constructor_stores_keyword_only_parameters(case):
    est = _estimator(case)
    sig = inspect.signature(type(est).__init__)
    params = [p for p in sig.parameters.values() if p.name != "self"]
    assert all(p.kind is p.KEYWORD_ONLY for p in params), [
        p.name for p in params if p.kind is not p.KEYWORD_ONLY
    ]
    got = est.get_params()
    assert set(got) == {p.name for p in params}
    for name, value in case.params.items():
        assert got[name] is value  # stored unchanged, not copied or converted
    assert not [k for k in vars(est) if k.endswith("_") and not k.startswith("_")]  # no learned state yet
    # every parameter has a declared rule
    assert set(type(est)._parameter_constraints) == set(got)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_clone_and_params_round_trip(case):
    est = _estimator(case)
    c = clone(est)
    assert type(c) is type(est) and c is not est
    assert c.get_params() == est.get_params()
    changed = {"random_state": 7} if "random_state" in est.get_params() else {"n_components": 3}
    assert est.set_params(**changed) is est
    assert {k: est.get_params()[k] for k in changed} == changed
    assert clone(est).get_params() == est.get_params()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_bad_parameter_is_refused_by_name_before_work(case):
    """For each parameter and each of its rules, a value that breaks that rule (and no other the
    parameter allows) is refused by ``fit`` with a ValueError naming the parameter."""
    est = _estimator(case)
    constraints = type(est)._parameter_constraints
    data = _data(case)
    tried = 0
    for name, rules in constraints.items():
        rules = [make_constraint(r) for r in rules]
        for rule in rules:
            try:
                bad = generate_invalid_param_val(rule)
            except NotImplementedError:
                continue
            if any(r.is_satisfied_by(bad) for r in rules):
                continue
            with pytest.raises(ValueError, match=rf"'{name}' parameter of {case.name} must be"):
                clone(est).set_params(**{name: bad}).fit(data)
            tried += 1
    assert tried >= 2


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_not_fitted_error(case):
    est = _estimator(case)
    calls = [case.needs_fit] if case.needs_fit else []
    if hasattr(est, "transform"):
        calls.append(("transform", _data(case)[0] if case.data == "views" else _data(case)))
    assert calls
    for name, *args in calls:
        with pytest.raises(NotFittedError):
            getattr(est, name)(*args)


def test_fit_returns_self_and_leaves_the_input_alone(fitted):
    case, est, out, data, before = fitted
    assert out is est
    for a, b in zip(data if case.data == "views" else [data], before if case.data == "views" else [before]):
        np.testing.assert_array_equal(a, b)


def test_fitted_attributes(fitted):
    case, est, _, data, _ = fitted
    n = (data[0] if case.data == "views" else data).shape[0]
    q = est.n_components
    assert est.embedding_.shape == (n, q) and np.all(np.isfinite(est.embedding_))
    var = est.embedding_var_
    assert var is None or (var.shape == (n, q) and np.all(var > 0))
    if hasattr(est, "embedding_cov_"):
        assert est.embedding_cov_.shape == (n, q, q)
        C = est.embedding_cov_
        np.testing.assert_allclose(C, np.swapaxes(C, 1, 2), rtol=1e-10, atol=0)  # covariances:
        assert np.all(np.linalg.eigvalsh(C) > -1e-10 * np.abs(C).max())  # symmetric, semi-definite
    assert isinstance(est.elbo_, float) and np.isfinite(est.elbo_)
    assert isinstance(est.n_iter_, (int, np.integer)) and est.n_iter_ >= 1
    assert est.elbo_trace_.shape == (est.n_iter_,) and np.all(np.isfinite(est.elbo_trace_))
    assert isinstance(est.converged_, (bool, np.bool_))  # stopped by its rule (or a closed form)
    fresh = clone(est)
    assert not hasattr(fresh, "embedding_")  # clone copies parameters, not learned state


def test_graph_is_used_or_refused(fitted):
    case, est, _, data, _ = fitted
    if case.uses_graph:
        return
    with pytest.raises(ValueError, match="does not use a neighbour graph"):
        clone(est).fit(data, graph=np.zeros((40, 3), dtype=int))


def test_transform_does_not_change_the_fitted_state(fitted):
    """``transform`` (or, for a model without one, its query method) leaves the fitted state and
    its argument as they were."""
    case, est, _, data, _ = fitted
    Y = data[0] if case.data == "views" else data
    before, Ynew = _snapshot(est), Y[:5].copy()
    if hasattr(est, "transform"):
        X = est.transform(Ynew)
        assert X.shape == (5, est.n_components)
        np.testing.assert_array_equal(Ynew, Y[:5])
    else:
        name, *args = case.needs_fit
        getattr(est, name)(*args)
    after = _snapshot(est)
    assert after.keys() == before.keys()
    changed = [k for k in before if not _same(before[k], after[k])]
    assert not changed, changed


def test_importing_and_fitting_leaves_jax_x64_flag_alone():
    """In a fresh interpreter: import every lvmcore module, then fit a Bayesian GP-LVM (jax work on
    the bound and its gradient); the process-wide flag stays off, jax's default dtype stays float32,
    and the fit itself still ran in float64."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import importlib, pkgutil
        import jax, jax.numpy as jnp, numpy as np
        import lvmcore
        names = [m.name for m in pkgutil.walk_packages(lvmcore.__path__, "lvmcore.")]
        for name in names:
            importlib.import_module(name)
            assert not jax.config.jax_enable_x64, name
        from lvmcore.models import BayesianGPLVM
        Y = np.random.default_rng(0).standard_normal((30, 4))
        m = BayesianGPLVM(n_components=2, n_inducing=4, max_iter=3, init_iters=1).fit(Y)
        assert not jax.config.jax_enable_x64
        assert jnp.ones(1).dtype == jnp.float32
        assert m.embedding_.dtype == np.float64 and np.asarray(m.glob_["Z"]).dtype == np.float64
        from lvmcore.models import BayesianHyperboloidGPLVM
        h = BayesianHyperboloidGPLVM(n_components=2, max_iter=3, random_state=0).fit(Y)
        assert not jax.config.jax_enable_x64
        assert h.embedding_.dtype == np.float64 and h.lorentz_embedding_.dtype == np.float64
        print(len(names), "modules")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[0]) >= 20


def test_check_options_names_the_key_and_the_accepted_ones():
    from lvmcore.checks import check_options

    check_options({"a": 1}, ["a", "b"], "data-set")  # known keys pass
    with pytest.raises(ValueError, match=r"unknown data-set option 'zz'; accepted: a, b$"):
        check_options({"a": 1, "zz": 2}, ["b", "a"], "data-set")
