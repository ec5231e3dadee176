"""Bound + gradient of the Bayesian GP-LVM (RBF-ARD): ours (fused jitted map-reduce, one chunk)
against GPy 1.15's BayesianGPLVM at the same parameters, in one run, on one CPU core (the process
is pinned to it: XLA's thread pool follows the affinity, not the thread variables; see
``bench/common.py``); then the chunked Dask evaluation at large N on 1 vs 2 worker processes, one
core each.

    python -m bench.gplvm.psi [--big 200000] [--repeats 5]
    python -m bench.gplvm.psi --native [--repeats 7]      # native pair kernel vs XLA path, sweep sizes
Prints ratios (GPy time / our time; 1-worker time / 2-worker time). Ours and GPy: the timed calls
of the two sides alternate, ``--repeats`` each, and the best of each side is reported. The
clusters: one at a time, ``--cluster-rounds`` lifetimes each, alternating, best of ``--repeats``
evaluations per lifetime.

The chunked ratio's anchor, measured in the same run: the same chunks' forward and backward passes
in plain processes, no Dask: one process pinned to one core doing all 8 chunks, against two pinned
to two cores doing 4 each, started together each round (a round of the pair lasts as long as
its slower process), once in each of the clusters' rounds. That is what the machine's two cores
give for this work at the time: on the shared VMs here, anything from 1.58x to 1.88x within one
hour (eighth session, bench/README.md)."""

import argparse
import os
import time

import numpy as np

from bench.common import pin_one_core, unpin


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


def ours_runner(Y, mu, S, Z, chunks=None, impl=None, client=None):
    from lvmcore.chunks import RowChunks
    from lvmcore.models.bgplvm import ViewStats, bound_objective

    Q = mu.shape[1]
    local = {"mu": mu, "logS": np.log(S)}
    glob = {"Z": Z[None], "kern": [{"log_var": 0.0, "log_ls": np.zeros(Q)}], "log_beta": np.array([0.5])}
    r = RowChunks(
        ViewStats(("rbf",), True, impl=impl),
        bound_objective(("rbf",), True, len(Y), (Y.shape[1],)),
        (Y,),
        chunks,
        client=client,
    )
    return lambda: r.value_and_grad(local, glob, 0.0)


#: (N, M, Q, D) of the sweep's Bayesian GP-LVM fits (n_inducing 20-30, latent_dim 2-5, the bundled
#: data sets' D) and of the earlier tables (M = 50)
SWEEP_SIZES = (
    (1000, 20, 2, 3),
    (1000, 30, 5, 3),
    (5000, 30, 2, 3),
    (5000, 30, 5, 20),
    (1000, 50, 5, 20),
    (5000, 50, 5, 20),
    (20000, 50, 10, 50),
)


def native_vs_xla(repeats):
    """Whole bound + gradient, one piece, the native pair kernel against the XLA path, interleaved."""
    from lvmcore.psi import native

    if not native.available():
        print(f"native kernel unavailable: {native.unavailable_reason()}")
        return
    print("size (N, M, Q, D)        xla_ms native_ms  xla/native")
    for N, M, Q, D in SWEEP_SIZES:
        Y, mu, S, Z = problem(N, M, Q, D)
        runs = [ours_runner(Y, mu, S, Z, impl=i) for i in ("xla", "native")]
        t_x, t_n = best_of_interleaved(runs, repeats)
        print(f"{(N, M, Q, D)!s:24s} {1e3 * t_x:8.1f} {1e3 * t_n:9.1f} {t_x / t_n:11.2f}")


def gpy_runner(Y, mu, S, Z):
    import GPy

    Q = mu.shape[1]
    m = GPy.models.BayesianGPLVM(
        Y, Q, X=mu, X_variance=S, Z=Z, num_inducing=len(Z), kernel=GPy.kern.RBF(Q, ARD=True)
    )
    x = m.optimizer_array.copy()
    return lambda: m._objective_grads(x)


def _plain_chunks(core, which, big, repeats, barrier, out):
    """A spawned process pinned to ``core`` (before jax starts): times the forward + backward
    passes of chunks ``which`` of the chunked problem, ``repeats`` rounds, each started at
    ``barrier``."""
    os.sched_setaffinity(0, {core})
    import jax

    from flows.workers.heap import keep_heap
    from lvmcore.models.bgplvm import ViewStats

    keep_heap()  # the heap settings of a Dask worker (see plain_ceiling)
    Y, mu, S, Z = problem(big, 50, 5, 20)
    size = big // 8
    rows = [slice(c * size, (c + 1) * size) for c in which]
    chunks = [({"mu": mu[r], "logS": np.log(S[r])}, (Y[r],)) for r in rows]
    glob = {"Z": Z[None], "kern": [{"log_var": 0.0, "log_ls": np.zeros(5)}], "log_beta": np.array([0.5])}
    st = ViewStats(("rbf",), True)
    lo0, d0 = chunks[0]
    cot = jax.tree_util.tree_map(np.ones_like, st.forward(lo0, glob, d0))
    for lo, d in chunks:
        st.backward(lo, glob, d, cot)
    times = []
    for _ in range(repeats):
        barrier.wait()
        t0 = time.perf_counter()
        for lo, d in chunks:
            st.forward(lo, glob, d)
        for lo, d in chunks:
            st.backward(lo, glob, d, cot)
        times.append(time.perf_counter() - t0)
    out.put((core, times))


def plain_ceiling(big, repeats):
    """(1 process, 8 chunks), (2 processes, 4 chunks each): best of ``repeats`` rounds each; see
    the module doc. None on fewer than 2 cores."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        return None

    def run(groups):
        barrier, out = ctx.Barrier(len(groups)), ctx.Queue()
        procs = [
            ctx.Process(target=_plain_chunks, args=(core, which, big, repeats, barrier, out))
            for core, which in zip(cores, groups, strict=False)
        ]
        # started as a Dask nanny starts its worker (MALLOC_TRIM_THRESHOLD_, then keep_heap in the
        # process): the same heap behaviour as the workers being compared with
        saved = os.environ.get("MALLOC_TRIM_THRESHOLD_")
        os.environ["MALLOC_TRIM_THRESHOLD_"] = "65536"
        try:
            for p in procs:
                p.start()
        finally:
            if saved is None:
                del os.environ["MALLOC_TRIM_THRESHOLD_"]
            else:
                os.environ["MALLOC_TRIM_THRESHOLD_"] = saved
        res = [out.get() for _ in procs]
        for p in procs:
            p.join()
        return min(max(r) for r in zip(*(t for _, t in res), strict=True))

    alone = run([list(range(8))])
    pair = run([list(range(4)), list(range(4, 8))])
    return alone, pair


def _load():
    """The 1-, 5- and 15-minute load averages (the machine is shared: note them with each number)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", type=int, default=200_000, help="0: skip the chunked run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cluster-rounds", type=int, default=3, help="lifetimes of each cluster, alternating")
    ap.add_argument("--native", action="store_true", help="only: the native kernel against the XLA path")
    a = ap.parse_args()
    # before jax starts its CPU backend; not at import, which the spawned Dask workers repeat
    print(f"in process on core {pin_one_core()}")
    if a.native:
        native_vs_xla(a.repeats)
        return
    print(f"load average at start: {_load()}")
    print("size (N, M, Q, D)        ours_ms   gpy_ms   gpy/ours")
    for N, M, Q, D in ((1000, 50, 5, 20), (5000, 50, 5, 20), (20000, 50, 10, 50)):
        Y, mu, S, Z = problem(N, M, Q, D)
        t_ours, t_gpy = best_of_interleaved([ours_runner(Y, mu, S, Z), gpy_runner(Y, mu, S, Z)], a.repeats)
        print(f"{(N, M, Q, D)!s:24s} {1e3 * t_ours:8.1f} {1e3 * t_gpy:8.1f} {t_gpy / t_ours:9.1f}")
    print(f"load average at end: {_load()}")
    if a.big <= 0:
        return
    from bench.common import local_client

    unpin()  # the workers start with every core; flows.workers.pin_cores gives each its own

    Y, mu, S, Z = problem(a.big, 50, 5, 20)
    # one cluster at a time, their lifetimes alternating (1 worker, 2 workers, 1, 2, ...): both
    # sides see the same drift of the machine's load, and no idle cluster's scheduler, nanny or
    # worker shares the cores with the busy one (with both clusters up at once, as before the
    # seventh session, that cost the 2-worker side more: it has no core to spare)
    times = {1: [], 2: []}
    plain = {1: [], 2: []}
    cores = {}
    for _ in range(a.cluster_rounds):
        for n in (1, 2):
            with local_client(n) as c:
                run = ours_runner(Y, mu, S, Z, chunks=a.big // 8, client=c)
                times[n].append(best_of_interleaved([run], a.repeats)[0])
                cores[n] = sorted(c.run(lambda: sorted(os.sched_getaffinity(0))).values())
        if (ceiling := plain_ceiling(a.big, a.repeats)) is not None:  # in the same rounds
            plain[1].append(ceiling[0])
            plain[2].append(ceiling[1])
    t1, t2 = min(times[1]), min(times[2])
    print(f"chunked N={a.big}: 1 worker {t1:.3f} s, 2 workers {t2:.3f} s, speed-up {t1 / t2:.2f}x")
    each = {n: [round(t, 3) for t in ts] for n, ts in times.items()}
    print(f"  per cluster lifetime: 1 worker {each[1]} s, 2 workers {each[2]} s")
    print(f"cores of the workers: 1-worker cluster {cores[1]}, 2-worker cluster {cores[2]}")
    if plain[1]:
        p1, p2 = min(plain[1]), min(plain[2])
        print(
            f"anchor, plain pinned processes (no Dask), same chunks: 1 process {p1:.3f} s, "
            f"2 processes {p2:.3f} s, speed-up {p1 / p2:.2f}x; "
            f"Dask's / the anchor's {(t1 / t2) / (p1 / p2):.2f}"
        )
        each = {n: [round(t, 3) for t in ts] for n, ts in plain.items()}
        print(f"  per round: 1 process {each[1]} s, 2 processes {each[2]} s")


if __name__ == "__main__":
    main()
