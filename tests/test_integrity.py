"""Nothing silently wrong (issue 21): inputs tied to their data, files read as they are, refusals
before any server or cluster starts, exit codes, retry of failed points, atomic store set-up and
the store lock. Real zarr stores, a real Prefect server and real Dask clusters throughout."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from flows.cli import main as cli_main
from flows.sweep import embed_sweep, input_paths
from lvmcore.data import ingest, load
from lvmcore.graph import knn
from tasks.store import inputs_dir, lock_path, read_status, store_path
from tests.prefect_server import pointed_at
from tests.results_store import hold_lock

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(prefect_api):
    with pointed_at(prefect_api) as env:
        yield env


# ---------------------------------------------------------------- 1. inputs tied to their data


@pytest.mark.slow
def test_a_leftover_graph_of_other_data_is_never_fitted_on(server, sweep_cluster, tmp_path):
    """The reproduction: a Swiss-roll sweep into x.zarr, x.zarr deleted, an S-curve sweep into
    x.zarr. The S-curve's graph must be the S-curve's kNN graph (main reused the roll's)."""
    store = tmp_path / "x.zarr"
    grid = {"k": [8], "latent_dim": [2], "seed": [0]}
    roll = {"name": "swiss_roll", "n": 300, "seed": 0}
    curve = {"name": "s_curve", "n": 300, "seed": 0}
    kw = {"models": ["glle_em"], "grid": grid, "store": str(store), "report": False, "n_generations": 0}
    embed_sweep(dataset=roll, cluster=sweep_cluster, **kw)
    import shutil

    shutil.rmtree(store)
    res = embed_sweep(dataset=curve, cluster=sweep_cluster, **kw)  # the same workers, other data
    assert res["done"] == 1
    data_path, graph_path = input_paths(str(store))
    Y = load("s_curve", n=300, seed=0)["Y"].values
    np.testing.assert_array_equal(xr.open_zarr(data_path, consolidated=False)["Y"].values, Y)
    want, _ = knn(Y, 8)
    got = xr.open_zarr(graph_path, consolidated=False)["indices"].values
    np.testing.assert_array_equal(got, want)


def test_graph_of_other_data_at_the_same_path_is_rebuilt(tmp_path):
    from tasks.knn import build_graph

    data_path, graph_path = str(tmp_path / "data.zarr"), str(tmp_path / "graph.zarr")
    ingest(load("swiss_roll", n=200, seed=0), data_path)
    build_graph(data_path, 6, graph_path)
    curve = load("s_curve", n=200, seed=0)
    ingest(curve, data_path, overwrite=True)
    build_graph(data_path, 6, graph_path)  # same k, same method, other data
    got = xr.open_zarr(graph_path, consolidated=False)["indices"].values
    np.testing.assert_array_equal(got, knn(curve["Y"].values, 6)[0])


def test_evaluation_references_follow_the_data_not_the_path(tmp_path):
    """Evaluation ranks and distances are cached per worker process; data rewritten at the same
    path must be evaluated against itself."""
    from tasks.evaluate import evaluate_point
    from tasks.store import PointResult

    data_path = str(tmp_path / "data.zarr")
    emb = np.random.default_rng(0).normal(size=(150, 2))

    def trust():
        res = PointResult(key="ppca", index=(0, 0), point={"latent_dim": 2, "seed": 0}, status="done")
        res.embedding = emb
        return evaluate_point(res, data_path).metrics["trustworthiness"]

    ingest(load("swiss_roll", n=150, seed=0), data_path)
    trust()
    ingest(load("s_curve", n=150, seed=0), data_path, overwrite=True)
    after = trust()
    import tasks.evaluate as ev

    ev._reference.cache_clear()
    assert after == trust()


@pytest.mark.slow
def test_store_x_and_store_x_zarr_are_one_store_with_one_inputs_folder(server, sweep_cluster, tmp_path):
    assert store_path(tmp_path / "x") == store_path(tmp_path / "x.zarr") == (tmp_path / "x.zarr").absolute()
    assert inputs_dir(tmp_path / "x") == inputs_dir(tmp_path / "x.zarr")
    assert input_paths(str(tmp_path / "x")) == input_paths(str(tmp_path / "x.zarr"))
    grid = {"latent_dim": [1], "seed": [0]}
    embed_sweep(
        dataset={"name": "swiss_roll", "n": 120},
        models="ppca",
        grid=grid,
        store=str(tmp_path / "x"),
        report=False,
        cluster=sweep_cluster,
    )
    assert (tmp_path / "x.zarr").is_dir() and not (tmp_path / "x").exists()
    before = (inputs_dir(tmp_path / "x") / "data.zarr" / "zarr.json").read_bytes()
    with pytest.raises(ValueError, match="holds a different sweep"):
        embed_sweep(
            dataset={"name": "s_curve", "n": 120},
            models="ppca",
            grid=grid,
            store=str(tmp_path / "x.zarr"),
            report=False,
        )
    assert (inputs_dir(tmp_path / "x") / "data.zarr" / "zarr.json").read_bytes() == before


@pytest.mark.slow
def test_a_changed_data_file_is_a_different_sweep(server, sweep_cluster, tmp_path):
    """Same path, same options, other content: the store must not be resumed with it."""
    f = tmp_path / "d.npy"
    np.save(f, load("swiss_roll", n=100, seed=0)["Y"].values)
    kw = {"models": "ppca", "grid": {"latent_dim": [1], "seed": [0]}, "store": str(tmp_path / "s.zarr")}
    kw["cluster"] = sweep_cluster
    embed_sweep(dataset=str(f), report=False, **kw)
    np.save(f, load("s_curve", n=100, seed=0)["Y"].values)
    with pytest.raises(ValueError, match="different sweep .*: the data changed since the store was made"):
        embed_sweep(dataset=str(f), report=False, **kw)


# ---------------------------------------------------------------- 2. files read as they are


def test_a_headerless_numeric_csv_keeps_its_first_row(tmp_path, caplog):
    Y = np.random.default_rng(0).normal(size=(300, 3))
    f = tmp_path / "plain.csv"
    np.savetxt(f, Y, delimiter=",")
    with caplog.at_level(logging.INFO, logger="lvmcore.data"):
        ds = load(str(f))
    assert ds.sizes["point"] == 300
    np.testing.assert_allclose(ds["Y"].values, Y)
    assert "read 300 rows x 3 columns" in caplog.text
    named = tmp_path / "named.csv"
    named.write_text("a,b,c\n" + "\n".join(",".join(repr(float(v)) for v in row) for row in Y) + "\n")
    ds = load(str(named))
    assert ds.sizes["point"] == 300
    np.testing.assert_allclose(ds["Y"].values, Y)
    # stated explicitly: a numeric first row taken as column names
    assert load(str(f), header=True).sizes["point"] == 299
    with pytest.raises(ValueError, match="header must be"):
        load(str(f), header="maybe")


def test_every_loader_says_what_it_read(tmp_path, caplog):
    np.save(tmp_path / "a.npy", np.ones((7, 4)))
    with caplog.at_level(logging.INFO, logger="lvmcore.data"):
        load(str(tmp_path / "a.npy"))
        load("swiss_roll", n=50)
        ingest(load("s_curve", n=20), tmp_path / "d.zarr")
        load(str(tmp_path / "d.zarr"))
    assert "read 7 rows x 4 columns" in caplog.text
    assert "read 50 rows x 3 columns" in caplog.text
    assert "read 20 rows x 3 columns" in caplog.text


# ---------------------------------------------------------------- 4. refusals before work

D300 = '{"name": "swiss_roll", "n": 300}'
G1 = '{"latent_dim": [2], "seed": [0]}'


def _bad_inputs(tmp_path):
    np.save(tmp_path / "one.npy", np.ones((1, 3)))
    big = tmp_path / "big.json"
    big.write_text(
        json.dumps(
            {
                "dataset": "swiss_roll",
                "models": ["ppca"],
                "grid": {"latent_dim": [1, 2], "seed": list(range(10**6))},
            }
        )
    )
    return [
        (["--models", "ppca", "--grid", G1, "--options", '{"ppca": {"bogus": 1}}'], "has no option 'bogus'"),
        (["--models", "ppca", "--grid", G1, "--options", '{"ppca": [1, 2]}'], "must be a mapping"),
        (
            ["--models", "glle", "--grid", '{"k": [6], "latent_dim": [2]}']
            + ["--options", '{"glle": {"max_iter": "ten"}}'],
            "must be an integer",
        ),
        (["--models", "ppca", "--grid", G1, "--options", '{"ppca": {"n_components": 3}}'], "set by the grid"),
        (["--models", "ppca", "--grid", "null"], "--grid must be a JSON object"),
        (["--models", "ppca", "--grid", "{nope"], "--grid: not valid JSON"),
        (["--models", "hgplvm", "--grid", '{"latent_dim": [2], "kappa": [NaN]}'], "finite number"),
        (["--models", "hgplvm", "--grid", '{"latent_dim": [2], "kappa": [-1.0]}'], "must be > 0"),
        (["--models", "glle", "--grid", '{"k": [2], "latent_dim": [2]}'], "needs k > latent_dim"),
        (["--models", "glle", "--grid", '{"k": [300], "latent_dim": [2]}'], "needs more than 300 points"),
        (["--models", "ppca", "--grid", G1, "--dataset", str(tmp_path / "one.npy")], "has 1 point(s)"),
        (["--config", str(big)], "above the limit of 10,000"),
        (["--models", "ppca", "--grid", G1, "--store", "/proc/no/x.zarr"], "is not writable"),
        (
            ["--models", "bgplvm_rbf", "--grid", G1, "--options", '{"bgplvm": {"kernel": "linear"}}'],
            "fixes kernel",
        ),
    ]


def test_bad_input_is_refused_with_exit_2_before_any_server_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # a refusal must come before the local server
    for argv, message in _bad_inputs(tmp_path):
        out = tmp_path / "out"
        args = ["run", "--out", str(out), "--no-report", *argv]
        if "--dataset" not in argv and "--config" not in argv:
            args += ["--dataset", D300]
        rc = cli_main(args)
        err = capsys.readouterr().err
        assert rc == 2, (argv, err)
        assert message in err, (argv, err)
        assert "Traceback" not in err
        assert not (out / "prefect-server.log").exists(), argv  # no server was started
        assert not list(out.glob("*.zarr")) if out.exists() else True


def _plane_csv(path, n=60):
    """Data on a plane through the origin: PPCA with latent_dim 2 has zero noise variance and
    fails (a singular posterior precision) - a real failure no up-front check can foresee."""
    Y = np.random.default_rng(0).normal(size=(n, 2))
    np.savetxt(path, np.hstack([Y, np.zeros((n, 1))]), delimiter=",")
    return str(path)


@pytest.mark.slow
def test_failed_points_give_exit_3_with_reasons_and_retry_failed_reruns_them(
    server, sweep_cluster, tmp_path, capsys
):
    data = _plane_csv(tmp_path / "plane.csv")
    argv = ["run", "--out", str(tmp_path), "--no-report", "--cluster", sweep_cluster, "--dataset", data]
    argv += ["--models", "ppca"]
    argv += ["--grid", '{"latent_dim": [1, 2], "seed": [0]}', "--store", "s.zarr"]
    assert cli_main(argv) == 3
    err = capsys.readouterr().err
    assert "1 grid point(s) failed" in err and "singular" in err and "--retry-failed" in err
    store = str(tmp_path / "s.zarr")
    assert read_status(store, "ppca").tolist() == [[1], [2]]
    # a re-run keeps the failed point failed and says so
    assert cli_main(argv) == 3
    # a point that failed for a passing reason (marked failed by hand: e.g. a worker killed by the
    # OOM killer) is run again by --retry-failed, and only it
    g = zarr.open_group(store, mode="r+")["ppca"]
    emb_done = g["embedding"][0].copy()
    g["status"][0, 0] = 2
    g["error"][0, 0] = "MemoryError: passing"
    rc = cli_main([*argv, "--retry-failed"])
    assert rc == 3  # the plane point still fails
    g = zarr.open_group(store, mode="r")["ppca"]
    assert read_status(store, "ppca").tolist() == [[1], [2]]
    np.testing.assert_array_equal(g["embedding"][0], emb_done)
    assert "singular" in str(g["error"][1, 0])


# ---------------------------------------------------------------- 5. atomic set-up and the lock


@pytest.mark.slow
def test_an_interrupted_set_up_is_resumable_and_replace_always_works(server, sweep_cluster, tmp_path, capsys):
    store = tmp_path / "s.zarr"
    # what main left after a set-up interrupted before the root attributes: groups, no sweep_id
    zarr.open_group(str(store), mode="w", zarr_format=3).create_group("ppca")
    leftover = tmp_path / ".s.zarr.setup-999999-abcdef"  # this code's interrupted set-up
    zarr.open_group(str(leftover), mode="w", zarr_format=3)
    argv = ["run", "--out", str(tmp_path), "--no-report", "--cluster", sweep_cluster]
    argv += ["--dataset", '{"name": "swiss_roll", "n": 100}']
    argv += ["--models", "ppca", "--grid", '{"latent_dim": [1], "seed": [0]}', "--store", "s.zarr"]
    assert cli_main(argv) == 2
    assert "--replace" in capsys.readouterr().err
    assert cli_main([*argv, "--replace"]) == 0
    assert read_status(str(store), "ppca").tolist() == [[1]]
    assert not leftover.exists()
    assert list(tmp_path.glob("s.zarr.replaced-*"))


@pytest.mark.slow
def test_a_second_sweep_on_a_store_is_refused_and_a_dead_holders_lock_is_taken_over(
    server, sweep_cluster, tmp_path, capsys
):
    import socket

    store = tmp_path / "s.zarr"
    argv = ["run", "--out", str(tmp_path), "--no-report", "--cluster", sweep_cluster]
    argv += ["--dataset", '{"name": "swiss_roll", "n": 100}']
    argv += ["--models", "ppca", "--grid", '{"latent_dim": [1], "seed": [0]}', "--store", "s"]
    holder = hold_lock(store)
    try:
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid} on host {socket.gethostname()}" in err
        assert not store.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_path(store).exists()  # left behind by the killed holder
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert f"removed a stale lock of pid {holder.pid}" in out
    assert not lock_path(store).exists()
    assert read_status(str(store), "ppca").tolist() == [[1]]


@pytest.mark.slow
def test_two_sweeps_started_together_on_one_store_run_each_point_once(server, sweep_cluster, tmp_path):
    store = tmp_path / "s.zarr"
    code = (
        "import sys; from flows.cli import main; "
        "sys.exit(main(['run', '--out', sys.argv[1], '--no-report', '--cluster', sys.argv[2], '--dataset', "
        "'{\"name\": \"swiss_roll\", \"n\": 100}', '--models', 'ppca', '--grid', "
        "'{\"latent_dim\": [1, 2], \"seed\": [0, 1, 2]}', '--store', 's']))"
    )
    env = dict(os.environ)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path), sweep_cluster],
            cwd=ROOT,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    t0 = time.time()
    rcs = [p.wait(timeout=300) for p in procs]
    errs = [p.stderr.read() for p in procs]
    assert sorted(rcs) == [0, 2], (rcs, errs, time.time() - t0)
    assert "is being written by another sweep" in errs[rcs.index(2)]
    assert (read_status(str(store), "ppca") == 1).all()


# ---------------------------------------------------------------- issue 25, item 2: sweeps that grow


def _points(store, key):
    ds = xr.open_datatree(str(store), engine="zarr", consolidated=False)[key].ds.load()
    return ds


@pytest.mark.slow
def test_a_sweep_grown_by_a_seed_and_a_k_runs_only_the_new_points_and_equals_one_run_whole(
    server, sweep_cluster, tmp_path
):
    data = {"name": "swiss_roll", "n": 200, "seed": 3}
    models = ["glle_em", "ppca"]
    kw = {"dataset": data, "models": models, "report": False, "n_generations": 0, "cluster": sweep_cluster}
    small = {"k": [8], "latent_dim": [2], "seed": [0]}
    grown = {"k": [6, 8], "latent_dim": [2], "seed": [0, 1]}  # a k below the first and one more seed
    store = tmp_path / "grown.zarr"
    assert embed_sweep(grid=small, store=str(store), **kw)["ran"] == 2
    first = _points(store, "glle_em")["embedding"].sel(k=8, seed=0).values.copy()
    res = embed_sweep(grid=grown, store=str(store), **kw)
    assert res["ran"] == 3 + 1 and res["done"] == 4  # glle: 4 - 1 points, ppca: 2 - 1
    whole = tmp_path / "whole.zarr"
    embed_sweep(grid=grown, store=str(whole), **kw)
    for key in models:
        a, b = _points(store, key), _points(whole, key)
        assert (a["status"].values == 1).all()
        for name in ("embedding", "elbo", "trustworthiness", "continuity"):
            np.testing.assert_allclose(
                a[name].sortby(list(a[name].dims[:-2] if name == "embedding" else a[name].dims)).values,
                b[name].sortby(list(b[name].dims[:-2] if name == "embedding" else b[name].dims)).values,
                rtol=1e-10,
                atol=1e-12,
                err_msg=f"{key} {name}",
            )
    # the finished point was kept, not refitted
    np.testing.assert_array_equal(_points(store, "glle_em")["embedding"].sel(k=8, seed=0).values, first)
    # the same command again finds nothing to do
    assert embed_sweep(grid=grown, store=str(store), **kw)["ran"] == 0
    # anything that changes a finished point's meaning is still refused
    with pytest.raises(ValueError, match="options of"):
        embed_sweep(grid=grown, store=str(store), model_options={"glle": {"reg": 0.01}}, **kw)
    with pytest.raises(ValueError, match="data_fingerprint"):
        embed_sweep(grid=grown, store=str(store), **{**kw, "dataset": {**data, "seed": 4}})
    with pytest.raises(ValueError, match="lacks"):
        embed_sweep(grid=small, store=str(store), **kw)


def test_a_store_on_a_read_only_file_system_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """A real read-only mount (tmpfs, ro): main passed its checks and failed 40 s later, once the
    server and the cluster were up."""
    ro = tmp_path / "ro"
    ro.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {r.stderr.decode().strip()}")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    try:
        rc = cli_main(
            ["run", "--out", str(ro / "results"), "--no-report", "--dataset", D300, "--models", "ppca"]
            + ["--grid", G1]
        )
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    err = capsys.readouterr().err
    assert rc == 2 and "Read-only file system" in err, err
