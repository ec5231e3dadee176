"""The benchmarks' one shared set-up: thread limits, core pinning, the local Dask cluster, peak
resident memory, and the command that runs a benchmark module in a child process.

Every script under bench/ runs from the repository root as a module,
``.venv/bin/python -m bench.<topic>.<script> ...``, and imports this module before numpy (or
anything that loads a BLAS or jax). Importing it gives BLAS, OpenMP and XLA one thread each, as
``flows.cluster`` gives the sweep's workers, unless the environment already says otherwise; a
script that needs more threads calls :func:`set_threads` itself before importing numpy.

XLA sizes its CPU thread pool from the process's CPU affinity; the thread variables and
``XLA_FLAGS=... intra_op_parallelism_threads=1`` do not bound it (jax-ml/jax#1539). Unpinned on a
2-core machine, a jitted bound + gradient ran on two XLA threads at once, so "one thread each"
against a single-threaded reference (GPy) was not true. :func:`pin_one_core` must run before jax
starts its CPU backend (the first jax computation), and not at import in a script that starts Dask
workers (they re-import the main module). :func:`unpin` gives the threads their cores back for
processes started afterwards (the Dask workers, which ``flows.workers.pin_cores`` then pins one core each);
jax's pool keeps the one thread it was sized for."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

#: the repository root (child processes run there, so ``-m bench....`` resolves)
ROOT = Path(__file__).resolve().parents[1]
#: the thread-count variables of OpenMP, OpenBLAS and MKL
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: XLA's CPU flags for one thread (what ``flows.cluster`` sets for the sweep's workers)
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

_original_cores: set[int] | None = None


def set_threads(n: int = 1, *, force: bool = False) -> None:
    """BLAS / OpenMP pools of ``n`` threads for this process and its children, and XLA's one-thread
    flags; ``force`` overrides values already in the environment. Only effective before numpy (or
    jax) is imported."""
    for v in THREAD_VARIABLES:
        if force:
            os.environ[v] = str(n)
        else:
            os.environ.setdefault(v, str(n))
    os.environ.setdefault("XLA_FLAGS", XLA_ONE_THREAD)


set_threads(1)


def quiet_prefect() -> None:
    """Prefect logs warnings only (a sweep's per-task lines would drown the benchmark's output)."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def pin_one_core() -> int | None:
    """Restricts this thread (and the threads it starts later) to the lowest core it may use;
    returns that core, or None where affinity cannot be set."""
    global _original_cores
    if not hasattr(os, "sched_setaffinity"):
        return None
    _original_cores = os.sched_getaffinity(0)
    core = min(_original_cores)
    os.sched_setaffinity(0, {core})
    return core


def unpin() -> None:
    """Gives every thread of this process the original cores back (a process started from any of
    them, e.g. by Dask's event-loop thread, inherits that thread's affinity)."""
    if _original_cores is None:
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), _original_cores)
        except OSError:  # the thread has ended
            pass


@contextlib.contextmanager
def local_client(n_workers: int):
    """A local Dask cluster of ``n_workers`` processes with one thread each, pinned to a core, and a
    client that talks to the workers directly (``direct_to_workers``), as a sweep's fit does from
    inside a worker: the row-chunk actors' calls then skip the scheduler's relay."""
    from distributed import Client, LocalCluster  # heavy; only the scripts with a cluster need it

    with (
        LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            preload=["flows.workers.pin_cores", "flows.workers.heap"],
        ) as lc,
        Client(lc, direct_to_workers=True) as client,
    ):
        yield client


def reset_peak() -> None:
    """Peak resident memory of this process (Linux /proc) from here on: VmHWM := VmRSS now
    (``clear_refs`` 5), so the next :func:`status_mb` reading is the peak since this call."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def status_mb(field: str = "VmHWM") -> float:
    """A field of /proc/self/status in MiB (nan where it is absent): by default the peak resident
    memory (``VmHWM``), ``"VmRSS"`` for the current one."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def module_command(module: str, *args: str) -> list[str]:
    """The command that runs benchmark ``module`` (``__spec__.name`` of the caller, e.g.
    ``bench.glle.scale``) with ``args`` in a child process; run it with ``cwd=ROOT``."""
    return [sys.executable, "-m", module, *args]


@contextlib.contextmanager
def observe_calls(funcs: dict, on_start, on_return):
    """Calls ``on_start(name)`` when a function of ``funcs`` ({name: function}) starts and
    ``on_return(name, value)`` when it returns, through ``sys.monitoring``'s start and return events
    enabled on those functions' code objects only: the functions are observed, not replaced, and
    every other call runs without a hook."""
    mon, ev = sys.monitoring, sys.monitoring.events
    tool = mon.PROFILER_ID
    names = {f.__code__: name for name, f in funcs.items()}
    mon.use_tool_id(tool, "bench.common")
    mon.register_callback(tool, ev.PY_START, lambda code, offset: on_start(names[code]))
    mon.register_callback(tool, ev.PY_RETURN, lambda code, offset, value: on_return(names[code], value))
    try:
        for code in names:
            mon.set_local_events(tool, code, ev.PY_START | ev.PY_RETURN)
        yield
    finally:
        for code in names:
            mon.set_local_events(tool, code, 0)
        mon.register_callback(tool, ev.PY_START, None)
        mon.register_callback(tool, ev.PY_RETURN, None)
        mon.free_tool_id(tool)
