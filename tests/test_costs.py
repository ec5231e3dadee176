"""The plan knows what each grid point costs (issue 35): it refuses, before any server or cluster
starts, a point the cluster cannot run (exit 2, one line naming the model, N, the prediction and
the way out), lets a feasible one through, takes its numbers from the cost data file (not from
constants in the code), and a point that runs past its prediction is stopped and recorded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from flows.cli import main as cli_main
from tasks import costs
from tasks.costs.calibrate import calibrate_machine
from tasks.store import read_status
from tasks.sweep_plan import plan_sweep
from tests.results_store import build_store

ROOT = Path(__file__).resolve().parents[1]
ROLL_20K = '{"name": "swiss_roll", "n": 20000, "seed": 0}'


def _refused(tmp_path, capsys, argv) -> str:
    """Run the CLI; it must refuse with exit 2 and one line, before any server starts."""
    out = tmp_path / "out"
    rc = cli_main(["run", "--out", str(out), "--no-report", *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert not (out / "prefect-server.log").exists()  # no server was started
    assert not list(out.glob("*.zarr")) if out.exists() else True
    return lines[0]


@pytest.fixture
def no_server(monkeypatch, tmp_path):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("EMBED_SWEEP_CALIBRATION", str(tmp_path / "no-calibration.json"))


def _costs_copy(tmp_path, monkeypatch, edit) -> Path:
    """A copy of the shipped cost data, changed by ``edit(data)``, in use for this test."""
    data = json.loads(costs.COSTS_PATH.read_text())
    edit(data)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("EMBED_SWEEP_COSTS", str(path))
    return path


def test_the_issue_command_refuses_the_point_hgplvm_at_20000_naming_the_way_out(no_server, tmp_path, capsys):
    line = _refused(
        tmp_path,
        capsys,
        ["--dataset", ROLL_20K, "--models", "hgplvm_point,lllvm"]
        + ["--grid", '{"kappa": [10], "k": [10], "latent_dim": [2], "seed": [0]}'],
    )
    assert line.startswith("embed-sweep: error: hgplvm_point at N = 20,000 "), line
    assert "hgplvm_sparse or hgplvm_bayesian instead of hgplvm_point" in line
    assert "predicted" in line or "needs about" in line


def test_a_dense_lllvm_beyond_a_workers_memory_is_refused_with_the_factorised_solver_named(
    no_server, tmp_path, capsys
):
    line = _refused(
        tmp_path,
        capsys,
        ["--dataset", '{"name": "swiss_roll", "n": 5000, "seed": 0}', "--models", "lllvm"]
        + ["--grid", '{"k": [10], "latent_dim": [2], "seed": [0]}']
        + ["--options", '{"lllvm": {"solver": "dense"}}']
        + ["--cluster", '{"type": "local", "n_workers": 2, "memory_limit": "2GB"}'],
    )
    assert "lllvm at N = 5,000 needs about" in line and "local worker's memory limit (1.9 GB)" in line, line
    assert 'solver="factorised"' in line and "more memory" in line
    # solver="auto" takes the factorised solver there: the same sweep is not refused for its cost
    # (refused only later, for the store it cannot write: no server starts in this test)
    rc = cli_main(
        ["run", "--out", str(tmp_path / "o2"), "--no-report", "--store", "/proc/no/x.zarr"]
        + ["--dataset", '{"name": "swiss_roll", "n": 5000, "seed": 0}', "--models", "lllvm"]
        + ["--grid", '{"k": [10], "latent_dim": [2], "seed": [0]}']
        + ["--cluster", '{"type": "local", "n_workers": 2, "memory_limit": "2GB"}']
    )
    out, err = capsys.readouterr()
    assert rc == 2 and "is not writable" in err, err
    assert "predicted cost" in out and "lllvm" in out


def test_a_feasible_sweep_passes_the_cost_check_and_prints_its_prediction(no_server, tmp_path, capsys):
    rc = cli_main(
        ["run", "--out", str(tmp_path / "o"), "--no-report", "--store", "/proc/no/x.zarr"]
        + ["--dataset", '{"name": "swiss_roll", "n": 300, "seed": 0}', "--models", "ppca,glle,hgplvm_point"]
        + ["--grid", '{"k": [8, 10], "latent_dim": [2], "kappa": [10.0], "seed": [0, 1]}']
    )
    out, err = capsys.readouterr()
    assert rc == 2 and "is not writable" in err, err  # the cost check came first and passed
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()}
    for key, points in (("ppca", "2"), ("glle_em", "4"), ("glle_direct", "4"), ("hgplvm_point", "2")):
        assert rows[key][1] == points, out
    assert "whole grid:" in out


@pytest.mark.parametrize(
    "models, options, names",
    [
        ("bgplvm_rbf", '{"bgplvm_rbf": {"n_inducing": 250}}', ("n_inducing", "250", "n_inducing <= 200")),
        (
            "hgplvm_sparse",
            '{"hgplvm_sparse": {"training": "minibatch", "batch_size": 500}}',
            ("batch_size (500)", "batch_size <= 200"),
        ),
    ],
)
def test_a_setting_the_data_sets_size_cannot_take_is_refused_in_the_plan(
    no_server, tmp_path, capsys, models, options, names
):
    """Found on pbmc68k_reduced (700 cells): such a point used to start the server and cluster,
    then fail on its worker."""
    line = _refused(
        tmp_path,
        capsys,
        ["--dataset", '{"name": "swiss_roll", "n": 200, "seed": 0}', "--models", models]
        + ["--grid", '{"latent_dim": [2], "kappa": [10.0], "seed": [0]}', "--options", options],
    )
    assert f"model {models!r} at " in line, line
    for name in names:
        assert name in line, line


def test_a_setting_within_the_data_sets_size_passes_the_plan(tmp_path):
    grid = {"latent_dim": [2], "seed": [0]}
    ok = {"bgplvm_rbf": {"n_inducing": 200}}
    plan_sweep({"name": "swiss_roll", "n": 200}, ["bgplvm_rbf"], grid, str(tmp_path / "s"), ok, 0, "auto")


def test_predictions_and_refusals_come_from_the_cost_data_file(no_server, tmp_path, capsys, monkeypatch):
    plan = plan_sweep(
        {"name": "swiss_roll", "n": 300},
        ["ppca", "lllvm"],
        {"k": [8], "latent_dim": [2]},
        str(tmp_path / "s"),
        None,
        3,
        "auto",
    )
    before = costs.check_plan(plan, {"type": "local"}, out=None)

    def slower(data):
        for entry in data["models"].values():
            for stage in ("fixed", "iteration", "generation"):
                entry[stage] = {m: 1000.0 * c for m, c in entry.get(stage, {}).items()}

    _costs_copy(tmp_path, monkeypatch, slower)
    after = costs.check_plan(plan, {"type": "local"}, max_point_hours=10**6, out=None)
    for b, a in zip(before, after):
        assert a["seconds"] == pytest.approx(1000.0 * b["seconds"], rel=1e-9)
    # a calibration on a machine half as fast doubles them; `calibrate` writes what it measured here
    monkeypatch.delenv("EMBED_SWEEP_COSTS")
    ref = json.loads(costs.COSTS_PATH.read_text())["probe_seconds"]
    (tmp_path / "no-calibration.json").write_text(json.dumps({"probe_seconds": 2 * ref}))
    slow = costs.check_plan(plan, {"type": "local"}, out=None)
    for b, a in zip(before, slow):
        assert a["seconds"] == pytest.approx(2.0 * b["seconds"], rel=1e-9)
    cal = calibrate_machine(repeats=3)
    assert costs.speed_factor() == pytest.approx(cal["probe_seconds"] / ref) == pytest.approx(cal["factor"])
    (tmp_path / "no-calibration.json").unlink()
    # a model the shipped data lets through is refused once its data says it is slow
    _costs_copy(tmp_path, monkeypatch, lambda d: d["models"]["ppca"].update(fixed={"1": 10.0 * 3600}))
    line = _refused(
        tmp_path,
        capsys,
        ["--dataset", '{"name": "swiss_roll", "n": 300}', "--models", "ppca", "--grid", '{"latent_dim": [2]}']
        + ["--max-point-hours", "2"],
    )
    assert "ppca at N = 300 is predicted to take up to 10.0 h per grid point" in line
    assert "above --max-point-hours 2 (2.0 h)" in line


def test_a_slurm_walltime_and_memory_share_are_the_limits(tmp_path):
    lim = costs.cluster_limits(
        {
            "type": "slurm",
            "memory": "16GB",
            "processes": 4,
            "walltime": "1-02:30:00",
            "adapt": {"maximum_jobs": 8},
        },
        max_point_hours=48,
    )
    assert lim["memory"] == pytest.approx(4e9)
    assert lim["seconds"] == 26.5 * 3600 and "walltime" in lim["time_what"]
    assert lim["workers"] == 32
    lim = costs.cluster_limits(
        {"type": "slurm", "memory": "16GB", "processes": 4, "walltime": "02:00:00"}, 24
    )
    assert lim["seconds"] == 7200
    assert (
        costs.cluster_limits({"type": "kubernetes", "resources": {"limits": {"memory": "4G"}}})["memory"]
        == 4e9
    )
    with pytest.raises(ValueError, match="max-point-hours must be > 0"):
        costs.cluster_limits({"type": "local"}, 0)


@pytest.mark.parametrize("name", ["local", "slurm", "k8s"])
def test_every_deployments_defaults_are_feasible_on_the_machines_it_names(name, tmp_path):
    deployments = {
        d["name"]: d for d in yaml.safe_load((ROOT / "deploy/prefect.yaml").read_text())["deployments"]
    }
    p = deployments[name]["parameters"]
    plan = plan_sweep(
        p["dataset"], p["models"], p["grid"], str(tmp_path / "s"), p.get("model_options"), 3, "auto"
    )
    rows = costs.check_plan(plan, p["cluster"], out=None)  # raises if any point cannot run there
    assert all(r["slowest"] is not None for r in rows), [r["key"] for r in rows if r["slowest"] is None]


def test_a_point_past_its_prediction_is_stopped_and_recorded_failed(tmp_path, monkeypatch):
    def tiny(data):
        data["overrun"] = {"factor": 1.0, "min_seconds": 1.0}
        data["models"]["lllvm/dense"].update(fixed={"1": 1e-3}, iteration={"1": 1e-6})

    _costs_copy(tmp_path, monkeypatch, tiny)
    store = tmp_path / "s.zarr"
    # 100,000 iterations without a stopping rule: minutes unless stopped
    opts = {"lllvm": {"max_iter": 100000, "tol": 0.0, "solver": "dense"}}
    build_store(
        store,
        {"name": "swiss_roll", "n": 60, "seed": 0},
        ["lllvm", "ppca"],
        {"k": [6], "latent_dim": [2]},
        opts,
    )
    import zarr

    g = zarr.open_group(str(store), mode="r")
    assert read_status(str(store), "lllvm").ravel().tolist() == [2]
    err = str(np.asarray(g["lllvm"]["error"][...]).ravel()[0])
    assert err.startswith("PointOverrun: lllvm at {") and "stopped after 1.0 s" in err, err
    assert read_status(str(store), "ppca").ravel().tolist() == [1]  # its prediction holds: not stopped


def test_the_stop_is_raised_in_the_running_code_and_not_after_it():
    import time

    with pytest.raises(
        costs.PointOverrun, match="x stopped after 10 ms of CPU time, past 2.0x its predicted 5 ms"
    ):
        with costs.overrun_guard((0.01, 0.005), "x"):
            for _ in range(10**8):
                pass
    with costs.overrun_guard((0.05, 0.01), "y"):  # ends in time: nothing raised, then or later
        pass
    time.sleep(0.1)
    for _ in range(10**5):
        pass


def test_the_progress_bars_time_left_starts_from_the_prediction(capsys):
    from flows.progress import Progress

    bar = Progress(2, tty=False, predicted=3600.0)
    assert "predicted (upper bound): about 1:00:00 for 2 grid points" in capsys.readouterr().out
    assert 3590 < bar.eta() <= 3600
    bar.point("ppca", {"seed": 0}, "done")  # then the pace of the points that finished
    assert bar.eta() < 60
    assert Progress(2, tty=False).eta() is None


def test_the_overrun_guard_holds_a_fit_only_to_predictions_for_data_as_wide_as_measured():
    """GLLE's cost terms were once measured on 3-D data only: at 2e5 x 50 (an atlas's PCA) they
    predicted 4 min and the guard stopped a fit after 14 min of CPU that would have finished. Data
    wider than WIDTH_MARGIN x the widest measured gets no guard (the plan still shows the
    prediction); data within it keeps one. GLLE is now measured at D = 50, so 50-D data is guarded."""
    widest = max(m["d"] for m in costs.load_costs()["models"]["glle_em"]["measured"])
    assert widest >= 50
    assert costs.within_measured_width("glle_em", [50])
    assert costs.within_measured_width("glle_em", [int(costs.WIDTH_MARGIN * widest)])
    assert not costs.within_measured_width("glle_em", [int(costs.WIDTH_MARGIN * widest) + 1])
    assert not costs.within_measured_width("mrd", [5, 100])  # the widest view decides
    assert not costs.within_measured_width("no such entry", [3])


def test_glles_upper_terms_hold_the_guard_and_the_plan_refuses_on_the_nominal_ones(
    tmp_path, monkeypatch, no_server
):
    """Data of high intrinsic dimension (an atlas's PCA) fills GLLE's LU far more than a roll of the
    same N and D: the shipped entry carries ``upper`` terms fitted on an atlas. The run-time stop is
    held to them (a fit on such data is not stopped for being it), the refusal to the nominal ones
    (a point that runs on a roll of that size is not refused), and the plan prints both."""
    import tasks.inputs

    args = {"n_neighbors": 15, "n_components": 2, "max_iter": 30, "random_state": 0}  # the point below
    shipped = costs.predict("glle_em", args, 200_000, [50], n_generations=3)
    assert shipped.upper_seconds > shipped.seconds and shipped.upper_memory_bytes >= shipped.memory_bytes

    def upper_x100(data):
        e = data["models"]["glle_em"]
        e["upper"] = {stage: {m: 100.0 * c for m, c in e[stage].items()} for stage in ("fixed", "generation")}
        e["upper"]["memory"] = e["memory"]

    _costs_copy(tmp_path, monkeypatch, upper_x100)
    p = costs.predict("glle_em", args, 20_000, [50], n_generations=3)
    nominal = p.fixed_s + p.budget * p.iteration_s + p.generations * p.generation_s
    assert p.seconds == pytest.approx(nominal)
    upper = 100.0 * (p.fixed_s + p.generations * p.generation_s) + p.budget * p.iteration_s
    assert p.upper_seconds == pytest.approx(upper)
    monkeypatch.setattr(tasks.inputs, "load_data", lambda path: {"Y": np.zeros((20_000, 50))})
    point = {"k": 15, "latent_dim": 2, "seed": 0}
    limit, held = costs.point_limit("glle_em", {"max_iter": 30}, point, "x", 3)
    assert held == pytest.approx(p.upper_seconds)
    assert limit == pytest.approx(max(4.0 * p.upper_seconds, 300.0))
    # the plan: refused on the nominal terms only, the upper ones printed beside them
    grid = {"k": [8], "latent_dim": [2]}
    plan = plan_sweep({"name": "swiss_roll", "n": 300}, ["glle"], grid, str(tmp_path / "s"), None, 3, "auto")
    lines = []
    rows = costs.check_plan(plan, {"type": "local"}, out=lines.append)
    slow = max((r["slowest"] for r in rows if r["key"] == "glle_em"), key=lambda x: x.seconds)
    assert "(glle_em on data of high intrinsic dimension" in lines[0]
    hours = 1.01 * slow.seconds / 3600  # the nominal prediction fits, the upper one (100x) does not
    costs.check_plan(plan, {"type": "local"}, max_point_hours=hours, out=None)
    with pytest.raises(ValueError, match="glle_em at N = 300 is predicted"):
        costs.check_plan(plan, {"type": "local"}, max_point_hours=0.5 * slow.seconds / 3600, out=None)


def test_an_expander_like_knn_graph_is_predicted_by_the_upper_terms(tmp_path, no_server):
    """Once the kNN graph exists the sweep measures how its balls grow (lvmcore.graph.
    growth_dimension): a swiss roll's graph grows like a 2-D manifold's, the graph of a cloud of
    intrinsic dimension 20 faster, above ``HIGH_DIM_GROWTH``; there the predicted seconds take
    GLLE's ``upper`` terms (fitted on an atlas), elsewhere its nominal ones."""
    import xarray as xr

    from lvmcore.graph import knn

    rng = np.random.default_rng(0)
    t = 1.5 * np.pi * (1 + 2 * rng.uniform(size=3000))
    roll = np.column_stack([t * np.cos(t), 20 * rng.uniform(size=3000), t * np.sin(t)])
    cloud = rng.normal(size=(3000, 20))
    growth = {}
    for name, Y in (("roll", roll), ("cloud", cloud)):
        idx, dist = knn(Y, 10)
        path = tmp_path / f"{name}.zarr"
        xr.Dataset(
            {"indices": (("point", "neighbor"), idx), "distances": (("point", "neighbor"), dist)}
        ).to_zarr(path)
        growth[name] = costs.graph_growth(str(path), 10)
    assert growth["roll"] < costs.HIGH_DIM_GROWTH < growth["cloud"], growth
    grid = {"k": [10], "latent_dim": [2]}
    plan = plan_sweep({"name": "swiss_roll", "n": 3000}, ["glle"], grid, str(tmp_path / "s"), None, 3, "auto")
    plan = dataclasses.replace(plan, size=[20_000, 50])  # an atlas's PCA of that size
    todo = [(s, (0, 0, 0), {"k": 10, "latent_dim": 2, "seed": 0}) for s in plan.specs if s.key == "glle_em"]
    p = costs.predict("glle_em", todo[0][0].constructor_args(todo[0][2], {}), 20_000, [50], n_generations=3)
    nominal = costs.predicted_seconds(plan, todo, 1, "all")
    upper = costs.predicted_seconds(plan, todo, 1, "all", high_dim=True)
    assert nominal == pytest.approx(p.seconds) and upper == pytest.approx(p.upper_seconds)
    assert upper > nominal


def test_the_grid_on_several_workers_takes_at_least_its_longest_point():
    """A grid point runs on one worker: a grid whose one point is most of its time takes that
    point's time however many workers share the rest (the plan's line and the progress bar's start)."""

    def row(key, seconds, points):
        p = costs.Prediction(key, key, seconds, seconds, 0.0, 0, 0.0, 0, memory_bytes=1e9, store_bytes=1e6)
        return {
            "key": key,
            "points": points,
            "slowest": p,
            "largest": p,
            "seconds": seconds * points,
            "store": 1e6,
        }

    one_long = costs.plan_table([row("glle_em", 1440.0, 1), row("ppca", 60.0, 4)], {"workers": 2})
    assert f"about {costs.fmt_seconds(1440.0)} on 2 worker(s)" in one_long, one_long
    many = costs.plan_table([row("ppca", 600.0, 8)], {"workers": 2})
    assert f"about {costs.fmt_seconds(2400.0)} on 2 worker(s)" in many, many
    assert costs.grid_seconds(1680.0, 1440.0, 2) == 1440.0 and costs.grid_seconds(4800.0, 600.0, 2) == 2400.0


def test_the_sparse_hgplvm_is_planned_by_the_training_auto_picks():
    """hgplvm_sparse has one cost entry per training, chosen by N as its ``training="auto"``
    chooses: the full-batch one (the measurements it had) up to 5,000 points, the minibatch one
    above, which at 10^5 x 50 predicts under an hour (the full-batch entry: about 18 h)."""
    from tasks.registry import MODELS

    args = MODELS["hgplvm_sparse"].constructor_args({"kappa": 100.0, "latent_dim": 2, "seed": 0}, {})
    small, big = (
        costs.predict("hgplvm_sparse", args, 5000, [50]),
        costs.predict("hgplvm_sparse", args, 10**5, [50]),
    )
    assert small.entry == "hgplvm_sparse/full" and big.entry == "hgplvm_sparse/minibatch"
    assert big.seconds < 3600 and big.budget == 10000
    full = costs.predict("hgplvm_sparse", dict(args, training="full"), 10**5, [50])
    assert full.entry == "hgplvm_sparse/full" and full.seconds > 10 * big.seconds


def test_glles_extras_are_counted_once_per_model_under_extras_chosen():
    """``extras="chosen"`` (the default): a GLLE grid of several points computes the generations and
    the covariance-scale study once, for the chosen point refitted after the selection, so the
    plan counts every point without them plus one refit with them; ``"all"`` counts them at every
    point, and a one-point grid carries them inline either way."""
    from tasks.registry import MODELS, grid_points, options_for

    spec, n = MODELS["glle_em"], 20_000
    grid = {"k": [8, 10, 12], "latent_dim": [2]}

    def predicted(g, gens):
        args = [spec.constructor_args(pt, options_for(spec, {})) for _, pt in grid_points(spec, g)]
        return [costs.predict("glle_em", a, n, [50], gens) for a in args]

    def row(g, mode):
        return costs.plan_costs([spec], g, n, [50], lambda s: options_for(s, {}), 3, mode)[0]

    bare, full = predicted(grid, 0), predicted(grid, 3)
    assert all(f.generations > 0 for f in full)
    assert row(grid, "all")["seconds"] == pytest.approx(sum(f.seconds for f in full))
    chosen = row(grid, "chosen")
    refit = max(full, key=lambda f: f.seconds)
    assert chosen["seconds"] == pytest.approx(sum(b.seconds for b in bare) + refit.seconds)
    assert chosen["seconds"] < row(grid, "all")["seconds"]
    assert chosen["slowest"].seconds == pytest.approx(refit.seconds)  # the longest task: the refit
    one = {"k": [8], "latent_dim": [2]}
    assert row(one, "chosen")["seconds"] == pytest.approx(row(one, "all")["seconds"])
    assert row(one, "chosen")["seconds"] == pytest.approx(predicted(one, 3)[0].seconds)
