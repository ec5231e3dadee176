"""The embed-sweep flow: ingest -> kNN (once, at the largest k) -> fit / evaluate / write per
grid point on a Dask cluster -> report. Resumable: grid points already done are skipped."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.futures import as_completed
from prefect_dask import DaskTaskRunner

from flows.cluster import client_kwargs, normalise_cluster, start_cluster
from flows.progress import Progress
from lvmcore.data import load
from lvmcore.graph import KNN_METHODS
from tasks.artifacts import publish_results, start_progress, update_progress
from tasks.ingest import dataset_spec, ingest_task
from tasks.knn import knn_task
from tasks.point import batch_sizes, batches, grid_points_task
from tasks.registry import ModelSpec, grid_points, model_grid, normalise_grid, resolve_models
from tasks.report import report_task
from tasks.store import (
    STATUS_DONE,
    STATUS_FAILED,
    Layout,
    prepare_store,
    read_status,
    sweep_id,
)

DEFAULT_GRID = {"k": [8, 12], "latent_dim": [2], "kappa": [100.0], "seed": [0]}


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
    """Where the sweep keeps its ingested data and kNN graph: beside the result store."""
    p = Path(store)
    base = p.parent / f"{p.name.removesuffix('.zarr')}.inputs"
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


def plan_sweep(dataset, models, grid, store, model_options, n_generations, knn_method) -> dict:
    """Validate everything a sweep needs before any work; raises ValueError with the fix."""
    specs = resolve_models(models)
    grid = normalise_grid(grid if grid is not None else DEFAULT_GRID)
    model_options = dict(model_options or {})
    known = {s.family for s in specs} | {s.key for s in specs}
    stray = set(model_options) - known
    if stray:
        raise ValueError(
            f"model_options for {sorted(stray)}, which are not in this sweep's models {sorted(known)}"
        )
    if knn_method not in KNN_METHODS:
        raise ValueError(f"knn_method must be one of {KNN_METHODS}, got {knn_method!r}")
    src, opts = dataset_spec(dataset)
    ds = load(src, **opts)
    n, D = ds.sizes["point"], ds.sizes["feature"]
    n_views = len(ds.attrs.get("views", [])) or 1
    for s in specs:
        g = model_grid(s, grid)
        if s.multiview and n_views < 2:
            raise ValueError(
                f"model {s.key!r} needs a multi-view data set; {src!r} has one view (try 'mrd_toy')"
            )
        if "k" in g and max(g["k"]) >= n:
            raise ValueError(f"grid k = {max(g['k'])} needs more than {n} points in {src!r}; lower k")
        dmin = min(ds.sizes[f"feature_{v}"] for v in range(n_views)) if s.multiview else D
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
    )
    identity = {
        "dataset": [src, opts],
        "models": [s.key for s in specs],
        "options": model_options,
        "grid": grid,
        "n_generations": int(n_generations),
        "knn_method": knn_method,
    }
    return {
        "specs": specs,
        "grid": grid,
        "options": model_options,
        "layout": layout,
        "identity": identity,
        "dataset": [src, opts],
        "provenance": dict(ds.attrs),
    }


def check_store(store: str, identity: dict) -> None:
    """Refuse a store that holds a different sweep (before any work starts)."""
    p = Path(store)
    if not p.exists():
        return
    import zarr

    try:
        have = zarr.open_group(str(p), mode="r").attrs.get("sweep_id")
    except Exception as e:
        raise ValueError(
            f"{p} exists but is not a readable zarr store ({e}); choose another store path"
        ) from e
    if have is None:
        raise ValueError(f"{p} exists but is not an embed-sweep result store; choose another store path")
    if have != sweep_id(identity):
        raise ValueError(
            f"{p} holds a different sweep (dataset, models, options or grid differ); choose another "
            "store path, or delete it to start over"
        )


def _progress(store: str, todo: int, already: int) -> Progress:
    """Terminal progress of this run's grid points, mirrored in a Prefect progress artifact."""
    artifact = start_progress(store, todo, already)
    return Progress(todo, on_update=lambda f: update_progress(artifact, f))


@flow(name="embed-sweep-grid", log_prints=True)
def sweep_grid(
    dataset: str | dict,
    models: list[str] | str,
    grid: dict | None,
    store: str,
    model_options: dict | None,
    knn_method: str,
    n_generations: int,
    make_report: bool,
    dashboard: str = "",
    points_per_task: int | None = None,
) -> dict:
    """Inner flow, run with a DaskTaskRunner: every task below runs on the sweep's cluster."""
    logger = get_run_logger()
    plan = plan_sweep(dataset, models, grid, store, model_options, n_generations, knn_method)
    specs, grid, layout = plan["specs"], plan["grid"], plan["layout"]
    data_path, graph_path = input_paths(store)
    Path(data_path).parent.mkdir(parents=True, exist_ok=True)
    src, opts = plan["dataset"]
    data_path = ingest_task.submit({"name": src, **opts} if src else src, data_path).result()
    ks = [max(model_grid(s, grid)["k"]) for s in specs if "k" in s.dims]
    graph = knn_task.submit(data_path, max(ks) if ks else 0, graph_path, knn_method).result() if ks else None
    attrs = {
        "dataset": json.dumps(plan["dataset"]),
        "flow_parameters": json.dumps(plan["identity"]),
        **{f"data_{k}": v for k, v in plan["provenance"].items()},
    }
    prepare_store(store, plan["identity"], specs, grid, layout, attrs)

    todo = []
    for s in specs:
        status = read_status(store, s.key)
        for idx, point in grid_points(s, grid):
            if status[idx] in (STATUS_DONE, STATUS_FAILED):
                continue
            todo.append((s, idx, point))
    total = sum(1 for s in specs for _ in grid_points(s, grid))
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
            _options_for(s, plan["options"]),
            data_path,
            graph or None,
            items,
            store,
            layout,
            len(items),
        )
        futures[id(fut)] = (fut, s.key, items)
    progress = _progress(store, len(todo), total - len(todo))
    for fut in as_completed([f for f, _, _ in futures.values()]):
        _, key, items = futures[id(fut)]
        for (_, point), state in zip(items, fut.result()):
            progress.point(key, point, state)
        progress.batch_done()
    progress.close()
    done, failed = progress.done, progress.failed
    if failed:
        logger.warning(f"{failed} grid points failed; their errors are in the store's 'error' variables")
    report = None
    if make_report:
        report = report_task.submit(store).result()
    publish_results(store, report)  # the Prefect UI: summary table and links (tasks.artifacts)
    return {
        "store": store,
        "total": total,
        "ran": len(todo),
        "done": done,
        "failed": failed,
        "report": report,
    }


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
) -> dict:
    """Fit every model over the grid and store the results.

    dataset: a name from `embed-sweep datasets`, a file path, or {"name": ..., option: value}.
    models: families (lllvm, glle, hgplvm, bgplvm, mrd, ppca), keys (glle_em, hgplvm_sparse, ...) or "all".
    grid: {"k": [...], "latent_dim": [...], "kappa": [...], "seed": [...]}; a dimension applies
        only to the models that have it (k: graph models; kappa: hGP-LVM).
    store: the result zarr store (inputs go beside it in <name>.inputs/).
    model_options: {family_or_key: {constructor option: value}}.
    points_per_task: grid points per Prefect task run (default: guided sizes, at most 8 points, shrinking
        to single points at the end; tasks.point.batch_sizes); every point is written as soon as it
        finishes either way.
    cluster: None (local processes), "tcp://host:8786", {"type": "local", "n_workers": 4},
        {"type": "slurm", ...SLURMCluster kwargs, "adapt": {...}}, {"type": "kubernetes", ...}.
    """
    spec = normalise_cluster(cluster)
    plan = plan_sweep(dataset, models, grid, store, model_options, n_generations, knn_method)
    check_store(store, plan["identity"])
    if os.environ.get("PREFECT_API_URL") is None:
        from prefect.settings import PREFECT_API_URL

        if PREFECT_API_URL.value():  # so worker processes talk to the same API
            os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()
    with start_cluster(spec) as (address, dashboard, _cluster):
        if dashboard:
            print(f"Dask dashboard: {dashboard}")
        runner = DaskTaskRunner(address=address, client_kwargs=client_kwargs(_cluster))
        return sweep_grid.with_options(task_runner=runner)(
            dataset,
            models,
            grid,
            store,
            model_options,
            knn_method,
            n_generations,
            report,
            dashboard,
            points_per_task,
        )
