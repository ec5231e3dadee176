"""GLLE at scale: the covariance-scale study and the embedding eigensolver.

1. Covariance scale (paper 001 section VI-C) on the four manifolds, 5,000 points, k = 10. For each
   dataset, variant and a in (0.01, 0.1, 1, 5, 10): mean / min |Spearman| of the best embedding
   coordinate (any direction: ``lvmcore.metrics.unfolding``) with the manifold parameter over 5
   generations, and the mean Procrustes disparity of the generations to the LLE embedding.

       python -m bench.glle.scale

2. Eigensolver of the embedding (``lvmcore.lle.embed``, Q = 2) on a 3-D swiss roll, k = 10, at
   each n given: the LLE weights W are built once and saved; each solver then runs in a fresh
   process (its own peak RSS, an address-space cap so that a solver that does not fit fails
   instead of swapping, and a time cap) and reports wall time (and its ordering part), the ratio
   to the anchor (the exact kNN query of the same data, timed in the same run), the peak RSS above
   the process's RSS after loading W, the eigenvalues ||A v_j||^2 (A = I - W, unit v_j),
   max_j ||A^T A v_j - lambda_j v_j||, the largest principal angle of its subspace to arpack's
   (where it finishes) and to pinned_lu_alt's (an independent factorisation) and the unfolding score
   (``lvmcore.metrics.unfolding``) of the vectors against the roll's parameter on a seeded
   subsample of ``UNFOLD_POINTS``.

       python -m bench.glle.scale eigen 10000 100000 1000000 [solver ...]

3. The sweep's fit, ``GLLE(method="em", n_neighbors=10, n_components=2, random_state=0)``, on a
   3-D swiss roll of each n given, with the exact kNN graph by cKDTree passed in (the anchor):
   total wall split into per-point statistics, EM, the METIS ordering and each eigensolve (the LLE
   embedding and the generation kept as ``embedding_``), peak RSS of the process, and the
   unfolding score of both embeddings. ``--chunks C`` runs the per-point work in chunks of C
   points over a 2-worker ``distributed.LocalCluster``.

       python -m bench.glle.scale fit 1000000 [--chunks 250000] [--data roll50] [--sweep] [--graph-dir D]
           [--k K]

   ``--data roll50``: bench/sweep/scale.py's 50-D roll (pynndescent graph, cached in D); ``--data
   atlas:DIR/data.zarr``: n cells of an ingested atlas's 50-D PCA (``bench/data/atlas.py``); ``--sweep``:
   then the sweep's generations (3 + one per covariance scale), with the peak RSS per phase.

4. The pinned LU's size (``fill``): stored entries per point, CPU time and off-diagonal pivots of
   the factor for the LLE weights and for a generation's draw at a = 10, with static and with
   threshold pivoting, on roll3 and roll50 at each n.

       python -m bench.glle.scale fill 10000 30000 100000 300000 [roll3|roll50] [--graph-dir D]
"""

import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
from scipy.spatial import procrustes

from bench.common import ROOT, local_client, module_command, observe_calls
from lvmcore.data import synthetic as S
from lvmcore.metrics import unfolding
from lvmcore.models.glle import GLLE

SCALES = (0.01, 0.1, 1, 5, 10)


def main():
    print("dataset method " + " ".join(f"a={a:<5g}" for a in SCALES))
    for name in ("s_curve", "swiss_roll", "swiss_hole", "severed_bowl"):
        Y, lat = getattr(S, name)(5000, seed=0)
        for method in ("em", "direct"):
            m = GLLE(n_components=2, n_neighbors=10, method=method, random_state=0).fit(Y)
            cells = []
            for a in SCALES:
                G = m.sample(5, random_state=1, cov_scale=a)
                r = [unfolding(g, lat[:, 0]) for g in G]
                d = [procrustes(m.lle_embedding_, g)[2] for g in G]
                cells.append(f"{np.mean(r):.3f}/{np.min(r):.3f}/{np.mean(d):.3f}")
            print(name, method, " ".join(cells), flush=True)


# --------------------------------------------------------------------------- eigensolver
#: solvers compared: "arpack" is the solver ``lvmcore.lle.embed`` used before session 3 (eigsh of
#: M with sigma = 0: shift-invert Lanczos, SuperLU factorising M with its default COLAMD ordering);
#: "pinned_lu" is ``embed``'s sparse solver now (ordering + Lanczos on M^+ through the pinned LU
#: of I - W); "pinned_lu_alt" is the same with the pin moved to the largest entry of the left null
#: vector and another start vector: an independent factorisation, the reference where arpack
#: does not fit
SOLVERS = ("arpack", "pinned_lu", "pinned_lu_alt")
#: the unfolding score is taken on this many seeded random points
UNFOLD_POINTS = 20000
#: address-space cap and time cap of each solver's process
CAP_GB = 6
CAP_S = 600


def _solve(path, solver, out):
    import scipy.sparse as sp
    from scipy.sparse.linalg import eigsh

    from lvmcore import lle

    resource.setrlimit(resource.RLIMIT_AS, (CAP_GB << 30, CAP_GB << 30))
    d = np.load(path)
    W = sp.csr_matrix((d["data"], d["indices"], d["indptr"]), shape=tuple(d["shape"]))
    n = W.shape[0]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    t_order = 0.0
    if solver == "arpack":
        M = lle.embedding_matrix(W)
        v0 = np.random.default_rng(0).uniform(-1.0, 1.0, n)
        vals, vecs = eigsh(M, 3, sigma=0.0, tol=1e-6, maxiter=1000, v0=v0)
        o = np.argsort(vals)
        vals, vecs = vals[o][1:], vecs[:, o][:, 1:]
        del M
    else:
        alt = solver == "pinned_lu_alt"
        order = lle.fill_reducing_order(W)
        t_order = time.perf_counter() - t
        vals, vecs = lle._pinned_lu(W, 2, order, 1 if alt else 0, pin_ratio=2.0 if alt else lle.PIN_MIN_RATIO)
    wall = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    vecs = vecs / np.linalg.norm(vecs, axis=0)
    A = sp.identity(n, format="csr") - W
    lam = np.sum((A @ vecs) ** 2, axis=0)  # Rayleigh quotients through A (M's rounding avoided)
    res = np.linalg.norm(A.T @ (A @ vecs) - vecs * lam, axis=0)
    np.save(out, vecs)
    print(
        json.dumps(
            {
                "wall_s": wall,
                "order_s": t_order,
                "rss_mb": (rss - rss0) / 1024,
                "rss0_mb": rss0 / 1024,
                "vals": lam.tolist(),
                "residual": float(res.max()),
            }
        )
    )


def eigen(ns, solvers=SOLVERS):
    """Each solver in its own capped process on the same saved W; the anchor is the exact kNN
    query (cKDTree) of the same data, timed in this process."""
    from scipy.linalg import subspace_angles
    from scipy.spatial import cKDTree
    from sklearn.datasets import make_swiss_roll

    from lvmcore.lle import barycenter_weights, weight_matrix

    tmp = tempfile.mkdtemp(prefix="glle_eigen_")
    print(
        "n solver wall_s (ordering_s) wall/anchor peak_rss_above_W_MB (RSS after loading W, MB) "
        "residual angle_to_arpack angle_to_pinned_lu_alt unfolding eigenvalues",
        flush=True,
    )
    for n in ns:
        Y, t = make_swiss_roll(n, random_state=0)
        t0 = time.perf_counter()
        idx = cKDTree(Y).query(Y, k=11)[1][:, 1:]
        anchor = time.perf_counter() - t0
        print(n, f"anchor: cKDTree build + 11-NN query {anchor:.2f} s", flush=True)
        W = weight_matrix(barycenter_weights(Y, idx), idx)
        path = os.path.join(tmp, f"W{n}.npz")
        np.savez(path, data=W.data, indices=W.indices, indptr=W.indptr, shape=W.shape)
        del W, Y, idx
        rows = {}
        sub = np.random.default_rng(0).choice(n, min(n, UNFOLD_POINTS), replace=False)
        for solver in solvers:
            out = os.path.join(tmp, f"v{n}_{solver}.npy")
            try:
                r = subprocess.run(
                    module_command(__spec__.name, "_solve", path, solver, out),
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    timeout=CAP_S,
                )
            except subprocess.TimeoutExpired:
                print(n, solver, f"> {CAP_S} s (stopped)", flush=True)
                continue
            if r.returncode != 0:
                err = (r.stderr.strip().splitlines() or ["?"])[-1]
                print(n, solver, f"failed (rc {r.returncode}): {err[:120]}", flush=True)
                continue
            rows[solver] = (json.loads(r.stdout.strip().splitlines()[-1]), np.load(out))
        refs = [rows[r][1] if r in rows else None for r in ("arpack", "pinned_lu_alt")]
        for solver, (d, V) in rows.items():
            ang = " ".join(f"{np.max(subspace_angles(R, V)):.2e}" if R is not None else "-" for R in refs)
            unf = unfolding(V[sub], t[sub])
            print(
                n,
                solver,
                f"{d['wall_s']:.2f} ({d['order_s']:.2f}) {d['wall_s'] / anchor:.2f} "
                f"{d['rss_mb']:.0f} ({d['rss0_mb']:.0f}) {d['residual']:.2e} {ang} {unf:.4f}",
                " ".join(f"{v:.6e}" for v in d["vals"]),
                flush=True,
            )


def roll(kind: str, n: int):
    """(Y, t) of the bench's data: ``atlas:PATH``, n cells drawn (seeded, without replacement) from
    the 50-D PCA of an ingested atlas store (``bench/data/atlas.py``'s data.zarr; t the cells' order in
    the store, no manifold parameter), or ``bench/sweep/scale.py``'s data: ``roll3`` the 3-D swiss roll,
    ``roll50`` the same roll through a fixed random orthonormal 3 -> 50 map plus N(0, 0.05^2) noise
    per dimension (the same generator and seeds as ``bench/sweep/scale.py make_data``, so the same array)."""
    from lvmcore.data.synthetic import swiss_roll

    if kind.startswith("atlas:"):
        import xarray as xr

        Y = xr.open_zarr(kind.split(":", 1)[1], consolidated=False)["Y"].values
        rows = np.arange(Y.shape[0])
        if n < Y.shape[0]:
            rows = np.sort(np.random.default_rng(0).choice(Y.shape[0], n, replace=False))
        return np.ascontiguousarray(Y[rows], dtype=np.float64), rows.astype(np.float64)
    Y3, t = swiss_roll(n, 0)
    if kind == "roll3":
        return Y3, t[:, 0]
    if kind != "roll50":
        raise ValueError(f"--data must be roll3 or roll50, got {kind!r}")
    rng = np.random.default_rng(50)
    Q, _ = np.linalg.qr(rng.standard_normal((50, 3)))
    Y = np.empty((n, 50))
    for a in range(0, n, 65536):
        b = min(a + 65536, n)
        Y[a:b] = Y3[a:b] @ Q.T + 0.05 * rng.standard_normal((b - a, 50))
    return Y, t[:, 0]


def neighbours(kind: str, Y, graph_dir: str | None, k: int = 10):
    """The sweep's graph: the exact kNN by cKDTree for roll3, pynndescent (``lvmcore.graph.knn``
    method "approx", what the sweep's "auto" picks at 10^6 x 50) for roll50, ``knn``'s "auto" for
    an atlas; with ``graph_dir`` the roll50 graph is cached there as idx_roll50_<n>.npy. Returns
    (idx, seconds)."""
    from scipy.spatial import cKDTree

    from lvmcore.graph import knn

    n = Y.shape[0]
    if kind.startswith("atlas:"):
        t0 = time.perf_counter()
        return knn(Y, k)[0], time.perf_counter() - t0
    name = f"idx_{kind}_{n}_k{k}.npy" if k != 10 else f"idx_{kind}_{n}.npy"
    path = os.path.join(graph_dir, name) if graph_dir else None
    if path and os.path.exists(path):
        return np.load(path), float("nan")
    t0 = time.perf_counter()
    idx = cKDTree(Y).query(Y, k=k + 1)[1][:, 1:] if kind == "roll3" else knn(Y, k, method="approx")[0]
    took = time.perf_counter() - t0
    if path:
        np.save(path, idx)
    return idx, took


class RssSampler:
    """Samples this process's RSS (VmRSS) every ``dt`` s in a thread; ``peak(label)`` is the
    largest value seen while ``label`` was the current phase (set by ``phase``)."""

    def __init__(self, dt=0.05):
        import threading

        self.dt, self.cur, self.peaks, self.stop = dt, "start", {}, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @staticmethod
    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self):
        while not self.stop.is_set():
            r = self.rss()
            self.peaks[self.cur] = max(self.peaks.get(self.cur, 0), r)
            self.stop.wait(self.dt)

    def phase(self, label):
        r = self.rss()
        self.peaks[self.cur] = max(self.peaks.get(self.cur, 0), r)
        self.cur = label
        self.peaks[label] = max(self.peaks.get(label, 0), r)


#: the stages of ``GLLE.fit`` timed by ``fit`` (functions of ``lvmcore.models.glle``'s namespace)
PHASES = ("map_points", "em_iterations", "fill_reducing_order", "embed", "weight_matrix")


def fit(ns, chunks=None, kind="roll3", sweep=False, graph_dir=None, k=10):
    """Time ``GLLE(method="em").fit`` by phase (the calls of the model module's functions in
    ``PHASES`` are observed by :func:`observe_calls`), with the peak RSS of each phase sampled by
    a thread and, for every sparse factorisation, its stored entries (SuperLU's ``nnz``: the
    supernodal L blocks and U) and CPU time; phases are reported as CPU seconds of the process (the
    machine is shared: wall measures the load), the total also as wall. ``chunks``: the per-point
    work on a 2-worker local cluster (``bench.common.local_client``). ``sweep``: then the sweep's
    generations as ``tasks/fit.py`` runs them (``sample(3, random_state=seed)`` and one
    ``sample(1, random_state=seed, cov_scale=a)`` per ``COV_SCALES`` value)."""
    import scipy.sparse.linalg as sla

    import lvmcore.models.glle as G

    spent, lus, started = {}, [], {}
    sampler = RssSampler()

    def on_start(name):
        if name != "splu":
            sampler.phase(f"{name}#{len(spent.get(name, []))}")
        started.setdefault(name, []).append(time.process_time())

    def on_return(name, value):
        took = time.process_time() - started[name].pop()
        if name == "splu":
            lus.append((value.nnz, took, sampler.rss()))
            return
        spent.setdefault(name, []).append(took)
        sampler.phase("other")

    watched = {name: getattr(G, name) for name in PHASES} | {"splu": sla.splu}
    with observe_calls(watched, on_start, on_return):
        _fit_rows(G, ns, chunks, kind, sweep, graph_dir, k, spent, lus, sampler)


def _fit_rows(G, ns, chunks, kind, sweep, graph_dir, k, spent, lus, sampler):
    """The rows of :func:`fit`, one per n."""
    with local_client(2) if chunks else contextlib.nullcontext() as client:
        for n in ns:
            spent.clear()
            lus.clear()
            Y, t = roll(kind, n)
            idx, anchor = neighbours(kind, Y, graph_dir, k)
            sampler.phase("other")
            base = sampler.rss()
            t0, c0 = time.perf_counter(), time.process_time()
            m = G.GLLE(method="em", n_neighbors=k, n_components=2, chunks=chunks, random_state=0).fit(
                Y, idx, client=client
            )
            total, cpu = time.perf_counter() - t0, time.process_time() - c0
            if sweep:
                from tasks.registry import COV_SCALES

                t1 = time.perf_counter()
                m.sample(3, random_state=0, client=client)
                for a in COV_SCALES:
                    m.sample(1, random_state=0, cov_scale=a, client=client)
                gen = time.perf_counter() - t1
            sampler.phase("end")
            sub = np.random.default_rng(0).choice(n, min(n, UNFOLD_POINTS), replace=False)
            phases = " ".join(f"{k}=" + "+".join(f"{v:.1f}" for v in vs) for k, vs in spent.items())
            shown = ("embed", "map", "fill")
            peaks = " ".join(f"{k}:{v / 2**30:.2f}" for k, v in sampler.peaks.items() if k.startswith(shown))
            print(
                f"n={n} data={kind} k={k} chunks={chunks} kNN={anchor:.1f}s "
                f"fit={total:.1f}s wall, {cpu:.1f}s CPU "
                + (f"sweep_generations={gen:.1f}s " if sweep else "")
                + f"rss_before_fit={base / 2**30:.2f}GB peak_rss={max(sampler.peaks.values()) / 2**30:.2f}GB "
                f"em_iter={m.n_iter_} | {phases} | peak RSS GB per phase {peaks} | splu (stored entries "
                "per point, s, RSS GB after) "
                + " ".join(f"{z / n:.0f},{s:.1f},{r / 2**30:.2f}" for z, s, r in lus)
                + f" | unfolding lle={unfolding(m.lle_embedding_[sub], t[sub]):.4f} "
                f"generation={unfolding(m.embedding_[sub], t[sub]):.4f}",
                flush=True,
            )


def fill(ns, kinds=("roll3", "roll50"), graph_dir=None):
    """The pinned LU's size on each data set and n: for the LLE (mean) weights and for one draw of
    a generation at a = 10 (``GLLE.sample_weights(random_state=3, cov_scale=10)``), SuperLU's
    stored entries per point, its CPU seconds and the off-diagonal pivots, with the static pivots
    ``embed`` uses now (threshold 0) and with session 3's threshold partial pivoting (0.1). One
    process per (data, n); the METIS ordering is the one GLLE computes."""
    import scipy.sparse as sp

    import lvmcore.models.glle as G
    from lvmcore import lle

    print("data n pivot weights stored_per_point cpu_s offdiag_pivots", flush=True)
    for kind in kinds:
        for n in ns:
            Y, _ = roll(kind, n)
            idx, _ = neighbours(kind, Y, graph_dir)
            m = G.GLLE(method="em", n_neighbors=10, n_components=2, random_state=0).fit(Y, idx)
            del Y
            for name, w in (("mean", m.weights_), ("a=10", m.sample_weights(random_state=3, cov_scale=10.0))):
                A = (sp.identity(n, format="csr") - lle.weight_matrix(w, idx)).tocsr()[m._order][:, m._order]
                App = A[:-1, :-1].tocsc()
                for pivot in (0.0, 0.1):
                    c0 = time.process_time()
                    lu = lle._PinnedFactor(App, pivot).lu
                    cpu = time.process_time() - c0
                    off = int(np.sum(lu.perm_r != np.arange(n - 1)))
                    print(kind, n, pivot, name, f"{lu.nnz / n:.0f} {cpu:.1f} {off}", flush=True)
                    del lu


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_solve":
        _solve(*sys.argv[2:5])
    elif len(sys.argv) > 1 and sys.argv[1] == "fit":
        args = sys.argv[2:]
        opt = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
        values = set(i + 1 for i, a in enumerate(args[:-1]) if a.startswith("--") and a != "--sweep")
        ns = [int(a) for i, a in enumerate(args) if a.isdigit() and i not in values]
        c = int(opt["--chunks"]) if "--chunks" in opt else None
        fit(
            ns,
            c,
            kind=opt.get("--data", "roll3"),
            sweep="--sweep" in args,
            graph_dir=opt.get("--graph-dir"),
            k=int(opt.get("--k", 10)),
        )
    elif len(sys.argv) > 1 and sys.argv[1] == "fill":
        args = sys.argv[2:]
        gdir = args[args.index("--graph-dir") + 1] if "--graph-dir" in args else None
        kinds = tuple(a for a in args if a in ("roll3", "roll50")) or ("roll3", "roll50")
        fill([int(a) for a in args if a.isdigit()], kinds, gdir)
    elif len(sys.argv) > 1 and sys.argv[1] == "eigen":
        args = sys.argv[2:]
        picked = tuple(a for a in args if not a.isdigit()) or SOLVERS
        eigen([int(a) for a in args if a.isdigit()], picked)
    else:
        main()
