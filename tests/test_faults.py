"""Fault tolerance with real parts: SIGKILL a Dask worker process during a sweep, and separately
SIGKILL the flow process (alone, or with its Dask workers) at ten moments; after a re-run every
grid point is done exactly once and equals an uninterrupted run's result."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import xarray as xr

from flows.sweep import embed_sweep
from tasks.store import read_status
from tests.flow_fork import Launcher
from tests.prefect_server import pointed_at

ROOT = Path(__file__).resolve().parents[1]
DATASET = {"name": "swiss_roll", "n": 600, "seed": 2}
MODELS = ["ppca"]
GRID = {"latent_dim": [1, 2], "seed": list(range(10))}
N_POINTS = 20
COMPARE = ["embedding", "elbo", "trustworthiness", "continuity", "shepard_goodness", "procrustes_disparity"]


@pytest.fixture(scope="module")
def env(prefect_api):
    with pointed_at(prefect_api, keys=("PREFECT_API_URL",)) as env:
        yield env


def _rerun(store, cluster):
    """The re-run after the faults, in process on the test process's sweep cluster (what is
    checked is what it finds left to do and the store it leaves, not its cluster)."""
    return embed_sweep(
        dataset=DATASET, models=MODELS, grid=GRID, store=str(store), report=False, cluster=cluster
    )


@pytest.fixture(scope="module")
def launcher(env):
    """Forks each flow process of this module from one interpreter that imported flows.sweep
    (tests/flow_fork.py): a process of its own, in its own session, with its own cluster."""
    la = Launcher(env, ROOT)
    yield la
    la.close()


def _start_flow(store, launcher):
    return launcher.start(
        dataset=DATASET, models=MODELS, grid=GRID, store=str(store), report=False, points_per_task=1
    )


def _n_done(store):
    try:
        return int(np.sum(read_status(store, "ppca") == 1))
    except Exception:  # the store is not created yet
        return 0


def _wait_for(store, proc, at_least, timeout=240):
    t0 = time.time()
    while time.time() - t0 < timeout:
        n = _n_done(store)
        if n >= at_least:
            return n
        assert proc.poll() is None, "the flow ended before the fault could be injected"
        time.sleep(0.2)
    raise AssertionError(f"fewer than {at_least} grid points done after {timeout} s")


def _assert_same(store, reference):
    got = xr.open_datatree(store, engine="zarr", consolidated=False)["ppca"].ds.load()
    ref = xr.open_datatree(reference, engine="zarr", consolidated=False)["ppca"].ds.load()
    assert np.all(got["status"].values == 1), got["status"].values
    assert not any(got["error"].values.ravel())
    for name in COMPARE:
        np.testing.assert_allclose(got[name].values, ref[name].values, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.fixture(scope="module")
def reference(env, sweep_cluster, tmp_path_factory):
    """The uninterrupted run, on the test process's sweep cluster in the flow's own batches: a
    grid point's result depends on its data and seed only, not on the cluster or its task."""
    store = tmp_path_factory.mktemp("ref") / "ref.zarr"
    res = embed_sweep(
        dataset=DATASET, models=MODELS, grid=GRID, store=str(store), report=False, cluster=sweep_cluster
    )
    assert res["done"] == N_POINTS
    return store


def _worker_processes(pid):
    """The local cluster's Dask worker processes among ``pid``'s descendants: the children of its
    fork server (flows.cluster.forked_workers), or spawned interpreters."""
    cmd = lambda p: " ".join(p.cmdline())  # noqa: E731
    out = []
    for p in psutil.Process(pid).children(recursive=True):
        forked = "multiprocessing.forkserver" in cmd(p) and "multiprocessing.forkserver" in cmd(p.parent())
        if forked or "spawn_main" in cmd(p):
            out.append(p)
    return out


def test_killing_a_dask_worker_mid_sweep_loses_nothing(launcher, reference, sweep_cluster, tmp_path):
    store = tmp_path / "s.zarr"
    proc = _start_flow(store, launcher)
    try:
        _wait_for(store, proc, 3)
        workers = _worker_processes(proc.pid)
        assert len(workers) >= 2, [p.cmdline() for p in workers]
        os.kill(workers[0].pid, signal.SIGKILL)
        killed_at = _n_done(store)
        assert proc.wait(timeout=300) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed_at < N_POINTS, "the sweep finished before the worker was killed"
    res = _rerun(store, sweep_cluster)  # a re-run finds nothing left to do
    assert res["ran"] == 0
    _assert_same(store, reference)


def _descendants(pid):
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _done_stamps(store):
    """{status chunk file: mtime_ns} of every grid point marked done (a cell is one chunk)."""
    status = read_status(store, "ppca")
    out = {}
    for idx in zip(*np.nonzero(status == 1)):
        f = Path(store) / "ppca" / "status" / "c" / "/".join(str(int(i)) for i in idx)
        out[str(f)] = f.stat().st_mtime_ns
    return out


def _kill_when(kind, store, proc, rng):
    """Wait for the moment to inject the fault: during the store's set-up (its temporary folder
    exists), just after a region write (one more point done; ``group`` too), or a seeded random
    time."""
    if kind == "setup":
        t0 = time.time()
        while time.time() - t0 < 240 and proc.poll() is None:
            if list(store.parent.glob(f".{store.name}.setup-*")) or store.exists():
                return
            time.sleep(0.001)
    elif kind in ("write", "group"):
        start, t0 = _n_done(store), time.time()
        while time.time() - t0 < 240 and proc.poll() is None and _n_done(store) <= start:
            time.sleep(0.02)  # a status read costs milliseconds: a tighter loop takes a core from the flow
    else:  # the drawn time, or sooner if the flow has ended by then (a kill then has nothing to hit)
        end = time.time() + float(rng.uniform(0.0, 14.0))
        while time.time() < end and proc.poll() is None:
            time.sleep(0.02)


@pytest.mark.slow
def test_sigkill_of_the_flow_at_ten_seeded_moments_then_rerun(launcher, reference, sweep_cluster, tmp_path):
    """Issue 21: SIGKILL the flow process at ten seeded moments, including during store set-up
    and right at a region write, re-running after each: nine times the flow process alone (its
    Dask workers must end on their own), once its whole process group (the flow and its workers
    at once, as a node's loss). Every grid point ends done exactly once (a done cell is never
    written again) and equal to an uninterrupted run; no process is left behind."""
    store = tmp_path / "s.zarr"
    rng = np.random.default_rng(21)
    kinds = ["setup", "write", "random", "write", "group", "random", "write", "random", "random", "random"]
    stamps = {}
    for kind in kinds:
        proc = _start_flow(store, launcher)
        try:
            _kill_when(kind, store, proc, rng)
            kids = _descendants(proc.pid)
            if kind == "group":
                with contextlib.suppress(ProcessLookupError):  # (a sweep already finished has no group)
                    os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.send_signal(signal.SIGKILL)  # the flow process alone, not its process group
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(kids, timeout=40)
        for q in alive:
            q.kill()
        assert not alive, [" ".join(q.cmdline())[:100] for q in alive]
        if store.exists():
            now = _done_stamps(store)
            for f, t in stamps.items():  # done once: never rewritten by a later run
                assert now.get(f) == t, f
            stamps.update(now)
    pending = int((read_status(store, "ppca") == 0).sum()) if store.exists() else N_POINTS
    res = _rerun(store, sweep_cluster)
    assert res["ran"] == pending and res["failed"] == 0
    assert not list(tmp_path.glob(".s.zarr.setup-*"))
    now = _done_stamps(store)
    assert all(now[f] == t for f, t in stamps.items())
    _assert_same(store, reference)
