"""A sweep's plan, made once per run before any server, cluster or store work: the data set
described (sizes, fingerprint), the models resolved, the grid and every model option validated
against the estimators (with the fix in each refusal), the store's layout, and the refusal of a
store that holds another sweep. :class:`SweepPlan` is handed on as plain JSON (the CLI to the flow,
the flow to its subflow); :func:`set_up_store` makes its result store once the data is ingested, and
:func:`points_to_run` says which of its grid points a run still has to do.
What the plan costs is :mod:`tasks.costs`."""

from __future__ import annotations

import inspect
import itertools
import json
import math
import numbers
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import zarr

from lvmcore.data import describe, label_names, list_datasets
from lvmcore.graph import KNN_METHODS
from tasks.evaluate import eval_subset, eval_subset_attrs, label_notes, read_labels
from tasks.ingest import dataset_spec, ingested_attrs
from tasks.registry import (
    MODELS,
    PARAM_OF_DIM,
    ModelSpec,
    grid_points,
    model_grid,
    normalise_grid,
    options_for,
    resolve_models,
)
from tasks.store import (
    STATUS_DONE,
    STATUS_FAILED,
    Layout,
    check_numerics,
    growth,
    inputs_dir,
    metadata_to_rebuild,
    numerics_version,
    prepare_store,
    read_status,
    store_grid,
    store_path,
    sweep_id,
    write_store_attrs,
)

DEFAULT_GRID = {"k": [8, 12], "latent_dim": [2], "kappa": [100.0], "seed": [0]}
#: a sweep's grid points (all models together) are refused above this many: the store template,
#: the flow's parameters and the status arrays grow with it; split a larger study into sweeps
MAX_GRID_POINTS = 10_000
#: the fewest data points a sweep fits on
MIN_POINTS = 3
#: models that fit local neighbourhoods need more neighbours than latent dimensions (LLE weights)
NEEDS_K_ABOVE_Q = ("glle",)


def input_paths(store: str) -> tuple[str, str]:
    """Where the sweep keeps its ingested data and kNN graph: ``x.zarr`` -> ``x.inputs/`` (owned by
    that one store: ``x`` and ``x.zarr`` name the same store, see tasks.store.store_path)."""
    base = inputs_dir(store)
    return str(base / "data.zarr"), str(base / "graph.zarr")


def _default_max_iter(spec: ModelSpec, options: dict) -> int:
    """The most iterations (``elbo_trace_`` entries) a fit can record: max_iter, plus the GP-LVMs'
    init_iters (their first phase)."""
    try:
        params = inspect.signature(spec.estimator_class()).parameters
    except ImportError:
        return 1
    total = 0
    for name in ("max_iter", "init_iters"):
        p = params.get(name)
        value = options.get(name, p.default if p is not None else None)
        total += int(value) if isinstance(value, int) else 0
    return max(total, 1)


def _check_grid_input(grid) -> None:
    """Size and finiteness of a raw grid, before it is expanded into anything."""
    if not isinstance(grid, dict):
        raise ValueError(
            f'grid must be a mapping like {{"k": [8, 12], "latent_dim": [2], "seed": [0]}}, got {grid!r}'
        )
    size = 1
    for d, vals in grid.items():
        vals = vals if isinstance(vals, (list, tuple)) else [vals]
        size *= max(1, len(vals))
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise ValueError(f"grid[{d!r}] holds {v!r}; every grid value must be a finite number")
    if size > MAX_GRID_POINTS:
        raise ValueError(
            f"the grid has {size:,} points per model, above the limit of {MAX_GRID_POINTS:,} "
            "(tasks.sweep_plan.MAX_GRID_POINTS); split the study into several sweeps"
        )


def check_model_options(spec: ModelSpec, options: dict, grid: dict, n_points: int) -> None:
    """Model options against the estimator's constructor: names it takes, values of the type of
    its defaults (finite numbers), none that a grid dimension or the model key sets; then, at
    every grid point, the estimator's own parameter rules (``_parameter_constraints``) and its
    refusals for the data set's ``n_points`` (``LatentModel.check_size``: e.g. ``batch_size`` or
    ``n_inducing`` above N), so the fit on a worker cannot fail on them after the sweep started."""
    try:
        cls = spec.estimator_class()
    except ImportError as e:
        raise ValueError(f"model {spec.key!r} cannot be imported ({e})") from e
    params = inspect.signature(cls).parameters
    open_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {n: p for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    by_grid = {PARAM_OF_DIM[d]: d for d in spec.dims}
    for name, value in options.items():
        if name in by_grid:
            raise ValueError(
                f"model option {name!r} of {spec.key!r} is set by the grid dimension {by_grid[name]!r}; "
                f"put it in the grid instead"
            )
        if name in spec.fixed and spec.fixed[name] != value:
            raise ValueError(
                f"model {spec.key!r} fixes {name}={spec.fixed[name]!r}, the option asks for {value!r}; "
                f"name the model variant you want instead (keys: {sorted(MODELS)})"
            )
        if name not in named:
            if open_kw:
                continue
            raise ValueError(
                f"{cls.__name__} ({spec.key!r}) has no option {name!r}; its options are "
                f"{sorted(n for n in named if n not in by_grid)}"
            )
        default = named[name].default
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"model option {spec.key}.{name} = {value!r}; give a finite number")
        want = None
        if isinstance(default, bool):
            want, ok = "true or false", isinstance(value, bool)
        elif isinstance(default, int):
            want, ok = "an integer", isinstance(value, numbers.Integral) and not isinstance(value, bool)
        elif isinstance(default, float):
            want, ok = "a number", isinstance(value, numbers.Real) and not isinstance(value, bool)
        elif isinstance(default, str):
            want, ok = "a string", isinstance(value, str)
        if want is not None and not ok:
            raise ValueError(
                f"model option {spec.key}.{name} must be {want} (default {default!r}), got {value!r}"
            )
    for _, point in grid_points(spec, grid):
        try:  # the parameter rules first, then the size refusals (every model is a LatentModel)
            cls(**spec.constructor_args(point, options)).check_size(int(n_points))
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"model {spec.key!r} at {point}: {e} (a model's options are set with --options "
                f"'{{\"{spec.key}\": {{\"option\": value}}}}')"
            ) from e


def check_writable(store) -> None:
    """The store's folder can be written (probed with a real file: permissions, read-only mounts)."""
    p = store_path(store)
    probe_dir = p if p.exists() else p.parent
    while not probe_dir.exists():
        probe_dir = probe_dir.parent
    try:
        fd, name = tempfile.mkstemp(prefix=".embed-sweep-probe-", dir=probe_dir)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise ValueError(
            f"cannot write the store {p}: {probe_dir} is not writable ({e.strerror}); "
            "choose another --out or --store"
        ) from e


def data_source(dataset) -> tuple:
    """``(name or absolute path, options)`` of a dataset argument: a file's path is made absolute
    (the CLI's working directory is not the workers'), so its spelling never changes the sweep."""
    src, opts = dataset_spec(dataset)
    if isinstance(src, str) and src not in list_datasets() and Path(src).expanduser().exists():
        src = str(Path(src).expanduser().absolute())
    return src, opts


def plan_sweep(dataset, models, grid, store, model_options, n_generations, knn_method) -> SweepPlan:
    """Validate everything a sweep needs before any work (once per run); raises ValueError with
    the fix."""
    specs = resolve_models(models)
    if grid is not None:
        _check_grid_input(grid)
    grid = normalise_grid(grid if grid is not None else DEFAULT_GRID)
    if model_options is not None and not isinstance(model_options, dict):
        raise ValueError(
            f"model options must be a mapping {{model: {{option: value}}}}, got {model_options!r}"
        )
    model_options = dict(model_options or {})
    for key, opts in model_options.items():
        if not isinstance(opts, dict):
            raise ValueError(
                f"model options for {key!r} must be a mapping {{option: value}}, got {opts!r}; "
                f'e.g. {{"{key}": {{"max_iter": 100}}}}'
            )
    known = {s.family for s in specs} | {s.key for s in specs}
    stray = set(model_options) - known
    if stray:
        raise ValueError(
            f"model_options for {sorted(stray)}, which are not in this sweep's models {sorted(known)}"
        )
    if knn_method not in KNN_METHODS:
        raise ValueError(f"knn_method must be one of {KNN_METHODS}, got {knn_method!r}")
    src, opts = data_source(dataset)
    # sizes, attributes, fingerprint: a large file is read in blocks, a named data set is not drawn
    # (its recipe is fingerprinted; the ingest task draws it on a worker)
    meta = describe(src, **opts)
    sizes = meta["sizes"]
    n, D = sizes["point"], sizes["feature"]
    if n < MIN_POINTS:
        raise ValueError(f"data set {src!r} has {n} point(s); a sweep needs at least {MIN_POINTS}")
    n_views = len(meta["attrs"].get("views", [])) or 1
    for s in specs:
        g = model_grid(s, grid)
        check_model_options(s, options_for(s, model_options), grid, n)
        if s.family in NEEDS_K_ABOVE_Q and "k" in g and min(g["k"]) <= max(g["latent_dim"]):
            raise ValueError(
                f"model {s.key!r} needs k > latent_dim at every grid point (LLE weights), got k = "
                f"{min(g['k'])} with latent_dim = {max(g['latent_dim'])}; raise k or lower latent_dim"
            )
        if max(g["latent_dim"]) >= n:
            raise ValueError(f"latent_dim {max(g['latent_dim'])} needs more than {n} points in {src!r}")
        if s.multiview and n_views < 2:
            raise ValueError(
                f"model {s.key!r} needs a multi-view data set; {src!r} has one view: give a MuData "
                "file's modalities (two or more, each its own view), or {\"views\": [file, file]} "
                "(or the data set 'mrd_toy')"
            )
        if "k" in g and max(g["k"]) >= n:
            raise ValueError(f"grid k = {max(g['k'])} needs more than {n} points in {src!r}; lower k")
        dmin = min(sizes[f"feature_{v}"] for v in range(n_views)) if s.multiview else D
        if s.family in ("lllvm", "glle", "ppca") and max(g["latent_dim"]) >= dmin:
            raise ValueError(
                f"model {s.key!r}: latent_dim {max(g['latent_dim'])} must be below the data dimension {dmin}"
            )
    q_max = max(grid.get("latent_dim", [2]))
    # what each model is fitted with: its spec's sweep defaults under the user's options (recorded
    # in the identity, so a store fitted under other defaults is not grown with them)
    applied = {s.key: s.sweep_options(options_for(s, model_options)) for s in specs}
    layout = Layout(
        n_points=n,
        q_max=q_max,
        n_views=n_views,
        n_generations=int(n_generations),
        trace_len={s.key: min(_default_max_iter(s, applied[s.key]) + 1, 2000) for s in specs},
        numerics=numerics_version(),
    )
    identity = {
        "dataset": [src, opts],
        "data_fingerprint": meta["fingerprint"],
        "models": [s.key for s in specs],
        "options": model_options,
        "per_model": applied,
        "grid": grid,
        "n_generations": int(n_generations),
        "knn_method": knn_method,
    }
    provenance = json.loads(json.dumps(dict(meta["attrs"]), default=str))  # plain JSON, a flow parameter
    return SweepPlan(identity=identity, layout=asdict(layout), provenance=provenance, size=[n, D])


@dataclass(frozen=True)
class SweepPlan:
    """A validated sweep, made once per run by :func:`plan_sweep` and handed on (the CLI to the
    flow, the flow to its subflow) as plain JSON (:meth:`to_dict`): models, grid and options live
    in ``identity`` (what the store records), the store's sizes in ``layout``."""

    identity: dict
    layout: dict
    provenance: dict
    size: list

    @property
    def specs(self) -> list[ModelSpec]:
        return [MODELS[k] for k in self.identity["models"]]

    @property
    def grid(self) -> dict:
        return self.identity["grid"]

    @property
    def options(self) -> dict:
        return self.identity["options"]

    @property
    def dataset(self) -> list:
        """[name or path, options]"""
        return self.identity["dataset"]

    def store_layout(self) -> Layout:
        return Layout(**self.layout)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SweepPlan:
        return cls(**d)

    def check_request(self, dataset, models, grid, model_options, n_generations, knn_method) -> None:
        """Refuse a plan made for other arguments than the flow was called with (cheap: no data
        is loaded; the arguments were validated when the plan was made)."""
        asked = {
            "dataset": list(data_source(dataset)),
            "models": [s.key for s in resolve_models(models)],
            "grid": normalise_grid(grid if grid is not None else DEFAULT_GRID),
            "options": dict(model_options or {}),
            "n_generations": int(n_generations),
            "knn_method": knn_method,
        }
        differ = [k for k, v in asked.items() if self.identity[k] != v]
        if differ:
            raise ValueError(f"the sweep plan was made for other {', '.join(differ)}; plan this sweep again")


def check_store(store: str, identity: dict, refit_models: bool = False) -> None:
    """Refuse a store that holds a different sweep (before any work starts). With ``refit_models``
    (``--refit-models``) finished points of another version of the numerics are not refused: the
    run fits them again and says if an embedding moved (tasks.point.refit_points)."""
    p = store_path(store)
    if not p.exists():
        return
    # a damaged zarr.json: named with the fix before any server or cluster starts, or (a model
    # group's, a per-point array's, in a re-run of the same sweep) said here and rebuilt by prepare_store
    rebuilt = metadata_to_rebuild(p, sweep_id(identity))
    try:
        have = zarr.open_group(str(p), mode="r").attrs.get("sweep_id")
    except Exception as e:
        raise ValueError(
            f"{p} exists but is not a readable zarr store ({e}); choose another store path"
        ) from e
    if have is None:
        raise ValueError(
            f"{p} exists but is not an embed-sweep result store (or its set-up never finished); choose "
            "another store path, or pass --replace to move it aside"
        )
    if have != sweep_id(identity):  # refused unless this sweep extends the store (more values, models)
        growth(p, identity, [MODELS[k] for k in identity["models"]], identity["grid"])
    if not refit_models:
        check_numerics(p, skip=rebuilt)  # finished points of another version of the numerics are not resumed


def store_points(store: str, spec: ModelSpec):
    """Every grid point of one model as (index, values) in the store's coordinate order (a grown
    store has its added values at the end of each dimension)."""
    g = store_grid(store, spec)
    for idx in itertools.product(*(range(len(g[d])) for d in spec.dims)):
        yield idx, {d: g[d][i] for d, i in zip(spec.dims, idx)}


def points_to_run(store: str, specs, retry_failed: bool = False) -> tuple[list, int, int]:
    """(the grid points this run does, as (spec, index, point) in grid order; all grid points of the
    store's models; those that failed in an earlier run): a point done is skipped, a failed one too
    unless ``retry_failed``."""
    todo = []
    finished = (STATUS_DONE,) if retry_failed else (STATUS_DONE, STATUS_FAILED)
    n_failed_before = 0
    for s in specs:
        status = read_status(store, s.key)
        for idx, point in store_points(store, s):
            n_failed_before += status[idx] == STATUS_FAILED
            if status[idx] in finished:
                continue
            todo.append((s, idx, point))
    total = sum(1 for s in specs for _ in store_points(store, s))
    return todo, total, int(n_failed_before)


def set_up_store(store: str, plan: SweepPlan, data_path: str) -> list[str]:
    """The result store of ``plan`` made (or checked and grown) once its data is ingested at
    ``data_path``: its attributes (the dataset, the flow's parameters, the data's provenance, the
    ingest's record, the evaluation subset); returns what the label metrics leave out or cannot
    compute, kept in the store as ``evaluation_notes`` (``show`` reads them back)."""
    labels = read_labels(data_path)
    attrs = {
        "dataset": json.dumps(plan.dataset),
        "flow_parameters": json.dumps(plan.identity),
        **{f"data_{k}": v for k, v in plan.provenance.items()},
        **ingested_attrs(data_path),  # the preprocessing's record (explained variance), ingest's own
        **eval_subset_attrs(plan.size[0], labels),
    }
    prepare_store(store, plan.identity, plan.specs, plan.grid, plan.store_layout(), attrs)
    notes = label_notes(labels, eval_subset(plan.size[0], labels), label_names(data_path))[1]
    write_store_attrs(store, {"evaluation_notes": notes})
    return notes
