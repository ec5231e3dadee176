"""Measure every model's cost and refresh the shipped cost data (tasks/costs.json).

    nice -n 10 .venv/bin/python bench/costs.py measure [--models all] [--raw bench/costs_raw.jsonl]
    COSTS_ROUND=2 nice -n 10 .venv/bin/python bench/costs.py measure --models glle_em,...   # fewer sizes
    .venv/bin/python bench/costs.py fit [--raw bench/costs_raw.jsonl,more.jsonl] [--out tasks/costs.json]

``measure``: for each cost entry (a model key, or key/regime where ``auto`` picks a path), fits at
the ``fit`` sizes (and one size with more data dimensions or inducing inputs, so their terms are
determined) and at the ``validate`` sizes, which the fit never sees. Each size runs in its own
process: the data (scikit-learn's swiss roll, embedded in D dimensions by a fixed orthonormal map
plus N(0, 0.05^2) noise; the MRD toy views for mrd) and its kNN graph are made, the probe of
tasks/costs.py is timed, then the model is fitted with a budget of I1 iterations, (JAX models: again
with I1, the first having compiled) and with I2: seconds per iteration = (t(I2) - t(I1)) /
(iterations run by I2 - by I1), the fixed part = the first fit less I1 iterations (so compilation
counts); GLLE also times two generations (``sample``). Times are CPU seconds of the process
(``time.process_time``): on a machine shared with other jobs, wall time measures the load, CPU time
the work. Peak memory is ru_maxrss above the process's resident size before the first fit. One JSON
line per size is appended to ``--raw``; a size past ``--timeout`` wall seconds is recorded as such.
``COSTS_ROUND=2`` takes the shorter plan ``ROUND2`` (fewer sizes, fewer iterations), ``COSTS_ROUND=3``
``ROUND3`` (one larger size for the memory terms), ``COSTS_ROUND=4`` ``ROUND4`` (LL-LVM's level
blocks; 50-D sizes for GLLE-direct and the Bayesian GP-LVM; larger MRD sizes; the sparse hGP-LVM at
fixed M; the minibatch hGP-LVM at 5e4 and 1e5), ``COSTS_ROUND=5`` ``ROUND5`` (GLLE on the 50-D roll
at 1e5-3e5, where its LU's fill grows), ``COSTS_ROUND=6`` ``ROUND6`` (the linear-kernel Bayesian GP-LVM
on the 50-D roll up to 5e4). bench/costs_raw.jsonl holds the
rounds that made the shipped data (``fit`` reads it by default).

Data of high intrinsic dimension: an entry with ``upper_of`` (``glle_em/high_dim``) is measured
on cells drawn from an ingested atlas's 50-D PCA (``bench/atlas.py``'s data.zarr, named by the
environment variable ``COSTS_ATLAS``; a size's extra ``{"data": "atlas", "k": 15}``) and fitted
into the ``upper`` terms of the entry it names (tasks/costs.py: the run-time stop holds a fit to
them, the plan shows them).

``fit``: per entry, non-negative least squares of each stage on its complexity's monomials (the
functional form is fixed below, per algorithm; relative errors: each measurement weighted by its
inverse), every time first scaled to the median probe. Prints measured and predicted per size, the
``validate`` sizes (never fitted on) marked, and the ratio prediction / measurement of a fit at the
model's default iteration budget; writes tasks/costs.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_k, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
sys.path.insert(0, str(ROOT))

#: per cost entry: the model key, options, iteration budgets (I1, I2), the sizes fitted on
#: ((N, D, extra options)), the sizes only validated on, and the monomials of each stage
#: (the algorithm's complexity per fixed stage, per iteration, per generation, and of its memory)
GP_ITER = ["1", "N*M^2*Q", "N*M*D", "M^3"]
PLAN = {
    "ppca": dict(
        key="ppca",
        iters=None,
        fit=[(20000, 3), (100000, 3), (300000, 3), (100000, 30), (100000, 50)],
        validate=[(1000000, 3)],
        fixed=["1", "N*D^2"],
        memory=["1", "N*D"],
    ),
    "lllvm/dense": dict(
        warm=False,
        key="lllvm",
        opts={"solver": "dense"},
        iters=(2, 4),
        fit=[(250, 3), (400, 3), (600, 3), (400, 30)],
        validate=[(900, 3)],
        fixed=["1", "N^2*Q^2"],
        iteration=["1", "N*k*D", "N^3*Q^3"],
        memory=["1", "N^2*Q^2"],
    ),
    "lllvm/factorised": dict(
        warm=False,
        key="lllvm",
        opts={"solver": "factorised"},
        iters=(2, 4),
        fit=[(500, 3), (1000, 3), (2000, 3), (4000, 3), (1000, 30)],
        validate=[(8000, 3)],
        fixed=["1", "N*k*Q^2"],
        iteration=["1", "N*k*Q^2", "N^1.5*Q^3", "N*k*D"],
        # the level blocks of the block-tridiagonal factor: sum_l (s_l Q)^2 with level widths
        # s_l ~ N^0.5 on a 2-D manifold (9.3 GB at 10^5, where the N-linear terms said 3.2)
        memory=["1", "N*k*Q^2", "N*k*D", "N^1.5*Q^2"],
    ),
    "glle_em": dict(
        warm=False,
        key="glle_em",
        iters=(5, 15),
        fit=[(2000, 3), (5000, 3), (10000, 3), (5000, 30), (5000, 50), (20000, 50)],
        validate=[(40000, 3), (50000, 50)],
        fixed=["1", "N*k^3", "N*k^2*D", "N^1.5"],
        iteration=["1", "N*k"],
        # the pinned LU's fill: constant per point on a 3-D roll, growing like N^0.75 per point on
        # the 50-D one above 10^5 (ROUND5): its memory, and the solves of each eigenproblem
        generation=["1", "N*k^2", "N^1.5", "N^1.75"],
        memory=["1", "N*k^2", "N^1.75"],
    ),
    # GLLE on data of high intrinsic dimension (an atlas's PCA, k = 15): the LU's fill and time
    # grow like N^1.75 and N^2.6 there (bench/README.md, "GLLE at scale"); fitted into glle_em's
    # ``upper`` terms
    "glle_em/high_dim": dict(
        warm=False,
        key="glle_em",
        upper_of="glle_em",
        iters=(3, 6),
        fit=[(s, 50, {"data": "atlas", "k": 15}) for s in (5000, 10000, 20000, 30000)],
        validate=[(50000, 50, {"data": "atlas", "k": 15})],
        fixed=["1", "N*k^2*D", "N^2.5"],
        iteration=["1", "N*k"],
        generation=["1", "N*k^2", "N^2.5"],
        memory=["1", "N^1.75"],
    ),
    "glle_direct": dict(
        warm=False,
        key="glle_direct",
        iters=(5, 15),
        fit=[(2000, 3), (5000, 3), (10000, 3)],
        validate=[(40000, 3)],
        fixed=["1", "N*k^3", "N*k^2*D", "N^1.5"],
        iteration=["1", "N*k"],
        generation=["1", "N*k^2", "N^1.5", "N^1.75"],  # as glle_em's
        memory=["1", "N*k^2", "N^1.75"],
    ),
    "bgplvm_rbf": dict(
        key="bgplvm_rbf",
        opts={"init_iters": 0},
        iters=(5, 15),
        fit=[(500, 3), (1000, 3), (2000, 3), (1000, 30), (1000, 3, {"n_inducing": 60})],
        validate=[(5000, 3)],
        fixed=["1", "N*D"],
        iteration=GP_ITER,
        memory=["1", "N*M", "N*D"],
        budget=["max_iter", "init_iters"],
    ),
    "bgplvm_linear": dict(
        key="bgplvm_linear",
        opts={"init_iters": 0},
        iters=(5, 15),
        fit=[(500, 3), (1000, 3), (2000, 3), (1000, 30)],
        validate=[(5000, 3)],
        fixed=["1", "N*D"],
        iteration=GP_ITER,
        memory=["1", "N*M", "N*D"],
        budget=["max_iter", "init_iters"],
    ),
    "bgplvm_svi": dict(
        key="bgplvm_svi",
        opts={"init_epochs": 0},
        iters=(1, 3),
        fit=[(2000, 3), (4000, 3), (8000, 3), (4000, 30), (4000, 3, {"n_inducing": 60}), (4000, 50)],
        validate=[(20000, 3)],
        fixed=["1", "N*D"],
        iteration=GP_ITER,
        memory=["1", "N*M", "N*D"],
    ),
    "mrd": dict(
        key="mrd",
        opts={"init_iters": 0},
        iters=(5, 15),
        fit=[(200, 30), (400, 30), (800, 30), (400, 30, {"n_inducing": 60})],
        validate=[(1600, 30)],
        fixed=["1", "N*D"],
        iteration=["1", "N*M^2*Q*V", "N*M*D", "M^3*V"],
        memory=["1", "N*M*V", "N*D"],
        budget=["max_iter", "init_iters"],
    ),
    "hgplvm_point": dict(
        key="hgplvm_point",
        iters=(10, 30),
        fit=[(150, 3), (300, 3), (600, 3), (300, 30)],
        validate=[(1000, 3)],
        fixed=["1", "N^2*D"],
        iteration=["1", "N^2*D", "N^3"],
        memory=["1", "N^2"],
    ),
    # the sparse hGP-LVM's full-batch fit (training="auto" takes it up to 5,000 points; the sizes
    # above force it); its rows before the minibatch fit existed are entry "hgplvm_sparse" (``was``)
    "hgplvm_sparse/full": dict(
        key="hgplvm_sparse",
        opts={"training": "full"},
        was="hgplvm_sparse",
        iters=(10, 30),
        fit=[(500, 3), (1000, 3), (2000, 3), (1000, 30), (1000, 50)],
        validate=[(4000, 3)],
        fixed=["1", "N*M*D"],
        # N M: the kernel rows and their gradient, which dominate at the sweep's M (measured at
        # fixed M = 64 and 256: time linear in N M, not N M^2)
        iteration=["1", "N*M", "N*M^2", "N*M*D", "M^3"],
        memory=["1", "N*M"],
    ),
    # its minibatch fit (point latents, lvmcore.models.hgplvm_svi): the fixed part holds the PCA
    # start, the per-point pass (local_iter steps over every row: N M^2, N M D) and the final pass;
    # a step is one batch. 100 steps for the per-step difference (milliseconds each)
    "hgplvm_sparse/minibatch": dict(
        key="hgplvm_sparse",
        iters=(5, 105),
        fit=[
            (2000, 3, {"training": "minibatch"}),
            (6000, 3),
            (12000, 3),
            (6000, 50),
            (20000, 50),
            (6000, 3, {"batch_size": 500}),
        ],
        validate=[(30000, 50)],
        fixed=["1", "N*M^2", "N*M*D"],
        iteration=["1", "B*M^2", "B*M*D"],
        memory=["1", "N*M", "N*D"],
    ),
    "hgplvm_bayesian/full": dict(
        key="hgplvm_bayesian",
        iters=(10, 30),
        fit=[(500, 3), (1000, 3), (2000, 3), (1000, 30), (1000, 50)],
        validate=[(4000, 3)],
        fixed=["1", "N*M*D"],
        iteration=["1", "N*M^2", "N*M*D", "M^3"],
        memory=["1", "N*M"],
    ),
    "hgplvm_bayesian/minibatch": dict(
        key="hgplvm_bayesian",
        iters=(5, 15),
        # N = 2,000 by training="minibatch" (auto takes it above 5,000): sizes the 5-minute cap allows
        fit=[(2000, 3, {"training": "minibatch"}), (6000, 3), (6000, 30), (6000, 3, {"batch_size": 500})],
        validate=[(12000, 3)],
        fixed=["1", "N*M^2", "N*M*D"],
        iteration=["1", "B*M^2", "B*M*D"],
        memory=["1", "N*M", "N*D"],
    ),
}
Q, K = 2, 10

#: a shorter round (``--round 2``): fewer sizes and iterations, for a machine whose load leaves each
#: measurement a small share of a core (the 5-minute cap per size)
ROUND2 = {
    "glle_em": dict(iters=(3, 8), fit=[(2000, 3), (5000, 3)], validate=[(10000, 3)]),
    "hgplvm_bayesian/full": dict(iters=(3, 8), fit=[(500, 3), (1000, 3)], validate=[(2000, 3)]),
    "bgplvm_svi": dict(iters=(1, 2), fit=[(1000, 3), (2000, 3)], validate=[(4000, 3)]),
    # MRD's iterations take milliseconds: a longer difference than (3, 8) to measure them
    "mrd": dict(iters=(10, 60), fit=[(200, 30), (400, 30), (800, 30)], validate=[(1600, 30)]),
    "hgplvm_point": dict(iters=(3, 8), fit=[], validate=[(1000, 3)]),
    "lllvm/factorised": dict(iters=(1, 2), fit=[], validate=[(6000, 3)]),
    "bgplvm_rbf": dict(iters=(3, 8), fit=[], validate=[(4000, 3)]),
    "hgplvm_sparse/full": dict(iters=(3, 8), fit=[(2000, 3)], validate=[(3000, 3)]),
    "glle_direct": dict(iters=(3, 8), fit=[], validate=[(20000, 3)]),
}
#: a third round (``COSTS_ROUND=3``): one larger size each, so the memory terms are set by more than
#: the constant (compilation, imports) that dominates the small sizes
ROUND3 = {
    "bgplvm_rbf": dict(iters=(1, 2), fit=[(100000, 3)], validate=[]),
    "glle_em": dict(iters=(3, 8), fit=[(30000, 3)], validate=[]),
}


#: a fourth round (``COSTS_ROUND=4``): LL-LVM's factorised solver at sizes where its level blocks,
#: not the per-edge terms, set the memory; validated at 10^5
ROUND4 = {
    "lllvm/factorised": dict(iters=(1, 2), fit=[(16000, 3), (32000, 3)], validate=[(100000, 3)]),
    # 50-D sizes where the table's 10^4 x 50 points were over-predicted 8x and 3x (their D terms
    # rested on 3-D sizes and one 30-D size at N = 1,000)
    "glle_direct": dict(fit=[(5000, 50), (20000, 50)], validate=[]),
    "bgplvm_rbf": dict(fit=[(2000, 50), (4000, 50), (20000, 50), (50000, 50)], validate=[]),
    # MRD's sizes stopped at N = 800; the table's 10^4 point was over-predicted 2.7x
    "mrd": dict(iters=(10, 60), fit=[(2000, 30), (4000, 30)], validate=[]),
    # the sparse hGP-LVM's M grows with N (N / 10 in [64, 256]) at every earlier size, so N M^2 and
    # M^3 could not be told apart: the table's 10^4 x 50 point ran 3x its prediction. Sizes at a
    # fixed M separate them; validated at the table's point
    "hgplvm_sparse/full": dict(
        fit=[
            (5000, 3, {"n_inducing": 64}),
            (10000, 3, {"n_inducing": 64}),
            (5000, 50, {"n_inducing": 64}),
            (2000, 3, {"n_inducing": 256}),
        ],
        validate=[(10000, 50)],
    ),
    # the minibatch Bayesian hGP-LVM's fixed part (PCA start, the final q(u) and per-point passes
    # over all N rows) grows with N: sizes up to 12,000 fitted it as a constant, and the table's
    # 10^6 x 50 point ran 6x its prediction; 100 steps for the per-step difference (10 were noise)
    "hgplvm_bayesian/minibatch": dict(iters=(5, 105), fit=[(50000, 50), (100000, 50)], validate=[]),
}


#: a fifth round (``COSTS_ROUND=5``): GLLE on the 50-D roll above 10^5, where the pinned LU's fill
#: per point stops being constant (96 entries per point at 10^5, 185 at 3 x 10^5, 437 at 10^6:
#: bench/README.md, "GLLE at scale") and sizes up to 5 x 10^4 predicted the 10^6 x 50 point at half
#: its time and memory (glle_direct: 0.48 and 7.5 GB against 4.6); validated at 10^6 by the table
ROUND5 = {
    "glle_em": dict(iters=(3, 8), fit=[(100000, 50), (200000, 50), (300000, 50)], validate=[]),
    "glle_direct": dict(iters=(3, 8), fit=[(100000, 50), (200000, 50), (300000, 50)], validate=[]),
}
#: the linear kernel's terms rested on 3-D sizes up to 2,000 and one 30-D size at N = 1,000: the
#: table's 10^5 and 10^6 x 50 points ran 1.9x and 2.5x their prediction (as bgplvm_rbf's in ROUND4);
#: 50 iterations apart, since an iteration costs milliseconds below 10^5
ROUND6 = {
    "bgplvm_linear": dict(
        iters=(10, 60), fit=[(4000, 50), (20000, 50), (50000, 50), (100000, 50)], validate=[]
    ),
}


ROUNDS = {"2": ROUND2, "3": ROUND3, "4": ROUND4, "5": ROUND5, "6": ROUND6}


def _plan(entry: str) -> dict:
    """The entry's plan in the round ``COSTS_ROUND`` names (1, the default: ``PLAN``)."""
    rounds = ROUNDS.get(os.environ.get("COSTS_ROUND", "1"), {})
    return dict(PLAN[entry], **rounds.get(entry, {}))


def make_data(key: str, n: int, d: int, data: str | None = None):
    import numpy as np

    if data == "atlas":
        import xarray as xr

        Y = xr.open_zarr(os.environ["COSTS_ATLAS"], consolidated=False)["Y"].values
        if Y.shape[1] != d:
            raise ValueError(f"COSTS_ATLAS holds {Y.shape[1]}-D data, the plan asks {d}")
        rows = np.sort(np.random.default_rng(0).choice(Y.shape[0], n, replace=False))
        return np.ascontiguousarray(Y[rows], dtype=np.float64), None

    if key == "mrd":
        from lvmcore.data.synthetic import mrd_toy

        views, _ = mrd_toy(n, seed=0)
        return [np.asarray(v) for v in views], None
    from lvmcore.data.synthetic import swiss_roll

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


def one(entry: str, n: int, d: int, extra: dict) -> dict:
    """Runs in its own process: one size of one entry."""
    import numpy as np

    from lvmcore.graph import knn
    from tasks.costs import probe_seconds
    from tasks.registry import MODELS

    plan = _plan(entry)
    spec = MODELS[plan["key"]]
    given = extra
    extra, data, k = _data_keys(given)
    Y, _ = make_data(plan["key"], n, d, data)
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
    entries, raw: Path, timeout: float, only_validate: bool = False, skip_done: bool = True, only_d=None
):
    done = set()
    if skip_done and raw.exists():
        for line in raw.read_text().splitlines():
            r = json.loads(line)
            if "error" in r:  # tried again
                continue
            done.add((r["entry"], r["n"], r["d"], json.dumps(r.get("extra", {}), sort_keys=True)))
    for entry in entries:
        plan = _plan(entry)
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
            cmd = [sys.executable, __file__, "one", entry, str(n), str(d), json.dumps(extra)]
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
    from tasks.costs import point_variables
    from tasks.registry import MODELS

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
    import numpy as np
    from scipy.optimize import nnls

    from tasks.costs import evaluate_terms

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
    import inspect

    from tasks.registry import MODELS

    params = inspect.signature(MODELS[PLAN[entry]["key"]].estimator_class()).parameters
    return sum(int(params[name].default) for name in e.get("budget", []) if name in params)


def fit(raw: Path, out: Path, entries=None) -> None:
    """Fit every entry of ``PLAN`` (``entries`` None) and write ``out`` anew; or refit only the
    named ``entries`` into the existing ``out``, at its reference probe (the other entries, and
    the machine speed they are in units of, unchanged)."""
    import numpy as np

    from tasks.costs import evaluate_terms

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
            "about": "cost data per model (CPU seconds, bytes), from bench/costs.py, read by tasks/costs.py",
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


# --------------------------------------------------------------------------- the scale table
#: the table's data: bench/scale.py's roll in 50 dimensions (the sweep's throughput data; mrd: its
#: toy views), k = 10, latent_dim = 2, seed 0, GLLE with 3 generations and the scale study
TABLE_D, TABLE_GENERATIONS = 50, 3


def point(key: str, n: int) -> dict:
    """Runs in its own process: one grid point of model ``key`` on n points as the sweep fits it
    (tasks/fit.py: the model's defaults, then GLLE's generations and scale study), timed in CPU
    and wall seconds; peak memory is the process's VmHWM from just before the fit (reset through
    /proc/self/clear_refs), so it holds the process, the data and the graph, as a worker would."""
    from _mem import reset_peak, status_mb

    from lvmcore.graph import knn
    from tasks.costs import probe_seconds
    from tasks.registry import COV_SCALES, MODELS

    spec = MODELS[key]
    Y, _ = make_data(key, n, TABLE_D)
    graph = knn(Y, K)[0] if "k" in spec.dims else None
    pt = {"k": K, "latent_dim": Q, "kappa": 100.0, "seed": 0}
    est = spec.estimator_class()(**spec.constructor_args({dd: pt[dd] for dd in spec.dims}, {}))
    probe = probe_seconds()
    reset_peak()
    c0, w0 = time.process_time(), time.perf_counter()
    if graph is not None:
        est.fit(Y, graph=graph)
    else:
        est.fit(Y)
    fit_cpu, fit_wall = time.process_time() - c0, time.perf_counter() - w0
    solves = []  # the generations' eigenproblems this code actually solves (GLLE: lle.embed calls)
    if "generations" in spec.extras:
        import lvmcore.models.glle as glle_module

        embed = glle_module.embed
        glle_module.embed = lambda *a, **kw: solves.append(1) or embed(*a, **kw)
        est.sample(TABLE_GENERATIONS, random_state=0)
        if "scale_study" in spec.extras:
            for a in COV_SCALES:
                est.sample(1, random_state=0, cov_scale=a)
        glle_module.embed = embed
    out = {
        "key": key,
        "n": n,
        "d": [v.shape[1] for v in Y] if isinstance(Y, list) else [Y.shape[1]],
        "cpu_s": time.process_time() - c0,
        "wall_s": time.perf_counter() - w0,
        "fit_cpu_s": fit_cpu,
        "fit_wall_s": fit_wall,
        "peak_bytes": status_mb() * 2**20,
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
    from tasks.costs import cluster_limits, plan_costs, refusal
    from tasks.registry import MODELS

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
    from tasks.costs import load_costs, probe_seconds, speed_factor

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
                cmd = [sys.executable, __file__, "point", key, str(n)]
                t0 = time.perf_counter()
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1.5 * cap, cwd=ROOT)
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
    from tasks.costs import fmt_bytes, fmt_seconds, load_costs, speed_factor
    from tasks.registry import MODELS

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
    if argv and argv[0] == "point":
        print(json.dumps(point(argv[1], int(argv[2]))))
        return
    if argv and argv[0] == "one":
        print(json.dumps(one(argv[1], int(argv[2]), int(argv[3]), json.loads(argv[4]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["measure", "fit", "table"])
    ap.add_argument("--models", default="all", help="comma-separated cost entries (default all)")
    ap.add_argument(
        "--raw", default=None, help="default bench/costs_raw.jsonl (table: bench/costs_table.jsonl)"
    )
    ap.add_argument("--out", default=str(ROOT / "tasks" / "costs.json"))
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per size")
    ap.add_argument("--validate-only", action="store_true")
    ap.add_argument("--only-d", default="", help="comma-separated data widths: measure only sizes of these D")
    ap.add_argument("--sizes", default="10000,100000,1000000", help="table: comma-separated N")
    ap.add_argument("--cap", type=float, default=3600.0, help="table: CPU seconds a point may be predicted")
    ap.add_argument("--dry", action="store_true", help="table: record refusals and caps only")
    a = ap.parse_args(argv)
    if a.what == "table":
        from tasks.registry import MODELS

        keys = list(MODELS) if a.models == "all" else a.models.split(",")
        raw = Path(a.raw or ROOT / "bench" / "costs_table.jsonl")
        table(keys, [int(x) for x in a.sizes.split(",")], raw, a.cap, a.dry)
        return
    raw = a.raw or str(ROOT / "bench" / "costs_raw.jsonl")
    entries = list(PLAN) if a.models == "all" else a.models.split(",")
    if a.what == "measure":
        only_d = {int(x) for x in a.only_d.split(",") if x}
        measure(entries, Path(raw), a.timeout, a.validate_only, only_d=only_d)
    else:
        fit(Path(raw), Path(a.out), None if a.models == "all" else entries)


if __name__ == "__main__":
    main()
