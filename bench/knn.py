"""Exact blocked kNN against scikit-learn brute force and faiss IndexFlatL2; pynndescent recall.

    .venv/bin/python bench/knn.py                # n = 100,000, d = 50, k = 15; pynndescent at 200,000
    .venv/bin/python bench/knn.py --n 20000 --approx-n 20000 --repeat 1   # quick look

Every engine gets the machine's 2 cores: scikit-learn and faiss through their OpenMP pools (2
threads), lvmcore.graph.knn through Dask (default threaded scheduler with 2 threads, each task
single-threaded BLAS; then a 2-process LocalCluster with one thread per worker). Times are the
minimum over ``--repeat`` runs (the machine is shared); ratios are against the faster of
scikit-learn and faiss measured in the same run. Memory: tracemalloc peak of one block-pair task
and one merge task at the block size used, and the process's peak RSS.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "2"  # pools may grow to 2; lvmcore's tasks are limited to 1 below

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
        return graph.knn(Y, k, block_rows=block_rows)


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=50)
    ap.add_argument("--k", type=int, default=15)
    ap.add_argument("--block-rows", type=int, default=graph.DEFAULT_BLOCK_ROWS)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--approx-n", type=int, default=200_000)
    ap.add_argument("--skip-cluster", action="store_true")
    ap.add_argument("--skip-approx", action="store_true")
    args = ap.parse_args()
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
        from distributed import Client, LocalCluster

        for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[v] = "1"  # the workers' BLAS
        with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cl:
            with Client(cl):
                graph.knn(Y[:2000], k, block_rows=512)  # warm the workers (numba cache load)
                t_cl, (i_cl, _) = timed(lambda: graph.knn(Y, k, block_rows=args.block_rows), args.repeat)
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
