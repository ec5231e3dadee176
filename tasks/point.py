"""Grid points as Prefect tasks: each point is fitted, evaluated and written as plain calls inside
one task, and a task runs a small batch of points.

The three steps also exist as separate tasks (tasks.fit, tasks.evaluate, tasks.write). Running
them as plain calls keeps a point's arrays on the worker that computed them, and batching a
few points per task divides Prefect's per-task-run cost (about 0.25 worker-seconds here: state
changes through the API server) among them. Every point still writes its own cell as soon as
it finishes, and a batch skips points already marked done, so a killed worker or flow loses
at most the point in flight (bench/sweep.py measures the difference).
"""

from __future__ import annotations

import math

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.evaluate import evaluate_point
from tasks.fit import fit_point
from tasks.registry import MODELS
from tasks.store import STATUS_PENDING, Layout, read_status, write_point

#: at most this many grid points per task run
MAX_POINTS_PER_TASK = 8
#: aim for at least this many task runs per worker, so the cluster stays balanced
TASKS_PER_WORKER = 8


def batch_size(n_points: int, n_workers: int, requested: int | None = None) -> int:
    """Points per task: ``requested`` if given, else enough tasks to keep every worker busy."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"points_per_task must be >= 1, got {requested}")
        return int(requested)
    per = math.ceil(n_points / max(1, TASKS_PER_WORKER * n_workers))
    return int(min(MAX_POINTS_PER_TASK, max(1, per)))


def batches(items: list, size: int) -> list[list]:
    """Split ``items`` into ceil(len / size) batches of at most ``size``, each a spread sample.

    Grid points come in grid order (k, latent_dim, ..., seed), so neighbouring points cost alike
    (a larger k or latent dimension is slower for every seed). Contiguous batches put the expensive
    ones together, and so does dealing them out round-robin when the number of batches divides a
    grid stride (8 batches of a (6, 2, 4) grid: every batch had one latent_dim). Either way one
    worker finished the last batches alone (bench/sweep.py, LL-LVM: the other worker idle for the
    last ~50 s). Here the points are put in a fixed pseudo-random order first (seeded: the same
    sweep always makes the same batches), then dealt out."""
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    n = math.ceil(len(items) / size)
    order = np.random.default_rng(0).permutation(len(items))
    return [[items[i] for i in order[j::n]] for j in range(n)]


def run_point(
    key: str,
    options: dict,
    data_path: str,
    graph_path: str | None,
    index: tuple,
    point: dict,
    store: str,
    layout: Layout,
) -> str:
    """Fit, evaluate and write one grid point; returns ``done`` or ``failed``."""
    n_gen = layout.n_generations if "generations" in MODELS[key].extras else 0
    res = evaluate_point(fit_point(key, options, data_path, graph_path, index, point, n_gen), data_path)
    write_point(store, MODELS[key], res, layout)
    return res.status


@task(name="grid-points", cache_policy=NO_CACHE, task_run_name="{key}-{n}-points")
def grid_points_task(
    key: str,
    options: dict,
    data_path: str,
    graph_path: str | None,
    items: list,
    store: str,
    layout: Layout,
    n: int = 0,
) -> list[str]:
    """Run a batch of grid points (``items``: (index, point) pairs) of one model, skipping any
    that a previous attempt already finished."""
    status = read_status(store, key)
    out = []
    for index, point in items:
        if np.asarray(status)[tuple(index)] != STATUS_PENDING:
            out.append("skipped")
            continue
        out.append(run_point(key, options, data_path, graph_path, tuple(index), point, store, layout))
    return out
