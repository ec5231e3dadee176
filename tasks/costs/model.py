"""What a grid point costs before it runs: seconds, peak memory and store size, predicted from the
shipped, measured cost data (``tasks/costs/costs.json``, written by :mod:`tasks.costs.calibrate`).

A model's cost is written as a sum of monomials in the point's sizes, each with a fitted
coefficient; the monomials are fixed by the algorithm's complexity (the point hGP-LVM's exact GP
is O(N^3) per step, a sparse GP O(N M^2), LL-LVM's dense solver O((N Q)^3) ...), the coefficients
by least squares on measured fits at small and mid sizes (:mod:`tasks.costs.calibrate`). Variables:

    N points, D data dimensions (summed over views), Q latent dimensions, k neighbours,
    M inducing inputs, B minibatch size, V views

A prediction is ``fixed + budget x iteration + generations x generation`` seconds, where the
budget is the fit's iteration budget (``max_iter``, plus ``init_iters`` where the model has one):
an upper bound, as a fit that converges stops earlier. Times are CPU seconds of one thread (a
worker runs one fit on one pinned thread; CPU time, unlike wall time, hardly moves with the load
of a shared machine), on the machine the data was measured on: ``python -m tasks.costs calibrate``
(:func:`tasks.costs.calibrate.calibrate_machine`) times a short probe here and every prediction is
scaled by the ratio, kept in the user's cache folder (or ``EMBED_SWEEP_CALIBRATION``). Memory is the
fit's peak above a worker's resident memory before it, plus that (``process_bytes``) and the data.
``EMBED_SWEEP_COSTS`` names another cost file (the tests edit a copy).

Data of high intrinsic dimension: GLLE's eigensolves factorise I - W of the kNN graph, and the
factor's fill is set by the graph's separators, which the sizes above do not describe: on the 50-D
PCA of a single-cell atlas it holds 4.6x (2e4 cells) to 7.5x (5e4) the entries it holds on a 50-D
swiss roll and its time grows like N^2.6 (bench/README.md, "GLLE at scale"). Such an entry carries
an ``upper`` set of terms, fitted on the atlas: the plan shows both, refuses on the nominal terms
(a point that can run on the data the user most likely has is not refused) and the run-time stop
(:mod:`tasks.costs.guard`) holds a fit to the upper one (a fit on wide, high-dimensional data is not
stopped for being it).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from lvmcore import user_cache_dir
from tasks.registry import COV_SCALES, MODELS

#: the shipped cost data
COSTS_PATH = Path(__file__).with_name("costs.json")
VARIABLES = ("N", "D", "Q", "k", "M", "B", "V")


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
    return Path(os.environ.get("EMBED_SWEEP_CALIBRATION") or user_cache_dir("costs", "calibration.json"))


def speed_factor(costs: dict | None = None) -> float:
    """Seconds here per second of the cost data's machine (1 until ``python -m tasks.costs calibrate``
    has run: :func:`tasks.costs.calibrate.calibrate_machine`)."""
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
    if entry.endswith("/minibatch"):  # the hyperboloid GP-LVMs' minibatch fit
        from lvmcore.models.hgplvm import minibatch  # imported here: the model loads JAX

        return minibatch.auto_inducing(n)
    from lvmcore.models.hgplvm import full  # imported here, as above: the hGP-LVM loads JAX

    return full.auto_inducing(n)


def point_variables(key: str, args: dict, n: int, dims: list[int]) -> tuple[str, dict]:
    """(cost entry, variables) of one grid point: model key, its full constructor arguments, n
    points and the data dimension of each view."""
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
    if params.get("random_state") is None:
        return 0
    return 1 + (params.get("cov_scale") in COV_SCALES)


def store_bytes(spec, v: dict, params: dict, generations: int) -> float:
    """A grid point's arrays in the store: embedding (and its variances), the generations and the
    bound's trace (float64, as the store writes them)."""
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
