"""Grid points, fitted, evaluated and written: :func:`run_point` does one, :func:`run_points` a
small batch (what one Prefect task of the sweep runs: flows.tasks.grid_points_task), and
:func:`work_batches` cuts a run's points into those batches.

The three steps run as plain calls, not separate tasks: that keeps a point's arrays on the
worker that computed them, and batching
points per task divides Prefect's per-task-run cost (about 0.25 worker-seconds here: state
changes through the API server) among them (see :func:`batch_sizes`). Every point still
writes its own cell as soon as it finishes, and a batch skips points already marked done, so a
killed worker or flow loses at most the point in flight (bench/sweep/overhead.py measures the difference).
"""

from __future__ import annotations

import math
import time

import numpy as np
import zarr

from tasks.costs.guard import PointOverrun, point_guard
from tasks.evaluate import evaluate_point
from tasks.fit import fit_point
from tasks.registry import MODELS, ModelSpec
from tasks.store import (
    STATUS_DONE,
    STATUS_FAILED,
    STATUS_PENDING,
    Layout,
    PointResult,
    StoreWriteError,
    has_model,
    numerics_version,
    read_status,
    record_model,
    write_error,
    write_extras,
    write_point,
)

#: a region write that fails with an I/O error is tried this many times, WRITE_RETRY_S apart
WRITE_ATTEMPTS = 3
WRITE_RETRY_S = 1.0
#: at most this many grid points per task run
MAX_POINTS_PER_TASK = 8
#: guided batch sizes: each batch takes 1 / (GUIDED_SHARE * workers) of the points still unassigned
GUIDED_SHARE = 2


def batch_sizes(n_points: int, n_workers: int, requested: int | None = None) -> list[int]:
    """Points per task run, in submission order: ``requested`` each if given, else guided sizes.

    Guided (as OpenMP's guided schedule): each batch takes 1 / (2 x workers) of the points not yet
    in a batch, between 1 and ``MAX_POINTS_PER_TASK``; large batches first, single points last. The
    large ones divide Prefect's per-task-run cost (about 0.25 worker-seconds: state changes through
    the API server); the single points at the end keep the workers finishing together (Dask hands
    queued tasks out in submission order). 48 points on 2 workers: 8 8 8 6 5 4 3 2 1 1 1 1."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"points_per_task must be >= 1, got {requested}")
        full, rest = divmod(n_points, int(requested))
        return [int(requested)] * full + ([rest] if rest else [])
    sizes, left = [], n_points
    while left > 0:
        size = min(MAX_POINTS_PER_TASK, max(1, math.ceil(left / (GUIDED_SHARE * max(1, n_workers)))))
        sizes.append(size)
        left -= size
    return sizes


def batches(items: list, sizes: list[int]) -> list[list]:
    """Split ``items`` into batches of the given ``sizes`` (which add up to len(items)), each a
    spread sample of the grid.

    Grid points come in grid order (k, latent_dim, ..., seed), so neighbouring points cost alike
    (a larger k or latent dimension is slower for every seed). Contiguous batches put the expensive
    ones together (bench/sweep/overhead.py, LL-LVM: one worker finished the last batches alone). Here the
    points are put in a fixed pseudo-random order first (seeded: the same sweep always makes the
    same batches), then cut into the sizes."""
    if sum(sizes) != len(items) or any(s < 1 for s in sizes):
        raise ValueError(f"batch sizes {sizes} do not split {len(items)} grid points")
    order = np.random.default_rng(0).permutation(len(items))
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [[items[i] for i in order[a:b]] for a, b in zip(bounds[:-1], bounds[1:])]


def work_batches(specs: list[ModelSpec], todo: list, n_workers: int, requested: int | None = None) -> list:
    """A run's grid points ``todo`` ((spec, index, point) triples) as (spec, batch of (index, point))
    pairs, one per task run: each model's points cut by :func:`batches` into :func:`batch_sizes`,
    larger batches first (a stable sort: grid order kept among equal sizes)."""
    work = []
    for s in specs:
        mine = [(idx, point) for spec, idx, point in todo if spec is s]
        work += [(s, b) for b in batches(mine, batch_sizes(len(mine), n_workers, requested))]
    work.sort(key=lambda sb: -len(sb[1]))
    return work


def run_point(
    key: str,
    options: dict,
    data_path: str,
    graph_path: str | None,
    index: tuple,
    point: dict,
    store: str,
    layout: Layout,
    extras: bool = True,
) -> str:
    """Fit, evaluate and write one grid point; returns ``done`` or ``failed``. A fit that runs past
    its predicted time by the set factor is stopped and recorded failed (tasks.costs.guard).
    ``extras``: compute GLLE's diagnostics (generations, covariance-scale study) with the fit; a
    sweep leaves them to the chosen setting (:func:`extras_inline`, :func:`add_extras`)."""
    n_gen = layout.n_generations if "generations" in MODELS[key].extras and extras else 0
    try:
        with point_guard(key, options, point, data_path, n_gen):
            res = fit_point(key, options, data_path, graph_path, index, point, n_gen)
    except PointOverrun as e:  # stopped outside the fit's own error handling
        res = PointResult(
            key=key, index=tuple(index), point=dict(point), status="failed", error=f"PointOverrun: {e}"
        )
    res = evaluate_point(res, data_path)
    for attempt in range(WRITE_ATTEMPTS):  # retries only on I/O (a transient file-system error)
        try:
            write_point(store, MODELS[key], res, layout)
            break
        except OSError as e:
            if attempt == WRITE_ATTEMPTS - 1:  # a full disk, an unwritable chunk: one line, no traceback
                raise write_error(store, e) from None
            time.sleep(WRITE_RETRY_S)
    return res.status


def run_points(
    key: str,
    options: dict,
    data_path: str,
    graph_path: str | None,
    items: list,
    store: str,
    layout: Layout,
    retry_failed: bool = False,
    extras: bool = True,
) -> list[str]:
    """Run a batch of grid points (``items``: (index, point) pairs) of one model, skipping any
    that a previous attempt already finished (failed ones too, unless ``retry_failed``). A point
    that cannot be written (StoreWriteError) ends the batch: its state is ``write-error: <the
    one-line reason>`` and the rest are ``skipped`` (the flow stops the sweep with that line).
    ``extras``: as :func:`run_point`'s."""
    status = read_status(store, key)
    runnable = (STATUS_PENDING, STATUS_FAILED) if retry_failed else (STATUS_PENDING,)
    out = []
    for index, point in items:
        if np.asarray(status)[tuple(index)] not in runnable:
            out.append("skipped")
            continue
        try:
            out.append(
                run_point(key, options, data_path, graph_path, tuple(index), point, store, layout, extras)
            )
        except StoreWriteError as e:
            out.append(f"write-error: {e}")
            break
    return out + ["skipped"] * (len(items) - len(out))


#: --refit-models: a refit whose embedding differs from the stored one by more than this (largest
#: absolute difference) is said: the store's numbers are kept, and the point keeps its old numerics
REFIT_TOLERANCE = 1e-8


def embedding_change(group, index: tuple, embedding: np.ndarray) -> float:
    """Largest absolute difference of a refit's ``embedding`` from the one the store's ``group``
    holds at grid cell ``index`` (its latent columns and rows); inf where either is not finite."""
    stored = np.asarray(group["embedding"][index])
    moved = float(np.max(np.abs(stored[: len(embedding), : embedding.shape[1]] - embedding), initial=0.0))
    return moved if np.isfinite(moved) else float("inf")


def points_without_models(store: str, spec: ModelSpec, points) -> list:
    """The finished grid points (``points``: (index, point) pairs) of ``spec`` whose model the
    store does not hold (a store written before models were kept: ``--refit-models``)."""
    status = read_status(store, spec.key)
    return [
        (idx, point)
        for idx, point in points
        if status[tuple(idx)] == STATUS_DONE and not has_model(store, spec.key, point)
    ]


def refit_points(
    key: str,
    options: dict,
    data_path: str,
    graph_path: str | None,
    items: list,
    store: str,
    layout: Layout,
) -> list[str]:
    """``--refit-models``: fit finished grid points again and keep their models, the stored
    embedding, metrics and extras unchanged. Each state is ``refit <largest absolute difference of
    the refit's embedding from the stored one>`` (within ``REFIT_TOLERANCE``: the point records this
    version of the numerics), or ``failed: <why>``."""
    group = zarr.open_group(str(store), mode="r")[key]
    out = []
    for index, point in items:
        index = tuple(index)
        res = fit_point(key, options, data_path, graph_path, index, point)  # the model needs no diagnostics
        if res.status != "done":
            out.append(f"failed: {res.error}")
            continue
        moved = embedding_change(group, index, res.embedding)
        version = (layout.numerics or numerics_version()) if moved <= REFIT_TOLERANCE else ""
        record_model(store, key, index, point, res.model, res.model_error, version)
        out.append(f"refit {moved!r}")
    return out


def refit_summary(key: str, items: list, states: list[str]) -> list[str]:
    """The lines ``--refit-models`` says for one model's refit points: how many kept their model,
    the largest embedding change, and each point whose embedding moved by more than
    ``REFIT_TOLERANCE`` (the stored numbers are kept; its model is the refit's) or whose refit failed."""
    moved, failed, largest = [], [], 0.0
    for (_, point), state in zip(items, states):
        if state.startswith("refit "):
            d = float(state.removeprefix("refit "))
            largest = max(largest, d)
            if d > REFIT_TOLERANCE:
                moved.append((point, d))
        elif state != "skipped":
            failed.append((point, state.removeprefix("failed: ")))
    n = len(items) - len(failed)
    lines = [
        f"{key}: {n} finished grid point(s) fitted again, their models kept; the largest embedding change "
        f"{largest:.3g} ({'within' if not moved else 'above'} {REFIT_TOLERANCE:g})"
    ]
    for point, d in moved:
        lines.append(
            f"warning: {key} {point}: the refit's embedding moved by {d:.3g} from the stored one (more than "
            f"{REFIT_TOLERANCE:g}); the store keeps its numbers, and this version does not reproduce them"
        )
    for point, why in failed:
        lines.append(f"warning: {key} {point}: the refit failed ({why}); the point keeps no model")
    return lines


def add_extras(
    key: str,
    options: dict,
    data_path: str,
    graph_path: str | None,
    items: list,
    store: str,
    layout: Layout,
) -> list[str]:
    """GLLE's diagnostics for finished grid points that lack them (``items``: (index, point)
    pairs; tasks.results.extras.extras_todo names them): each point fitted again as its sweep fitted
    it, then ``n_generations`` generations and the covariance-scale study computed as a grid point
    computes them with ``extras`` (same seeds, the same numbers), and written into the point's cell
    beside its stored numbers, which are kept (tasks.store.write_extras). Each state is ``extras
    <largest absolute difference of the refit's embedding from the stored one>`` or ``failed: <why>``."""
    spec = MODELS[key]
    group = zarr.open_group(str(store), mode="r")[key]
    out = []
    for index, point in items:
        index = tuple(index)
        res = fit_point(key, options, data_path, graph_path, index, point, layout.n_generations)
        if res.status != "done":
            out.append(f"failed: {res.error}")
            continue
        moved = embedding_change(group, index, res.embedding)
        write_extras(store, spec, index, res.extras, layout)
        out.append(f"extras {moved!r}")
    return out


def extras_summary(key: str, items: list, states: list[str]) -> list[str]:
    """The lines a sweep says for the points that got GLLE's diagnostics after its selection: each
    point, and a warning where the refit's embedding moved from the stored one by more than
    ``REFIT_TOLERANCE`` (the diagnostics then belong to the refit) or the refit failed."""
    lines = []
    for (_, point), state in zip(items, states):
        where = ", ".join(f"{d}={v}" for d, v in point.items())
        if state.startswith("extras "):
            d = float(state.removeprefix("extras "))
            lines.append(
                f"{key} {where}: generations and covariance-scale study computed (the chosen setting)"
            )
            if d > REFIT_TOLERANCE:
                lines.append(
                    f"warning: {key} {where}: the refit for its generations moved the embedding by {d:.3g} "
                    f"from the stored one (more than {REFIT_TOLERANCE:g})"
                )
        elif state != "skipped":
            lines.append(f"warning: {key} {where}: its generations failed ({state.removeprefix('failed: ')})")
    return lines
