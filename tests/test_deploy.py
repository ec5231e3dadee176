"""End to end with real parts: a Prefect server on 127.0.0.1, a process work pool, `prefect deploy`
from deploy/prefect.yaml, `prefect deployment run`, a worker with --run-once, and the result
store read back as an xarray DataTree."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from tests.prefect_server import PREFECT

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


def test_deployment_run_completes_and_store_is_complete(server, tmp_path):
    env = server
    for pool in ("local-pool", "slurm-pool", "k8s-pool"):
        _run(["work-pool", "create", pool, "--type", "process", "--overwrite"], env)
    out = _run(["--no-prompt", "deploy", "--all", "--prefect-file", "deploy/prefect.yaml"], env)
    assert "embed-sweep/local" in out
    store = tmp_path / "deployed.zarr"
    grid = {"k": [6, 8], "latent_dim": [1, 2], "seed": [0]}
    out = _run(
        [
            "deployment",
            "run",
            "embed-sweep/local",
            "--param",
            f"store={store}",
            "--param",
            'models=["ppca", "lllvm"]',
            "--param",
            'model_options={"lllvm": {"max_iter": 3}}',
            "--param",
            f"grid={json.dumps(grid)}",
            "--param",
            'dataset={"name": "swiss_roll", "n": 200, "seed": 3}',
            "--param",
            "report=false",
        ],
        env,
    )
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)
    wout = _run(
        ["worker", "start", "--pool", "local-pool", "--type", "process", "--run-once"], env, timeout=600
    )
    info = _run(["flow-run", "inspect", run_id], env)
    assert "COMPLETED" in info, wout[-4000:]

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
