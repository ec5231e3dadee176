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


def process_role(cmdline: list[str]) -> str:
    """A short name for a process of a benchmark's tree, from its command line: the Prefect
    server, a Dask worker (or another multiprocessing child), the ``embed-sweep`` CLI, a bench
    stage (``-m bench....``), else the command's first 60 characters."""
    cmd = " ".join(cmdline)
    if "prefect" in cmd and "server" in cmd:
        return "prefect server"
    if "resource_tracker" in cmd:
        return "resource tracker"
    if "spawn_main" in cmd or "multiprocessing" in cmd or "distributed.cli" in cmd:
        return "dask worker"
    if "embed-sweep" in cmd or "embed_sweep" in cmd:
        return "embed-sweep"
    if "-m" in cmdline and any(c.startswith("bench.") for c in cmdline):
        return "stage"
    return cmd[:60]


class TreeSampler:
    """Resident memory of a process and all its descendants, sampled every ``interval`` s (psutil)
    in a thread of this process, from :meth:`start` until :meth:`stop`: each process's peak RSS
    and the peak over samples of the SUM of RSS of the processes alive at that sample (the tree's
    concurrent footprint; pages shared between processes, such as mapped libraries, count once per
    process). A spike shorter than ``interval`` may be missed; a process's own ``ru_maxrss`` is
    exact."""

    def __init__(self, pid: int, interval: float = 0.2):
        import threading

        self.pid, self.interval = pid, interval
        self.procs: dict[int, dict] = {}  # pid -> {"role", "peak_mb", "first_s", "last_s"}
        self.peak_sum_mb = 0.0
        self.peak_sum_n = 0  # processes in the sample that gave peak_sum_mb
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def _sample(self, root) -> None:
        import time

        import psutil

        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        now = time.perf_counter() - self._t0
        total, n = 0.0, 0
        for p in procs:
            try:
                rss = p.memory_info().rss / 2**20
                if p.pid not in self.procs:
                    self.procs[p.pid] = {
                        "role": process_role(p.cmdline()),
                        "peak_mb": 0.0,
                        "first_s": now,
                        "last_s": now,
                    }
            except (psutil.Error, OSError):  # ended between the listing and the reading
                continue
            rec = self.procs[p.pid]
            rec["peak_mb"] = max(rec["peak_mb"], rss)
            rec["last_s"] = now
            total, n = total + rss, n + 1
        self.samples += 1
        if total > self.peak_sum_mb:
            self.peak_sum_mb, self.peak_sum_n = total, n

    def _run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            self._sample(root)
            self._stop.wait(self.interval)

    def start(self) -> TreeSampler:
        import time

        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stops sampling; returns :meth:`result`."""
        self._stop.set()
        self._thread.join()
        return self.result()

    def result(self) -> dict:
        """``{"peak_sum_mb", "peak_sum_processes", "samples", "processes": [{"pid", "role",
        "peak_mb", "first_s", "last_s"}, ...]}``, the processes by role, then largest peak first."""
        procs = sorted(
            ({"pid": pid, **rec} for pid, rec in self.procs.items()),
            key=lambda r: (r["role"] != "stage", r["role"], -r["peak_mb"]),
        )
        return {
            "peak_sum_mb": self.peak_sum_mb,
            "peak_sum_processes": self.peak_sum_n,
            "samples": self.samples,
            "processes": procs,
        }


def run_sampled(argv: list[str], *, cwd=ROOT, interval: float = 0.2, timeout: float | None = None) -> dict:
    """Runs ``argv`` as a child process (stdout and stderr captured as text), its process tree
    sampled by a :class:`TreeSampler`: ``{"rc", "stdout", "stderr", "wall_s", "timed_out",
    "load_start", "load_end" (os.getloadavg()'s 1, 5 and 15 minute averages), "tree": the
    sampler's result}``. On ``timeout`` the tree is killed (descendants first)."""
    import subprocess
    import tempfile
    import time

    import psutil

    load_start = os.getloadavg()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, text=True)
        sampler = TreeSampler(proc.pid, interval).start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                kids = psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                kids = []
            for k in reversed(kids):
                with contextlib.suppress(psutil.Error):
                    k.kill()
            proc.kill()
            proc.wait()
        wall = time.perf_counter() - t0
        tree = sampler.stop()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return {
        "rc": proc.returncode,
        "stdout": stdout,
        "stderr": stderr,
        "wall_s": wall,
        "timed_out": timed_out,
        "load_start": list(load_start),
        "load_end": list(os.getloadavg()),
        "tree": tree,
    }
