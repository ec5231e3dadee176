"""The sweep's cluster settings, on a real 2-process Dask LocalCluster started by the sweep's own
``start_cluster``."""

from __future__ import annotations

import os

import pytest
from distributed import Client

from flows.cluster import compile_cache_env, normalise_cluster, start_cluster
from lvmcore.chunks import scheduler_workers


def test_compile_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache_env() == {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "embed-sweep" / "jax")}
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = str(tmp_path / "home" / ".cache" / "embed-sweep" / "jax")
    assert compile_cache_env() == {"JAX_COMPILATION_CACHE_DIR": expected}
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "")  # the user's way to switch it off
    assert compile_cache_env() == {"JAX_COMPILATION_CACHE_DIR": ""}


def test_a_second_worker_loads_what_the_first_compiled(monkeypatch, tmp_path):
    """The sweep's cluster gives its workers the default cache folder; worker 0 compiles a jitted
    function and writes it there; worker 1 then gets the same function from there (jax's cache-hit
    event) instead of compiling it."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "embed-sweep" / "jax"
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # cache even this small one

    def compile_once():
        import jax
        import jax.numpy as jnp
        from jax import monitoring

        events = []
        monitoring.register_event_listener(lambda name, **kw: events.append(name))
        f = jax.jit(lambda x: jnp.sin(x) @ jnp.cos(x).T + 3.0)
        value = float(f(jnp.arange(64.0).reshape(8, 8)).sum())
        return {
            "dir": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
            "hits": events.count("/jax/compilation_cache/cache_hits"),
            "misses": events.count("/jax/compilation_cache/cache_misses"),
            "value": value,
        }

    with (
        start_cluster(normalise_cluster({"type": "local", "n_workers": 2})) as (address, _, _),
        Client(address) as client,
    ):
        w0, w1 = sorted(scheduler_workers(client))
        first = client.submit(compile_once, workers=[w0], pure=False).result()
        entries = sorted(p.name for p in cache.glob("*-cache"))
        second = client.submit(compile_once, workers=[w1], pure=False).result()
    assert first["dir"] == second["dir"] == str(cache)
    assert first["hits"] == 0 and first["misses"] >= 1, first
    assert entries, f"nothing written to {cache}"
    assert second["hits"] >= 1, second
    assert second["value"] == first["value"]


def _probe_worker():
    import os

    import jax
    import psutil

    return {
        "probe": os.environ.get("EMBED_SWEEP_PROBE"),
        "jax_cache": jax.config.jax_compilation_cache_dir,
        "cwd": os.getcwd(),
        "parent": " ".join(psutil.Process().parent().cmdline()),
        "affinity": sorted(os.sched_getaffinity(0)),
    }


def _fork_scenario(tmp: str) -> dict:
    """Start local clusters as :func:`test_each_cluster_forks_its_workers_from_a_server_in_this_process_state`
    describes and return what their workers saw (run in a fresh interpreter: no other cluster of
    the test process may be holding a fork server)."""
    seen = []
    for i in range(2):
        os.environ["EMBED_SWEEP_PROBE"] = str(i)
        os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(tmp, f"cache{i}")
        if i:
            os.chdir(tmp)
        cwd = os.getcwd()
        with (
            start_cluster(normalise_cluster({"type": "local", "n_workers": 1})) as (address, _, _),
            Client(address) as client,
        ):
            (got,) = client.run(_probe_worker).values()
        seen.append(dict(got, expected_cwd=cwd))
    local = normalise_cluster({"type": "local", "n_workers": 1})
    with start_cluster(local) as (a1, _, _), Client(a1) as c1:
        os.environ["EMBED_SWEEP_PROBE"] = "2"
        with start_cluster(local) as (a2, _, _), Client(a2) as c2:
            (inner,) = c2.run(_probe_worker).values()
        (outer,) = c1.run(_probe_worker).values()
    return {"seen": seen, "inner": inner, "outer": outer, "affinity": sorted(os.sched_getaffinity(0))}


def test_each_cluster_forks_its_workers_from_a_server_in_this_process_state(tmp_path):
    """Local workers are forked from a server that imported the task code once (flows.cluster.
    forked_workers). A cluster started after the environment or the working directory changed
    gets workers that see the change, as spawned interpreters would, including what was read at
    import (JAX's cache folder); each worker is still pinned to one core. A cluster started in
    another state while one is still running gets spawned workers (the running one's workers keep
    its server alive, and stopping it would wait on them). Run in a fresh interpreter, so that no
    cluster of this test process (a session fixture's) holds a fork server already."""
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    call = f"t._fork_scenario({str(tmp_path)!r})"
    script = f"import json, tests.test_cluster as t; print('RESULT', json.dumps({call}))"
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-4000:]
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    got = json.loads(line[len("RESULT ") :])
    for i, w in enumerate(got["seen"]):
        assert "multiprocessing.forkserver" in w["parent"], w
        expected = (str(i), str(tmp_path / f"cache{i}"), w["expected_cwd"])
        assert (w["probe"], w["jax_cache"], w["cwd"]) == expected, w
        assert len(w["affinity"]) == 1 or len(got["affinity"]) == 1, w
    assert got["seen"][1]["cwd"] == str(tmp_path) != got["seen"][0]["cwd"], got["seen"]
    inner, outer = got["inner"], got["outer"]
    assert inner["probe"] == "2" and "multiprocessing.forkserver" not in inner["parent"], inner
    assert outer["probe"] == "1" and "multiprocessing.forkserver" in outer["parent"], outer


def _listening(pids):
    """(ip, port) of every listening TCP socket of these processes."""
    import psutil

    out = set()
    for pid in pids:
        for c in psutil.Process(pid).net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN:
                out.add((c.laddr.ip, c.laddr.port))
    return out


def _tree_pids():
    import psutil

    me = psutil.Process()
    return [me.pid] + [p.pid for p in me.children(recursive=True)]


def test_local_cluster_listens_on_loopback_only():
    """The sweep's default cluster: scheduler, dashboard, nannies and workers all bound to
    127.0.0.1 (no socket on 0.0.0.0 or ::)."""
    before = _listening(_tree_pids())
    with start_cluster(normalise_cluster(None)) as (address, dashboard, _), Client(address) as client:
        assert len(scheduler_workers(client)) == 2
        new = _listening(_tree_pids()) - before
    assert address.startswith("tcp://127.0.0.1:") and "127.0.0.1" in dashboard
    # scheduler + dashboard + per worker: nanny, worker (at least 6 sockets)
    assert len(new) >= 6, new
    assert {ip for ip, _ in new} == {"127.0.0.1"}, new


def test_slurm_spec_refuses_plain_tcp_beyond_loopback():
    from flows.cluster import _check_slurm_security

    with pytest.raises(ValueError, match="security=false with the scheduler listening on every interface"):
        _check_slurm_security({"type": "slurm", "security": False})
    with pytest.raises(ValueError, match="listening on 10.0.0.5"):
        _check_slurm_security({"security": False, "scheduler_options": {"host": "10.0.0.5"}})
    with pytest.raises(ValueError, match="must be true, false or a dict"):
        _check_slurm_security({"security": "yes"})
    _check_slurm_security({"security": False, "scheduler_options": {"host": "127.0.0.1"}})


def test_slurm_cluster_spec_listens_with_tls_and_dashboard_on_loopback(tmp_path, monkeypatch):
    """The SLURMCluster the sweep builds from the deployment's spec (its scheduler runs in this
    process; no job is submitted, so no Slurm is needed): the scheduler's socket may face every
    interface, but it speaks TLS only (a plain-TCP client is refused; a client with the cluster's
    certificates gets in); the dashboard is on 127.0.0.1."""
    import asyncio

    import yaml
    from dask_jobqueue import SLURMCluster
    from distributed.comm.core import CommClosedError

    from flows.cluster import slurm_cluster_kwargs

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spec = next(d for d in yaml.safe_load(open("deploy/prefect.yaml"))["deployments"] if d["name"] == "slurm")
    spec = dict(spec["parameters"]["cluster"])
    for key in ("type", "adapt", "jobs"):
        spec.pop(key, None)
    before = _listening(_tree_pids())
    with SLURMCluster(**slurm_cluster_kwargs(spec)) as cluster:
        new = _listening(_tree_pids()) - before
        address = cluster.scheduler_address
        assert address.startswith("tls://"), address
        port = int(address.rsplit(":", 1)[1])
        dash = {(ip, p) for ip, p in new if p != port}
        assert dash and {ip for ip, _ in dash} == {"127.0.0.1"}, new
        assert "--tls-cert" in cluster.job_script() and "tls://" in cluster.job_script()
        run_dirs = list((tmp_path / "embed-sweep" / "tls").glob("run-*"))
        assert len(run_dirs) == 1 and any(run_dirs[0].iterdir())  # the workers' copy of the certs
        assert run_dirs[0].stat().st_mode & 0o077 == 0

        async def plain_tcp():
            from distributed.comm import connect

            comm = await connect(f"tcp://127.0.0.1:{port}", timeout=5)
            await comm.write({"op": "identity"})
            return await comm.read()

        with pytest.raises((CommClosedError, OSError, asyncio.TimeoutError)):
            asyncio.run(plain_tcp())
        with Client(cluster, timeout=20) as client:  # with the certificates: accepted
            assert client.scheduler_info()["address"] == address


def test_worker_heartbeat_to_a_lost_scheduler_logs_one_line():
    """The worker preload flows.workers.logs: distributed's heartbeat failure on a closed connection
    (an OSError) is logged without its traceback, the message kept; any other record from the
    worker's logger keeps its traceback."""
    import io
    import logging

    from distributed.comm.core import CommClosedError

    from flows.workers import logs as worker_logs

    log = logging.getLogger("distributed.worker")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    log.addHandler(handler)
    try:
        worker_logs.install()
        worker_logs.install()  # idempotent: one filter
        assert sum(isinstance(f, worker_logs.OneLineLostScheduler) for f in log.filters) == 1
        try:
            raise CommClosedError("in <TCP (closed) ConnectionPool.heartbeat_worker>: Stream is closed")
        except OSError:
            log.exception("Failed to communicate with scheduler during heartbeat.")
        lost = out.getvalue()
        assert "Failed to communicate with scheduler during heartbeat." in lost
        assert "Traceback" not in lost and "Stream is closed" not in lost
        try:
            raise RuntimeError("a real failure")
        except RuntimeError:
            log.exception("Unexpected exception during heartbeat. Closing worker.")
        assert "Traceback" in out.getvalue()[len(lost) :] and "a real failure" in out.getvalue()
    finally:
        log.removeHandler(handler)
        log.filters = [f for f in log.filters if not isinstance(f, worker_logs.OneLineLostScheduler)]
