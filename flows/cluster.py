"""Dask clusters for the sweep: local processes (default), an existing scheduler, Slurm through
dask-jobqueue, Kubernetes through dask-kubernetes. Each is validated before any work starts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile

#: one BLAS / OpenMP / XLA thread per Dask worker thread (oversubscription cost 5x here)
PINNED_THREADS_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}

CLUSTER_TYPES = ("local", "address", "slurm", "kubernetes")

#: distributed's loggers that report a cluster's start at INFO
QUIET_LOGGERS = (
    "distributed",
    "distributed.scheduler",
    "distributed.nanny",
    "distributed.core",
    "distributed.http.proxy",
)

#: seconds to wait for an existing scheduler (an address) to answer before the run is refused; it
#: bounds only that connection, never the start of Slurm or Kubernetes workers
CONNECT_TIMEOUT_S = 10.0


class SchedulerUnreachable(ValueError):
    """The scheduler at a given address did not answer within the connect timeout."""


def check_scheduler(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Connect to the scheduler at ``address`` and close the connection again; raises
    SchedulerUnreachable naming the address and the timeout if it does not answer in ``timeout`` s
    (distributed retries a refused connection until then)."""
    from distributed.comm import connect  # distributed is imported only where a cluster is used

    async def probe():
        comm = await connect(address, timeout=timeout)
        await comm.close()

    try:
        asyncio.run(probe())
    except OSError as e:  # distributed's connect raises OSError when its timeout passes
        raise SchedulerUnreachable(
            f"cannot reach the scheduler at {address} (timed out after {timeout:g} s); start it, check "
            "the address, or give the scheduler more time with --connect-timeout"
        ) from e


def compile_cache_env() -> dict:
    """JAX's persistent compilation cache for the workers: ``{"JAX_COMPILATION_CACHE_DIR": dir}``.

    XLA compiles each model's bound and gradient once per worker process and data shape (5-6 s
    for the Bayesian GP-LVM's at N = 1,000 on one core, against 10-14 ms per evaluation). With
    the cache on disk, a second worker, a later sweep or the next scheduled run of the same grid
    loads the executable instead. The directory is the caller's ``JAX_COMPILATION_CACHE_DIR`` if
    set (set it empty to switch the cache off), else ``$XDG_CACHE_HOME/embed-sweep/jax`` (default
    ``~/.cache/embed-sweep/jax``). jax compresses each entry and treats an entry it cannot read
    (e.g. one being written by another process) as a miss."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return {"JAX_COMPILATION_CACHE_DIR": os.environ["JAX_COMPILATION_CACHE_DIR"]}
    from lvmcore import user_cache_dir

    return {"JAX_COMPILATION_CACHE_DIR": user_cache_dir("jax")}


def normalise_cluster(cluster) -> dict:
    """A cluster spec as a dict with a ``type``; raises ValueError for a spec that cannot work."""
    if cluster is None:
        cluster = {"type": "local"}
    elif isinstance(cluster, str):
        cluster = {"type": "address", "address": cluster} if "://" in cluster else {"type": cluster}
    else:
        cluster = dict(cluster)
    if "address" in cluster and "type" not in cluster:
        cluster["type"] = "address"
    kind = cluster.setdefault("type", "local")
    if kind not in CLUSTER_TYPES:
        raise ValueError(f"unknown cluster type {kind!r}; use one of {CLUSTER_TYPES}")
    if kind == "local":
        n = cluster.get("n_workers", 2)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"the worker count must be positive, got {n!r} (cluster n_workers)")
    if kind == "address" and not str(cluster.get("address", "")).startswith(
        ("tcp://", "tls://", "inproc://")
    ):
        raise ValueError(f"cluster address must look like tcp://host:8786, got {cluster.get('address')!r}")
    if "connect_timeout" in cluster:
        t = cluster["connect_timeout"]
        if kind != "address":
            raise ValueError(
                f"connect_timeout bounds the connection to an existing scheduler (an address), not a "
                f"{kind} cluster's start; leave it out"
            )
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
            raise ValueError(f"the connect timeout must be a positive number of seconds, got {t!r}")
    if kind == "slurm":
        try:
            import dask_jobqueue  # noqa: F401
        except ImportError as e:
            raise ValueError("a Slurm cluster needs dask-jobqueue: pip install dask-jobqueue") from e
        if shutil.which("sbatch") is None:
            raise ValueError(
                "cluster type 'slurm' but no `sbatch` on PATH: run the flow on a Slurm login node "
                "(without sbatch dask-jobqueue only logs the failure and the flow would wait forever)"
            )
    if kind == "slurm":
        _check_slurm_security(cluster)
    if kind == "kubernetes":
        try:
            import dask_kubernetes  # noqa: F401
        except ImportError as e:
            raise ValueError(
                "a Kubernetes cluster needs dask-kubernetes: pip install 'embed-sweep[k8s]'"
            ) from e
    return cluster


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _slurm_host(spec: dict) -> str:
    """The host a Slurm spec's scheduler listens on ('' for every interface, dask-jobqueue's
    default, which compute nodes need to reach it)."""
    opts = spec.get("scheduler_options") or {}
    return str(opts.get("host", "")) if not opts.get("interface") else f"interface {opts['interface']}"


def _check_slurm_security(spec: dict) -> None:
    """TLS is on unless the scheduler listens on loopback only (a one-node Slurm); turning it off
    for a scheduler other hosts can reach is refused."""
    sec = spec.get("security", True)
    if sec is False and _slurm_host(spec) not in LOOPBACK:
        where = _slurm_host(spec) or "every interface"
        raise ValueError(
            f"cluster security=false with the scheduler listening on {where}: "
            "anyone who can reach the port could run code as you. Keep TLS (the default), or listen on "
            "loopback only: scheduler_options={'host': '127.0.0.1'} (one-node Slurm)"
        )
    if not isinstance(sec, (bool, dict)):
        raise ValueError(
            f"cluster security must be true, false or a dict of distributed.Security arguments "
            f"(e.g. tls_ca_file, tls_scheduler_cert, tls_worker_cert, ...), got {sec!r}"
        )


def slurm_cluster_kwargs(spec: dict) -> dict:
    """SLURMCluster arguments for a normalised Slurm spec (without type, jobs, adapt).

    Exposure: the dashboard listens on 127.0.0.1 (reach it with an ssh tunnel); the scheduler
    listens where compute nodes can reach it, so its connections use TLS with mutual certificate
    checks (distributed's ``Security``): by default ``Security.temporary()``, a fresh CA and
    certificate made for this run, written for the jobs (mode 0600) into a fresh 0700 folder under
    ``shared_temp_directory`` (default ``~/.cache/embed-sweep/tls``, which must be on a file system
    the nodes share, as home usually is) and removed when the cluster closes; or certificates
    from paths, ``security: {"tls_ca_file": ..., "tls_scheduler_cert": ..., "tls_scheduler_key":
    ..., "tls_worker_cert": ..., ...}``. ``security: false`` is accepted only with
    ``scheduler_options: {"host": "127.0.0.1"}``."""
    from distributed.security import Security

    from lvmcore import user_cache_dir

    spec = dict(spec)
    sec = spec.pop("security", True)
    opts = {"dashboard_address": "127.0.0.1:0", **(spec.pop("scheduler_options", None) or {})}
    prologue = list(spec.pop("job_script_prologue", []))
    prologue += [f"export {k}='{v}'" for k, v in worker_env().items()]
    spec["worker_extra_args"] = [*spec.get("worker_extra_args", []), "--preload", "flows.workers.heap"]
    kw = {"scheduler_options": opts, "job_script_prologue": prologue, **spec}
    if sec is True:
        kw["security"] = Security.temporary()
        base = spec.get("shared_temp_directory") or user_cache_dir("tls")
        os.makedirs(base, mode=0o700, exist_ok=True)
        kw["shared_temp_directory"] = tempfile.mkdtemp(prefix="run-", dir=base)  # removed at close
    elif isinstance(sec, dict):
        kw["security"] = Security(require_encryption=True, **sec)
    return kw


def client_kwargs(cluster) -> dict:
    """What a client of ``cluster`` needs beyond its address: its TLS credentials if it has any."""
    sec = getattr(cluster, "security", None)
    if sec is not None and str(getattr(cluster, "scheduler_address", "")).startswith("tls://"):
        return {"security": sec}
    return {}


def worker_env() -> dict:
    """The environment every worker gets: one thread per library and the compilation cache."""
    return dict(PINNED_THREADS_ENV, **compile_cache_env())


def pin_threads() -> None:
    """Set :func:`worker_env` here (inherited by worker processes spawned afterwards)."""
    for k, v in worker_env().items():
        os.environ.setdefault(k, v)


#: what a local cluster's fork server imports once, before it forks each worker process
WORKER_IMPORTS = ["distributed", "flows.tasks"]

#: {pid: (environment, sys.path, working directory)} of the fork server this module last used
_FORK_SERVER: dict = {}


def _process_state() -> tuple:
    return dict(os.environ), list(sys.path), os.getcwd()


@contextlib.contextmanager
def forked_workers():
    """Start local worker processes from a fork server that has imported the task code once,
    instead of spawning fresh interpreters that each import it (about 5 CPU s per worker here:
    Prefect, JAX, xarray, zarr, scipy). The fork server is a single-threaded process started for
    the purpose (no fork of this multithreaded process); each worker still runs its preloads (core
    pinning) before its first task, and XLA sizes its thread pool at first use, after the pinning.

    A fork server keeps the environment, import path and working directory it started with, and
    what it imported read the environment then (JAX's cache folder, Prefect's API): one started
    in another state than this process's now is stopped, so the workers see what spawned ones
    would; while another cluster's workers still use it (it cannot stop before they end), this
    cluster's workers are spawned instead. Dask's nanny reads the start method whenever it
    (re)starts a worker, so the method is set for the cluster's life. Without the fork server's
    interface (not CPython 3.12+ on a POSIX system) the workers are spawned as before."""
    from multiprocessing import forkserver

    import dask

    server = getattr(forkserver, "_forkserver", None)
    if not all(hasattr(server, a) for a in ("_forkserver_pid", "_stop")):
        yield
        return
    from distributed.utils import get_mp_context

    pid = server._forkserver_pid
    if pid is not None and _FORK_SERVER.get(pid) != _process_state():
        if _serving(pid):  # another cluster's workers hold it open: it cannot stop before they end
            with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
                yield  # so this cluster's workers are spawned
            return
        server._stop()  # a fresh one starts with this process's state at the first worker
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        get_mp_context().set_forkserver_preload(WORKER_IMPORTS)
        yield


def _serving(pid: int) -> bool:
    """Whether the fork server ``pid`` has live workers. Each forked process holds the server's
    lifeline, so the server ends only after them: stopping it (which waits for it) would wait for
    every cluster still using it."""
    import psutil

    try:
        kids = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return False
    alive = []
    for k in kids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if k.status() != psutil.STATUS_ZOMBIE:
                alive.append(k)
    return bool(alive)


def note_fork_server() -> None:
    """Record the state a fork server started by :func:`forked_workers` inherited (call once the
    cluster's workers are up, so Dask's pre-spawn variables are in it)."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid is not None and pid not in _FORK_SERVER:
        _FORK_SERVER.clear()
        _FORK_SERVER[pid] = _process_state()


@contextlib.contextmanager
def start_cluster(spec: dict):
    """Yield (scheduler address, dashboard link, cluster or None) for a normalised spec."""
    spec = dict(spec)
    kind = spec.pop("type")
    cleanup: list[str] = []
    pin_threads()
    if kind == "address":
        check_scheduler(spec["address"], spec.get("connect_timeout", CONNECT_TIMEOUT_S))
        yield spec["address"], "", None
        return
    # the scheduler's start-up lines (its address, each nanny and worker) are not the user's news:
    # quiet from before the cluster starts (distributed sets these levels when it is imported)
    import distributed  # noqa: F401  (imported here: a sweep on a scheduler's address needs none of it)

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    with contextlib.ExitStack() as scope:  # the local cluster's start method, for its life
        if kind == "local":
            from distributed import LocalCluster

            scope.enter_context(forked_workers())
            kw = {
                "n_workers": 2,
                "silence_logs": logging.WARNING,
                "threads_per_worker": 1,
                "processes": True,
                "host": "127.0.0.1",
                "dashboard_address": "127.0.0.1:0",
                "memory_limit": "auto",
                # pin each worker to a core (bounds XLA's threads), a lost scheduler as one log line,
                # then import the task code while the workers start, not at their first task; the
                # task runs' failure records to the run's log, not the terminal (flows.errors)
                "preload": [
                    "flows.workers.pin_cores",
                    "flows.workers.heap",
                    "flows.workers.logs",
                    "flows.tasks",
                    "flows.errors",
                ],
            }
            kw.update(spec)
            cluster = LocalCluster(**kw)
            note_fork_server()
        elif kind == "slurm":
            from dask_jobqueue import SLURMCluster

            adapt = spec.pop("adapt", None)
            jobs = spec.pop("jobs", 2)
            kw = slurm_cluster_kwargs(spec)
            if "shared_temp_directory" in kw:
                cleanup.append(kw["shared_temp_directory"])
            cluster = SLURMCluster(**kw)
            cluster.adapt(**adapt) if adapt else cluster.scale(jobs=jobs)
        else:  # kubernetes
            from dask_kubernetes.operator import KubeCluster

            adapt = spec.pop("adapt", None)
            n = spec.pop("n_workers", 2)
            env = dict(worker_env(), **spec.pop("env", {}))
            # the scheduler's Service stays inside the cluster (ClusterIP); this process reaches it
            # through a port-forward on 127.0.0.1 that dask-kubernetes opens
            spec.setdefault("scheduler_service_type", "ClusterIP")
            cluster = KubeCluster(n_workers=n, env=env, **spec)
            if adapt:
                cluster.adapt(**adapt)
        try:
            yield cluster.scheduler_address, getattr(cluster, "dashboard_link", ""), cluster
        finally:
            cluster.close()
            for d in cleanup:  # this run's TLS key and certificates
                shutil.rmtree(d, ignore_errors=True)
