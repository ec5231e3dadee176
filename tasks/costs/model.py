"""What a grid point costs before it runs: seconds, peak memory and store size from the shipped,
measured cost data (``tasks/costs.json``, refreshed by ``bench/costs.py``), and the refusals and
the run-time stop built on them.

A model's cost is written as a sum of monomials in the point's sizes, each with a fitted
coefficient; the monomials are fixed by the algorithm's complexity (the point hGP-LVM's exact GP
is O(N^3) per step, a sparse GP O(N M^2), LL-LVM's dense solver O((N Q)^3) ...), the coefficients
by least squares on measured fits at small and mid sizes (bench/costs.py). Variables:

    N points, D data dimensions (summed over views), Q latent dimensions, k neighbours,
    M inducing inputs, B minibatch size, V views

A prediction is ``fixed + budget x iteration + generations x generation`` seconds, where the
budget is the fit's iteration budget (``max_iter``, plus ``init_iters`` where the model has one):
an upper bound, as a fit that converges stops earlier. Times are CPU seconds of one thread (a
worker runs one fit on one pinned thread; CPU time, unlike wall time, hardly moves with the load
of a shared machine), on the machine the data was measured on: ``calibrate()`` (``python -m
tasks.costs calibrate``) times a short probe here and scales every prediction by the ratio, kept in
the user's cache folder (or ``EMBED_SWEEP_CALIBRATION``). Memory is the fit's peak above a worker's
resident memory before it, plus that (``process_bytes``) and the data. ``EMBED_SWEEP_COSTS`` names
another cost file (the tests edit a copy).

At run time a fit is stopped once it has used ``overrun.factor`` times its predicted CPU time (and
at least ``overrun.min_seconds``): :func:`overrun_guard` raises :class:`PointOverrun` inside the
fitting thread, which the fit records as the point's error.

Data of high intrinsic dimension: GLLE's eigensolves factorise I - W of the kNN graph, and the
factor's fill is set by the graph's separators, which the sizes above do not describe: on the 50-D
PCA of a single-cell atlas it holds 4.6x (2e4 cells) to 7.5x (5e4) the entries it holds on a 50-D
swiss roll and its time grows like N^2.6 (bench/README.md, "GLLE at scale"). Such an entry carries
an ``upper`` set of terms, fitted on the atlas: the plan shows both, refuses on the nominal terms
(a point that can run on the data the user most likely has is not refused) and the run-time stop
holds a fit to the upper one (a fit on wide, high-dimensional data is not stopped for being it).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: the shipped cost data
COSTS_PATH = Path(__file__).with_name("costs.json")
#: a point is refused when predicted to run longer than this (hours), unless the user says otherwise
DEFAULT_MAX_POINT_HOURS = 24.0
VARIABLES = ("N", "D", "Q", "k", "M", "B", "V")


class PointOverrun(Exception):
    """A grid point ran past its predicted time by the set factor and was stopped."""


# --------------------------------------------------------------------------- the cost data
def costs_path() -> Path:
    return Path(os.environ.get("EMBED_SWEEP_COSTS") or COSTS_PATH)


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime: float) -> dict:
    with open(path) as f:
        return json.load(f)


def load_costs() -> dict:
    """The cost data in use (``EMBED_SWEEP_COSTS`` or the shipped file)."""
    p = costs_path()
    try:
        return _load(str(p), p.stat().st_mtime)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read the cost data {p} ({e}); unset EMBED_SWEEP_COSTS or reinstall") from e


def calibration_path() -> Path:
    from lvmcore import user_cache_dir

    return Path(os.environ.get("EMBED_SWEEP_CALIBRATION") or user_cache_dir("costs", "calibration.json"))


def speed_factor(costs: dict | None = None) -> float:
    """Seconds here per second of the cost data's machine (1 until :func:`calibrate` has run)."""
    costs = costs or load_costs()
    try:
        cal = json.loads(calibration_path().read_text())
        return float(cal["probe_seconds"]) / float(costs["probe_seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1.0


def evaluate_terms(terms: dict, v: dict) -> float:
    """sum of coefficient x monomial; a monomial is ``"1"`` or ``"N^3*Q^3"`` (powers may be fractional)."""
    total = 0.0
    for mono, coef in terms.items():
        x = 1.0
        if mono != "1":
            for factor in mono.split("*"):
                name, _, power = factor.partition("^")
                x *= float(v[name]) ** (float(power) if power else 1.0)
        total += float(coef) * x
    return total


# --------------------------------------------------------------------------- a point's sizes
def regime(key: str, args: dict, n: int) -> str:
    """The cost entry of model ``key`` with constructor ``args`` at n points: the key, or the key
    and the path its ``auto`` setting takes there (``lllvm/dense``, ``hgplvm_bayesian/minibatch``,
    ``hgplvm_sparse/full``)."""
    from tasks.registry import MODELS

    est = MODELS[key].estimator_class()(**args)
    if key == "lllvm":
        return f"lllvm/{est._resolve_solver(n)}"
    if key in ("hgplvm_bayesian", "hgplvm_sparse"):
        return f"{key}/{est.resolve_training(n)}"
    return key


def _inducing(key: str, entry: str, args: dict, n: int) -> int:
    m = args.get("n_inducing", "auto")
    if m != "auto":
        return min(int(m), n)
    if entry.endswith("/minibatch"):  # the hyperboloid GP-LVMs' minibatch fit (hgplvm_svi)
        from lvmcore.models.hgplvm_svi import auto_inducing

        return auto_inducing(n)
    from lvmcore.models.hgplvm import _auto_inducing

    return _auto_inducing(n)


def point_variables(key: str, args: dict, n: int, dims: list[int]) -> tuple[str, dict]:
    """(cost entry, variables) of one grid point: model key, its full constructor arguments, n
    points and the data dimension of each view."""
    from tasks.registry import MODELS

    entry = regime(key, args, n)
    est = MODELS[key].estimator_class()(**args)
    p = est.get_params() if hasattr(est, "get_params") else dict(args)
    v = {
        "N": n,
        "D": sum(dims),
        "Q": int(p.get("n_components", 2)),
        "k": int(p.get("n_neighbors", 0) or 0),
        "M": 0,
        "B": int(p.get("batch_size", 0) or 0),
        "V": len(dims),
    }
    if "n_inducing" in p:
        v["M"] = _inducing(key, entry, p, n) if key.startswith("hgplvm") else min(int(p["n_inducing"]), n)
    return entry, v


def iteration_budget(entry: dict, params: dict) -> int:
    """The fit's most iterations: the sum of the constructor parameters the entry names."""
    return int(sum(int(params.get(name, 0) or 0) for name in entry.get("budget", [])))


# --------------------------------------------------------------------------- predictions
@dataclass
class Prediction:
    key: str
    entry: str
    seconds: float  # upper bound: fixed + budget x iteration + generations x generation
    fixed_s: float
    iteration_s: float
    budget: int
    generation_s: float
    generations: int
    memory_bytes: float  # a worker's peak resident memory while it fits the point
    store_bytes: float  # the point's arrays in the result store (uncompressed)
    upper_seconds: float | None = None  # the entry's ``upper`` terms (high intrinsic dimension)
    upper_memory_bytes: float | None = None

    def line(self) -> str:
        return (
            f"{self.key}: {fmt_seconds(self.seconds)} per point (fixed {fmt_seconds(self.fixed_s)} + "
            f"{self.budget} iterations x {fmt_seconds(self.iteration_s)}"
            + (
                f" + {self.generations} generation eigensolves x {fmt_seconds(self.generation_s)}"
                if self.generations
                else ""
            )
            + f"), peak {fmt_bytes(self.memory_bytes)}"
            + (
                f"; on data of high intrinsic dimension up to {fmt_seconds(self.upper_seconds)}, "
                f"{fmt_bytes(self.upper_memory_bytes)}"
                if self.upper_seconds is not None
                else ""
            )
        )


def predict(key: str, args: dict, n: int, dims: list[int], n_generations: int = 0) -> Prediction | None:
    """The cost of fitting model ``key`` with constructor ``args`` on n points of ``dims``
    dimensions (one per view); None where the cost data has no entry for its regime."""
    from tasks.registry import COV_SCALES, MODELS

    costs = load_costs()
    entry_name, v = point_variables(key, args, n, dims)
    entry = costs["models"].get(entry_name)
    if entry is None:
        return None
    spec = MODELS[key]
    params = spec.estimator_class()(**args).get_params()
    speed = speed_factor(costs)
    stored = (n_generations + len(COV_SCALES)) if "generations" in spec.extras and n_generations > 0 else 0
    gens = max(stored - kept_draw_answers(params), 0) if stored else 0  # the eigensolves the point runs
    fixed = evaluate_terms(entry.get("fixed", {}), v) * speed
    per_it = evaluate_terms(entry.get("iteration", {}), v) * speed
    per_gen = evaluate_terms(entry.get("generation", {}), v) * speed
    budget = iteration_budget(entry, params)
    seconds = fixed + budget * per_it + gens * per_gen
    base = float(costs.get("process_bytes", 0)) + 8.0 * n * v["D"]
    memory = base + max(evaluate_terms(entry.get("memory", {}), v), 0)
    upper = entry.get("upper")
    upper_s = upper_mem = None
    if upper:
        upper_s = speed * (
            evaluate_terms(upper.get("fixed", {}), v)
            + budget * evaluate_terms(upper.get("iteration", entry.get("iteration", {})), v)
            + gens * evaluate_terms(upper.get("generation", {}), v)
        )
        upper_mem = base + max(evaluate_terms(upper.get("memory", {}), v), 0)
    return Prediction(
        key=key,
        entry=entry_name,
        seconds=seconds,
        fixed_s=fixed,
        iteration_s=per_it,
        budget=budget,
        generation_s=per_gen,
        generations=gens,
        memory_bytes=memory,
        store_bytes=store_bytes(spec, v, params, stored),
        upper_seconds=None if upper_s is None else max(upper_s, seconds),
        upper_memory_bytes=None if upper_mem is None else max(upper_mem, memory),
    )


def kept_draw_answers(params: dict) -> int:
    """How many of a GLLE point's stored generations its fit's kept draw answers without an
    eigensolve (``GLLE._kept``): generation 0 of the sweep's ``sample(G, seed)`` and the scale
    study's entry at the constructor's a, when the fit was seeded with the point's seed (the
    sweep's ``random_state``; unseeded, every draw is new)."""
    from tasks.registry import COV_SCALES

    if params.get("random_state") is None:
        return 0
    return 1 + (params.get("cov_scale") in COV_SCALES)


def store_bytes(spec, v: dict, params: dict, generations: int) -> float:
    """A grid point's arrays in the store: embedding (and its variances), the generations and the
    bound's trace (float64, as tasks/store.py writes them)."""
    per = v["N"] * v["Q"] * 8.0
    total = per * (1 + spec.has_variance + generations)
    budget = sum(int(params.get(name, 0) or 0) for name in ("max_iter", "init_iters"))
    return total + 8.0 * min(budget + 1, 2000) + 256.0


def fmt_seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.0f} days"


def fmt_bytes(b: float) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b:.0f} B"


# --------------------------------------------------------------------------- the cluster's limits
def _parse_bytes(x) -> float | None:
    if x is None:
        return None
    from dask.utils import parse_bytes

    return float(parse_bytes(x)) if isinstance(x, str) else float(x)


def _parse_walltime(w) -> float | None:
    """Slurm's [days-]hours:minutes:seconds (or minutes) as seconds."""
    if w is None:
        return None
    text = str(w)
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [float(p) for p in text.split(":")]
    if len(parts) == 1:
        secs = parts[0] * 60
    else:
        while len(parts) < 3:
            parts.insert(0, 0.0)
        secs = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return days * 86400 + secs


def _parse_k8s_bytes(x) -> float | None:
    """Kubernetes quantities: 4G = 4e9, 4Gi = 4 x 2^30 (dask's parse_bytes reads both units)."""
    if x is None:
        return None
    text = str(x).strip()
    if text[-1:] in "KMGTP" and text[-1:]:
        text += "B"
    return _parse_bytes(text)


def cluster_limits(spec: dict, max_point_hours: float | None = None) -> dict:
    """A normalised cluster spec's limits on one grid point: ``memory`` (bytes per worker, None
    when unknown), ``seconds`` (the least of --max-point-hours and a Slurm job's walltime),
    ``workers`` (how many points run at once, for the whole grid's estimate) and ``what``
    (the names of those limits, for the refusal)."""
    hours = DEFAULT_MAX_POINT_HOURS if max_point_hours is None else float(max_point_hours)
    if not hours > 0:
        raise ValueError(f"--max-point-hours must be > 0, got {max_point_hours!r}")
    out = {"memory": None, "seconds": hours * 3600, "workers": 1, "time_what": f"--max-point-hours {hours:g}"}
    kind = spec.get("type", "local")
    if kind == "local":
        import psutil

        n = int(spec.get("n_workers", 2))
        threads = int(spec.get("threads_per_worker", 1))
        limit = spec.get("memory_limit", "auto")
        if limit in ("auto", None):
            # distributed's rule for "auto": the machine's memory x min(1, threads / cores)
            mem = psutil.virtual_memory().total * min(1.0, threads / (os.cpu_count() or 1))
        else:
            mem = _parse_bytes(limit)
        out.update(memory=mem, workers=n * threads, memory_what="a local worker's memory limit")
    elif kind == "slurm":
        procs = int(spec.get("processes", 1) or 1)
        mem = _parse_bytes(spec.get("memory"))
        out["memory"] = mem / procs if mem else None
        out["memory_what"] = f"a Slurm worker's share of the job's memory ({spec.get('memory')} / {procs})"
        jobs = (spec.get("adapt") or {}).get("maximum_jobs", spec.get("jobs", 2))
        out["workers"] = procs * int(jobs or 1)
        wall = _parse_walltime(spec.get("walltime"))
        if wall is not None and wall < out["seconds"]:
            out["seconds"], out["time_what"] = wall, f"the Slurm walltime {spec.get('walltime')}"
    elif kind == "kubernetes":
        res = spec.get("resources") or {}
        mem = (res.get("limits") or {}).get("memory") or (res.get("requests") or {}).get("memory")
        out["memory"] = _parse_k8s_bytes(mem)
        out["memory_what"] = f"a Kubernetes worker's memory limit ({mem})"
        out["workers"] = int((spec.get("adapt") or {}).get("maximum", spec.get("n_workers", 2)))
    return out


# --------------------------------------------------------------------------- the plan
FIXES = {
    "hgplvm_point": "use hgplvm_sparse or hgplvm_bayesian instead of hgplvm_point",
    "lllvm/dense": 'use solver="factorised" (--options \'{"lllvm": {"solver": "factorised"}}\')',
}


def plan_costs(specs, grid: dict, n: int, dims: list[int], options_for, n_generations: int) -> list[dict]:
    """Every model's predicted cost over the grid, one row per model: its grid points, the
    slowest point's and the largest point's :class:`Prediction` (``slowest``, ``largest``; None
    without cost data), the points' total seconds and the store's size for them.
    ``options_for(spec)`` gives the model's options; ``dims`` the data dimension of each view."""
    from tasks.registry import grid_points

    rows = []
    for spec in specs:
        opts = options_for(spec)
        row = {"key": spec.key, "points": 0, "slowest": None, "largest": None, "seconds": 0.0, "store": 0.0}
        for _, point in grid_points(spec, grid):
            p = predict(
                spec.key,
                spec.constructor_args(point, opts),
                n,
                dims if spec.multiview else dims[:1],
                n_generations,
            )
            row["points"] += 1
            if p is None:
                continue
            row["seconds"] += p.seconds
            row["store"] += p.store_bytes
            if row["slowest"] is None or p.seconds > row["slowest"].seconds:
                row["slowest"] = p
            if row["largest"] is None or p.memory_bytes > row["largest"].memory_bytes:
                row["largest"] = p
        rows.append(row)
    return rows


def refusal(rows, n: int, limits: dict) -> str | None:
    """The first model with a grid point the cluster cannot run, as one line (model, N, the
    prediction, the limit, the way out); None when every point fits."""
    for r in rows:
        big, slow = r["largest"], r["slowest"]
        if big is not None and limits.get("memory") and big.memory_bytes > limits["memory"]:
            fix = FIXES.get(big.entry) or FIXES.get(big.key)
            way = f"{fix}, or give the workers more memory" if fix else "give the workers more memory"
            return (
                f"{big.key} at N = {n:,} needs about {fmt_bytes(big.memory_bytes)} per grid point, above "
                f"{limits['memory_what']} ({fmt_bytes(limits['memory'])}); {way}"
            )
        if slow is not None and slow.seconds > limits["seconds"]:
            fix = FIXES.get(slow.entry) or FIXES.get(slow.key)
            more = "raise the walltime" if "walltime" in limits["time_what"] else "raise --max-point-hours"
            per = fmt_seconds(slow.iteration_s)
            less = f"lower max_iter ({slow.budget} iterations x {per}) or {more}" if slow.budget else more
            return (
                f"{slow.key} at N = {n:,} is predicted to take up to {fmt_seconds(slow.seconds)} per grid "
                f"point, above {limits['time_what']} ({fmt_seconds(limits['seconds'])}); "
                + (f"{fix}, or {less}" if fix else less)
            )
    return None


def plan_table(rows, limits: dict) -> str:
    """The plan's cost lines: per model its points, the slowest point's prediction (an upper bound:
    iteration budget x per-iteration cost), the points' total, the largest point's peak memory and
    the store's size; then the whole grid on the cluster's workers."""
    head = f"{'model':16s} {'points':>6s} {'per point':>10s} {'all points':>11s} {'peak memory':>12s} "
    head += f"{'store':>9s}"
    lines = ["predicted cost (upper bound: every fit runs its whole iteration budget)", head]
    total_s = total_store = peak = 0.0
    for r in rows:
        if r["slowest"] is None:
            lines.append(f"{r['key']:16s} {r['points']:>6d} {'no cost data':>10s}")
            continue
        total_s += r["seconds"]
        total_store += r["store"]
        peak = max(peak, r["largest"].memory_bytes)
        lines.append(
            f"{r['key']:16s} {r['points']:>6d} {fmt_seconds(r['slowest'].seconds):>10s} "
            f"{fmt_seconds(r['seconds']):>11s} {fmt_bytes(r['largest'].memory_bytes):>12s} "
            f"{fmt_bytes(r['store']):>9s}"
        )
    for r in rows:
        slow, big = r["slowest"], r["largest"]
        if slow is not None and slow.upper_seconds is not None:
            lines.append(
                f"  ({r['key']} on data of high intrinsic dimension, e.g. an atlas's PCA: up to "
                f"{fmt_seconds(slow.upper_seconds)} per point, {fmt_bytes(big.upper_memory_bytes)} peak)"
            )
    w = max(1, int(limits.get("workers") or 1))
    longest = max((r["slowest"].seconds for r in rows if r["slowest"] is not None), default=0.0)
    wall = grid_seconds(total_s, longest, w)
    lines.append(
        f"whole grid: {fmt_seconds(total_s)} of fitting, about {fmt_seconds(wall)} on {w} worker(s) "
        f"(at most {fmt_bytes(peak)} per worker); store {fmt_bytes(total_store)}"
    )
    return "\n".join(lines)


def grid_seconds(total: float, longest: float, workers: int) -> float:
    """The grid's time on ``workers`` workers: its points' summed seconds shared out, but never less
    than its longest point, which runs on one worker (the 10^6 x 50 sweep's GLLE point was 24 of
    its 29 predicted minutes: "14 min on 2 workers" where it took 25)."""
    return max(total / max(1, workers), longest)


def check_plan(plan, cluster_spec: dict, max_point_hours: float | None = None, out=print) -> list[dict]:
    """The cost step of a sweep's plan (a :class:`flows.sweep.SweepPlan`), before any server or
    cluster starts: raises ValueError (one line) for a grid point the cluster cannot run, else
    prints the cost table through ``out`` (None: quiet) and returns its rows."""
    from flows.sweep import _options_for

    n, D = (int(x) for x in plan.size)
    n_views = int(plan.layout.get("n_views", 1) or 1)
    dims = [max(1, D // n_views)] * n_views if n_views > 1 else [D]
    limits = cluster_limits(cluster_spec, max_point_hours)
    rows = plan_costs(
        plan.specs,
        plan.grid,
        n,
        dims,
        lambda s: _options_for(s, plan.options),
        plan.layout.get("n_generations", 0),
    )
    why = refusal(rows, n, limits)
    if why:
        raise ValueError(why)
    if out is not None:
        out(plan_table(rows, limits))
    return rows


def predicted_seconds(plan, todo, n_workers: int) -> float | None:
    """The plan's predicted seconds for the grid points ``todo`` ((spec, index, point) triples) on
    ``n_workers`` workers (:func:`grid_seconds`; None if a point has none)."""
    from flows.sweep import _options_for

    n, D = (int(x) for x in plan.size)
    n_views = int(plan.layout.get("n_views", 1) or 1)
    dims = [max(1, D // n_views)] * n_views if n_views > 1 else [D]
    total = longest = 0.0
    try:
        for spec, _, point in todo:
            args = spec.constructor_args(point, _options_for(spec, plan.options))
            p = predict(
                spec.key, args, n, dims if spec.multiview else dims[:1], plan.layout.get("n_generations", 0)
            )
            if p is None:
                return None
            total += p.seconds
            longest = max(longest, p.seconds)
    except Exception:  # a prediction is a courtesy here; the plan checked the points already
        return None
    return grid_seconds(total, longest, n_workers)


# --------------------------------------------------------------------------- run time
#: the run-time guard trusts a prediction for data at most this many times wider (D, the widest
#: view) than the widest data its cost entry was measured on: most entries were measured on 3-D
#: data, and terms without D (GLLE's) under-predict 50-D data several-fold (bench/README.md, atlas)
WIDTH_MARGIN = 2.0


def within_measured_width(entry_name: str, dims: list[int]) -> bool:
    """Whether data of ``dims`` (one width per view) is within ``WIDTH_MARGIN`` times the widest
    data the cost entry ``entry_name`` was measured on."""
    measured = load_costs()["models"].get(entry_name, {}).get("measured", [])
    widest = max((float(m["d"]) for m in measured), default=0.0)
    return max(dims) <= WIDTH_MARGIN * widest


def point_limit(key: str, options: dict, point: dict, data_path: str, n_generations: int = 0):
    """(seconds a grid point may run, its predicted seconds): ``overrun.factor`` x the prediction
    (the entry's ``upper`` one where it has it: see the module docstring), at least
    ``overrun.min_seconds``; None where there is no prediction to hold the fit to (no cost
    data for the model's regime, data wider than its measurements allow: see
    ``within_measured_width``, or the data cannot be read: the fit reports that itself)."""
    from tasks.inputs import load_data
    from tasks.registry import MODELS

    try:
        spec = MODELS[key]
        data = load_data(data_path)  # cached per process: the fit reads the same
        if spec.multiview:
            n, dims = data["views"][0].shape[0], [v.shape[1] for v in data["views"]]
        else:
            n, dims = data["Y"].shape[0], [data["Y"].shape[1]]
        p = predict(key, spec.constructor_args(point, options), n, dims, n_generations)
    except Exception:
        return None
    if p is None or not within_measured_width(p.entry, dims):
        return None
    ov = load_costs().get("overrun", {})
    held = p.seconds if p.upper_seconds is None else p.upper_seconds
    return max(float(ov.get("factor", 4.0)) * held, float(ov.get("min_seconds", 300.0))), held


def point_guard(key: str, options: dict, point: dict, data_path: str, n_generations: int = 0):
    """:func:`overrun_guard` for one grid point of a sweep (tasks.point.run_point)."""
    return overrun_guard(point_limit(key, options, point, data_path, n_generations), f"{key} at {point}")


def _set_async_exc(tid: int, exc) -> None:
    """Raise ``exc`` (an exception class) in thread ``tid`` at its next Python operation; None
    withdraws one not yet raised. (CPython's C API; no argtypes set on the shared function.)"""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(tid), None if exc is None else ctypes.py_object(exc)
    )


@contextlib.contextmanager
def overrun_guard(limit, what: str):
    """Stop the code inside once it has used ``limit`` = (limit seconds, predicted seconds) of CPU
    time (this process's, the unit of the predictions: a loaded machine's slower wall clock does not
    stop a fit), or ten times that of wall time (a fit that hangs): a watcher raises
    :class:`PointOverrun` in this thread, delivered between Python operations (a single long
    numerical call finishes first). ``limit`` None: no stop. A stop that fires as the code ends is
    withdrawn before this returns (never raised after it)."""
    if limit is None:
        yield
        return
    seconds, predicted = limit
    message = (
        f"{what} stopped after {fmt_seconds(seconds)} of CPU time, past "
        f"{seconds / max(predicted, 1e-9):.1f}x its predicted {fmt_seconds(predicted)} (tasks/costs.py; "
        "on a slower machine run `python -m tasks.costs calibrate`)"
    )
    # the exception class the watcher raises (CPython instantiates it with no arguments)
    stop = type(
        "PointOverrun", (PointOverrun,), {"__init__": lambda self, *a: PointOverrun.__init__(self, message)}
    )
    tid = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}
    ended = threading.Event()
    cpu0, wall0 = time.process_time(), time.perf_counter()

    def watch():
        while not ended.wait(min(1.0, max(seconds / 20, 0.005))):
            if time.process_time() - cpu0 > seconds or time.perf_counter() - wall0 > 10 * seconds:
                with lock:
                    if not state["done"]:
                        state["fired"] = True
                        _set_async_exc(tid, stop)
                return

    watcher = threading.Thread(target=watch, daemon=True, name="overrun-guard")
    try:  # a stop that fires while the watcher starts (a tiny limit) is raised from inside too
        watcher.start()
        yield
    finally:
        ended.set()
        with lock:
            state["done"] = True
            if state["fired"]:  # a stop not yet delivered is withdrawn (NULL clears it)
                _set_async_exc(tid, None)


# --------------------------------------------------------------------------- calibration
def probe_seconds(repeats: int = 5) -> float:
    """A short fixed workload (dense Cholesky and products, a sparse LU, a Python loop): the median
    CPU seconds of ``repeats`` runs (about 0.02 s each), the machine's speed in the cost data's units."""
    import numpy as np
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    rng = np.random.default_rng(0)
    A = rng.standard_normal((300, 300))
    S = A @ A.T + 300 * np.eye(300)
    g = 60
    T = sp.diags([4.0] * g, 0) - sp.diags([1.0] * (g - 1), 1) - sp.diags([1.0] * (g - 1), -1)
    L = (sp.kron(sp.identity(g), T) + sp.kron(T, sp.identity(g)) * 0.5).tocsc()
    ts = []
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(3):
            np.linalg.cholesky(S)
            S @ A
        splu(L)
        acc = 0.0
        for i in range(100_000):
            acc += i * 0.5
        ts.append(time.process_time() - t0)
    return float(sorted(ts)[len(ts) // 2])


def calibrate(repeats: int = 15) -> dict:
    """Time the probe here and keep the ratio to the cost data's machine (``calibration_path()``)."""
    costs = load_costs()
    here = probe_seconds(repeats)
    out = {
        "probe_seconds": here,
        "reference_probe_seconds": costs["probe_seconds"],
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    p = calibration_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(out, indent=1))
    out["factor"] = here / float(costs["probe_seconds"])
    out["path"] = str(p)
    return out


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m tasks.costs", description="cost data: calibrate to this machine"
    )
    ap.add_argument("what", choices=["calibrate", "show"])
    a = ap.parse_args(argv)
    if a.what == "calibrate":
        r = calibrate()
        print(
            f"probe {r['probe_seconds']:.3f} s here, {r['reference_probe_seconds']:.3f} s on the cost data's "
            f"machine: predictions x {r['factor']:.2f} (kept in {r['path']})"
        )
    else:
        print(json.dumps(load_costs(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
