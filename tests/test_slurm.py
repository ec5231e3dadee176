"""The Slurm deployment against a real Slurm: a one-node cluster (munged, slurmctld, slurmd on
127.0.0.1; tests/slurm_local.py), a Prefect server, `prefect deploy` of deploy/prefect.yaml,
`prefect deployment run 'embed-sweep/slurm'` and a process worker. The flow starts dask-jobqueue's
SLURMCluster (TLS on, the deployment's default); its jobs must appear in `squeue` and the store must
come back complete. In CI (CI=true) a missing Slurm is a failure, never a skip."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

from tests.prefect_server import PREFECT, pointed_at
from tests.slurm_local import missing, one_node_slurm

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = missing()
    if why:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the real-Slurm test, but {why}; .ci/run installs it with apt")
        pytest.skip(why)
    with one_node_slurm(tmp_path_factory.mktemp("slurm")) as env:
        yield env


def _run(cmd, env, timeout=300):
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def test_slurm_deployment_runs_jobs_in_squeue_and_completes_the_store(slurm, prefect_api, tmp_path):
    extra = {
        "EMBED_SWEEP_HOME": str(ROOT),
        "SLURM_CONF": slurm["SLURM_CONF"],
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # the run's TLS certificates go here
    }
    env = dict(prefect_api, **extra)  # the test run's Prefect server (tests/conftest.py)
    _run([PREFECT, "work-pool", "create", "slurm-pool", "--type", "process", "--overwrite"], env)
    out = _run(
        [PREFECT, "--no-prompt", "deploy", "--name", "slurm", "--prefect-file", "deploy/prefect.yaml"],
        env,
    )
    assert "embed-sweep/slurm" in out
    # the deployment's cluster spec, with job sizes that fit this 1-node, 2-core "cluster"
    deployed = yaml.safe_load((ROOT / "deploy" / "prefect.yaml").read_text())["deployments"]
    cluster = dict(next(d for d in deployed if d["name"] == "slurm")["parameters"]["cluster"])
    assert cluster["type"] == "slurm" and "security" not in cluster  # TLS by default
    cluster.update(
        cores=1,
        processes=1,
        memory="2GB",
        walltime="00:20:00",
        job_name="embed-sweep-test",
        log_directory=str(tmp_path / "slurm-logs"),
        adapt={"minimum_jobs": 2, "maximum_jobs": 2},
    )
    store = tmp_path / "slurm.zarr"
    grid = {"k": [6, 8], "latent_dim": [1, 2], "seed": [0]}
    out = _run(
        [
            PREFECT,
            "deployment",
            "run",
            "embed-sweep/slurm",
            "--param",
            f"store={store}",
            "--param",
            'models=["ppca", "glle_em"]',
            "--param",
            f"grid={json.dumps(grid)}",
            "--param",
            'dataset={"name": "swiss_roll", "n": 300, "seed": 5}',
            "--param",
            f"cluster={json.dumps(cluster)}",
            "--param",
            "report=false",
        ],
        env,
    )
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)
    wlog = open(tmp_path / "worker.log", "w")  # noqa: SIM115
    worker = subprocess.Popen(
        [PREFECT, "worker", "start", "--pool", "slurm-pool", "--type", "process", "--run-once"],
        env=env,
        cwd=ROOT,
        stdout=wlog,
        stderr=subprocess.STDOUT,
    )
    seen = set()
    try:
        t0 = time.time()
        while worker.poll() is None and time.time() - t0 < 900:
            q = subprocess.run(
                ["squeue", "-h", "-o", "%i %j %T"], env=env, capture_output=True, text=True
            ).stdout
            seen |= {line for line in q.splitlines() if "embed-sweep-test" in line}
            time.sleep(0.5)
        assert worker.poll() is not None, "the Prefect worker did not finish in 900 s"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        wlog.close()
    wout = (tmp_path / "worker.log").read_text()
    from prefect import get_client

    with pointed_at(prefect_api), get_client(sync_client=True) as client:  # not a `prefect` process
        state = client.read_flow_run(run_id).state
    assert state.is_completed(), (state, wout[-4000:])
    jobs = {line.split()[0] for line in seen}
    assert len(jobs) >= 2, seen  # the two dask-jobqueue jobs, seen by squeue
    assert any(line.endswith("RUNNING") for line in seen), seen
    scripts = list((tmp_path / "slurm-logs").glob("*"))
    assert scripts, "no Slurm job log: the jobs did not run"
    assert "tls://" in "".join(p.read_text() for p in scripts)  # the workers connected with TLS

    tree = xr.open_datatree(store, engine="zarr", consolidated=False)
    assert set(tree.children) == {"ppca", "glle_em"}
    for key in ("ppca", "glle_em"):
        ds = tree[key].ds
        assert ds.sizes["point"] == 300
        assert np.all(ds["status"].values == 1), (key, ds["status"].values, ds["error"].values)
        for q in (1, 2):  # components beyond latent_dim are padding (NaN)
            assert np.isfinite(ds["embedding"].sel(latent_dim=q).values[..., :q]).all()
    assert dict(tree["glle_em"].ds["status"].sizes) == {"k": 2, "latent_dim": 2, "seed": 1}
