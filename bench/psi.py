"""Bound + gradient of the Bayesian GP-LVM (RBF-ARD): ours (fused jitted map-reduce, one chunk)
against GPy 1.15's BayesianGPLVM at the same parameters, in one run, on one CPU core (the process
is pinned to it: XLA's thread pool follows the affinity, not the thread variables; see
``bench/_pin.py``); then the chunked Dask evaluation at large N on 1 vs 2 worker processes, one
core each.

    python bench/psi.py [--big 200000] [--repeats 5]
Prints ratios (GPy time / our time; 1-worker time / 2-worker time). Ours and GPy: the timed calls
of the two sides alternate, ``--repeats`` each, and the best of each side is reported. The
clusters: one at a time, ``--cluster-rounds`` lifetimes each, alternating, best of ``--repeats``
evaluations per lifetime."""

import os

for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[v] = "1"
os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from _pin import pin_one_core, unpin  # noqa: E402


def problem(N, M, Q, D, seed=0):
    rng = np.random.default_rng(seed)
    Y = rng.standard_normal((N, D))
    Y -= Y.mean(0)
    return Y, rng.standard_normal((N, Q)), rng.uniform(0.1, 0.5, (N, Q)), rng.standard_normal((M, Q))


def best_of_interleaved(fs, repeats):
    """Best wall time of each function in ``fs``, their timed calls alternating (after one warm-up
    call each), so that a change in the machine's load during the run hits all of them alike."""
    for f in fs:
        f()
    ts = [[] for _ in fs]
    for _ in range(repeats):
        for f, t in zip(fs, ts):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [min(t) for t in ts]


def ours_runner(Y, mu, S, Z, chunks=None):
    from lvmcore.models.bgplvm import ViewStats, bound_objective
    from lvmcore.psi.reduce import RowChunks

    Q = mu.shape[1]
    local = {"mu": mu, "logS": np.log(S)}
    glob = {"Z": Z[None], "kern": [{"log_var": 0.0, "log_ls": np.zeros(Q)}], "log_beta": np.array([0.5])}
    r = RowChunks(
        ViewStats(("rbf",), True), bound_objective(("rbf",), True, len(Y), (Y.shape[1],)), (Y,), chunks
    )
    return lambda: r.value_and_grad(local, glob, 0.0)


def gpy_runner(Y, mu, S, Z):
    import GPy

    Q = mu.shape[1]
    m = GPy.models.BayesianGPLVM(
        Y, Q, X=mu, X_variance=S, Z=Z, num_inducing=len(Z), kernel=GPy.kern.RBF(Q, ARD=True)
    )
    x = m.optimizer_array.copy()
    return lambda: m._objective_grads(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", type=int, default=200_000, help="0: skip the chunked run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cluster-rounds", type=int, default=3, help="lifetimes of each cluster, alternating")
    a = ap.parse_args()
    # before jax starts its CPU backend; not at import, which the spawned Dask workers repeat
    print(f"in process on core {pin_one_core()}")
    print("size (N, M, Q, D)        ours_ms   gpy_ms   gpy/ours")
    for N, M, Q, D in ((1000, 50, 5, 20), (5000, 50, 5, 20), (20000, 50, 10, 50)):
        Y, mu, S, Z = problem(N, M, Q, D)
        t_ours, t_gpy = best_of_interleaved([ours_runner(Y, mu, S, Z), gpy_runner(Y, mu, S, Z)], a.repeats)
        print(f"{(N, M, Q, D)!s:24s} {1e3 * t_ours:8.1f} {1e3 * t_gpy:8.1f} {t_gpy / t_ours:9.1f}")
    if a.big <= 0:
        return
    from _cluster import local_client

    unpin()  # the workers start with every core; flows.pin_cores gives each its own

    Y, mu, S, Z = problem(a.big, 50, 5, 20)
    # one cluster at a time, their lifetimes alternating (1 worker, 2 workers, 1, 2, ...): both
    # sides see the same drift of the machine's load, and no idle cluster's scheduler, nanny or
    # worker shares the cores with the busy one (with both clusters up at once, as before the
    # seventh session, that cost the 2-worker side more: it has no core to spare)
    times = {1: [], 2: []}
    cores = {}
    for _ in range(a.cluster_rounds):
        for n in (1, 2):
            with local_client(n) as c:
                run = ours_runner(Y, mu, S, Z, chunks=a.big // 8)
                times[n].append(best_of_interleaved([run], a.repeats)[0])
                cores[n] = sorted(c.run(lambda: sorted(os.sched_getaffinity(0))).values())
    t1, t2 = min(times[1]), min(times[2])
    print(f"chunked N={a.big}: 1 worker {t1:.3f} s, 2 workers {t2:.3f} s, speed-up {t1 / t2:.2f}x")
    each = {n: [round(t, 3) for t in ts] for n, ts in times.items()}
    print(f"  per cluster lifetime: 1 worker {each[1]} s, 2 workers {each[2]} s")
    print(f"cores of the workers: 1-worker cluster {cores[1]}, 2-worker cluster {cores[2]}")


if __name__ == "__main__":
    main()
