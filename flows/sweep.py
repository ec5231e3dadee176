"""The embed-sweep flow: plan (tasks.sweep_plan, tasks.costs) -> ingest -> kNN (once, at the
largest k) -> fit / evaluate / write per grid point on a Dask cluster -> report. Resumable: grid
points already done are skipped. The flows only orchestrate: every step is a call into the pipeline
library (tasks/), run here or as a Prefect task (flows.tasks) on the cluster."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from prefect import flow, get_client, get_run_logger
from prefect.context import FlowRunContext
from prefect.futures import as_completed
from prefect.runtime import flow_run
from prefect.settings import PREFECT_API_URL
from prefect.states import Crashed, Failed
from prefect_dask import DaskTaskRunner

from flows.artifacts import publish_results, start_progress, update_progress
from flows.cluster import client_kwargs, normalise_cluster, start_cluster
from flows.progress import Progress
from flows.tasks import extras_task, grid_points_task, ingest_task, knn_task, refit_points_task, report_task
from tasks.costs import HIGH_DIM_GROWTH, check_plan, graph_growth, predicted_seconds
from tasks.knn import graph_matches
from tasks.point import (
    extras_summary,
    points_without_models,
    refit_summary,
    work_batches,
)
from tasks.registry import check_extras_mode, extras_inline, model_grid, options_for
from tasks.results.extras import extras_todo
from tasks.results.models import keep_chosen_models
from tasks.store import (
    StoreWriteError,
    describe_damage,
    failure_summary,
    mark_pending,
    record_flow_run,
    store_lock,
    store_path,
    verify_points,
    write_error,
)
from tasks.sweep_plan import (
    SweepPlan,
    check_store,
    check_writable,
    input_paths,
    plan_sweep,
    points_to_run,
    set_up_store,
    store_points,
)


def get_dask_worker_count() -> int:
    """Number of workers (threads) of the Dask cluster this flow's task runner uses (0 outside one)."""
    try:
        runner = FlowRunContext.get().task_runner
        info = runner._client.scheduler_info(n_workers=-1)["workers"]
        return sum(int(w.get("nthreads", 1)) for w in info.values())
    except Exception:  # not on a Dask task runner: batch for a single worker
        return 0


def _note_flow_run(store: str, stale: list[dict] | None = None) -> None:
    """Record this flow run in the store's lock; mark the flow runs of the dead lock holders in
    ``stale`` (what :func:`tasks.store.store_lock` returned when it took their locks over) crashed."""
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
    with get_client(sync_client=True) as client:
        for fid in flow_run_ids:
            try:
                run = client.read_flow_run(fid)
            except Exception:  # not on this API server (e.g. another server's database)
                continue
            if run.state is not None and not run.state.is_final():
                client.set_flow_run_state(fid, Crashed(message=f"Crashed: {why}"), force=True)


def _progress(store: str, todo: int, already: int, predicted: float | None = None) -> Progress:
    """Terminal progress of this run's grid points, mirrored in a Prefect progress artifact;
    ``predicted``: the plan's seconds for them (tasks.costs), the time left until one finishes."""
    artifact = start_progress(store, todo, already)
    return Progress(todo, on_update=lambda f: update_progress(artifact, f), predicted=predicted)


def refit_models_of(store: str, plan: SweepPlan, data_path: str, graph: str | None, n_workers: int) -> None:
    """``--refit-models``: every finished grid point whose model the store lacks fitted again on
    the cluster (tasks.point.refit_points: the model kept, the stored numbers not changed), and what
    it found said (tasks.point.refit_summary: an embedding that moved by more than 1e-8 is named)."""
    todo = [
        (s, idx, pt)
        for s in plan.specs
        for idx, pt in points_without_models(store, s, store_points(store, s))
    ]
    if not todo:
        print("--refit-models: every finished grid point keeps its model already")
        return
    futures = []
    for s, items in work_batches(plan.specs, todo, max(1, n_workers)):
        opts = options_for(s, plan.options)
        fut = refit_points_task.submit(
            s.key, opts, data_path, graph, items, store, plan.store_layout(), len(items)
        )
        futures.append((s.key, items, fut))
    by_key = {}
    for key, items, fut in futures:
        got = by_key.setdefault(key, ([], []))
        got[0].extend(items)
        got[1].extend(fut.result())
    for key, (items, states) in by_key.items():
        for line in refit_summary(key, items, states):
            print(line)


def extras_of_chosen(
    store: str, plan: SweepPlan, data_path: str, graph: str | None, mode: str, n_workers: int
):
    """After the selection: GLLE's diagnostics for the finished points that should carry them and
    do not (tasks.results.extras.extras_todo: each group's chosen setting, with ``mode`` "all" every
    finished point), computed on the cluster (tasks.point.add_extras) and said
    (tasks.point.extras_summary). A grown or resumed store whose choice moved gets them for its new
    chosen point; an earlier one keeps its own."""
    if plan.store_layout().n_generations == 0:
        return
    todo = extras_todo(store, plan.specs, everywhere=mode == "all")
    futures = []
    for s, items in work_batches(plan.specs, todo, max(1, n_workers), 1):
        opts = options_for(s, plan.options)
        fut = extras_task.submit(s.key, opts, data_path, graph, items, store, plan.store_layout(), len(items))
        futures.append((s.key, items, fut))
    for key, items, fut in futures:
        for line in extras_summary(key, items, fut.result()):
            print(line)


@flow(name="embed-sweep-grid", log_prints=True)
def sweep_grid(
    plan: dict,
    store: str,
    make_report: bool,
    dashboard: str = "",
    points_per_task: int | None = None,
    retry_failed: bool = False,
    keep_models: str = "all",
    refit_models: bool = False,
    extras: str = "chosen",
) -> dict:
    """Inner flow, run with a DaskTaskRunner: every task below runs on the sweep's cluster.
    ``plan``: the outer flow's :class:`SweepPlan`, as a dict."""
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
        data = {"name": src, **opts} if src else src
        data_path = ingest_task.submit(data, data_path, fp, refit_models).result()
        ks = [max(model_grid(s, grid)["k"]) for s in specs if "k" in s.dims]
        graph = knn_task.submit(data_path, max(ks), graph_path, knn_method).result() if ks else None
        if graph and not graph_matches(graph, data_path, max(ks), knn_method):
            raise RuntimeError(f"the kNN graph {graph} does not match the data {data_path}; re-run")
        notes = set_up_store(store, plan, data_path)
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
    if refit_models:  # the finished points of a store written without models: fitted again for them
        refit_models_of(store, plan, data_path, graph or None, get_dask_worker_count())

    todo, total, n_failed_before = points_to_run(store, specs, retry_failed)
    print(
        f"{total - len(todo)} of {total} grid points already in {store}; {len(todo)} to run"
        + (f"; Dask dashboard: {dashboard}" if dashboard else "")
    )
    futures = {}
    n_workers = max(1, get_dask_worker_count())
    for s, items in work_batches(specs, todo, n_workers, points_per_task):  # larger batches first
        fut = grid_points_task.submit(
            s.key,
            options_for(s, plan.options),
            data_path,
            graph or None,
            items,
            store,
            layout,
            len(items),
            retry_failed,
            extras_inline(s, grid, extras),
        )
        futures[id(fut)] = (fut, s.key, items)
    high_dim = False
    if graph and todo:  # an expander-like kNN graph (data of high intrinsic dimension): GLLE fills
        growth = graph_growth(graph, max(ks))
        high_dim = growth >= HIGH_DIM_GROWTH
        if high_dim:
            print(
                f"the kNN graph's balls grow like a {growth:.1f}-dimensional manifold's (a swiss roll's: "
                "about 2): data of high intrinsic dimension, so the prediction below takes the cost "
                "model's terms for such data where it has them (GLLE's)"
            )
    predicted = predicted_seconds(plan, todo, n_workers, extras, high_dim=high_dim)
    progress = _progress(store, len(todo), total - len(todo), predicted)
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
    # after the selection: the chosen settings' generations and covariance-scale studies
    extras_of_chosen(store, plan, data_path, graph or None, extras, n_workers)
    if keep_models == "chosen":  # after the selection: only each model's chosen setting keeps its model
        removed = keep_chosen_models(store)
        print(f"--keep-models chosen: {sum(removed.values())} model(s) of settings not chosen removed")
    report = None
    if make_report:
        report = report_task.submit(store).result()
    publish_results(store, report, reasons, notes)  # the Prefect UI: summary and links (flows.artifacts)
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
    keep_models: str = "all",
    refit_models: bool = False,
    extras: str = "chosen",
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
        also a Slurm job's walltime and a worker's memory: tasks.costs.plan.check_plan).
    keep_models: "all" (every finished point keeps its fitted model in the store) or "chosen" (after
        the sweep, only each model's chosen setting's: tasks.results.models.keep_chosen_models).
    refit_models: fit the finished points of a store written before models were kept again and keep
        their models, the stored numbers unchanged; says if any embedding moved by more than 1e-8.
    extras: where GLLE's diagnostics (``n_generations`` generations and the covariance-scale study,
        each an eigensolve as costly as the fit's embedding) are computed: "chosen" (each model's
        chosen setting, after the selection; a one-point grid with its fit) or "all" (every grid
        point). The store's per-point ``has_extras`` says which points carry them.
    """
    spec = normalise_cluster(cluster)
    check_extras_mode(extras)
    store = str(store_path(store))
    given = plan  # the CLI printed a given plan's costs already
    if plan is None:
        plan = plan_sweep(dataset, models, grid, store, model_options, n_generations, knn_method)
    else:
        plan = SweepPlan.from_dict(plan)
        plan.check_request(dataset, models, grid, model_options, n_generations, knn_method)
    check_store(store, plan.identity, refit_models=refit_models)
    check_writable(store)
    # before the cluster
    check_plan(plan, spec, max_point_hours, out=print if given is None else None, extras=extras)
    if os.environ.get("PREFECT_API_URL") is None:
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
            keep_models,
            refit_models,
            extras,
            return_state=True,
        )
        if state.is_failed():  # failed grid points or an unwritable store: this run ends Failed too
            exc = state.result(raise_on_failure=False)
            if isinstance(exc, (PointsFailed, StoreWriteError)):
                return Failed(message=state.message, data=exc)
        return state.result()
