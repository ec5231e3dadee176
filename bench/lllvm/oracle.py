"""Oracle for LL-LVM: run the authors' EM (mijungi/lllvm, ``code/lllvm/lllvm_1ep.m``, unmodified)
under GNU Octave on data, graph and initial values generated here, and save its per-iteration bounds,
gamma and posterior means as a small test fixture.

    apt-get install -y octave                     # Debian's GNU Octave (7.3 here)
    # their code, not vendored: e.g. git --git-dir=<mirror of github:mijungi/lllvm> archive HEAD code
    .venv/bin/python -m bench.lllvm.oracle --code /tmp/lllvm_src/code \
        [--n 60] [--k 6] [--iters 15] [--out tests/fixtures/lllvm_oracle.npz]

What is passed explicitly (so nothing depends on their random draws): Y (raw; their code centres it and
divides by max|Y|, as ``LLLVM(standardize=True)`` does), the 0/1 graph G (our union kNN graph, k
excluding the point itself), dx = 2, epsilon = 1e-3, alpha0 = 1e-3 (their M-step fixes alpha at 1e-3),
gamma0, mean_c0 and cov_c0 (q(C)'s start), max_em_iter, abs_tol = -1 (run every iteration).
Their model: Sigma_y^{-1} = (eps 1 1^T + 2 gamma L) kron I, C prior (eps 1 1^T + 2 L) kron I, no beta,
i.e. ``LLLVM(epsilon_form="ones", alpha=1e-3, beta=1.0)``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile

import numpy as np
import scipy.io as sio

from lvmcore.data.synthetic import lllvm_swiss_roll
from lvmcore.graph import adjacency, knn

DRIVER = r"""
addpath(genpath('{code}/helper'));
addpath(genpath('{code}/lllvm'));
addpath(genpath('{code}/thirdparty'));
load('{inp}');
op = struct();
op.seed = 1;
op.max_em_iter = double(max_em_iter);
op.abs_tol = -1;
op.G = double(G);
op.dx = double(dx);
op.alpha0 = alpha0;
op.gamma0 = gamma0;
op.epsilon = epsilon;
op.cov_c0 = cov_c0;
op.mean_c0 = mean_c0;
[r, op2] = lllvm_1ep(Y, op);
lwbs = r.lwbs; gammas = r.gamma; alphas = r.alpha; mean_x = r.mean_x; mean_c = r.mean_c;
cov_x_diag = r.cov_x; cov_c_diag = r.cov_c;
save('-mat7-binary', '{out}', 'lwbs', 'gammas', 'alphas', 'mean_x', 'mean_c', 'cov_x_diag', 'cov_c_diag');
"""


def make_inputs(n: int, k: int, iters: int, seed: int = 0):
    Y, lat, _ = lllvm_swiss_roll(n, seed)
    idx, _ = knn(Y, k)
    G = adjacency(idx).toarray()
    rng = np.random.default_rng(seed + 1)
    dx, dy = 2, Y.shape[1]
    # q(C) start as their experiment scripts draw it: identity covariance, N(0, 1) means
    cov_c0 = np.eye(n * dx)
    mean_c0 = rng.standard_normal((dy, n * dx))
    return dict(
        Y=Y.T.copy(),  # their layout: dy x n
        G=G,
        dx=dx,
        alpha0=1e-3,
        gamma0=1.0,
        epsilon=1e-3,
        cov_c0=cov_c0,
        mean_c0=mean_c0,
        max_em_iter=iters,
    )


def run(code: str, inputs: dict, octave: str = "octave") -> dict:
    tmp = tempfile.mkdtemp(prefix="lllvm_oracle_")
    try:
        inp, out = os.path.join(tmp, "in.mat"), os.path.join(tmp, "out.mat")
        sio.savemat(inp, inputs)
        drv = os.path.join(tmp, "driver.m")
        with open(drv, "w") as f:
            f.write(DRIVER.format(code=os.path.abspath(code), inp=inp, out=out))
        subprocess.run([octave, "--no-gui", "--quiet", "--no-window-system", drv], check=True, cwd=tmp)
        res = sio.loadmat(out)
        return {key: np.asarray(res[key], dtype=np.float64) for key in res if not key.startswith("__")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", required=True, help="the 'code' folder of a checkout of mijungi/lllvm")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--out", default="tests/fixtures/lllvm_oracle.npz")
    args = ap.parse_args(argv)
    if shutil.which("octave") is None:
        raise SystemExit("GNU Octave is not installed: apt-get install -y octave")
    if not os.path.isfile(os.path.join(args.code, "lllvm", "lllvm_1ep.m")):
        raise SystemExit(f"{args.code} has no lllvm/lllvm_1ep.m: pass the 'code' folder of mijungi/lllvm")
    inputs = make_inputs(args.n, args.k, args.iters)
    res = run(args.code, inputs)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    np.savez_compressed(
        args.out,
        **{"in_" + key: np.asarray(v, dtype=np.float64) for key, v in inputs.items()},
        **{"out_" + key: v for key, v in res.items()},
    )
    print(
        f"saved {args.out}: bounds {np.ravel(res['lwbs'])[[0, -1]]}, gamma {np.ravel(res['gammas'])[-1]:.6g}"
    )


if __name__ == "__main__":
    main()
