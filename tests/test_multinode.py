"""A sweep on a Dask cluster assembled the way a multi-node cluster is: a `dask scheduler` process
and two `dask worker` processes started separately, each with its own environment (HOME, TMPDIR,
caches) and local directory, passed to the sweep as ``cluster="tcp://..."``. One worker is
SIGKILLed while it runs a grid point (no nanny brings it back, as when a node is lost); the sweep
completes on the other and the store equals a sweep run on the default local cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from flows.server import free_port
from flows.sweep import embed_sweep
from lvmcore.chunks import scheduler_workers
from tasks.store import read_status
from tests.polling import wait_until
from tests.prefect_server import pointed_at

ROOT = Path(__file__).resolve().parents[1]
DASK = str(Path(sys.executable).with_name("dask"))
DATASET = {"name": "swiss_roll", "n": 600, "seed": 4}
MODELS = ["ppca"]
GRID = {"latent_dim": [1, 2], "seed": list(range(8))}
N_POINTS = 16
COMPARE = ["embedding", "elbo", "trustworthiness", "continuity"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(prefect_api):
    with pointed_at(prefect_api, keys=("PREFECT_API_URL",)) as env:
        yield env


def _node_env(base: Path, api_url: str) -> dict:
    """What a separate node would have: its own home, temp and cache folders; only the project's
    environment and the Prefect API address in common."""
    for d in ("home", "tmp", "cache"):
        (base / d).mkdir(parents=True, exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL")}
    return dict(
        keep,
        HOME=str(base / "home"),
        TMPDIR=str(base / "tmp"),
        XDG_CACHE_HOME=str(base / "cache"),
        JAX_COMPILATION_CACHE_DIR=str(base / "cache" / "jax"),
        PREFECT_API_URL=api_url,
        PREFECT_HOME=str(base / "home" / ".prefect"),
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )


@pytest.fixture
def separate_cluster(env, tmp_path):
    """`dask scheduler` + two `dask worker --no-nanny` processes, each in its own session."""
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = {}
    logs = []

    def start(name, args, node):
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115
        logs.append(log)
        node.mkdir(parents=True, exist_ok=True)
        procs[name] = subprocess.Popen(
            [DASK, *args],
            cwd=node,
            env=_node_env(node, env["PREFECT_API_URL"]),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    start(
        "scheduler",
        ["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
        tmp_path / "node-s",
    )
    for i in (1, 2):
        node = tmp_path / f"node-{i}"
        start(
            f"worker{i}",
            [
                "worker",
                address,
                "--name",
                f"node-{i}",
                "--nthreads",
                "1",
                "--no-nanny",
                "--no-dashboard",
                "--host",
                "127.0.0.1",
                "--local-directory",
                str(node / "dask-scratch"),
            ],
            node,
        )
    try:
        with Client(address, timeout=60) as client:
            wait_until(lambda: len(scheduler_workers(client)) == 2, 90, "two workers")
            yield address, procs, client
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in logs:
            log.close()


def _n_done(store):
    try:
        return int(np.sum(read_status(store, "ppca") == 1))
    except Exception:  # the store is not created yet
        return 0


def test_sweep_on_separately_started_scheduler_and_workers_survives_a_lost_worker(
    env, separate_cluster, sweep_cluster, tmp_path
):
    address, procs, client = separate_cluster
    workers = scheduler_workers(client)
    local_dirs = {w["name"]: w.get("local_directory", "") for w in workers.values()}
    assert all(f"{n}/dask-scratch" in d for n, d in local_dirs.items()), local_dirs
    pid_of = {"node-1": procs["worker1"].pid, "node-2": procs["worker2"].pid}  # no nanny in between

    store = tmp_path / "multi.zarr"
    code = (
        "import json, sys; from flows.sweep import embed_sweep; "
        f"embed_sweep(dataset={DATASET!r}, models={MODELS!r}, grid=json.loads(sys.argv[1]), "
        "store=sys.argv[2], report=False, points_per_task=1, cluster=sys.argv[3])"
    )
    flow = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(GRID), str(store), address],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        victim = {}

        def fitting():  # a worker running a grid-point task while some points are already stored
            if flow.poll() is not None:
                raise AssertionError("the flow ended before the fault could be injected")
            if _n_done(store) < 2:
                return False
            by_addr = {a: w["name"] for a, w in scheduler_workers(client).items()}
            for addr, keys in client.processing().items():
                if keys:  # past ingest and kNN, every task is a grid point
                    victim["name"] = by_addr[addr]
                    return True
            return False

        wait_until(fitting, 300, "a worker running a grid point")
        killed_at = _n_done(store)
        os.kill(pid_of[victim["name"]], signal.SIGKILL)
        out, _ = flow.communicate(timeout=400)
        assert flow.returncode == 0, out.decode()[-3000:]
    finally:
        if flow.poll() is None:
            os.killpg(flow.pid, signal.SIGKILL)
    assert killed_at < N_POINTS, "the sweep finished before the worker was killed"
    survivors = [w["name"] for w in scheduler_workers(client).values()]
    assert survivors == [n for n in ("node-1", "node-2") if n != victim["name"]]

    # the reference: the flow's default local cluster (the test process's, tests/conftest.py), in
    # the flow's own batches; a point's result depends on its data and seed only
    reference = tmp_path / "reference.zarr"
    embed_sweep(
        dataset=DATASET, models=MODELS, grid=GRID, store=str(reference), report=False, cluster=sweep_cluster
    )
    got = xr.open_datatree(store, engine="zarr", consolidated=False)["ppca"].ds.load()
    ref = xr.open_datatree(reference, engine="zarr", consolidated=False)["ppca"].ds.load()
    assert np.all(got["status"].values == 1), got["status"].values
    assert not any(got["error"].values.ravel())
    for name in COMPARE:
        np.testing.assert_allclose(got[name].values, ref[name].values, rtol=1e-10, atol=1e-12, err_msg=name)
