"""kNN engines by regime (crossovers for ``knn(method="auto")``), and the exact blocked search
against scikit-learn brute force and faiss IndexFlatL2.

    .venv/bin/python -m bench.graph.knn --crossover    # n = 10^4..10^6 x d = 3, 10, 50; the 10^6 anchors
    .venv/bin/python -m bench.graph.knn --crossover --ns 10000,100000 --budget 30   # quick look
    .venv/bin/python -m bench.graph.knn                # n = 100,000, d = 50, k = 15; pynndescent at 200,000
    .venv/bin/python -m bench.graph.knn --n 20000 --approx-n 20000 --repeat 1   # quick look

Crossover mode: every method ("tree": scipy cKDTree, "exact": the blocked search, "approx":
pynndescent) on every (n, d) cell, data of low intrinsic dimension (a Swiss roll in 3-D, a smooth
5-D manifold in 10-D and 50-D); a cell whose time, extrapolated from the same method at the
previous n (x (n/n_prev)^2 for brute force and for the tree above 3-D), exceeds ``--budget``
seconds is skipped and printed as such. Then the anchors in the same run: at the largest n,
d = 3, ``knn(method="auto")`` against ``cKDTree(Y).query(Y, k + 1, workers=2)`` (same neighbour
sets required); at d = 50 against standalone ``pynndescent.NNDescent`` with the same settings,
recall on sampled rows against float64 brute force.

Every engine gets the machine's 2 cores: scikit-learn and faiss through their OpenMP pools (2
threads), lvmcore.graph.knn through Dask (default threaded scheduler with 2 threads, each task
single-threaded BLAS; then ``bench.common.local_client(2)``: 2 pinned one-thread workers). Times are the
minimum over ``--repeat`` runs (the machine is shared); ratios are against the faster of
scikit-learn and faiss measured in the same run. Memory: tracemalloc peak of one block-pair task
and one merge task at the block size used, and the process's peak RSS.
"""

from __future__ import annotations

from bench import common

common.set_threads(2, force=True)  # pools may grow to 2; lvmcore's tasks are limited to 1 below

import argparse  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from lvmcore import graph  # noqa: E402


def timed(fn, repeat):
    best, out = np.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def sklearn_brute(Y, k):
    from sklearn.neighbors import NearestNeighbors

    with threadpool_limits(2):
        d, i = NearestNeighbors(n_neighbors=k, algorithm="brute", n_jobs=2).fit(Y).kneighbors()
    return i, d


def faiss_flat(Y, k):
    import faiss

    faiss.omp_set_num_threads(2)
    X = np.ascontiguousarray(Y, dtype=np.float32)
    index = faiss.IndexFlatL2(X.shape[1])
    index.add(X)
    d2, i = index.search(X, k + 1)
    return graph._drop_self(i, np.sqrt(np.maximum(d2, 0)).astype(np.float64), k)


def ours(Y, k, block_rows):
    with threadpool_limits(1):
        return graph.knn(Y, k, method="exact", block_rows=block_rows)


def task_memory(Y, k, block_rows):
    """tracemalloc peak (MiB) of one block-pair task and one merge task."""
    b = min(block_rows, Y.shape[0] // 2)
    Yc = Y - Y.mean(0)
    A, B = Yc[:b].astype(np.float32), Yc[b : 2 * b].astype(np.float32)
    graph._pair_tile(A[:10], B[:10], k + 8, False)  # compiled outside the measurement
    tracemalloc.start()
    with threadpool_limits(1):
        part = graph._pair_tile(A, B, k + 8, False)
    pair_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    diag = graph._pair_tile(A, A, k + 8, True)
    sq = np.einsum("ij,ij->i", Yc, Yc)
    tracemalloc.start()
    graph._merge_block(0, [diag[:2], part[:2]], [0, b], Yc, sq, k, k + 8, 0.0, 0.0)
    merge_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return b, pair_peak / 2**20, merge_peak / 2**20


def low_dim_data(n, d, intrinsic, seed):
    """Points on a smooth `intrinsic`-dimensional manifold embedded in d dimensions."""
    rng = np.random.default_rng(seed)
    Z = rng.uniform(-1, 1, size=(n, intrinsic))
    W = rng.normal(size=(intrinsic, d))
    return np.sin(2.0 * Z) @ W + 0.3 * np.cos(Z) @ rng.normal(size=(intrinsic, d))


def sampled_recall(Y, idx, k, n_query, seed):
    """Recall of idx against exact neighbours of n_query random rows (float64 brute force)."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(Y.shape[0], size=n_query, replace=False)
    sq = np.einsum("ij,ij->i", Y, Y)
    hits = 0
    for chunk in np.array_split(rows, max(1, n_query // 250)):
        d2 = sq[chunk, None] + sq[None, :] - 2.0 * Y[chunk] @ Y.T
        d2[np.arange(len(chunk)), chunk] = np.inf
        true = np.argpartition(d2, k - 1, axis=1)[:, :k]
        hits += sum(len(np.intersect1d(a, t)) for a, t in zip(idx[chunk], true))
    return hits / (n_query * k)


def manifold_data(n, d, seed):
    """The crossover data: a Swiss roll for d = 3, a smooth 5-D manifold in d dimensions above."""
    if d == 3:
        rng = np.random.default_rng(seed)
        t = 1.5 * np.pi * (1 + 2 * rng.uniform(size=n))
        h = 21 * rng.uniform(size=n)
        return np.column_stack([t * np.cos(t), h, t * np.sin(t)]) + 0.05 * rng.normal(size=(n, 3))
    return low_dim_data(n, d, 5, seed)


def crossover(args):
    ns = [int(x) for x in args.ns.split(",")]
    ds = [int(x) for x in args.ds.split(",")]
    k = args.k
    print(f"# crossover: k = {k}, one timing per cell, budget {args.budget:.0f} s per cell; threads: 2")
    graph.knn(np.random.default_rng(0).normal(size=(3000, 8)), k, method="approx")  # JIT compile
    graph.knn(np.random.default_rng(0).normal(size=(600, 8)), k, method="exact", block_rows=128)
    print(f"{'d':>3} {'n':>8} {'auto picks':>10} {'tree s':>9} {'exact s':>9} {'approx s':>9} {'recall':>7}")
    rows = []
    for d in ds:
        prev = {}
        for n in ns:
            Y = manifold_data(n, d, 0)
            times, rec = {}, float("nan")
            for m in ("tree", "exact", "approx"):
                if m in prev:
                    p_n, p_t = prev[m]
                    power = 1.1 if (m == "approx" or (m == "tree" and d <= 3)) else 2.0
                    guess = p_t * (n / p_n) ** power
                    if guess > args.budget:
                        times[m] = f"skip({guess:.0f})"
                        continue
                with threadpool_limits(1 if m == "exact" else 2):
                    t = time.perf_counter()
                    idx, _ = graph.knn(Y, k, method=m, n_jobs=2)
                    times[m] = time.perf_counter() - t
                prev[m] = (n, times[m])
                if m == "approx":
                    rec = sampled_recall(Y, idx, k, min(1000, n), 3)
                del idx
            pick = graph.choose_knn_method(n, d, k)
            fmt = {m: (f"{v:9.2f}" if isinstance(v, float) else f"{v:>9}") for m, v in times.items()}
            print(
                f"{d:3d} {n:8d} {pick:>10} {fmt['tree']} {fmt['exact']} {fmt['approx']} {rec:7.3f}",
                flush=True,
            )
            rows.append((d, n, pick, times, rec))
    return rows


def anchors(args):
    from pynndescent import NNDescent
    from scipy.spatial import cKDTree

    n, k = max(int(x) for x in args.ns.split(",")), args.k
    warm = np.random.default_rng(0).normal(size=(3000, 8))
    _ = NNDescent(warm.astype(np.float32), n_neighbors=k + 1, random_state=0, n_jobs=2).neighbor_graph
    graph.knn(warm, k, method="approx", n_jobs=2)  # JIT compile outside the timings
    graph.knn(warm, k, method="tree", n_jobs=2)
    Y = manifold_data(n, 3, 1)
    print(f"# anchor d = 3, n = {n}, k = {k}: knn(method='auto') vs cKDTree(Y).query(Y, k + 1, workers=2)")
    t_ck, t_us = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        d_ck, i_ck = cKDTree(Y).query(Y, k=k + 1, workers=2)
        t_ck.append(time.perf_counter() - t)
        t = time.perf_counter()
        i_us, d_us = graph.knn(Y, k, n_jobs=2)
        t_us.append(time.perf_counter() - t)
    i_ck, d_ck = graph._drop_self(i_ck, d_ck, k)
    same = np.array_equal(np.sort(i_ck, 1), np.sort(i_us, 1))
    print(
        f"auto picks {graph.choose_knn_method(n, 3, k)!r}; cKDTree {min(t_ck):.2f} s, "
        f"ours {min(t_us):.2f} s, ratio {min(t_us) / min(t_ck):.2f} (target <= 2); "
        f"same neighbour sets: {same}; max |dist diff| {np.abs(d_us - d_ck).max():.1e}; "
        f"tie rows redone: {graph._tree_knn.last_fallback_rows}",
        flush=True,
    )
    del Y, i_ck, d_ck, i_us, d_us
    Y = manifold_data(n, 50, 2)
    print(f"# anchor d = 50, n = {n}, k = {k}: knn(method='auto') vs NNDescent(n_neighbors=k + 1, n_jobs=2)")
    t = time.perf_counter()
    i_nn, d_nn = NNDescent(Y.astype(np.float32), n_neighbors=k + 1, random_state=0, n_jobs=2).neighbor_graph
    t_nn = time.perf_counter() - t
    t = time.perf_counter()
    i_us, _ = graph.knn(Y, k, n_jobs=2)
    t_us = time.perf_counter() - t
    rec_us = sampled_recall(Y, i_us, k, 2000, 4)
    rec_nn = sampled_recall(Y, graph._drop_self(i_nn, d_nn, k)[0], k, 2000, 4)
    print(
        f"auto picks {graph.choose_knn_method(n, 50, k)!r}; pynndescent {t_nn:.2f} s, ours {t_us:.2f} s, "
        f"ratio {t_us / t_nn:.2f} (target <= 1.5); recall on 2000 rows: ours {rec_us:.3f} (target >= 0.95), "
        f"standalone {rec_nn:.3f}",
        flush=True,
    )
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crossover", action="store_true", help="methods by regime and the 10^6 anchors")
    ap.add_argument("--ns", default="10000,100000,1000000")
    ap.add_argument("--ds", default="3,10,50")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds a crossover cell may take")
    ap.add_argument("--skip-anchors", action="store_true")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=50)
    ap.add_argument("--k", type=int, default=15)
    ap.add_argument("--block-rows", type=int, default=graph.DEFAULT_BLOCK_ROWS)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--approx-n", type=int, default=200_000)
    ap.add_argument("--skip-cluster", action="store_true")
    ap.add_argument("--skip-approx", action="store_true")
    args = ap.parse_args()
    if args.crossover:
        if not args.skip_anchors:
            anchors(args)
        crossover(args)
        return
    n, d, k = args.n, args.d, args.k
    Y = np.random.default_rng(0).normal(size=(n, d))
    print(f"# exact kNN: n = {n}, d = {d}, k = {k}, block_rows = {args.block_rows}, min of {args.repeat}")
    ours(Y[:500], k, 128)  # numba compile / cache load outside the timings

    t_sk, (i_sk, d_sk) = timed(lambda: sklearn_brute(Y, k), args.repeat)
    t_fa, (i_fa, _) = timed(lambda: faiss_flat(Y, k), args.repeat)
    t_us, (i_us, d_us) = timed(lambda: ours(Y, k, args.block_rows), args.repeat)
    anchor = min(t_sk, t_fa)
    print(f"sklearn brute (2 threads)      {t_sk:8.2f} s   ratio {t_sk / anchor:5.2f}")
    print(f"faiss IndexFlatL2 (2 threads)  {t_fa:8.2f} s   ratio {t_fa / anchor:5.2f}")
    print(f"lvmcore exact, threaded (2)    {t_us:8.2f} s   ratio {t_us / anchor:5.2f}   (target <= 1.2)")
    print(
        f"  indices equal to sklearn: {np.array_equal(i_us, i_sk)}; to faiss: {np.array_equal(i_us, i_fa)}; "
        f"max |dist - sklearn| {np.abs(d_us - d_sk).max():.2e}; "
        f"rows redone by brute force: {graph._exact_knn.last_fallback_rows}"
    )
    b, pair_mib, merge_mib = task_memory(Y, k, args.block_rows)
    print(
        f"  memory per task (tracemalloc peak): block pair {pair_mib:.0f} MiB, merge {merge_mib:.0f} MiB "
        f"(block {b} rows; data itself {Y.nbytes / 2**20:.0f} MiB)"
    )

    if not args.skip_cluster:
        common.set_threads(1, force=True)  # the workers' BLAS
        with common.local_client(2) as client:
            graph.knn(Y[:2000], k, method="exact", block_rows=512, client=client)  # warm the workers
            t_cl, (i_cl, _) = timed(
                lambda: graph.knn(Y, k, method="exact", block_rows=args.block_rows, client=client),
                args.repeat,
            )
        print(
            f"lvmcore exact, LocalCluster 2x1 {t_cl:7.2f} s   ratio {t_cl / anchor:5.2f}   "
            f"(target < 1; equal to threaded: {np.array_equal(i_cl, i_us)})"
        )
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB")

    if not args.skip_approx:
        na = args.approx_n
        print(
            f"# pynndescent (lvmcore.graph.knn(method='approx')): n = {na}, d = {d}, k = {k}, "
            "recall on 2000 sampled rows against exact"
        )
        graph.knn(Y[:2000], k, method="approx")  # numba compile outside the timings
        for label, Ya in [
            ("low intrinsic dim (5)", low_dim_data(na, d, 5, 1)),
            ("high intrinsic dim (50, Gaussian)", np.random.default_rng(2).normal(size=(na, d))),
        ]:
            t_a, (i_a, _) = timed(lambda Ya=Ya: graph.knn(Ya, k, method="approx"), 1)
            rec = sampled_recall(Ya, i_a, k, 2000, 3)
            print(f"{label:36s} time {t_a:7.2f} s   recall {rec:.3f}")


if __name__ == "__main__":
    main()
