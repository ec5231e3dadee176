"""The cost data read against measurements at scale: each model's grid point at N = 10^4, 10^5 and
10^6 on the 50-D roll, fitted as the sweep fits it, beside the prediction of the shipped cost data
(``tasks/costs/costs.json``; the ratio "as run" is its anchor: 1 is a perfect prediction).

    .venv/bin/python -m bench.costs.table [--models all] [--sizes 10000,100000,1000000] [--cap 3600]
    .venv/bin/python -m bench.costs.table --dry     # record the plan's refusals and caps, print

Each point runs in its own process (stopped at ``cap`` x 1.5 wall seconds); a point whose
prediction at this machine's speed is above ``--cap`` CPU seconds is not run, and one the plan
refuses is recorded with the plan's reason. One JSON line per (model, size) in ``--raw``
(bench/costs/table.jsonl); a pair already there is not run again. The cost data itself is measured
and fitted by ``python -m tasks.costs.calibrate``.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from pathlib import Path

from bench import common  # first: one thread each, before numpy loads
from lvmcore.graph import knn
from lvmcore.models import glle as glle_module
from tasks.costs import cluster_limits, fmt_bytes, fmt_seconds, load_costs, plan_costs, refusal, speed_factor
from tasks.costs.calibrate import make_data, probe_seconds
from tasks.costs.design import K, Q
from tasks.registry import COV_SCALES, MODELS

#: the raw results of the table
RAW = Path(__file__).with_name("table.jsonl")


#: the table's data: bench/scale.py's roll in 50 dimensions (the sweep's throughput data; mrd: its
#: toy views), k = 10, latent_dim = 2, seed 0, GLLE with 3 generations and the scale study
TABLE_D, TABLE_GENERATIONS = 50, 3


def point(key: str, n: int) -> dict:
    """Runs in its own process: one grid point of model ``key`` on n points as the sweep fits it
    (tasks/fit.py: the model's defaults, then GLLE's generations and scale study), timed in CPU
    and wall seconds; peak memory is the process's VmHWM from just before the fit (reset through
    /proc/self/clear_refs), so it holds the process, the data and the graph, as a worker would."""
    spec = MODELS[key]
    Y, _ = make_data(key, n, TABLE_D)
    graph = knn(Y, K)[0] if "k" in spec.dims else None
    pt = {"k": K, "latent_dim": Q, "kappa": 100.0, "seed": 0}
    est = spec.estimator_class()(**spec.constructor_args({dd: pt[dd] for dd in spec.dims}, {}))
    probe = probe_seconds()
    common.reset_peak()
    c0, w0 = time.process_time(), time.perf_counter()
    if graph is not None:
        est.fit(Y, graph=graph)
    else:
        est.fit(Y)
    fit_cpu, fit_wall = time.process_time() - c0, time.perf_counter() - w0
    solves = []  # the generations' eigenproblems this code actually solves (GLLE: lle.embed calls)
    if "generations" in spec.extras:
        # counted by observing the module's eigensolver (sys.monitoring), not by replacing it
        watched = {"embed": glle_module.embed}
        count = common.observe_calls(watched, lambda _: solves.append(1), lambda *a: None)
        with count:
            est.sample(TABLE_GENERATIONS, random_state=0)
            if "scale_study" in spec.extras:
                for a in COV_SCALES:
                    est.sample(1, random_state=0, cov_scale=a)
    out = {
        "key": key,
        "n": n,
        "d": [v.shape[1] for v in Y] if isinstance(Y, list) else [Y.shape[1]],
        "cpu_s": time.process_time() - c0,
        "wall_s": time.perf_counter() - w0,
        "fit_cpu_s": fit_cpu,
        "fit_wall_s": fit_wall,
        "peak_bytes": common.status_mb() * 2**20,
        "n_iter": int(getattr(est, "n_iter_", 0) or len(getattr(est, "elbo_trace_", [])) or 0),
        "converged": bool(getattr(est, "converged_", False)),
        "elbo": float(getattr(est, "elbo_", float("nan"))),
    }
    if "generations" in spec.extras:
        out["generation_solves"] = len(solves)
    out["probe_s"] = (probe * probe_seconds(3)) ** 0.5
    return out


@functools.cache
def _table_dims(key: str) -> tuple:
    """The table's data widths for model ``key`` (its views' for mrd), from a 50-point draw."""
    Y, _ = make_data(key, 50, TABLE_D)
    return tuple(v.shape[1] for v in Y) if isinstance(Y, list) else (TABLE_D,)


def _table_prediction(key: str, n: int):
    """(prediction at the reference machine's speed, the refusal line or None) of the table's point."""
    spec = MODELS[key]
    dims = list(_table_dims(key))
    grid = {"k": [K], "latent_dim": [Q], "kappa": [100.0], "seed": [0]}
    rows = plan_costs([spec], grid, n, dims, lambda s: {}, TABLE_GENERATIONS)
    return rows[0]["slowest"], refusal(rows, n, cluster_limits({"type": "local"}))


def table(keys, sizes, raw: Path, cap: float, dry: bool = False) -> None:
    """Each model at each size: refused by the plan (the reason), not run (its prediction above
    ``cap`` CPU seconds at this machine's speed), or run (``point``, in its own process, stopped at
    ``cap`` x 1.5 wall seconds). One JSON line per (model, size) in ``raw``; a pair already there
    is not run again. Then prints the table from ``raw``."""
    done = set()
    if raw.exists():
        done = {(r["key"], r["n"]) for r in map(json.loads, raw.read_text().splitlines())}
    speed = probe_seconds(9) / float(load_costs()["probe_seconds"]) / speed_factor()
    for n in sizes:
        for key in keys:
            if (key, n) in done:
                continue
            pred, why = _table_prediction(key, n)
            r = {"key": key, "n": n}  # predictions are read from the shipped data when printed
            if why:
                r["refused"] = why
            elif pred is not None and pred.seconds * speed > cap:
                r["not_run"] = (
                    f"predicted {pred.seconds * speed / 60:.0f} CPU min here, "
                    f"above the {cap / 60:.0f}-minute cap"
                )
            elif not dry:
                cmd = common.module_command("bench.costs.table", "point", key, str(n))
                t0 = time.perf_counter()
                try:
                    p = subprocess.run(
                        cmd, capture_output=True, text=True, timeout=1.5 * cap, cwd=common.ROOT
                    )
                    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
                    if p.returncode != 0 or not lines:
                        r["error"] = p.stderr[-600:]
                    else:
                        r.update(json.loads(lines[-1]))
                except subprocess.TimeoutExpired:
                    r["error"] = f"stopped after {1.5 * cap:.0f} s of wall time"
                r["bench_wall_s"] = time.perf_counter() - t0
                r["load"] = open("/proc/loadavg").read().split()[0]
            else:
                continue
            with open(raw, "a") as f:
                f.write(json.dumps(r) + "\n")
            brief = {k: v for k, v in r.items() if k != "error"}
            print(json.dumps(brief | ({"error": r["error"][-200:]} if "error" in r else {})), flush=True)
    print_table(raw)


def print_table(raw: Path) -> None:
    """The README's table: per model and size, CPU and wall seconds, peak memory, iterations run,
    and beside each the prediction of the cost data now shipped (CPU at the run's probe speed: the
    budget's upper bound, and the fixed part + the iterations actually run + generations), so a
    refit is read against the same measurements."""
    rows = [json.loads(x) for x in raw.read_text().splitlines()] if raw.exists() else []
    order = {k: i for i, k in enumerate(MODELS)}
    rows.sort(key=lambda r: (order.get(r["key"], len(order)), r["n"]))
    print(
        "| model | N | CPU s (wall s) | iterations | predicted CPU: budget / as run | ratio as run "
        "| peak RSS / predicted |"
    )
    print("|---|---:|---|---:|---|---:|---|")
    for r in rows:
        head = f"| {r['key']} | {r['n']:,} |"
        pred, why = _table_prediction(r["key"], r["n"])
        if why:
            print(f"{head} refused: {why} | | | | |")
            continue
        if "cpu_s" not in r:
            what = r.get("not_run") or "failed: " + r.get("error", "?").strip().splitlines()[-1][:120]
            print(f"{head} not run: {what} | | | | |")
            continue
        # this run's speed against the cost data's (predict scales by a calibration, if one exists)
        f = r["probe_s"] / float(load_costs()["probe_seconds"]) / speed_factor()
        # the eigensolves the measured code ran (rows before the fit's kept draw was reused: all 8)
        gens = pred.generation_s * r.get("generation_solves", pred.generations)
        as_run = (pred.fixed_s + r["n_iter"] * pred.iteration_s + gens) * f
        print(
            f"{head} {r['cpu_s']:.1f} ({r['wall_s']:.1f}) | "
            f"{r['n_iter']}{'' if r['converged'] else ' (budget)'} | "
            f"{fmt_seconds(pred.seconds * f)} / {fmt_seconds(as_run)} | "
            f"{as_run / max(r['cpu_s'], 1e-9):.2f} | "
            f"{fmt_bytes(r['peak_bytes'])} / {fmt_bytes(pred.memory_bytes)} |"
        )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "point":  # one point, in the process table() started
        print(json.dumps(point(argv[1], int(argv[2]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="all", help="comma-separated model keys (default all)")
    ap.add_argument("--raw", default=str(RAW), help="the table's results (JSON lines)")
    ap.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated N")
    ap.add_argument("--cap", type=float, default=3600.0, help="CPU seconds a point may be predicted")
    ap.add_argument("--dry", action="store_true", help="record refusals and caps only")
    a = ap.parse_args(argv)
    keys = list(MODELS) if a.models == "all" else a.models.split(",")
    table(keys, [int(x) for x in a.sizes.split(",")], Path(a.raw), a.cap, a.dry)


if __name__ == "__main__":
    main()
