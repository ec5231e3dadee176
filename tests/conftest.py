"""Shared test settings: one BLAS thread (the test machine has 2 cores shared by several jobs)."""

import os
import sys

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

# Each test process keeps two 2-worker clusters and a Prefect server alive for the whole run, and
# most pipeline tests start more; idle, a Dask process spends its CPU on the statistical profiler
# (a stack sample every 10 ms), the event-loop tick (20 ms), the system monitor (0.5 s) and the
# nanny's memory poll (0.1 s): these four settings cut that (bench/README.md, "Test-suite time").
# Nothing in the tests reads the profiles or depends on those intervals; the variables reach every
# process the tests start (the CLI's and the flows' clusters, Slurm jobs).
_DASK_IDLE = {
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "2s",
    "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "1s",
}
for _k, _v in _DASK_IDLE.items():
    os.environ.setdefault(_k, _v)
if "dask.config" in sys.modules:  # imported before this file (a plugin): re-read the variables
    import dask.config

    dask.config.refresh()

# the sweep's workers use jax's persistent compilation cache (flows.cluster.compile_cache_env); the
# tests keep theirs in a fresh folder of this run, not in the user's ~/.cache
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="embed-sweep-test-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

# likewise the native psi2 kernel (lvmcore.psi.native) is built once per test run, into a fresh folder
if "EMBED_SWEEP_NATIVE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["EMBED_SWEEP_NATIVE_DIR"] = tempfile.mkdtemp(prefix="embed-sweep-test-native-")
    atexit.register(shutil.rmtree, os.environ["EMBED_SWEEP_NATIVE_DIR"], ignore_errors=True)


# a Prefect database that a server of this run has migrated, copied into the other fresh Prefect
# homes the tests start servers on (tests/prefect_server.py: ~7 CPU s less per server start)
if "EMBED_SWEEP_TEST_PREFECT_TEMPLATE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["EMBED_SWEEP_TEST_PREFECT_TEMPLATE"] = tempfile.mkdtemp(prefix="embed-sweep-test-prefect-db-")
    atexit.register(shutil.rmtree, os.environ["EMBED_SWEEP_TEST_PREFECT_TEMPLATE"], ignore_errors=True)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def shared_cluster():
    """One real 2-process Dask LocalCluster (one thread per worker) per test process (``.ci/test``
    runs two, pytest-xdist), without a client: its start and each worker's imports and
    compilations are paid once, not per module or test. A test connects with
    ``Client(shared_cluster)`` for as long as it needs one (the client is Dask's default only
    while it is open). Tests that kill workers or need other worker settings start their own."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as lc:
        yield lc


@pytest.fixture(scope="module")
def cluster_client(shared_cluster):
    """A client of the shared cluster, the default client for the rest of the module."""
    from distributed import Client

    with Client(shared_cluster) as client:
        yield client


#: {"url": ..., "home": ...} of the test run's Prefect server when pytest-xdist's controller started it
SHARED_PREFECT = "EMBED_SWEEP_TEST_PREFECT_SERVER"
_shared_server: list = []  # (process, log, home) in the controller


def pytest_configure(config):
    """Under pytest-xdist (.ci/test: two test processes), the controller starts the run's one
    Prefect server before it starts the test processes, and stops it when they have ended: each
    process had its own (a start, 8-14 CPU s, and ~1.1 CPU s a minute idle for the whole run); the
    processes find it through ``$EMBED_SWEEP_TEST_PREFECT_SERVER`` (``prefect_api``). The start is
    not waited for here: the processes collect meanwhile, and the first to need it waits."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    if os.environ.get(SHARED_PREFECT):
        return
    import json
    import tempfile
    from pathlib import Path

    from tests.prefect_server import start_server

    home = Path(tempfile.mkdtemp(prefix="embed-sweep-test-prefect-home-"))
    proc, log, env, seeded = start_server(home)
    _shared_server.append((proc, log, home))
    os.environ[SHARED_PREFECT] = json.dumps({"url": env["PREFECT_API_URL"], "home": str(home)})


def pytest_unconfigure(config):
    if not _shared_server:
        return
    import shutil

    from tests.prefect_server import stop_server

    while _shared_server:
        proc, log, home = _shared_server.pop()
        stop_server(proc, log)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """One real Prefect API server for every module that needs one (its start costs 10-35 s on the
    test machine): the run's, started by pytest-xdist's controller (``pytest_configure``), else
    this process's own; a module points itself at it with ``tests.prefect_server.pointed_at``, or
    passes its environment to the commands it starts. Flow runs and artifacts are told apart by
    store path; work pools are created with ``--overwrite``."""
    from tests.prefect_server import prefect_server

    shared = os.environ.get(SHARED_PREFECT)
    if not shared:
        with prefect_server(tmp_path_factory.mktemp("prefect-home")) as env:
            yield env
        return
    import json
    from pathlib import Path

    from flows.server import flush_prefect_logs, wait_healthy
    from tests.prefect_server import _save_template, server_env

    where = json.loads(shared)
    wait_healthy(where["url"])
    _save_template(Path(where["home"]))  # the first process here saves it; a no-op once saved
    try:
        yield server_env(where["home"], where["url"])
    finally:
        flush_prefect_logs()  # this process's buffered run logs, while the server is up


@pytest.fixture(scope="session")
def prefect_template(prefect_api):
    """The folder of this run's template Prefect database (saved by the first server of the run;
    this process's own server, at the latest): ``tests.prefect_server.seed_home`` copies it into
    a fresh PREFECT_HOME that a command under test will start its own server on."""
    from tests.prefect_server import TEMPLATE_ENV

    return os.environ[TEMPLATE_ENV]


@pytest.fixture(scope="session")
def sweep_cluster(prefect_api):
    """The flow's own default local cluster (``flows.cluster.start_cluster``: two worker
    processes), started once per test process for every module whose sweeps are not about the
    cluster; they reach it by address, as a user's scheduler, instead of each starting and
    stopping one (5-20 s and two workers' imports and compilations each). Its workers point at
    the test run's Prefect server."""
    from flows.cluster import normalise_cluster, start_cluster
    from tests.prefect_server import pointed_at

    with pointed_at(prefect_api, keys=("PREFECT_API_URL",)):
        with start_cluster(normalise_cluster(None)) as (address, _, _):
            yield address


# The longest modules first (longest-processing-time order): .ci/test runs two processes that take
# whole files in collection order (xdist's own reorder, by test count, is switched off there), and a
# long file taken late leaves one process running it alone at the end. tests/durations.json holds
# each file's measured wall seconds (python -m bench.suite.cpu --write-durations refreshes it); a file
# it does not know yet goes first.
def pytest_collection_modifyitems(session, config, items):
    import json

    path = os.path.join(os.path.dirname(__file__), "durations.json")
    with open(path) as f:
        seconds = json.load(f)
    items.sort(key=lambda item: -seconds.get(item.path.name, float("inf")))  # stable: modules stay whole


def _tree_cpu() -> dict:
    """CPU seconds so far of this process and every process under it, by (pid, start time); a
    process's reaped children are in its own figure."""
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[(p.pid, p.create_time())] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With EMBED_SWEEP_TEST_CPU=FILE, one JSON line per test: its wall seconds and the CPU seconds
    its process tree spent (the servers, clusters and commands it started included), the figure
    the 2-core suite budget is made of (``--durations`` gives only wall time)."""
    path = os.environ.get("EMBED_SWEEP_TEST_CPU")
    if not path:
        yield
        return
    import json
    import time

    before, t0 = _tree_cpu(), time.perf_counter()
    yield
    after = _tree_cpu()
    # totals, not per-process deltas: a process reaped during the test leaves ``before`` and its
    # whole CPU enters its parent's children figure, so only its remainder is counted again
    cpu = sum(after.values()) - sum(before.values())
    with open(path, "a") as f:
        f.write(json.dumps({"test": item.nodeid, "wall": time.perf_counter() - t0, "cpu": cpu}) + "\n")
