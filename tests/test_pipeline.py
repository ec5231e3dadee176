"""The embed-sweep flow with real parts: a Prefect server, a 2-process Dask LocalCluster and zarr
stores on disk. Bad input is refused before any work; re-runs resume; failures are recorded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import flows.sweep
from flows.cli import main as cli_main
from flows.sweep import embed_sweep
from tasks.registry import MODELS, resolve_models
from tasks.report import make_report, summary_table
from tasks.sweep_plan import check_store, plan_sweep
from tests.prefect_server import pointed_at

TINY = {"name": "swiss_roll", "n": 150, "seed": 1}
OPTS = {"lllvm": {"max_iter": 4}}


@pytest.fixture(scope="module", autouse=True)
def server(prefect_api):
    with pointed_at(prefect_api) as env:
        yield env


def _tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"models": ["umap"]}, "unknown model 'umap'"),
        ({"models": []}, "models is empty"),
        ({"dataset": "no_such_set"}, "unknown data set 'no_such_set'"),
        ({"grid": {}}, "grid must be a non-empty mapping"),
        ({"grid": {"k": []}}, "grid['k'] is empty"),
        ({"grid": {"depth": [1]}}, "unknown grid dimensions ['depth']"),
        ({"grid": {"k": [500]}, "models": ["lllvm"]}, "grid k = 500 needs more than 150 points"),
        (
            {"models": ["mrd"]},
            "needs a multi-view data set" if MODELS["mrd"].available() else "model 'mrd' is not available",
        ),
        ({"grid": {"latent_dim": [3]}, "models": ["ppca"]}, "must be below the data dimension 3"),
        ({"model_options": {"lllvm": {"max_iter": 3}}, "models": ["ppca"]}, "not in this sweep's models"),
    ],
)
def test_bad_sweep_parameters_are_refused_before_any_work(tmp_path, kwargs, message):
    args = {"dataset": TINY, "models": ["ppca"], "grid": {"latent_dim": [1]}, "model_options": None}
    args.update(kwargs)
    with pytest.raises(ValueError) as e:
        plan_sweep(
            args["dataset"],
            args["models"],
            args["grid"],
            str(tmp_path / "s.zarr"),
            args["model_options"],
            0,
            "exact",
        )
    assert message in str(e.value)
    with pytest.raises(ValueError):
        embed_sweep(store=str(tmp_path / "s.zarr"), report=False, **args)
    assert not (tmp_path / "s.zarr").exists()
    assert not (tmp_path / "s.inputs").exists()


def test_unknown_cluster_type_is_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown cluster type 'yarn'"):
        embed_sweep(
            dataset=TINY,
            models="ppca",
            grid={"latent_dim": [1]},
            store=str(tmp_path / "s.zarr"),
            cluster={"type": "yarn"},
        )
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without Slurm (CI installs it)
    with pytest.raises(ValueError, match="no `sbatch` on PATH"):
        embed_sweep(
            dataset=TINY,
            models="ppca",
            grid={"latent_dim": [1]},
            store=str(tmp_path / "s.zarr"),
            cluster={"type": "slurm", "cores": 1, "memory": "1GB"},
        )
    assert not (tmp_path / "s.zarr").exists()


def test_sweep_writes_rectangular_groups_resumes_and_refuses_a_different_sweep(
    tmp_path, monkeypatch, sweep_cluster
):
    store = tmp_path / "sweep.zarr"
    grid = {"k": [6, 9], "latent_dim": [1, 2], "seed": [0, 1]}
    plans = []  # the flow and its subflow plan once between them (the data loaded once)
    monkeypatch.setattr(flows.sweep, "plan_sweep", lambda *a: plans.append(a) or plan_sweep(*a))
    # on the test process's sweep cluster: what is checked is the store, not the cluster (a sweep
    # that starts its own local cluster runs to the end in test_lifecycle's and test_faults' runs)
    res = embed_sweep(
        dataset=TINY,
        models=["ppca", "lllvm"],
        grid=grid,
        store=str(store),
        report=True,
        n_generations=2,
        model_options=OPTS,
        cluster=sweep_cluster,
    )
    assert res["ran"] == res["total"] == 4 + 8
    assert len(plans) == 1
    tree = xr.open_datatree(store, engine="zarr", consolidated=False)
    ppca = tree["ppca"].ds
    assert ppca["embedding"].dims == ("latent_dim", "seed", "point", "component")
    assert ppca.sizes["component"] == 2 and ppca.sizes["point"] == 150
    assert np.all(ppca["status"].values == 1)
    # the 1-D fits are padded with NaN in the second component, the 2-D fits are complete
    emb = ppca["embedding"]
    assert np.isfinite(emb.sel(latent_dim=1).values[..., 0]).all()
    assert np.isnan(emb.sel(latent_dim=1).values[..., 1]).all()
    assert np.isfinite(emb.sel(latent_dim=2).values).all()
    # metrics computed against the known truth and data
    assert (ppca["trustworthiness"].values > 0.5).all()
    assert np.isfinite(ppca["procrustes_disparity"].values).all()
    assert tree["lllvm"].ds["status"].dims == ("k", "latent_dim", "seed")
    assert np.all(tree["lllvm"].ds["status"].values == 1)
    var = tree["lllvm"].ds["embedding_var"]
    assert (var.sel(latent_dim=2).values > 0).all() and (var.sel(latent_dim=1).values[..., 0] > 0).all()
    assert np.isnan(var.sel(latent_dim=1).values[..., 1]).all()
    assert Path(res["report"]).exists()
    assert (store.parent / "sweep.report" / "embeddings.png").stat().st_size > 1000

    before = _tree_digest(store)
    args = {"dataset": TINY, "models": ["ppca", "lllvm"], "grid": grid, "model_options": OPTS}
    plan = plan_sweep(TINY, ["ppca", "lllvm"], grid, str(store), OPTS, 2, "auto").to_dict()
    assert json.loads(json.dumps(plan)) == plan  # plain JSON: it travels as a flow parameter
    with pytest.raises(ValueError, match="plan was made for other grid"):  # a plan for other arguments
        embed_sweep(**{**args, "grid": {**grid, "seed": [0]}}, store=str(store), n_generations=2, plan=plan)
    # the resume, with the caller's plan
    again = embed_sweep(
        **args, store=str(store), report=False, n_generations=2, plan=plan, cluster=sweep_cluster
    )
    assert again["ran"] == 0 and again["total"] == 12 and len(plans) == 1  # the caller's plan is used
    assert _tree_digest(store) == before

    with pytest.raises(ValueError, match="holds a different sweep"):
        embed_sweep(dataset=TINY, models=["ppca"], grid={"latent_dim": [1, 2], "seed": [0]}, store=str(store))
    assert _tree_digest(store) == before

    table = summary_table(store)
    assert set(table["model"]) == {"ppca", "lllvm"}
    assert (table.loc[table.model == "ppca", "done"] == 4).all()
    assert cli_main(["show", str(store)]) == 0
    assert Path(make_report(store, tmp_path / "rep")).read_text().count("<img") >= 2


def test_store_that_is_not_a_sweep_is_refused(tmp_path):
    bogus = tmp_path / "other.zarr"
    bogus.mkdir()
    (bogus / "zarr.json").write_text("{not json")
    ident = plan_sweep(TINY, ["ppca"], {"latent_dim": [1]}, str(bogus), None, 0, "exact").identity
    with pytest.raises(ValueError, match=r"other.zarr/zarr.json is damaged .*--replace"):
        check_store(str(bogus), ident)
    assert (bogus / "zarr.json").read_text() == "{not json"


def test_registry_families_expand_to_every_variant_or_say_what_is_missing():
    variants = {
        "hgplvm": ["hgplvm_point", "hgplvm_sparse", "hgplvm_bayesian"],
        "glle": ["glle_em", "glle_direct"],
        "bgplvm": ["bgplvm_rbf", "bgplvm_linear"],
        "lllvm": ["lllvm"],
        "mrd": ["mrd"],
    }
    for family, keys in variants.items():
        if all(MODELS[k].available() for k in keys):
            assert [s.key for s in resolve_models([family])] == keys
        else:
            with pytest.raises(ValueError, match=f"model '{family}' is not available"):
                resolve_models([family])
    assert {s.key for s in resolve_models("all")} >= {"lllvm", "ppca"}


def test_cli_datasets_lists_every_generator(capsys):
    assert cli_main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name in ("swiss_roll", "binary_tree", "mrd_toy", "digits", "severed_bowl"):
        assert name in out


def test_batches_mix_the_grid_and_shrink_towards_the_end():
    from tasks.point import MAX_POINTS_PER_TASK, batch_sizes, batches

    sizes = batch_sizes(48, 2)
    assert sizes == [8, 8, 8, 6, 5, 4, 3, 2, 1, 1, 1, 1]  # guided: 1/4 of what is left, at most 8
    assert sizes == sorted(sizes, reverse=True) and sum(sizes) == 48
    assert sum(batch_sizes(1000, 2)) == 1000 and max(batch_sizes(1000, 2)) == MAX_POINTS_PER_TASK
    assert batch_sizes(5, 2) == [2, 1, 1, 1] and batch_sizes(0, 2) == []
    assert batch_sizes(7, 2, requested=3) == [3, 3, 1]
    items = list(range(48))  # a (k: 6, latent_dim: 2, seed: 4) grid in grid order
    out = batches(items, [6] * 8)
    assert len(out) == 8 and all(len(b) == 6 for b in out)
    assert sorted(x for b in out for x in b) == items  # every point exactly once
    assert out == batches(items, [6] * 8)  # the same sweep makes the same batches
    latent = [{(i // 4) % 2 for i in b} for b in out]
    assert sum(len(d) == 2 for d in latent) >= 6  # batches mix latent dimensions (costs differ)
    assert sum(len({i // 8 for i in b}) >= 3 for b in out) >= 6  # and span the k values
    assert sorted(x for b in batches(items, sizes) for x in b) == items
    assert batches([], []) == []
    with pytest.raises(ValueError, match="do not split"):
        batches(items, [40, 7])
    with pytest.raises(ValueError, match="points_per_task must be >= 1"):
        batch_sizes(48, 2, requested=0)


def test_cli_runs_several_sweeps_on_one_local_cluster(tmp_path, capsys):
    """`run --config` with a "sweeps" list: every sweep is validated before any work, then all of
    them run on one LocalCluster (one dashboard line), each store complete."""
    from tasks.store import STATUS_DONE, read_status

    out = tmp_path / "out"
    sweeps = [
        {"dataset": TINY, "models": ["ppca"], "grid": {"latent_dim": [1, 2], "seed": [0]}, "store": "a.zarr"},
        {
            "dataset": {"name": "binary_tree", "depth": 3, "seed": 0},
            "models": ["ppca"],
            "grid": {"latent_dim": [2], "seed": [0, 1, 2]},
            "store": "b.zarr",
        },
    ]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sweeps": [sweeps[0], dict(sweeps[1], models=["umap"])]}))
    assert cli_main(["run", "--config", str(bad), "--out", str(out), "--no-report"]) == 2
    assert "unknown model 'umap'" in capsys.readouterr().err
    assert not (out / "a.zarr").exists()  # the first sweep did not start

    good = tmp_path / "good.json"
    good.write_text(json.dumps({"sweeps": sweeps}))
    assert cli_main(["run", "--config", str(good), "--out", str(out), "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("Dask dashboard: http://127.0.0.1:") == 1
    assert (read_status(out / "a.zarr", "ppca") == STATUS_DONE).sum() == 2
    assert (read_status(out / "b.zarr", "ppca") == STATUS_DONE).sum() == 3


def test_queued_grid_points_do_not_run_side_by_side_on_a_one_thread_worker(tmp_path):
    """Reading the inputs and fitting a model without `chunks` must not secede from the worker's
    thread pool: a seceded task lets the worker start its next queued task beside it (before the
    fix every queued batch of a sweep ran at once on the worker's one core, 8x slower each)."""
    import time

    from distributed import Client, LocalCluster

    from tasks.ingest import ingest_dataset
    from tasks.knn import build_graph
    from tasks.sweep_plan import input_paths

    data_path, graph_path = input_paths(str(tmp_path / "s.zarr"))
    Path(data_path).parent.mkdir(parents=True)
    ingest_dataset(TINY, data_path)
    build_graph(data_path, 8, graph_path)

    def grid_point(seed):
        from tasks.fit import fit_point
        from tasks.inputs import load_data, load_graph

        t0 = time.time()
        load_data(data_path), load_graph(graph_path)  # cold per-process caches on the first tasks
        res = fit_point("ppca", {}, data_path, graph_path, (0, 0), {"latent_dim": 2, "seed": seed})
        t1 = time.time()
        while time.time() < t1 + 0.3:  # keep the thread busy so that an overlap would show
            pass
        return t0, time.time(), res.status

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        with Client(lc) as client:
            spans = client.gather([client.submit(grid_point, s, pure=False) for s in range(4)])
    assert [s for _, _, s in spans] == ["done"] * 4
    spans = sorted(spans)
    for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
        assert start >= end - 1e-3, spans  # each task starts after the previous one ended


def test_evaluation_equals_the_reference_metrics(tmp_path):
    """A grid point's stored metrics (data-side ranks cached per dataset, fast average ranks)
    equal the metrics computed from scratch: our trustworthiness / continuity (themselves checked
    against scikit-learn in test_metrics), and the Shepard goodness as scipy's spearmanr."""
    from scipy.spatial.distance import pdist
    from scipy.stats import spearmanr

    from lvmcore import metrics
    from tasks.evaluate import EVAL_NEIGHBORS, evaluate_point
    from tasks.fit import fit_point
    from tasks.ingest import ingest_dataset
    from tasks.inputs import load_data

    path = str(tmp_path / "data.zarr")
    ingest_dataset({"name": "swiss_roll", "n": 300, "seed": 0}, path)
    Y = load_data(path)["Y"]
    for seed in (0, 1):
        point = {"latent_dim": 2, "seed": seed}
        res = evaluate_point(fit_point("ppca", {}, path, None, (0, seed), point), path)
        X, m = res.embedding, res.metrics
        assert res.status == "done" and res.error == ""
        assert m["trustworthiness"] == pytest.approx(metrics.trustworthiness(Y, X, EVAL_NEIGHBORS), abs=1e-12)
        assert m["continuity"] == pytest.approx(metrics.continuity(Y, X, EVAL_NEIGHBORS), abs=1e-12)
        assert m["shepard_goodness"] == pytest.approx(spearmanr(pdist(Y), pdist(X))[0], abs=1e-12)
        assert (m["qlocal"], m["qglobal"]) == pytest.approx(metrics.quality_scores(Y, X)[:2], abs=1e-12)
