"""Interleaved A/B of two checkouts of lvmcore: the GP-LVM engine's hot paths, timed in fresh
processes pinned to one core, alternating A and B every round, medians reported.

    git worktree add /tmp/base <commit>        # the "before" checkout (same .venv)
    python -m bench.gplvm.engine_ab --a /tmp/base --b . [--rounds 5] [--what bound hgplvm]

Measured per round and side (one process each, so each side compiles its own code):

* ``bound``: the Bayesian GP-LVM bound + gradient (RBF-ARD, one chunk, ``RowChunks``) at (N, M, Q, D)
  = (1000, 50, 5, 20), (5000, 50, 5, 20), (20000, 50, 10, 50): the best of 5 calls after a
  warm-up call (the same problem as ``bench/gplvm/psi.py``).
* ``hgplvm``: one fit per hGP-LVM variant on the depth-5 binary tree (620 points), seed 0, a fixed
  300 iterations (tol = 0, so both sides run the same steps): after a first fit of 100 iterations
  that compiles, the wall time of a 300-iteration fit and the milliseconds per iteration from fits
  of 100 and 300 iterations, (t300 - t100) / 200 (set-up cancels).

Prints, per item, the median over rounds of A and B and B / A (< 1: B is faster). The machine is
shared: read the ratio, not the absolute times."""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import common

SIZES = ((1000, 50, 5, 20), (5000, 50, 5, 20), (20000, 50, 10, 50))
VARIANTS = ("point", "sparse", "bayesian")


def one_bound(repeats=5):
    from bench.gplvm.psi import ours_runner, problem

    out = {}
    for N, M, Q, D in SIZES:
        f = ours_runner(*problem(N, M, Q, D))
        f()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        out[f"bound {N},{M},{Q},{D} ms"] = 1e3 * min(ts)
    return out


def one_hgplvm(iters=(100, 300)):
    from lvmcore.data.synthetic import binary_tree
    from lvmcore.models.hgplvm import BayesianHyperboloidGPLVM, HyperboloidGPLVM

    Y, *_ = binary_tree(5, seed=0)
    out = {}
    for variant in VARIANTS:
        t = {}
        lo, hi = iters
        for it in (lo, lo, hi):  # the first fit compiles (and is overwritten): the other two reuse it
            kw = dict(n_components=2, max_iter=it, tol=0, random_state=0)
            if variant == "bayesian":  # the Bayesian model's one entry, its full-batch fit (both checkouts)
                m = BayesianHyperboloidGPLVM(training="full", **kw)
            else:
                m = HyperboloidGPLVM(variant=variant, **kw)
            t0 = time.perf_counter()
            m.fit(Y)
            t[it] = time.perf_counter() - t0
        out[f"hgplvm {variant} fit {hi} it s"] = t[hi]
        out[f"hgplvm {variant} ms/it"] = 1e3 * (t[hi] - t[lo]) / (hi - lo)
    return out


def child(what, iters):
    from bench.common import pin_one_core

    pin_one_core()
    import lvmcore

    res = {"lvmcore": str(Path(lvmcore.__file__).parent.parent)}
    if "bound" in what:
        res.update(one_bound())
    if "hgplvm" in what:
        res.update(one_hgplvm(iters))
    print("RESULT " + json.dumps(res), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", default="/tmp/base")
    ap.add_argument("--b", default=".")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--what", nargs="+", default=["bound", "hgplvm"])
    ap.add_argument("--iters", type=int, nargs=2, default=[100, 300], help="the two hGP-LVM fits' budgets")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        child(a.what, a.iters)
        return
    sides = {"A": str(Path(a.a).resolve()), "B": str(Path(a.b).resolve())}
    got = {"A": [], "B": []}
    for r in range(a.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            # lvmcore from the side's checkout, the bench package from this one; -P: neither the
            # working directory nor the script's folder goes before PYTHONPATH on sys.path
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([sides[name], str(common.ROOT)]))
            args = ("--child", "--what", *a.what, "--iters", *map(str, a.iters))
            cmd = common.module_command(__spec__.name, *args)
            p = subprocess.run(
                [cmd[0], "-P", *cmd[1:]], env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                sys.exit(f"side {name} failed:\n{p.stderr[-3000:]}")
            res = json.loads(line[-1][7:])
            assert res.pop("lvmcore") == sides[name], "the child imported the other checkout"
            got[name].append(res)
            print(f"round {r} {name}: " + " ".join(f"{k}={v:.4g}" for k, v in res.items()), flush=True)
    print(f"\nmedians over {a.rounds} rounds; A = {sides['A']}, B = {sides['B']}")
    print(f"{'item':34s} {'A':>10s} {'B':>10s} {'B/A':>6s}")
    for k in got["A"][0]:
        ma = float(np.median([g[k] for g in got["A"]]))
        mb = float(np.median([g[k] for g in got["B"]]))
        print(f"{k:34s} {ma:10.4g} {mb:10.4g} {mb / ma:6.3f}")


if __name__ == "__main__":
    main()
