"""LL-LVM benchmarks and studies of the default model (the paper's normalised likelihood).

    .venv/bin/python -m bench.lllvm.fit [--sizes 500 ...] [--iters 3]
    .venv/bin/python -m bench.lllvm.fit --study roll     # k choice on the authors' roll (n=400, k=5..12)
    .venv/bin/python -m bench.lllvm.fit --study short    # short-circuit protocol (paper 003 fig. 4)
    .venv/bin/python -m bench.lllvm.fit --study digits   # 5-fold 1-NN error, digits 0-4, 60 / 120 per class
Spearman|Spearman| with t (best direction)
    .venv/bin/python -m bench.lllvm.fit --study approx   # dense vs factorised at n = 400, 1000, 2000
    (studies take --seeds N, --iters N, --alpha A|learned, --beta B|learned, --likelihood, --solver S)

Timing: each size runs in its own process (``--one``) so the peak resident memory (ru_maxrss) is that
size's; seconds per EM iteration are the mean after the first iteration, wall and CPU (this
process's CPU time: on a machine shared with other jobs the CPU time is the steadier of the two).
``solver="auto"`` runs the default model on the exact dense solver up to ``GAUSSIAN_DENSE_MAX_N``
and on the factorised solver above (``--solvers auto dense factorised`` times the others too). The
anchor, measured in the same process, is scipy's SuperLU factorisation of eps I + 2 L on the same
graph. Timings on a shared machine are noisy: read ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

from bench.common import ROOT, module_command
from lvmcore.data.synthetic import lllvm_swiss_roll
from lvmcore.graph import adjacency, knn
from lvmcore.models import LLLVM


def _opt(v):
    return None if v in (None, "learned") else float(v)


def best_direction_spearman(Z, t, n_dir: int = 720) -> float:
    """max over 720 directions u of |Spearman(Z u, t)| (a 1-D projection that orders the roll)."""
    from scipy.stats import spearmanr

    th = np.arange(n_dir) * np.pi / n_dir
    return max(abs(spearmanr(Z @ np.array([np.cos(a), np.sin(a)]), t)[0]) for a in th)


def _anchor_seconds(W, reps: int = 3) -> float:
    """The anchor: scipy's SuperLU factorisation of eps I + 2 L on the same graph (median of reps)."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    deg = np.asarray(W.sum(axis=1)).ravel()
    A = sp.csc_matrix(1e-3 * sp.identity(W.shape[0]) + 2.0 * (sp.diags(deg) - W))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        splu(A, permc_spec="MMD_AT_PLUS_A")
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def one_size(n, k, iters, likelihood, solver, anchor=True):
    """Fit ``iters`` iterations at size n (``solver="auto"``: the estimator's choice); returns the
    seconds per iteration after the first, the whole fit's seconds, peak RSS and the anchor."""
    Y, _, _ = lllvm_swiss_roll(n, 0)
    idx, _ = knn(Y, k)
    stamps, cpu = [], []
    from lvmcore.models.lllvm import lllvm_fit

    if solver == "auto":
        solver = LLLVM(likelihood=likelihood)._resolve_solver(n)
    Ys = (Y - Y.mean(0)) / np.abs(Y - Y.mean(0)).max()
    W = adjacency(idx)
    anchor = _anchor_seconds(W) if anchor else float("nan")
    t0 = time.perf_counter()
    kw = dict(solver=solver, max_iter=max(iters, 2), random_state=0, likelihood=likelihood)
    if likelihood == "gaussian":
        kw.update(learn_alpha=False, learn_beta=False)

    def progress(it, qx, qc, th, F):
        stamps.append(time.perf_counter())
        cpu.append(time.process_time())
        print(
            f"  n = {n}, iteration {it}: {stamps[-1] - t0:.1f} s, bound {F:.2f}", file=sys.stderr, flush=True
        )

    *_, trace = lllvm_fit(Ys, W, callback=progress, **kw)
    total = time.perf_counter() - t0
    per = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    per_cpu = (cpu[-1] - cpu[0]) / (len(cpu) - 1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # MiB
    return {
        "n": n,
        "solver": solver,
        "s_per_it": per,
        "cpu_s_per_it": per_cpu,
        "total_s": total,
        "peak_mib": rss,
        "anchor_s": anchor,
        "bound": float(trace[-1]),
    }


def timing(sizes, k, iters, solvers=("auto",), anchor=True):
    print(
        f"LL-LVM EM (default model) on the authors' roll, Q = 2, k = {k}, {iters} iterations per fit, "
        "one process per fit; anchor: SuperLU factorisation of eps I + 2 L (same graph, same process)"
    )
    print(
        f"{'n':>7} {'solver':>11} {'s/it':>9} {'CPU s/it':>9} {'fit s':>8} {'peak MiB':>9} {'anchor s':>9} "
        f"{'s/it / anchor':>14} {'bound':>12}"
    )
    for n in sizes:
        for solver in solvers:
            cmd = module_command(__spec__.name, "--one", str(n), str(k), str(iters), "gaussian", solver)
            cmd.append("anchor" if anchor else "no-anchor")
            out = subprocess.run(
                cmd, stdout=subprocess.PIPE, text=True, check=True, cwd=ROOT
            ).stdout  # progress: stderr
            r = json.loads(out.strip().splitlines()[-1])
            name = r["solver"] + (" (auto)" if solver == "auto" else "")
            print(
                f"{n:>7} {name:>11} {r['s_per_it']:>9.3f} {r['cpu_s_per_it']:>9.3f} {r['total_s']:>8.1f} "
                f"{r['peak_mib']:>9.0f} "
                f"{r['anchor_s']:>9.4f} {r['s_per_it'] / r['anchor_s']:>14.0f} {r['bound']:>12.2f}",
                flush=True,
            )


def _fit(Y, graph, k, seed, iters, **kw):
    return LLLVM(n_neighbors=k, max_iter=iters, tol=0, random_state=seed, **kw).fit(Y, graph)


def study_roll(seeds=3, ks=range(5, 13), iters=30, **kw):
    """Mean (sd) final bound over seeds per k on the authors' roll, n = 400 (paper 003)."""
    Y, _, _ = lllvm_swiss_roll(400, 0)
    print(
        f"k choice, authors' roll n = 400, {iters} iterations, seeds 0..{seeds - 1}, {kw} "
        "(k excludes the point)"
    )
    out = {}
    for k in ks:
        idx, _ = knn(Y, k)
        fits = [_fit(Y, idx, k, s, iters, **kw) for s in range(seeds)]
        b = [f.elbo_ for f in fits]
        out[k] = (float(np.mean(b)), float(np.std(b)))
        print(
            f"k = {k:>2}: mean bound {out[k][0]:10.2f}  sd {out[k][1]:7.2f}  alpha {fits[0].alpha_:.3g} "
            f"beta {fits[0].beta_:.3g}",
            flush=True,
        )
    best = max(out, key=lambda kk: out[kk][0])
    print(f"peak at k = {best} ({'inside' if min(out) < best < max(out) else 'AT AN END of'} the range)")
    return out


def study_short(seeds=3, iters=50, k=9, **kw):
    """Short-circuit protocol: roll n = 400, our k (default 9), one wrong edge (24, -26 of argsort t)."""
    Y, lat, _ = lllvm_swiss_roll(400, 0)
    order = np.argsort(lat[:, 0])
    a, b = order[24], order[-26]
    idx, _ = knn(Y, k)
    W = adjacency(idx)
    Ws = W.tolil()
    Ws[a, b] = Ws[b, a] = 1.0
    for s in range(seeds):
        g = _fit(Y, W, k, s, iters, **kw)
        w = _fit(Y, Ws.tocsr(), k, s, iters, **kw)
        sp_g = best_direction_spearman(g.embedding_, lat[:, 0])
        print(
            f"k = {k}, seed {s}, {kw}: bound {g.elbo_:.2f} without, {w.elbo_:.2f} with the wrong edge "
            f"(difference {w.elbo_ - g.elbo_:+.2f}); unrolling |Spearman| {sp_g:.3f}",
            flush=True,
        )


def study_digits(iters=30, seeds=1, **kw):
    """5-fold 1-NN error of the 2-D embedding, digits 0-4 with 60 and 120 per class, k = 8, 12."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.neighbors import KNeighborsClassifier

    X, y = load_digits(return_X_y=True)
    for per in (60, 120):
        rng = np.random.default_rng(0)
        sel = np.concatenate([rng.choice(np.flatnonzero(y == c), per, replace=False) for c in range(5)])
        Y, lab = X[sel].astype(np.float64), y[sel]
        cv = StratifiedKFold(5, shuffle=True, random_state=0)
        for k in (8, 12):
            for s in range(seeds):
                t0 = time.perf_counter()
                m = _fit(Y, None, k, s, iters, **kw)
                err = 1.0 - float(np.mean(cross_val_score(KNeighborsClassifier(1), m.embedding_, lab, cv=cv)))
                print(
                    f"digits 0-4, {per} per class, k = {k}, seed {s}: 1-NN error {err:.3f}, "
                    f"bound {m.elbo_:.1f} "
                    f"({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )


def study_unroll(iters=30, **kw):
    """The main job's LL-LVM panel: scikit-learn roll, n = 400, seed 0, k = 8 and 12, its graph."""
    from lvmcore.data.synthetic import swiss_roll

    Y, lat = swiss_roll(400, 0)
    idx, _ = knn(Y, 12)
    for k in (8, 12):
        m = _fit(Y, idx[:, :k], k, 0, iters, **kw)
        print(
            f"main-job roll, k = {k}: best-direction |Spearman| with t "
            f"{best_direction_spearman(m.embedding_, lat[:, 0]):.3f}"
            f", bound {m.elbo_:.1f}",
            flush=True,
        )


def study_approx(sizes=(400, 1000, 2000), k=9, iters=30, seed=0, **kw):
    """The factorised solver's approximation cost: the same fit (authors' roll n, our k, ``iters``
    iterations, seed, default settings) with solver='dense' and solver='factorised'; bound gap per
    point, Procrustes disparity of the embeddings (scipy: both standardised, optimal rotation,
    scaling and reflection; 0 = identical, 1 = unrelated), unrolling of each, time of each."""
    from scipy.spatial import procrustes

    print(f"dense vs factorised, authors' roll, our k = {k}, {iters} iterations, seed {seed}, {kw}")
    for n in sizes:
        Y, lat, _ = lllvm_swiss_roll(n, 0)
        idx, _ = knn(Y, k)
        fits, secs = {}, {}
        for solver in ("dense", "factorised"):
            t0 = time.perf_counter()
            fits[solver] = _fit(Y, idx, k, seed, iters, solver=solver, **kw)
            secs[solver] = time.perf_counter() - t0
        d, f = fits["dense"], fits["factorised"]
        _, _, disp = procrustes(d.embedding_, f.embedding_)
        print(
            f"n = {n:>5}: bound dense {d.elbo_:.2f}, factorised {f.elbo_:.2f}, gap per point "
            f"{(d.elbo_ - f.elbo_) / n:.4f}; gamma {d.gamma_:.3f} / {f.gamma_:.3f}; Procrustes disparity "
            f"{disp:.4f}; unrolling |Spearman| {best_direction_spearman(d.embedding_, lat[:, 0]):.3f} / "
            f"{best_direction_spearman(f.embedding_, lat[:, 0]):.3f}; fit s {secs['dense']:.0f} / "
            f"{secs['factorised']:.0f}",
            flush=True,
        )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--one":
        n, k, iters, lik, solver = argv[1:6]
        anchor = len(argv) < 7 or argv[6] == "anchor"
        print(json.dumps(one_size(int(n), int(k), int(iters), lik, solver, anchor)))
        return None
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000, 4000, 8000, 16000])
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument(
        "--solvers", nargs="+", default=["auto"], help="timing: solvers per size (auto, dense, factorised)"
    )
    ap.add_argument(
        "--k", type=int, default=None, help="timing: k (default 10); --study short: our k (default 9)"
    )
    ap.add_argument(
        "--no-anchor", action="store_true", help="timing: skip the SuperLU anchor (minutes at N = 10^5)"
    )
    ap.add_argument("--study", choices=["roll", "short", "digits", "unroll", "approx"], default=None)
    ap.add_argument("--solver", default=None, help="studies: the estimator's solver (default 'auto')")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--likelihood", default="gaussian")
    ap.add_argument("--alpha", default=None, help="fixed alpha, or 'learned' (default: the estimator's)")
    ap.add_argument("--beta", default=None, help="fixed beta, or 'learned' (default: the estimator's)")
    args = ap.parse_args(argv)
    if args.study is None:
        return timing(args.sizes, args.k or 10, args.iters or 3, tuple(args.solvers), not args.no_anchor)
    kw = {"likelihood": args.likelihood}
    if args.solver is not None:
        kw["solver"] = args.solver
    for name in ("alpha", "beta"):
        v = getattr(args, name)
        if v is not None:
            kw[name] = _opt(v)
    if args.likelihood == "quadratic":
        kw.setdefault("solver", "auto")
    extra = {}
    if args.seeds:
        extra["seeds"] = args.seeds
    if args.iters:
        extra["iters"] = args.iters
    if args.k and args.study == "short":
        extra["k"] = args.k
    fn = {
        "roll": study_roll,
        "short": study_short,
        "digits": study_digits,
        "unroll": study_unroll,
        "approx": study_approx,
    }[args.study]
    if fn in (study_unroll, study_approx):
        extra.pop("seeds", None)
    if fn is study_approx:
        if args.k:
            extra["k"] = args.k
        if args.sizes != ap.get_default("sizes"):
            extra["sizes"] = tuple(args.sizes)
    return fn(**extra, **kw)


if __name__ == "__main__":
    main()
