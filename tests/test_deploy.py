"""End to end with real parts: a Prefect server on 127.0.0.1, a process work pool, `prefect deploy`
from deploy/prefect.yaml, `prefect deployment run` (as users run sweeps), one worker with
--run-once that takes every scheduled run, and what the runs leave read back: the result store as
an xarray DataTree, the flow runs' states, logs and artifacts through the Prefect client."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from tests.failing_sweep import FAILED_MESSAGE, assert_failed_in_prefect, flow_run_logs, write_plane_csv
from tests.prefect_server import PREFECT, pointed_at

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(prefect_api):
    """The test run's Prefect server (tests/conftest.py), with the project's path for the
    deployment's pull step."""
    return dict(prefect_api, EMBED_SWEEP_HOME=str(ROOT))


def _run(args, env, timeout=300):
    r = subprocess.run([PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"prefect {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def _deployment_run(env, params: dict) -> str:
    """`prefect deployment run embed-sweep/local --param k=v ...`; returns the flow run's id."""
    args = ["deployment", "run", "embed-sweep/local"]
    for k, v in params.items():
        args += ["--param", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    return re.search(r"UUID:\s*([0-9a-f-]{36})", _run(args, env)).group(1)


def _create_process_pools(env, names):
    """What `prefect work-pool create NAME --type process --overwrite` does, through the client."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    with pointed_at(env), get_client(sync_client=True) as client:
        for name in names:
            template = ProcessWorker.get_default_base_job_template()
            client.create_work_pool(
                WorkPoolCreate(name=name, type="process", base_job_template=template), overwrite=True
            )
        assert [client.read_work_pool(name).type for name in names] == ["process"] * len(names)


@pytest.fixture(scope="module")
def runs(server, sweep_cluster, tmp_path_factory):
    """Both deployment runs of this module, taken by one worker (--run-once polls once, starts every
    scheduled run, and waits for them): a sweep that completes on the flow's own local cluster, and
    one whose every point fails (PPCA with latent_dim 2 on points that lie in a plane: its
    covariance is singular there) on a running scheduler given by address, as a user's own (with
    the deployment's entrypoint a file path, that run failed to unpickle the flow's tasks there)."""
    env = server
    tmp = tmp_path_factory.mktemp("deploy")
    # the pool the runs below take, with the command of docs/sweeps.md; the other two only so that `deploy
    # --all` finds every pool the file names: made through the client as that command makes them
    # (a process pool with the process worker's default job template), not by a `prefect` process
    # each (2.5 CPU s, 4-5 s; test_slurm creates and uses slurm-pool with the command)
    _run(["work-pool", "create", "local-pool", "--type", "process", "--overwrite"], env)
    _create_process_pools(env, ["slurm-pool", "k8s-pool"])
    out = _run(["--no-prompt", "deploy", "--all", "--prefect-file", "deploy/prefect.yaml"], env)
    assert "embed-sweep/local" in out
    ok_store = tmp / "deployed.zarr"
    ok = _deployment_run(
        env,
        {
            "store": str(ok_store),
            "models": ["ppca", "lllvm"],
            "model_options": {"lllvm": {"max_iter": 3}},
            "grid": {"k": [6, 8], "latent_dim": [1, 2], "seed": [0]},
            "dataset": {"name": "swiss_roll", "n": 200, "seed": 3},
            "report": False,
        },
    )
    bad_store = tmp / "plane.zarr"
    bad = _deployment_run(
        env,
        {
            "store": str(bad_store),
            "models": ["ppca"],
            "grid": {"latent_dim": [2], "seed": [0, 1]},
            "dataset": write_plane_csv(tmp / "plane.csv"),
            "cluster": {"address": sweep_cluster},
            "report": False,
        },
    )
    wout = _run(
        ["worker", "start", "--pool", "local-pool", "--type", "process", "--run-once"], env, timeout=600
    )
    return {"ok": (ok, ok_store), "bad": (bad, bad_store), "worker": wout}


def test_deployment_run_completes_and_store_is_complete(server, runs):
    from prefect import get_client

    run_id, store = runs["ok"]
    with pointed_at(server), get_client(sync_client=True) as client:  # not a `prefect` process (4 CPU s)
        state = client.read_flow_run(run_id).state
    assert state.is_completed(), (state, runs["worker"][-4000:])

    tree = xr.open_datatree(store, engine="zarr", consolidated=False)
    assert set(tree.children) == {"ppca", "lllvm"}
    ppca = tree["ppca"].ds
    assert dict(ppca["status"].sizes) == {"latent_dim": 2, "seed": 1}
    assert "k" not in ppca.dims  # k does not apply to PPCA
    lllvm = tree["lllvm"].ds
    assert dict(lllvm["status"].sizes) == {"k": 2, "latent_dim": 2, "seed": 1}
    for ds in (ppca, lllvm):
        assert ds.sizes["point"] == 200
        # every grid point done (a failed one would carry its reason in `error`)
        st = ds["status"].values
        assert np.all(st == 1), ds["error"].values[st != 1]
        assert np.isfinite(ds["elbo"].values).all()
    assert json.loads(tree.attrs["identity"])["grid"]["k"] == [6, 8]


def test_a_deployment_run_whose_every_point_fails_ends_failed_with_counts_and_reasons(server, runs):
    """Issue 36 W6 where users meet it: a scheduled sweep that fails every point must not look green."""
    from prefect import get_client

    run_id, store = runs["bad"]
    with pointed_at(server), get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        assert run.state.is_failed(), (run.state, runs["worker"][-4000:])
        assert run.state.message == FAILED_MESSAGE
        own = flow_run_logs(client, run.id)  # the deployment's flow run: its end state with the counts
        assert f"Finished in state Failed('{FAILED_MESSAGE}')" in own, own
        assert_failed_in_prefect(client, run.id, store)
    st = xr.open_datatree(store, engine="zarr", consolidated=False)["ppca"].ds["status"].values
    assert (st == 2).all()  # both points recorded as failed, none as done
