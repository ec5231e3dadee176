"""The embed-sweep flow: ingest -> kNN (once, at the largest k) -> fit / evaluate / write per
grid point on a Dask cluster -> report. Resumable: grid points already done are skipped."""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import numbers
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import zarr
from prefect import flow, get_run_logger
from prefect.futures import as_completed
from prefect_dask import DaskTaskRunner

from flows.cluster import client_kwargs, normalise_cluster, start_cluster
from flows.progress import Progress
from lvmcore.data import describe, label_names
from lvmcore.graph import KNN_METHODS
from tasks.artifacts import publish_results, start_progress, update_progress
from tasks.evaluate import eval_subset, eval_subset_attrs, label_notes
from tasks.ingest import dataset_spec, ingest_task, ingested_attrs
from tasks.knn import graph_matches, knn_task
from tasks.point import batch_sizes, batches, grid_points_task
from tasks.registry import MODELS, ModelSpec, grid_points, model_grid, normalise_grid, resolve_models
from tasks.report import report_task
from tasks.store import (
    STATUS_DONE,
    STATUS_FAILED,
    Layout,
    StoreWriteError,
    check_numerics,
    describe_damage,
    failure_summary,
    growth,
    inputs_dir,
    mark_pending,
    metadata_to_rebuild,
    numerics_version,
    prepare_store,
    read_status,
    record_flow_run,
    store_grid,
    store_lock,
    store_path,
    sweep_id,
    verify_points,
    write_error,
)

DEFAULT_GRID = {"k": [8, 12], "latent_dim": [2], "kappa": [100.0], "seed": [0]}
#: a sweep's grid points (all models together) are refused above this many: the store template,
#: the flow's parameters and the status arrays grow with it; split a larger study into sweeps
MAX_GRID_POINTS = 10_000
#: the fewest data points a sweep fits on
MIN_POINTS = 3
#: models that fit local neighbourhoods need more neighbours than latent dimensions (LLE weights)
NEEDS_K_ABOVE_Q = ("glle",)


def get_dask_worker_count() -> int:
    """Number of workers (threads) of the Dask cluster this flow's task runner uses (0 outside one)."""
    try:
        from prefect.context import FlowRunContext

        runner = FlowRunContext.get().task_runner
        info = runner._client.scheduler_info(n_workers=-1)["workers"]
        return sum(int(w.get("nthreads", 1)) for w in info.values())
    except Exception:  # not on a Dask task runner: batch for a single worker
        return 0


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


def _options_for(spec: ModelSpec, model_options: dict) -> dict:
    opts = dict(model_options.get(spec.family, {}))
    opts.update(model_options.get(spec.key, {}))
    return opts


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
            "(flows.sweep.MAX_GRID_POINTS); split the study into several sweeps"
        )


def check_model_options(spec: ModelSpec, options: dict, grid: dict, n_points: int) -> None:
    """Model options against the estimator's constructor: names it takes, values of the type of
    its defaults (finite numbers), none that a grid dimension or the model key sets; then, at
    every grid point, the estimator's own parameter rules (``_parameter_constraints``) and its
    refusals for the data set's ``n_points`` (``LatentModel.check_size``: e.g. ``batch_size`` or
    ``n_inducing`` above N), so the fit on a worker cannot fail on them after the sweep started."""
    from tasks.registry import _PARAM_OF_DIM

    try:
        cls = spec.estimator_class()
    except ImportError as e:
        raise ValueError(f"model {spec.key!r} cannot be imported ({e})") from e
    params = inspect.signature(cls).parameters
    open_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {n: p for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    by_grid = {_PARAM_OF_DIM[d]: d for d in spec.dims}
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
    from lvmcore.data import list_datasets

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
        check_model_options(s, _options_for(s, model_options), grid, n)
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
    layout = Layout(
        n_points=n,
        q_max=q_max,
        n_views=n_views,
        n_generations=int(n_generations),
        trace_len={s.key: min(_default_max_iter(s, _options_for(s, model_options)) + 1, 2000) for s in specs},
        numerics=numerics_version(),
    )
    identity = {
        "dataset": [src, opts],
        "data_fingerprint": meta["fingerprint"],
        "models": [s.key for s in specs],
        "options": model_options,
        "per_model": {s.key: _options_for(s, model_options) for s in specs},
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


def check_store(store: str, identity: dict) -> None:
    """Refuse a store that holds a different sweep (before any work starts)."""
    p = store_path(store)
    if not p.exists():
        return
    import zarr

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
    check_numerics(p, skip=rebuilt)  # finished points of another version of the numerics are not resumed


def _store_points(store: str, spec: ModelSpec):
    """Every grid point of one model as (index, values) in the store's coordinate order (a grown
    store has its added values at the end of each dimension)."""
    import itertools

    g = store_grid(store, spec)
    for idx in itertools.product(*(range(len(g[d])) for d in spec.dims)):
        yield idx, {d: g[d][i] for d, i in zip(spec.dims, idx)}


def _note_flow_run(store: str, stale: list[dict] | None = None) -> None:
    """Record this flow run in the store's lock; mark the flow runs of the dead lock holders in
    ``stale`` (what :func:`tasks.store.store_lock` returned when it took their locks over) crashed."""
    from prefect.runtime import flow_run

    if flow_run.id:
        record_flow_run(store, flow_run.id)
    mark_stale(stale)


def mark_stale(stale: list[dict] | None) -> None:
    """Mark the flow runs recorded by dead lock holders (``store_lock``'s value) crashed."""
    for held in stale or []:
        ids = held.get("flow_runs", [])
        if ids:
            mark_crashed(ids, f"its process (pid {held.get('pid')} on {held.get('host')}) died")
            print(f"marked {len(ids)} flow run(s) of pid {held.get('pid')} crashed")


class PointsFailed(Exception):
    """Some grid points of a sweep failed: the flow run ends Failed with this as its result
    (``result``: the sweep's counts, as a completed run returns them)."""

    def __init__(self, message: str, result: dict):
        super().__init__(message, result)
        self.message, self.result = message, result

    def __str__(self) -> str:
        return self.message


def outcome(state):
    """The result of a sweep flow run called with ``return_state=True``: its dict, also for a run
    that ended Failed because grid points failed (PointsFailed); any other failure is raised."""
    if state.is_failed():
        exc = state.result(raise_on_failure=False)
        if isinstance(exc, PointsFailed):
            return exc.result
    return state.result()


def mark_crashed(flow_run_ids, why: str) -> None:
    """Set flow runs still shown as running to Crashed (their process was killed, e.g. SIGKILL)."""
    from prefect import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        for fid in flow_run_ids:
            try:
                run = client.read_flow_run(fid)
            except Exception:  # not on this API server (e.g. another server's database)
                continue
            if run.state is not None and not run.state.is_final():
                client.set_flow_run_state(fid, Crashed(message=f"Crashed: {why}"), force=True)


def _labels(data_path: str):
    """The ingested data's label codes (None without labels), read alone (not the data)."""
    import xarray as xr

    ds = xr.open_zarr(data_path, consolidated=False)
    return ds["label"].values if "label" in ds else None


def _progress(store: str, todo: int, already: int, predicted: float | None = None) -> Progress:
    """Terminal progress of this run's grid points, mirrored in a Prefect progress artifact;
    ``predicted``: the plan's seconds for them (tasks.costs), the time left until one finishes."""
    artifact = start_progress(store, todo, already)
    return Progress(todo, on_update=lambda f: update_progress(artifact, f), predicted=predicted)


@flow(name="embed-sweep-grid", log_prints=True)
def sweep_grid(
    plan: dict,
    store: str,
    make_report: bool,
    dashboard: str = "",
    points_per_task: int | None = None,
    retry_failed: bool = False,
) -> dict:
    """Inner flow, run with a DaskTaskRunner: every task below runs on the sweep's cluster.
    ``plan``: the outer flow's :class:`SweepPlan`, as a dict."""
    from prefect.states import Failed

    logger = get_run_logger()
    store = str(store_path(store))
    _note_flow_run(store)
    plan = SweepPlan.from_dict(plan)
    specs, grid, layout, knn_method = plan.specs, plan.grid, plan.store_layout(), plan.identity["knn_method"]
    data_path, graph_path = input_paths(store)
    Path(data_path).parent.mkdir(parents=True, exist_ok=True)
    src, opts = plan.dataset
    fp = plan.identity["data_fingerprint"]
    try:  # a full disk or an unwritable folder: one line (StoreWriteError), not a traceback
        data_path = ingest_task.submit({"name": src, **opts} if src else src, data_path, fp).result()
        ks = [max(model_grid(s, grid)["k"]) for s in specs if "k" in s.dims]
        graph = knn_task.submit(data_path, max(ks), graph_path, knn_method).result() if ks else None
        if graph and not graph_matches(graph, data_path, max(ks), knn_method):
            raise RuntimeError(f"the kNN graph {graph} does not match the data {data_path}; re-run")
        labels = _labels(data_path)
        attrs = {
            "dataset": json.dumps(plan.dataset),
            "flow_parameters": json.dumps(plan.identity),
            **{f"data_{k}": v for k, v in plan.provenance.items()},
            **ingested_attrs(data_path),  # the preprocessing's record (explained variance), ingest's own
            **eval_subset_attrs(plan.size[0], labels),
        }
        prepare_store(store, plan.identity, specs, grid, layout, attrs)
        # what the label metrics leave out or cannot compute: said once here, kept for `show`
        notes = label_notes(labels, eval_subset(plan.size[0], labels), label_names(data_path))[1]
        zarr.open_group(store, mode="r+").attrs["evaluation_notes"] = json.dumps(notes)
        for note in notes:
            print(f"note: {note}")
    except OSError as e:
        err = write_error(store, e)
        logger.error(str(err))
        return Failed(message=str(err), data=err)
    damaged = verify_points(store)  # finished points whose chunks are gone or whose values are not finite
    if damaged:
        print(f"{describe_damage(store, damaged)}; running them again")
        mark_pending(store, damaged)

    todo = []
    finished = (STATUS_DONE,) if retry_failed else (STATUS_DONE, STATUS_FAILED)
    n_failed_before = 0
    for s in specs:
        status = read_status(store, s.key)
        for idx, point in _store_points(store, s):
            n_failed_before += status[idx] == STATUS_FAILED
            if status[idx] in finished:
                continue
            todo.append((s, idx, point))
    total = sum(1 for s in specs for _ in _store_points(store, s))
    print(
        f"{total - len(todo)} of {total} grid points already in {store}; {len(todo)} to run"
        + (f"; Dask dashboard: {dashboard}" if dashboard else "")
    )
    futures = {}
    n_workers = max(1, get_dask_worker_count())
    work = []  # (spec, batch) of every model; larger batches are submitted first
    for s in specs:
        mine = [(idx, point) for spec, idx, point in todo if spec is s]
        work += [(s, b) for b in batches(mine, batch_sizes(len(mine), n_workers, points_per_task))]
    work.sort(key=lambda sb: -len(sb[1]))  # stable: grid order kept among equal sizes
    for s, items in work:
        fut = grid_points_task.submit(
            s.key,
            _options_for(s, plan.options),
            data_path,
            graph or None,
            items,
            store,
            layout,
            len(items),
            retry_failed,
        )
        futures[id(fut)] = (fut, s.key, items)
    from tasks.costs import predicted_seconds

    progress = _progress(store, len(todo), total - len(todo), predicted_seconds(plan, todo, n_workers))
    unwritten = None
    for fut in as_completed([f for f, _, _ in futures.values()]):
        _, key, items = futures[id(fut)]
        for (_, point), state in zip(items, fut.result()):
            if state.startswith("write-error: "):  # the store cannot be written: stop here
                unwritten = unwritten or StoreWriteError(state.removeprefix("write-error: "))
                state = "skipped"
            progress.point(key, point, state)
        progress.batch_done()
        if unwritten is not None:
            break
    progress.close()
    if unwritten is not None:  # the points in flight are lost; those written are kept
        logger.error(str(unwritten))
        return Failed(message=str(unwritten), data=unwritten)
    done, failed = progress.done, progress.failed
    failed_before = 0 if retry_failed else int(n_failed_before)
    reasons = failure_summary(store) if failed or failed_before else []
    if failed:
        logger.error(f"{failed} of the {len(todo)} grid points run failed; their errors are in the store")
    if failed_before:
        logger.error(
            f"{failed_before} grid points failed in an earlier run and were not re-run; "
            "run again with --retry-failed (retry_failed=True) to re-run them"
        )
    for line in reasons:
        logger.error(line)
    report = None
    if make_report:
        report = report_task.submit(store).result()
    publish_results(store, report, reasons, notes)  # the Prefect UI: summary and links (tasks.artifacts)
    result = {
        "store": store,
        "total": total,
        "ran": len(todo),
        "done": done,
        "failed": failed,
        "failed_before": failed_before,
        "report": report,
    }
    if failed or failed_before:  # the flow run ends Failed, as the CLI exits 3
        msg = f"{failed + failed_before} of {total} grid points failed ({failed} in this run)"
        return Failed(message=msg, data=PointsFailed(msg, result))
    return result


@flow(name="embed-sweep", log_prints=True)
def embed_sweep(
    dataset: str | dict = "swiss_roll",
    models: list[str] | str = "all",
    grid: dict | None = None,
    store: str = "results/sweep.zarr",
    model_options: dict | None = None,
    cluster: dict | str | None = None,
    knn_method: str = "auto",
    n_generations: int = 3,
    report: bool = True,
    points_per_task: int | None = None,
    retry_failed: bool = False,
    plan: dict | None = None,
    max_point_hours: float | None = None,
) -> dict:
    """Fit every model over the grid and store the results.

    dataset: a name from `embed-sweep datasets`, a file path, or {"name": ..., option: value}.
    models: families (lllvm, glle, hgplvm, bgplvm, mrd, ppca), keys (glle_em, hgplvm_sparse, ...) or "all".
    grid: {"k": [...], "latent_dim": [...], "kappa": [...], "seed": [...]}; a dimension applies
        only to the models that have it (k: graph models; kappa: hGP-LVM).
    store: the result zarr store (``x`` means ``x.zarr``; inputs go beside it in ``x.inputs/``; while the
        sweep writes it, ``x.zarr.lock`` names the writing process and a second sweep is refused).
    retry_failed: run the grid points that failed in an earlier run again (default: keep them failed).
    model_options: {family_or_key: {constructor option: value}}.
    points_per_task: grid points per Prefect task run (default: guided sizes, at most 8 points, shrinking
        to single points at the end; tasks.point.batch_sizes); every point is written as soon as it
        finishes either way.
    cluster: None (local processes), "tcp://host:8786", {"type": "local", "n_workers": 4},
        {"type": "slurm", ...SLURMCluster kwargs, "adapt": {...}}, {"type": "kubernetes", ...}.
    plan: this sweep's ``plan_sweep(...).to_dict()`` when the caller planned it already (the CLI
        plans every sweep before it starts anything); refused if made for other arguments.
    max_point_hours: refuse the sweep if a grid point is predicted to run longer (default 24 h;
        also a Slurm job's walltime and a worker's memory: tasks.costs.check_plan).
    """
    spec = normalise_cluster(cluster)
    store = str(store_path(store))
    given = plan  # the CLI printed a given plan's costs already
    if plan is None:
        plan = plan_sweep(dataset, models, grid, store, model_options, n_generations, knn_method)
    else:
        plan = SweepPlan.from_dict(plan)
        plan.check_request(dataset, models, grid, model_options, n_generations, knn_method)
    check_store(store, plan.identity)
    check_writable(store)
    from tasks.costs import check_plan

    check_plan(plan, spec, max_point_hours, out=print if given is None else None)  # before the cluster
    if os.environ.get("PREFECT_API_URL") is None:
        from prefect.settings import PREFECT_API_URL

        if PREFECT_API_URL.value():  # so worker processes talk to the same API
            os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()
    with contextlib.ExitStack() as stack:
        stale = stack.enter_context(store_lock(store))  # dead holders whose lock it took over
        _note_flow_run(store, stale)
        address, dashboard, _cluster = stack.enter_context(start_cluster(spec))
        if dashboard:
            print(f"Dask dashboard: {dashboard}")
        runner = DaskTaskRunner(address=address, client_kwargs=client_kwargs(_cluster))
        state = sweep_grid.with_options(task_runner=runner)(
            plan.to_dict(),
            store,
            report,
            dashboard,
            points_per_task,
            retry_failed,
            return_state=True,
        )
        if state.is_failed():  # failed grid points or an unwritable store: this run ends Failed too
            from prefect.states import Failed

            exc = state.result(raise_on_failure=False)
            if isinstance(exc, (PointsFailed, StoreWriteError)):
                return Failed(message=state.message, data=exc)
        return state.result()
