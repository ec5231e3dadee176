"""GLLE's diagnostics where they are looked at (issue 52 item 2): paper 001's generations and
covariance-scale study computed for the setting the sweep chooses (``extras="chosen"``, the
default), at every grid point with ``extras="all"``; the store's ``has_extras``, the report and the
export say which points carry them; a grown store whose choice moves gets them for the new chosen
point; the chosen point's numbers equal what a grid point computing them with its fit stores, and
no metric that chooses a setting depends on them.

The sweeps here run the flow's own steps in process (plan, ingest, kNN, store set-up, each point's
fit / evaluation / write, the post-selection step: flows.sweep.sweep_grid calls the same
functions as Prefect tasks); one test runs them through the flow on the test cluster."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from tasks.evaluate import evaluate_point
from tasks.fit import fit_point
from tasks.ingest import ingest_dataset
from tasks.knn import build_graph
from tasks.point import add_extras, extras_summary, run_point
from tasks.registry import DIAGNOSTICS, EXTRAS_FLAG, MODELS, extras_inline, model_grid
from tasks.report import extras_notes
from tasks.results.export import to_anndata
from tasks.results.extras import carries_extras, extras_settings, extras_todo
from tasks.results.selection import model_groups, open_store, select
from tasks.store import METRICS
from tasks.sweep_plan import input_paths, plan_sweep, points_to_run, set_up_store

DATASET = {"name": "swiss_roll", "n": 150, "seed": 1}
KEY = "glle_em"
N_GEN = 2


def sweep(store: Path, grid: dict, mode: str = "chosen", n_generations: int = N_GEN) -> list:
    """One sweep run over ``store`` (made, resumed or grown) with the flow's steps in process;
    returns the post-selection step's (index, point) items."""
    plan = plan_sweep(DATASET, [KEY], grid, str(store), {}, n_generations, "exact")
    data_path, graph_path = input_paths(str(store))
    Path(data_path).parent.mkdir(parents=True, exist_ok=True)
    src, opts = plan.dataset
    ingest_dataset({"name": src, **opts}, data_path)
    graph = build_graph(data_path, max(model_grid(MODELS[KEY], plan.grid)["k"]), graph_path)
    set_up_store(str(store), plan, data_path)
    layout = plan.store_layout()
    todo, _, _ = points_to_run(str(store), plan.specs)
    for s, idx, point in todo:
        run_point(
            s.key, {}, data_path, graph, idx, point, str(store), layout, extras_inline(s, plan.grid, mode)
        )
    if layout.n_generations == 0:
        return []
    items = [(idx, pt) for _, idx, pt in extras_todo(str(store), plan.specs, everywhere=mode == "all")]
    states = add_extras(KEY, {}, data_path, graph, items, str(store), layout)
    assert all(s.startswith("extras ") and float(s.split()[1]) == 0.0 for s in states), states
    assert len(extras_summary(KEY, items, states)) == len(items)
    return items


def group(store):
    return model_groups(open_store(store))[KEY]


def flags(store) -> dict:
    """{(k, seed): carries the diagnostics} of the store's finished points."""
    ds = group(store)
    f = carries_extras(ds)
    return {
        (int(k), int(s)): bool(f.sel(k=k, latent_dim=2, seed=s))
        for k in ds["k"].values
        for s in ds["seed"].values
    }


GRID = {"k": [6, 9], "latent_dim": [2], "seed": [0, 1]}


@pytest.fixture(scope="module")
def chosen_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("chosen") / "s.zarr"
    items = sweep(store, GRID)
    return store, items


@pytest.fixture(scope="module")
def all_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("all") / "s.zarr"
    assert sweep(store, GRID, "all") == []  # every point computed them with its fit
    return store


def test_extras_only_for_the_chosen_point(chosen_store):
    store, items = chosen_store
    pick = select(str(store), KEY)["setting"]
    assert [pt for _, pt in items] == [pick]  # the post-selection step did the chosen point only
    f = flags(store)
    assert f == {key: key == (pick["k"], pick["seed"]) for key in f}
    ds = group(store)
    raw = ds[EXTRAS_FLAG].values
    assert sorted(raw.ravel().tolist()) == [0.0, 0.0, 0.0, 1.0]  # 0: fitted without them, not NaN
    for k, s in f:
        cell = ds.sel(k=k, latent_dim=2, seed=s)
        for name in DIAGNOSTICS:
            values = cell[name].values[..., :2]
            assert np.isfinite(values).all() if f[k, s] else np.isnan(values).all(), (name, k, s)
    assert extras_settings(ds) == [pick]
    assert extras_todo(str(store), [MODELS[KEY]]) == []  # a resume has nothing more to compute
    # the report's note and the export's uns record
    (note,) = extras_notes([(KEY, ds)], {KEY: {"setting": pick}})
    assert "at 1 of 4 finished point(s)" in note and "the chosen setting carries them" in note
    adata = to_anndata(str(store))
    assert adata.uns["embed_sweep"]["models"][KEY][EXTRAS_FLAG] == 1


def test_chosen_extras_equal_todays_and_metrics_do_not_depend_on_them(chosen_store, all_store):
    store, _ = chosen_store
    a, b = group(store), group(all_store)
    # every number a setting is chosen by is the same with and without the diagnostics
    for name in ("embedding", "elbo", "status", *METRICS):
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)
    pick = select(str(store), KEY)["setting"]
    assert select(str(all_store), KEY)["setting"] == pick
    assert all(flags(all_store).values())
    # the chosen point's diagnostics: bit-equal to the "all" store's, and to a fit that computes them
    # as the grid points did before (fit_point with n_generations, the point's seed)
    for name in DIAGNOSTICS:
        np.testing.assert_array_equal(a[name].sel(pick).values, b[name].sel(pick).values, err_msg=name)
    data_path, graph_path = input_paths(str(store))
    idx = tuple(int(np.nonzero(a[d].values == pick[d])[0][0]) for d in ("k", "latent_dim", "seed"))
    ref = fit_point(KEY, {}, data_path, graph_path, idx, pick, N_GEN)
    assert ref.extras[EXTRAS_FLAG] == 1.0
    for name in DIAGNOSTICS:
        np.testing.assert_array_equal(a[name].sel(pick).values[..., :2], ref.extras[name], err_msg=name)
    # one point's fit with and without them: the same embedding, bound and metrics
    bare = fit_point(KEY, {}, data_path, graph_path, idx, pick, 0)
    assert bare.extras[EXTRAS_FLAG] == 0.0 and not set(DIAGNOSTICS) & set(bare.extras)
    np.testing.assert_array_equal(bare.embedding, ref.embedding)
    assert bare.elbo == ref.elbo
    m_ref, m_bare = evaluate_point(ref, data_path).metrics, evaluate_point(bare, data_path).metrics
    assert m_ref == m_bare


def test_extras_all_on_a_chosen_store_fills_the_rest(chosen_store, all_store, tmp_path):
    store = tmp_path / "s.zarr"
    shutil.copytree(chosen_store[0], store)
    shutil.copytree(chosen_store[0].with_name("s.inputs"), tmp_path / "s.inputs")
    items = sweep(store, GRID, "all")  # a resume with extras "all": the three others get them
    assert len(items) == 3 and all(flags(store).values())
    a, b = group(store), group(all_store)
    for name in (*DIAGNOSTICS, EXTRAS_FLAG, "embedding"):
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)


def test_grown_store_computes_extras_for_the_new_chosen_point(tmp_path):
    """A store grown by a k whose embedding agrees best with the data's geodesics (GLLE's k is
    chosen by the geodesic agreement; its seeds tie on the bound, the first wins): the new chosen
    point gets its diagnostics after the selection; the earlier chosen point keeps its own, flagged."""
    store = tmp_path / "s.zarr"
    sweep(store, {"k": [6, 8], "latent_dim": [2], "seed": [0, 1]})
    assert select(str(store), KEY)["setting"] == {"k": 8, "latent_dim": 2, "seed": 0}
    assert flags(store) == {(k, s): (k, s) == (8, 0) for k in (6, 8) for s in (0, 1)}
    items = sweep(store, {"k": [6, 8, 10], "latent_dim": [2], "seed": [0, 1]})  # grown
    pick = {"k": 10, "latent_dim": 2, "seed": 0}
    assert select(str(store), KEY)["setting"] == pick and [pt for _, pt in items] == [pick]
    assert flags(store) == {(k, s): (k, s) in ((8, 0), (10, 0)) for k in (6, 8, 10) for s in (0, 1)}
    (note,) = extras_notes([(KEY, group(store))], {KEY: {"setting": pick}})
    assert "at 2 of 6 finished point(s)" in note and "the chosen setting carries them" in note
    assert extras_todo(str(store), [MODELS[KEY]]) == []


def test_one_point_grid_computes_them_with_its_fit_and_old_stores_read_as_carrying(tmp_path):
    spec = MODELS[KEY]
    assert extras_inline(spec, {"k": [8], "latent_dim": [2], "seed": [0]}, "chosen")
    assert not extras_inline(spec, GRID, "chosen") and extras_inline(spec, GRID, "all")
    assert extras_inline(MODELS["ppca"], GRID, "chosen")  # nothing changes for models without them
    with pytest.raises(ValueError, match="extras must be one of"):
        extras_inline(spec, GRID, "some")
    store = tmp_path / "s.zarr"
    assert sweep(store, {"k": [8], "latent_dim": [2], "seed": [0]}) == []  # no second fit
    assert flags(store) == {(8, 0): True}
    # a store written before the flag (NaN there): a point carries them where its generations hold numbers
    zarr.open_group(str(store), mode="r+")[KEY][EXTRAS_FLAG][...] = np.nan
    assert flags(store) == {(8, 0): True}
    g = zarr.open_group(str(store), mode="r+")[KEY]
    g["generations"][...] = np.nan
    assert flags(store) == {(8, 0): False}
    # without generations (n_generations 0) a group holds neither them nor the flag
    bare = tmp_path / "b.zarr"
    sweep(bare, {"k": [8], "latent_dim": [2], "seed": [0]}, n_generations=0)
    assert EXTRAS_FLAG not in group(bare) and carries_extras(group(bare)) is None


@pytest.fixture(scope="module")
def api(prefect_api):
    """This module's flow runs on the test run's Prefect server."""
    from tests.prefect_server import pointed_at

    with pointed_at(prefect_api):
        yield prefect_api


@pytest.mark.slow  # the Prefect server and the test cluster: ~45 s of wall time on the loaded 2-core machine
def test_the_flow_computes_them_for_the_chosen_point(api, sweep_cluster, tmp_path, capfd, caplog):
    """embed_sweep's default (extras "chosen") on the test cluster: the grid points without them,
    then the chosen point's after the selection, said; an unknown mode refused before anything."""
    from flows.sweep import embed_sweep

    store = tmp_path / "f.zarr"
    kw = {"dataset": DATASET, "models": [KEY], "grid": GRID, "store": str(store), "report": False}
    with pytest.raises(ValueError, match="extras must be one of"):
        embed_sweep(**kw, n_generations=N_GEN, extras="some")
    assert not store.exists()
    res = embed_sweep(**kw, n_generations=N_GEN, cluster=sweep_cluster)
    assert res["done"] == 4 and res["failed"] == 0
    pick = select(str(store), KEY)["setting"]
    assert flags(store) == {key: key == (pick["k"], pick["seed"]) for key in flags(store)}
    got = capfd.readouterr()
    out = got.out + got.err + caplog.text  # the flow's prints are its run's log records
    where = ", ".join(f"{d}={v}" for d, v in pick.items())
    assert f"{KEY} {where}: generations and covariance-scale study computed (the chosen setting)" in out
