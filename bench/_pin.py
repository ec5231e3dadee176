"""One CPU core for the in-process timings against single-threaded references (GPy).

XLA sizes its CPU thread pool from the process's CPU affinity; the thread variables (OMP, OpenBLAS)
and ``XLA_FLAGS=... intra_op_parallelism_threads=1`` do not bound it (jax-ml/jax#1539). Unpinned on
the 2-core VM, a jitted bound + gradient ran on two XLA threads at once (each busy about 100% of
the wall time), so "one thread each" against GPy was not true. :func:`pin_one_core` must run before
jax starts its CPU backend (the first jax computation), and not at import in a script that starts
Dask workers (they re-import it). :func:`unpin` gives the threads their cores back for processes
started afterwards (the Dask workers of the chunked runs, which ``flows.pin_cores`` then pins one
core each); jax's pool keeps the one thread it was sized for."""

import os

_original = None


def pin_one_core():
    """Restricts this thread (and the threads it starts later) to the lowest core it may use;
    returns that core, or None where affinity cannot be set."""
    global _original
    if not hasattr(os, "sched_setaffinity"):
        return None
    _original = os.sched_getaffinity(0)
    core = min(_original)
    os.sched_setaffinity(0, {core})
    return core


def unpin():
    """Gives every thread of this process the original cores back (a process started from any of
    them, e.g. by Dask's event-loop thread, inherits that thread's affinity)."""
    if _original is None:
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), _original)
        except OSError:  # the thread has ended
            pass
