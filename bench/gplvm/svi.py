"""Minibatch (stochastic variational) Bayesian GP-LVM against the full-batch collapsed fit, in
the same run (issue 23: at n = 10^5 the minibatch bound per point within 1% of the collapsed one
at convergence, in less wall time, memory not growing with n beyond q(X)).

Data: the 3-D swiss roll (``lvmcore.data.synthetic.swiss_roll``, seed 0), Q = 2, M = 30. Each fit
runs in its own process (its own peak RSS, ``ru_maxrss``) and reports wall time, n_iter_ and
elbo_ / n:

* anchor: ``BayesianGPLVM`` (collapsed bound, L-BFGS over all points, its defaults: 100 + 500
  iterations, tol 1e-9);
* svi: ``StochasticBayesianGPLVM`` (batches of ``--batch`` points, ``--epochs`` epochs), whose
  elbo_ is the exact full bound at its final state (q(u) at its optimum for the exact statistics:
  equal to the collapsed bound there) and elbo_uncollapsed_ the full bound with q(u) as trained;
* the SVI fit again at n / 10 and the same settings, for the growth of its peak RSS with n.

    python -m bench.gplvm.svi [--n 100000] [--batch 1000] [--epochs 100] [--dim 3] [--only svi]
                        [--opt NAME=VALUE ...] [--anchor-opt NAME=VALUE ...]

``--dim D`` > 3: the D-dimensional roll of ``tasks.costs.calibrate.make_data`` (the cost table's
data) instead.
``--opt`` / ``--anchor-opt``: constructor options of the SVI fits / the anchor (e.g.
``--opt local_learning_rate=0.1``, ``--anchor-opt max_iter=5000``; VALUE read as JSON). Each fit
reports its CPU seconds (``cpu_s``, the process's own: the machine is shared) and ``elbo_per_value``
(elbo_ / (N D)); each SVI fit also ``gain_per_value_last10`` (the mean rise of its epoch estimate
per epoch and data value over its last 10 epochs: what a per-value ``tol`` would be compared
with), ``converged`` and ``trace_per_value`` (the epoch estimates per data value).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from bench.common import ROOT, module_command


def _one(kind, n, batch, epochs, dim=3, opts="{}"):
    import numpy as np

    from lvmcore.models import BayesianGPLVM, StochasticBayesianGPLVM
    from tasks.costs.calibrate import make_data

    Y, _ = make_data("bgplvm_svi", n, dim)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    opts = json.loads(opts)
    t, c = time.perf_counter(), time.process_time()
    if kind == "anchor":
        m = BayesianGPLVM(**{"n_components": 2, "n_inducing": 30, "random_state": 0, **opts}).fit(Y)
        extra = {}
    else:
        args = {"n_components": 2, "n_inducing": 30, "batch_size": batch, "max_iter": epochs}
        args["random_state"] = 0
        m = StochasticBayesianGPLVM(**{**args, **opts}).fit(Y)
        est = np.asarray(m.elbo_trace_[:-1])  # the epoch estimates (the last entry is elbo_)
        extra = {
            "elbo_uncollapsed_per_point": m.elbo_uncollapsed_ / n,
            "gain_per_value_last10": float(np.mean(np.diff(est[-11:])) / Y.size),
            "converged": bool(m.converged_),
            "trace_per_value": (est / Y.size).round(5).tolist(),
        }
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    extra = {"opts": opts, "cpu_s": cpu, "elbo_per_value": m.elbo_ / Y.size, **extra}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({
        "kind": kind, "n": n, "wall_s": wall, "n_iter": int(m.n_iter_), "elbo_per_point": m.elbo_ / n,
        "peak_rss_mb": rss / 1024, "rss_before_fit_mb": rss0 / 1024,
        "noise_var": float(np.asarray(m.noise_variance_)[0]), "ard": np.asarray(m.ard_weights_).tolist(),
        **extra,
    }), flush=True)


def _options(pairs):
    """{name: value} of NAME=VALUE pairs, VALUE read as JSON where it parses, else a string."""
    opts = {}
    for o in pairs:
        k, v = o.split("=", 1)
        try:
            opts[k] = json.loads(v)
        except json.JSONDecodeError:
            opts[k] = v
    return opts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--dim", type=int, default=3)
    ap.add_argument("--only", choices=["anchor", "svi", "svi_small"], default=None)
    ap.add_argument("--opt", action="append", default=[], metavar="NAME=VALUE",
                    help="a constructor option of the fit (repeatable; VALUE read as JSON, else a string)")
    ap.add_argument("--anchor-opt", action="append", default=[], metavar="NAME=VALUE",
                    help="a constructor option of the anchor (as --opt)")
    a = ap.parse_args()
    opts, anchor_opts = _options(a.opt), _options(a.anchor_opt)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    res = {}
    runs = [("svi", a.n), ("svi_small", a.n // 10), ("anchor", a.n)]
    for name, n in runs:
        if a.only and name != a.only:
            continue
        kind = "anchor" if name == "anchor" else "svi"
        print("load", open("/proc/loadavg").read().strip(), flush=True)
        r = subprocess.run(
            module_command(__spec__.name, "_one", kind, str(n), str(a.batch), str(a.epochs), str(a.dim),
                           json.dumps(opts if kind == "svi" else anchor_opts)),
            capture_output=True, text=True, env=env, cwd=ROOT,
        )
        if r.returncode != 0:
            print(name, "failed:", r.stderr[-2000:], flush=True)
            continue
        res[name] = json.loads(r.stdout.strip().splitlines()[-1])
        print(name, json.dumps(res[name]), flush=True)
    print("load", open("/proc/loadavg").read().strip(), flush=True)
    if "svi" in res and "anchor" in res:
        s, c = res["svi"], res["anchor"]
        gap = (c["elbo_per_point"] - s["elbo_per_point"]) / abs(c["elbo_per_point"])
        print(f"bound per point: svi {s['elbo_per_point']:.4f} anchor {c['elbo_per_point']:.4f} "
              f"(svi below anchor by {100 * gap:.2f}% of |anchor|); wall: svi {s['wall_s']:.0f} s, "
              f"anchor {c['wall_s']:.0f} s, ratio anchor / svi {c['wall_s'] / s['wall_s']:.2f}")
    if "svi" in res and "svi_small" in res:
        s, t = res["svi"], res["svi_small"]
        print(f"svi peak RSS: n={t['n']} {t['peak_rss_mb']:.0f} MB, n={s['n']} {s['peak_rss_mb']:.0f} MB; "
              f"q(X) + Adam moments + centred data at n={s['n']}: "
              f"{s['n'] * (6 * 2 + 3) * 8 / 2**20:.0f} MB")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_one":
        _one(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
    else:
        main()
