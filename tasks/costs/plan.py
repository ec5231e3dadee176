"""The cost step of a sweep's plan: the cluster's limits on one grid point (a worker's memory, a
Slurm job's walltime, ``--max-point-hours``), every grid point's prediction (:mod:`tasks.costs.model`)
as a table per model, and the refusal of a point the cluster cannot run, all before any server or
cluster starts."""

from __future__ import annotations

import os

import psutil
from dask.utils import parse_bytes

from tasks.costs.model import fmt_bytes, fmt_seconds, predict
from tasks.registry import extras_inline, grid_points, options_for

#: a point is refused when predicted to run longer than this (hours), unless the user says otherwise
DEFAULT_MAX_POINT_HOURS = 24.0


def _parse_bytes(x) -> float | None:
    if x is None:
        return None
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


def extras_once(spec, grid: dict, extras: str, n_generations: int) -> bool:
    """Whether GLLE's diagnostics (``n_generations`` generations and the covariance-scale study) are
    computed once for the model, after the selection (the chosen point refitted with them,
    ``tasks.point.add_extras``), not with every point: where the points leave them
    (``tasks.registry.extras_inline``)."""
    return n_generations > 0 and not extras_inline(spec, grid, extras)


def plan_costs(
    specs, grid: dict, n: int, dims: list[int], options_for, n_generations: int, extras: str = "chosen"
) -> list[dict]:
    """Every model's predicted cost over the grid, one row per model: its grid points, the
    slowest point's and the largest point's :class:`Prediction` (``slowest``, ``largest``; None
    without cost data), the points' total seconds and the store's size for them.
    ``options_for(spec)`` gives the model's options; ``dims`` the data dimension of each view.
    ``extras``: the sweep's mode (``tasks.registry.EXTRAS_MODES``); under "chosen" a grid of
    several points pays GLLE's diagnostics once (:func:`extras_once`: the slowest point refitted
    with them, counted in the total and the store), not at every point."""
    rows = []
    for spec in specs:
        opts = options_for(spec)
        once = extras_once(spec, grid, extras, n_generations)
        row = {"key": spec.key, "points": 0, "slowest": None, "largest": None, "seconds": 0.0, "store": 0.0}
        for _, point in grid_points(spec, grid):
            p = predict(
                spec.key,
                spec.constructor_args(point, opts),
                n,
                dims if spec.multiview else dims[:1],
                0 if once else n_generations,
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
            if row["slowest"] is p:
                row["slowest_point"] = point
        if once and row["slowest"] is not None:  # the chosen point's refit with its diagnostics
            args = spec.constructor_args(row["slowest_point"], opts)
            refit = predict(spec.key, args, n, dims if spec.multiview else dims[:1], n_generations)
            row["seconds"] += refit.seconds
            row["store"] += refit.store_bytes - row["slowest"].store_bytes
            row["slowest"] = refit  # the longest task: the refit runs as one, on one worker
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


def check_plan(
    plan, cluster_spec: dict, max_point_hours: float | None = None, out=print, extras: str = "chosen"
) -> list[dict]:
    """The cost step of a sweep's plan (a :class:`tasks.sweep_plan.SweepPlan`), before any server or
    cluster starts: raises ValueError (one line) for a grid point the cluster cannot run, else
    prints the cost table through ``out`` (None: quiet) and returns its rows. ``extras``: the
    sweep's mode for GLLE's diagnostics (:func:`plan_costs`)."""
    n, D = (int(x) for x in plan.size)
    n_views = int(plan.layout.get("n_views", 1) or 1)
    dims = [max(1, D // n_views)] * n_views if n_views > 1 else [D]
    limits = cluster_limits(cluster_spec, max_point_hours)
    rows = plan_costs(
        plan.specs,
        plan.grid,
        n,
        dims,
        lambda s: options_for(s, plan.options),
        plan.layout.get("n_generations", 0),
        extras,
    )
    why = refusal(rows, n, limits)
    if why:
        raise ValueError(why)
    if out is not None:
        out(plan_table(rows, limits))
    return rows


#: a neighbour graph whose balls grow at least this fast (``lvmcore.graph.growth_dimension``: a
#: swiss roll's 1.5-1.9, pbmc68k_reduced's 2.4, an atlas's 50-D PCA 3.2-4.2) is predicted by the
#: cost entries' ``upper`` terms, fitted on such data (tasks.costs.model)
HIGH_DIM_GROWTH = 2.5


def graph_growth(graph_path: str, k: int) -> float:
    """The growth dimension of the sweep's kNN graph at ``k`` neighbours (its stored indices)."""
    from lvmcore.graph import adjacency, growth_dimension
    from tasks.inputs import load_graph

    return growth_dimension(adjacency(load_graph(graph_path)[0][:, :k]))


def predicted_seconds(
    plan, todo, n_workers: int, extras: str = "chosen", high_dim: bool = False
) -> float | None:
    """The plan's predicted seconds for the grid points ``todo`` ((spec, index, point) triples) on
    ``n_workers`` workers (:func:`grid_seconds`; None if a point has none); GLLE's diagnostics
    where the points compute them (``extras``: :func:`extras_once`). ``high_dim``: the kNN graph
    is expander-like (:func:`graph_growth` at least ``HIGH_DIM_GROWTH``), so an entry's ``upper``
    terms predict its points where it has them."""
    n, D = (int(x) for x in plan.size)
    n_views = int(plan.layout.get("n_views", 1) or 1)
    dims = [max(1, D // n_views)] * n_views if n_views > 1 else [D]
    total = longest = 0.0
    try:
        for spec, _, point in todo:
            args = spec.constructor_args(point, options_for(spec, plan.options))
            gens = plan.layout.get("n_generations", 0)
            gens = 0 if extras_once(spec, plan.grid, extras, gens) else gens
            p = predict(spec.key, args, n, dims if spec.multiview else dims[:1], gens)
            if p is None:
                return None
            sec = p.upper_seconds if high_dim and p.upper_seconds is not None else p.seconds
            total += sec
            longest = max(longest, sec)
    except Exception:  # a prediction is a courtesy here; the plan checked the points already
        return None
    return grid_seconds(total, longest, n_workers)
