"""LL-LVM's out-of-sample E-step (paper 000 section 4.2), gaussian likelihood: cells per CPU
second (this process's; the steadier figure on a shared machine) of ``LLLVM``'s new-point E-step
(``transform`` / ``score_samples`` / ``map_points``) after a short fit on the authors' Swiss roll.

    taskset -c 1 .venv/bin/python -m bench.lllvm.oos --n 2000 --new 20 --iters 2 [--form identity]
        [--solver dense|factorised] [--save out.npz] [--compare out.npz]

The first ``n`` rows of ``lllvm_swiss_roll(n + new)`` are fitted (``max_iter=iters``, seed 0), the
last ``new`` are mapped. ``--save`` keeps (x*, its covariance, C*, C*'s covariance); ``--compare``
prints the largest absolute difference from a saved run (e.g. of an older commit: the fit is the
same, the E-step's answer should be).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.common import pin_one_core
from lvmcore.data.synthetic import lllvm_swiss_roll
from lvmcore.models import LLLVM

KEYS = ("mean", "cov", "C", "C_cov")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--new", type=int, default=20)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--form", default="identity", choices=("identity", "ones"))
    ap.add_argument("--solver", default="dense", choices=("dense", "factorised"))
    ap.add_argument("--save")
    ap.add_argument("--compare")
    a = ap.parse_args(argv)
    pin_one_core()
    Y, _, _ = lllvm_swiss_roll(a.n + a.new, seed=0)
    m = LLLVM(solver=a.solver, n_neighbors=a.k, max_iter=a.iters, epsilon_form=a.form, random_state=0)
    t0 = time.perf_counter()
    m.fit(Y[: a.n])
    t_fit = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    _, _, *out = m._out_of_sample(Y[a.n :])
    t, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"n={a.n} new={a.new} k={a.k} form={a.form} solver={a.solver} "
        f"fit {t_fit:.1f} s ({a.iters} iterations); "
        f"E-step {t:.2f} s wall, {cpu:.2f} s CPU = {a.new / cpu:.3f} cells per CPU s"
    )
    res = dict(zip(KEYS, out))
    if a.save:
        np.savez(a.save, **res)
    if a.compare:
        ref = np.load(a.compare)
        for key in KEYS:
            d = np.max(np.abs(res[key] - ref[key]))
            print(f"  max |{key} - saved| = {d:.3e} (max |saved| {np.max(np.abs(ref[key])):.3e})")


if __name__ == "__main__":
    main()
