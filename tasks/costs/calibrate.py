"""The cost data's own tool: measure every model's cost, fit the cost model and write the shipped
cost data (``tasks/costs/costs.json``); and scale the predictions to the machine at hand.

    python -m tasks.costs.calibrate machine           # (or python -m tasks.costs calibrate)
    nice -n 10 python -m tasks.costs.calibrate measure [--models all] [--raw measurements.jsonl]
    nice -n 10 python -m tasks.costs.calibrate measure --round 2 --models glle_em,...   # fewer sizes
    python -m tasks.costs.calibrate fit [--raw measurements.jsonl,more.jsonl] [--out costs.json]

``machine``: times a short probe (:func:`probe_seconds`, under a second) and keeps its ratio to the
cost data's machine in the user's cache folder (:func:`tasks.costs.model.calibration_path`); every
prediction is scaled by it.

``measure``: for each cost entry (:mod:`tasks.costs.design`), fits at the ``fit`` sizes (and one size
with more data dimensions or inducing inputs, so their terms are determined) and at the ``validate``
sizes, which the fit never sees. Each size runs in its own process: the data (scikit-learn's swiss
roll, embedded in D dimensions by a fixed orthonormal map plus N(0, 0.05^2) noise; the MRD toy views
for mrd) and its kNN graph are made, the probe is timed, then the model is fitted with a budget of I1
iterations, (JAX models: again with I1, the first having compiled) and with I2: seconds per
iteration = (t(I2) - t(I1)) / (iterations run by I2 - by I1), the fixed part = the first fit less I1
iterations (so compilation counts); GLLE also times two generations (``sample``). Times are CPU
seconds of the process (``time.process_time``): on a machine shared with other jobs, wall time
measures the load, CPU time the work. Peak memory is ru_maxrss above the process's resident size
before the first fit. One JSON line per size is appended to ``--raw``; a size past ``--timeout`` wall
seconds is recorded as such. ``--round N`` takes round N's changes to the plan (``ROUND2`` ...
``ROUND6`` of :mod:`tasks.costs.design`; 1, the default: ``PLAN``). ``tasks/costs/measurements.jsonl``
holds the rounds that made the shipped data (``--raw``'s default, for ``measure`` and ``fit``).

Data of high intrinsic dimension: an entry with ``upper_of`` (``glle_em/high_dim``) is measured
on cells drawn from an ingested atlas's 50-D PCA (``bench/data/atlas.py``'s data.zarr, named by
``--atlas``; a size's extra ``{"data": "atlas", "k": 15}``) and fitted into the ``upper`` terms of the
entry it names (:mod:`tasks.costs.guard` holds a fit to them, the plan shows them).

``fit``: per entry, non-negative least squares of each stage on its complexity's monomials (the
functional form is fixed in :mod:`tasks.costs.design`, per algorithm; relative errors: each
measurement weighted by its inverse), every time first scaled to the median probe. Prints measured
and predicted per size, the ``validate`` sizes (never fitted on) marked, and the ratio prediction /
measurement of a fit at the model's default iteration budget; writes the cost data.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.optimize import nnls
from scipy.sparse.linalg import splu

from lvmcore.data.synthetic import mrd_toy, swiss_roll
from lvmcore.graph import knn
from tasks.costs.design import PLAN, ROUNDS, K, Q, entry_plan
from tasks.costs.model import COSTS_PATH, calibration_path, evaluate_terms, load_costs, point_variables
from tasks.registry import MODELS

#: the repository (the measurements run each size in a process started here)
ROOT = Path(__file__).resolve().parents[2]
#: the measurements that made the shipped cost data
MEASUREMENTS = Path(__file__).with_name("measurements.jsonl")
#: the threads a measurement runs on: one, as a sweep's worker (set for ``measure`` and ``fit``)
ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}


# --------------------------------------------------------------------------- this machine
def probe_seconds(repeats: int = 5) -> float:
    """A short fixed workload (dense Cholesky and products, a sparse LU, a Python loop): the median
    CPU seconds of ``repeats`` runs (about 0.02 s each), the machine's speed in the cost data's units."""
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


def calibrate_machine(repeats: int = 15) -> dict:
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


# --------------------------------------------------------------------------- measuring
def make_data(key: str, n: int, d: int, data: str | None = None, atlas: str | None = None):
    """(data, None) of one measured size: the swiss roll in ``d`` dimensions (mrd: its toy views),
    or with ``data="atlas"`` n cells of the ingested atlas store ``atlas`` (a zarr of 50-D PCA)."""
    if data == "atlas":
        import xarray as xr  # imported here: only the atlas sizes read a store

        if atlas is None:
            raise ValueError("the atlas sizes need --atlas (bench/data/atlas.py's data.zarr)")
        Y = xr.open_zarr(atlas, consolidated=False)["Y"].values
        if Y.shape[1] != d:
            raise ValueError(f"the atlas {atlas} holds {Y.shape[1]}-D data, the plan asks {d}")
        rows = np.sort(np.random.default_rng(0).choice(Y.shape[0], n, replace=False))
        return np.ascontiguousarray(Y[rows], dtype=np.float64), None

    if key == "mrd":
        views, _ = mrd_toy(n, seed=0)
        return [np.asarray(v) for v in views], None
    Y, _ = swiss_roll(n, 0)
    if d > 3:
        rng = np.random.default_rng(d)
        B, _ = np.linalg.qr(rng.standard_normal((d, 3)))
        Y = Y @ B.T + 0.05 * rng.standard_normal((n, d))
    return Y, None


def _data_keys(extra: dict) -> tuple[dict, str | None, int]:
    """(constructor options, data kind, k) of a size's extra: "data" and "k" name the data set and
    the neighbours, the rest are constructor options."""
    extra = dict(extra)
    return extra, extra.pop("data", None), int(extra.pop("k", K))


def _maxrss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def one(entry: str, n: int, d: int, extra: dict, round_: str = "1", atlas: str | None = None) -> dict:
    """Runs in its own process: one size of one entry (in round ``round_``)."""
    plan = entry_plan(entry, round_)
    spec = MODELS[plan["key"]]
    given = extra
    extra, data, k = _data_keys(given)
    Y, _ = make_data(plan["key"], n, d, data, atlas)
    graph = knn(Y, k)[0] if "k" in spec.dims else None
    point = {"k": k, "latent_dim": Q, "kappa": 100.0, "seed": 0}
    base = dict(plan.get("opts", {}), **extra)
    cls = spec.estimator_class()
    probe = probe_seconds()

    def fit(iters):
        opts = dict(base)
        if iters is not None:
            opts["max_iter"] = iters
            opts["tol"] = 0.0
        est = cls(**spec.constructor_args({dd: point[dd] for dd in spec.dims}, opts))
        t0 = time.process_time()
        if graph is not None:
            est.fit(Y, graph=graph)
        else:
            est.fit(Y)
        t = time.process_time() - t0
        its = len(getattr(est, "elbo_trace_", [])) or int(getattr(est, "n_iter_", 0) or 0)
        return t, its, est

    rss0 = _maxrss()
    out = {"entry": entry, "n": n, "d": d, "extra": given, "probe_s": probe}
    if plan["iters"] is None:
        t0, _, est = fit(None)
        t1, _, est = fit(None)
        out.update(fixed_s=min(t0, t1), iteration_s=0.0)
    else:
        i1, i2 = plan["iters"]
        tw, nw, est = fit(i1)
        # JAX models compile in their first fit: fit again for the per-iteration difference
        t1, n1, est = fit(i1) if plan.get("warm", True) else (tw, nw, est)
        t2, n2, est = fit(i2)
        per = (t2 - t1) / (n2 - n1) if n2 > n1 else 0.0
        out.update(
            warm_s=tw,
            t1_s=t1,
            t2_s=t2,
            n1=n1,
            n2=n2,
            iteration_s=max(per, 0.0),
            # a negative difference is noise (the first fit's one-time costs): no iterations' worth
            fixed_s=max(tw - max(per, 0.0) * n1, 0.0),
        )
    if hasattr(est, "sample") and "generations" in spec.extras:
        ts = []
        for a in (1.0, 10.0):
            t0 = time.process_time()
            # seed 1, not the fit's 0: the fit's kept draw would answer seed 0 at a = 1 unsolved
            est.sample(1, random_state=1, cov_scale=a)
            ts.append(time.process_time() - t0)
        out["generation_s"] = float(np.mean(ts))
    out["memory_bytes"] = max(_maxrss() - rss0, 0.0)
    out["rss0_bytes"] = rss0
    out["probe_after_s"] = probe_seconds(3)
    out["probe_s"] = (probe * out["probe_after_s"]) ** 0.5  # the machine's speed around the fits
    return out


def measure(
    entries,
    raw: Path,
    timeout: float,
    only_validate: bool = False,
    skip_done: bool = True,
    only_d=None,
    round_: str = "1",
    atlas: str | None = None,
):
    """Measure every size of ``entries`` in round ``round_`` not yet in ``raw`` (each in its own
    process: :func:`one`), appending one JSON line per size to ``raw``."""
    done = set()
    if skip_done and raw.exists():
        for line in raw.read_text().splitlines():
            r = json.loads(line)
            if "error" in r:  # tried again
                continue
            done.add((r["entry"], r["n"], r["d"], json.dumps(r.get("extra", {}), sort_keys=True)))
    for entry in entries:
        plan = entry_plan(entry, round_)
        sizes = [(*s, "fit") for s in plan["fit"]] + [(*s, "validate") for s in plan["validate"]]
        for s in sizes:
            n, d = s[0], s[1]
            extra = s[2] if len(s) > 3 else {}
            role = s[-1]
            if (only_validate and role != "validate") or (only_d and d not in only_d):
                continue
            tag = (entry, n, d, json.dumps(extra, sort_keys=True))
            if tag in done:
                continue
            cmd = [sys.executable, "-m", "tasks.costs.calibrate", "one", entry, str(n), str(d)]
            cmd += [json.dumps(extra), str(round_)] + ([atlas] if atlas else [])
            t0 = time.perf_counter()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
                lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
                if p.returncode != 0 or not lines:
                    r = {"entry": entry, "n": n, "d": d, "extra": extra, "error": p.stderr[-800:]}
                else:
                    r = json.loads(lines[-1])
            except subprocess.TimeoutExpired:
                r = {
                    "entry": entry,
                    "n": n,
                    "d": d,
                    "extra": extra,
                    "error": f"timed out after {timeout:.0f} s",
                }
            r["role"] = role
            r["wall_s"] = time.perf_counter() - t0
            r["load"] = open("/proc/loadavg").read().split()[0]
            with open(raw, "a") as f:
                f.write(json.dumps(r) + "\n")
            brief = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "error"}
            print(
                json.dumps(brief) if "error" not in r else f"{entry} {n} {d}: ERROR {r['error'][-300:]}",
                flush=True,
            )


# --------------------------------------------------------------------------- fitting
def _variables(entry: str, r: dict) -> dict:
    plan = PLAN[entry]
    spec = MODELS[plan["key"]]
    extra, _, k = _data_keys(r.get("extra", {}))
    point = {"k": k, "latent_dim": Q, "kappa": 100.0, "seed": 0}
    args = spec.constructor_args({dd: point[dd] for dd in spec.dims}, dict(plan.get("opts", {}), **extra))
    dims = [15, 15] if plan["key"] == "mrd" else [r["d"]]
    got, v = point_variables(plan["key"], args, r["n"], dims)
    if got != plan.get("upper_of", entry):
        raise RuntimeError(f"{entry}: the measured point resolves to {got}")
    return v


def _nnls(rows, monomials):
    rows = [(v, t) for v, t in rows if t > 0]  # a difference that measured nothing says nothing
    if not monomials or not rows:
        return {}
    A = np.array([[evaluate_terms({m: 1.0}, v) for m in monomials] for v, _ in rows])
    y = np.array([t for _, t in rows])
    w = 1.0 / np.maximum(y, 1e-6)
    scale = np.maximum(np.abs(A * w[:, None]).max(axis=0), 1e-300)
    coef, _ = nnls(A * w[:, None] / scale, y * w)
    coef = coef / scale
    return {m: float(c) for m, c in zip(monomials, coef) if c > 0}


def _fixed(r: dict) -> float:
    """The fixed part of a measured size: the first fit less its iterations at the measured (never
    negative) per-iteration cost (rows measured before that rule subtracted a negative difference)."""
    if "warm_s" in r and "n1" in r:
        return max(r["warm_s"] - r["iteration_s"] * r["n1"], 0.0)
    return r["fixed_s"]


def _default_budget(entry: str, e: dict) -> int:
    """The model's default iteration budget (its constructor's defaults for the entry's budget)."""
    params = inspect.signature(MODELS[PLAN[entry]["key"]].estimator_class()).parameters
    return sum(int(params[name].default) for name in e.get("budget", []) if name in params)


def fit(raw: Path, out: Path, entries=None) -> None:
    """Fit every entry of ``PLAN`` (``entries`` None) and write ``out`` anew; or refit only the
    named ``entries`` into the existing ``out``, at its reference probe (the other entries, and
    the machine speed they are in units of, unchanged)."""
    paths = [Path(p) for p in str(raw).split(",") if Path(p).exists()]
    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines()]
    good = [r for r in rows if "error" not in r]
    old = json.loads(out.read_text()) if out.exists() else {}
    if entries is not None:
        costs = old
        ref = float(old["probe_seconds"])
    else:
        ref = float(np.median([r["probe_s"] for r in good]))
        costs = {
            "about": "cost data per model (CPU seconds, bytes), from tasks/costs/calibrate.py, read by "
            "tasks/costs/model.py",
            "probe_seconds": ref,
            "process_bytes": float(np.median([r["rss0_bytes"] for r in good])),
            "overrun": old.get("overrun", {"factor": 4.0, "min_seconds": 300.0}),
            "models": {},
        }
    print(f"reference probe {ref:.4f} CPU s (median of {len(good)} measurements)")
    print(
        "per size: CPU s per iteration and of the fixed part, measured / predicted; 'budget': the fit at "
        "its default iteration budget, predicted / measured; peak MB above the process, measured / predicted"
    )
    head = f"{'entry':26s} {'N':>8s} {'D':>3s} {'role':8s} {'s/it':>19s} {'fixed':>19s} {'budget':>6s}"
    print(head + f" {'MB':>11s}")
    for entry, plan in PLAN.items():
        if entries is not None and entry not in entries:
            continue
        mine = [r for r in good if r["entry"] in (entry, plan.get("was"))]
        if not mine:
            print(f"{entry}: no measurements")
            continue
        norm = [(r, ref / r["probe_s"]) for r in mine]
        fitted = [(r, s) for r, s in norm if r["role"] == "fit"]
        e = {"budget": plan.get("budget", ["max_iter"] if plan["iters"] else [])}
        stage_rows = {
            "fixed": [(_variables(entry, r), _fixed(r) * s) for r, s in fitted],
            "iteration": [
                (_variables(entry, r), r["iteration_s"] * s)
                for r, s in fitted
                if r.get("n2", 1) > r.get("n1", 0)
            ],
            "generation": [
                (_variables(entry, r), r["generation_s"] * s) for r, s in fitted if "generation_s" in r
            ],
            "memory": [(_variables(entry, r), r["memory_bytes"]) for r, _ in fitted],
        }
        for stage, rs in stage_rows.items():
            terms = _nnls(rs, plan.get(stage, []))
            if terms:
                e[stage] = terms
        e["measured"] = [
            {
                k: r[k]
                for k in ("n", "d", "extra", "role", "fixed_s", "iteration_s", "memory_bytes", "probe_s")
                if k in r
            }
            | ({"generation_s": r["generation_s"]} if "generation_s" in r else {})
            for r in mine
        ]
        if "upper_of" in plan:  # high intrinsic dimension: the upper terms of the entry it names
            costs["models"][plan["upper_of"]]["upper"] = {
                stage: e[stage] for stage in ("fixed", "iteration", "generation", "memory") if stage in e
            } | {"measured": e["measured"], "data": "atlas"}
            e = dict(e, budget=costs["models"][plan["upper_of"]]["budget"])
        else:
            costs["models"][entry] = e
        for r, s in sorted(norm, key=lambda x: (x[0]["role"] != "fit", x[0]["n"])):
            v = _variables(entry, r)
            pi = evaluate_terms(e.get("iteration", {}), v)
            pf = evaluate_terms(e.get("fixed", {}), v)
            pm = evaluate_terms(e.get("memory", {}), v)
            budget = _default_budget(entry, e)
            mi, mf = r["iteration_s"] * s, _fixed(r) * s
            ratio = (pf + budget * pi) / max(mf + budget * mi, 1e-9)
            gen = ""
            if "generation_s" in r:
                gen = f" gen {r['generation_s'] * s:.3g} / {evaluate_terms(e.get('generation', {}), v):.3g}"
            print(
                f"{entry:26s} {r['n']:>8d} {r['d']:>3d} {r['role']:8s} {mi:>9.3g} / {pi:<7.3g} {mf:>9.3g} / "
                f"{pf:<7.3g} {ratio:>6.2f} {r['memory_bytes'] / 2**20:>5.0f} / {pm / 2**20:<5.0f}{gen}"
                + (f" {r['extra']}" if r.get("extra") else "")
            )
    out.write_text(json.dumps(costs, indent=1) + "\n")
    print(f"wrote {out}")


# --------------------------------------------------------------------------- the command line
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "one":  # one measured size, in the process measure() started
        atlas = argv[6] if len(argv) > 6 else None
        print(json.dumps(one(argv[1], int(argv[2]), int(argv[3]), json.loads(argv[4]), argv[5], atlas)))
        return 0
    ap = argparse.ArgumentParser(prog="python -m tasks.costs.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["machine", "show", "measure", "fit"])
    ap.add_argument("--models", default="all", help="comma-separated cost entries (default all)")
    ap.add_argument("--raw", default=str(MEASUREMENTS), help="the measurements (JSON lines)")
    ap.add_argument("--out", default=str(COSTS_PATH), help="fit: the cost data written")
    ap.add_argument("--timeout", type=float, default=300.0, help="measure: wall seconds per size")
    ap.add_argument("--validate-only", action="store_true")
    ap.add_argument("--only-d", default="", help="comma-separated data widths: measure only sizes of these D")
    ap.add_argument("--round", default="1", choices=["1", *ROUNDS], help="measure: the plan's round")
    ap.add_argument("--atlas", default=None, help="measure: the atlas store of the high_dim sizes")
    a = ap.parse_args(argv)
    if a.what == "machine":
        r = calibrate_machine()
        print(
            f"probe {r['probe_seconds']:.3f} s here, {r['reference_probe_seconds']:.3f} s on the cost data's "
            f"machine: predictions x {r['factor']:.2f} (kept in {r['path']})"
        )
        return 0
    if a.what == "show":
        print(json.dumps(load_costs(), indent=1))
        return 0
    for name, value in ONE_THREAD.items():  # inherited by each measured size's process
        os.environ.setdefault(name, value)
    entries = list(PLAN) if a.models == "all" else a.models.split(",")
    if a.what == "measure":
        only_d = {int(x) for x in a.only_d.split(",") if x}
        measure(
            entries, Path(a.raw), a.timeout, a.validate_only, only_d=only_d, round_=a.round, atlas=a.atlas
        )
    else:
        fit(Path(a.raw), Path(a.out), None if a.models == "all" else entries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
