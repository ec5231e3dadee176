"""Which models a sweep can fit, which sweep dimensions apply to each, and how a grid point
becomes constructor arguments. Plain Python: no Prefect, no Dask.

A *family* (``glle``) names every variant; a *key* (``glle_em``) names one variant and is the
group name in the result store.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from importlib import import_module

import numpy as np

#: sweep dimensions in store order, and the constructor argument each maps to
SWEEP_DIMS = ("k", "latent_dim", "kappa", "seed")
#: covariance scales a of GLLE's scale study (paper 001 section VI-C): one generation per a
COV_SCALES = (0.01, 0.1, 1.0, 5.0, 10.0)
#: paper 001's diagnostics of a fitted GLLE: its generations and its covariance-scale study, each
#: as costly as the fit's own embedding and needed by no metric that chooses a setting. A sweep
#: computes them for the setting it chooses (``extras="chosen"``, the default) or at every grid
#: point (``extras="all"``); ``EXTRAS_FLAG`` (a per-point value of the groups that hold them) is 1
#: where the point carries them, 0 where it was fitted without them
DIAGNOSTICS = ("generations", "scale_study")
EXTRAS_FLAG = "has_extras"
#: the sweep's choices of where the diagnostics are computed
EXTRAS_MODES = ("chosen", "all")
#: the constructor argument each sweep dimension sets
PARAM_OF_DIM = {"k": "n_neighbors", "latent_dim": "n_components", "kappa": "kappa", "seed": "random_state"}


@dataclass(frozen=True)
class ModelSpec:
    key: str
    family: str
    target: str  # "module:Class"
    dims: tuple[str, ...]
    fixed: dict = field(default_factory=dict)
    #: the sweep's own defaults for constructor parameters, where the estimator's default is not
    #: what a sweep should fit; a model option overrides them (``fixed`` ones it cannot)
    defaults: dict = field(default_factory=dict)
    multiview: bool = False
    #: the embedding lives in the Poincare ball: distances are hyperbolic
    hyperbolic: bool = False
    #: the model has posterior variances of the embedding
    has_variance: bool = False
    #: extra per-grid-point outputs: name -> dims after the sweep dims (the fitted attribute
    #: ``<name>_``, e.g. the graph models' ``n_components_graph``: how many connected components
    #: the neighbour graph had, each fitted apart and placed arbitrarily where more than one; GLLE's
    #: ``DIAGNOSTICS`` and their ``EXTRAS_FLAG``, which are not fitted attributes)
    extras: dict = field(default_factory=dict)
    description: str = ""
    #: sweep dimensions across which the bound (``elbo_``) ranks fits of the same data meaningfully;
    #: along the others "best" is chosen by the geodesic agreement (tasks.results; measured in
    #: bench/README.md, "Selection study"). Seeds only restart the same model.
    bound_comparable: tuple[str, ...] = ("seed",)

    def available(self) -> bool:
        """Whether this installation has the model's module."""
        from importlib.util import find_spec

        return find_spec(self.target.split(":")[0]) is not None

    def estimator_class(self):
        mod, cls = self.target.split(":")
        return getattr(import_module(mod), cls)

    def sweep_options(self, options: dict) -> dict:
        """The options a sweep applies to this model: its ``defaults``, then ``options`` over them
        (``fixed`` values and grid values aside: the model key and the point set those)."""
        return {**self.defaults, **options}

    def constructor_args(self, point: dict, options: dict) -> dict:
        args = dict(self.defaults)
        args.update(self.fixed)
        args.update(options)
        for d in self.dims:
            args[PARAM_OF_DIM[d]] = point[d]
        return args


def _spec(key, family, target, dims, **kw):
    return ModelSpec(key=key, family=family, target=target, dims=tuple(dims), **kw)


MODELS: dict[str, ModelSpec] = {
    s.key: s
    for s in [
        _spec(
            "ppca",
            "ppca",
            "lvmcore.models.ppca:PPCA",
            ("latent_dim", "seed"),
            has_variance=True,
            description="probabilistic PCA baseline (closed form)",
        ),
        _spec(
            "lllvm",
            "lllvm",
            "lvmcore.models.lllvm:LLLVM",
            ("k", "latent_dim", "seed"),
            has_variance=True,
            extras={"alpha": (), "beta": (), "gamma": (), "n_components_graph": ()},
            description="locally linear latent variable model, variational EM (paper 000)",
        ),
        _spec(
            "glle_em",
            "glle",
            "lvmcore.models.glle:GLLE",
            ("k", "latent_dim", "seed"),
            fixed={"method": "em"},
            extras={
                "generations": ("generation", "point", "component"),
                "scale_study": ("cov_scale", "point", "component"),
                "n_components_graph": (),
                EXTRAS_FLAG: (),
            },
            description="generative LLE, EM (paper 001, Algorithm 1)",
        ),
        _spec(
            "glle_direct",
            "glle",
            "lvmcore.models.glle:GLLE",
            ("k", "latent_dim", "seed"),
            fixed={"method": "direct"},
            extras={
                "generations": ("generation", "point", "component"),
                "scale_study": ("cov_scale", "point", "component"),
                "n_components_graph": (),
                EXTRAS_FLAG: (),
            },
            description="generative LLE, direct sampling (paper 001, Algorithm 2)",
        ),
        _spec(
            "bgplvm_rbf",
            "bgplvm",
            "lvmcore.models.bgplvm:BayesianGPLVM",
            ("latent_dim", "seed"),
            fixed={"kernel": "rbf"},
            has_variance=True,
            extras={"ard_weights": ("component",)},
            bound_comparable=("latent_dim", "seed"),
            description="Bayesian GP-LVM, RBF-ARD kernel (paper 004)",
        ),
        _spec(
            "bgplvm_svi",
            "bgplvm_svi",
            "lvmcore.models.bgplvm_svi:StochasticBayesianGPLVM",
            ("latent_dim", "seed"),
            fixed={"kernel": "rbf"},
            has_variance=True,
            extras={"ard_weights": ("component",)},
            bound_comparable=("latent_dim", "seed"),
            description="Bayesian GP-LVM, RBF-ARD, minibatch stochastic variational training (paper 004)",
        ),
        _spec(
            "bgplvm_linear",
            "bgplvm",
            "lvmcore.models.bgplvm:BayesianGPLVM",
            ("latent_dim", "seed"),
            fixed={"kernel": "linear"},
            has_variance=True,
            extras={"ard_weights": ("component",)},
            bound_comparable=("latent_dim", "seed"),
            description="Bayesian GP-LVM, linear-ARD kernel (paper 004)",
        ),
        _spec(
            "mrd",
            "mrd",
            "lvmcore.models.mrd:MRD",
            ("latent_dim", "seed"),
            multiview=True,
            # the estimator's 30 inducing inputs predict a held-out view worse than 10-NN
            # regression does on the UCI digits; 100 do better on every split measured, for about
            # 4x the fit (bench/README.md, "Mapping new cells", MRD's prediction)
            defaults={"n_inducing": 100},
            has_variance=True,
            extras={"ard_weights": ("view", "component")},
            bound_comparable=("latent_dim", "seed"),
            description="manifold relevance determination, views share q(X) (paper 004)",
        ),
        _spec(
            "hgplvm_point",
            "hgplvm",
            "lvmcore.models.hgplvm:HyperboloidGPLVM",
            ("kappa", "latent_dim", "seed"),
            fixed={"variant": "point"},
            hyperbolic=True,
            description="hyperboloid GP-LVM, exact (paper 002, eq. 4)",
        ),
        _spec(
            "hgplvm_sparse",
            "hgplvm",
            "lvmcore.models.hgplvm:HyperboloidGPLVM",
            ("kappa", "latent_dim", "seed"),
            # training="auto": full batch up to lvmcore.models.hgplvm.FULL_BATCH_MAX_N points,
            # minibatch above (point latents, lvmcore.models.hgplvm.minibatch); the extra output says which
            # ran
            fixed={"variant": "sparse"},
            hyperbolic=True,
            extras={"minibatch": ()},
            description=(
                "hyperboloid GP-LVM, sparse, learned inducing inputs (paper 002, eq. 5); full-batch fit "
                "up to 5,000 points, minibatch (uncollapsed bound, point latents) above: output "
                "'minibatch' is 1 where the minibatch fit ran"
            ),
        ),
        _spec(
            "hgplvm_bayesian",
            "hgplvm",
            # training="auto": full batch up to lvmcore.models.hgplvm.FULL_BATCH_MAX_N points,
            # minibatch (stochastic variational) above; the extra output says which ran
            "lvmcore.models.hgplvm:BayesianHyperboloidGPLVM",
            ("kappa", "latent_dim", "seed"),
            hyperbolic=True,
            has_variance=True,
            extras={"minibatch": ()},
            description=(
                "hyperboloid GP-LVM, wrapped-Gaussian variational (paper 002, eq. 6); full-batch fit up "
                "to 5,000 points, minibatch (stochastic variational) above: output 'minibatch' is 1 "
                "where the minibatch fit ran"
            ),
        ),
    ]
}

FAMILIES = sorted({s.family for s in MODELS.values()})


def resolve_models(names) -> list[ModelSpec]:
    """Model keys for a list of family names or keys (``"all"`` = every model), validated."""
    if isinstance(names, str):
        names = [names]
    if not names:
        raise ValueError("models is empty; name at least one of " + ", ".join(FAMILIES + list(MODELS)))
    out: list[ModelSpec] = []
    for name in names:
        if name == "all":
            picked = list(MODELS.values())
        elif name in MODELS:
            picked = [MODELS[name]]
        elif name in FAMILIES:
            picked = [s for s in MODELS.values() if s.family == name]
        else:
            raise ValueError(
                f"unknown model {name!r}; choose from families {FAMILIES}, keys {sorted(MODELS)} or 'all'"
            )
        if name == "all":
            picked = [s for s in picked if s.available()]
        missing = [s.key for s in picked if not s.available()]
        if missing:
            raise ValueError(
                f"model {name!r} is not available in this version (missing: {', '.join(missing)})"
            )
        out.extend(s for s in picked if s not in out)
    return out


def normalise_grid(grid: dict) -> dict[str, list]:
    """Validate a sweep grid: every dimension a non-empty list of distinct values."""
    if not isinstance(grid, dict) or not grid:
        raise ValueError(f"grid must be a non-empty mapping of {list(SWEEP_DIMS)} to lists, got {grid!r}")
    unknown = set(grid) - set(SWEEP_DIMS)
    if unknown:
        raise ValueError(f"unknown grid dimensions {sorted(unknown)}; allowed: {list(SWEEP_DIMS)}")
    out = {}
    for d in SWEEP_DIMS:
        if d not in grid:
            continue
        vals = grid[d]
        vals = list(vals) if isinstance(vals, (list, tuple, np.ndarray)) else [vals]
        if not vals:
            raise ValueError(f"grid[{d!r}] is empty; give at least one value")
        if len(set(vals)) != len(vals):
            raise ValueError(f"grid[{d!r}] has repeated values {vals}")
        if d in ("k", "latent_dim", "seed"):
            if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in vals):
                raise ValueError(f"grid[{d!r}] must hold integers, got {vals}")
            vals = [int(v) for v in vals]
            lo = 0 if d == "seed" else 1
            if min(vals) < lo:
                raise ValueError(f"grid[{d!r}] values must be >= {lo}, got {vals}")
        else:
            vals = [float(v) for v in vals]
            if min(vals) <= 0:
                raise ValueError(f"grid['kappa'] values must be > 0, got {vals}")
        out[d] = sorted(vals)
    return out


DEFAULT_DIM_VALUE = {"k": 10, "latent_dim": 2, "kappa": 100.0, "seed": 0}


def model_grid(spec: ModelSpec, grid: dict) -> dict[str, list]:
    """The part of the grid that applies to one model (a missing dimension takes its default)."""
    return {d: grid.get(d, [DEFAULT_DIM_VALUE[d]]) for d in spec.dims}


def options_for(spec: ModelSpec, model_options: dict) -> dict:
    """The constructor options of one model from a sweep's ``{family_or_key: {option: value}}``: its
    family's, then its key's (which win)."""
    opts = dict(model_options.get(spec.family, {}))
    opts.update(model_options.get(spec.key, {}))
    return opts


def grid_points(spec: ModelSpec, grid: dict):
    """Every grid point of one model as (index tuple, value dict)."""
    g = model_grid(spec, grid)
    dims = list(g)
    for idx in itertools.product(*(range(len(g[d])) for d in dims)):
        yield idx, {d: g[d][i] for d, i in zip(dims, idx)}


def check_extras_mode(mode: str) -> str:
    """``mode`` if it is one of ``EXTRAS_MODES`` (where a sweep computes GLLE's diagnostics), else
    ValueError naming them."""
    if mode not in EXTRAS_MODES:
        raise ValueError(f"extras must be one of {list(EXTRAS_MODES)}, got {mode!r}")
    return mode


def extras_inline(spec: ModelSpec, grid: dict, mode: str) -> bool:
    """Whether the grid points of ``spec`` compute GLLE's diagnostics with their fit: under
    ``extras="all"``, and where the model's grid has one point (it is the chosen setting, so no
    second fit after the selection); else the chosen setting gets them after the selection
    (``tasks.point.add_extras``). Models without diagnostics: True (nothing changes for them)."""
    if EXTRAS_FLAG not in spec.extras or check_extras_mode(mode) == "all":
        return True
    return sum(1 for _ in grid_points(spec, grid)) == 1


def available_families(names) -> list[str]:
    """The families among ``names`` whose every variant is available in this installation."""
    return [f for f in names if all(s.available() for s in MODELS.values() if s.family == f)]
