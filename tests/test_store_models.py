"""The fitted models in the result store (issue 50 items 1 and 6): each finished grid point's model
as checksummed arrays plus JSON params, read back by ``load_model`` into an estimator whose outputs
equal an in-memory fit's; ``verify`` naming a damaged model array and a re-run repairing it;
``--keep-models chosen``; ``--refit-models`` on a store written before models were kept (and
``load_model`` refusing such a store); the preprocessing kept with the ingested inputs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec

from embed_sweep import load_model
from flows.cli import main as cli_main
from tasks.inputs import load_data, load_graph
from tasks.point import points_without_models, refit_points, run_points
from tasks.registry import MODELS, grid_points, options_for
from tasks.results.models import REFIT_FIX, keep_chosen_models, model_sizes, read_preprocessing
from tasks.store import (
    MODEL_BYTES,
    MODELS_GROUP,
    SCHEMA_VERSION,
    mark_pending,
    open_results,
    point_id,
    read_model,
    verify_points,
)
from tasks.sweep_plan import input_paths, plan_sweep
from tests.results_store import build_store

DATASET = {"name": "swiss_roll", "n": 150}
GRID = {"k": [8], "latent_dim": [2], "seed": [0, 1]}
#: few iterations: exact round trips and refits do not need a converged model
OPTIONS = {"bgplvm": {"n_inducing": 10, "max_iter": 10, "init_iters": 10}}
KEYS = ["ppca", "bgplvm_rbf", "glle_em"]


def _plan(store):
    return plan_sweep(DATASET, KEYS, GRID, str(store), OPTIONS, 0, "exact")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    store = tmp_path_factory.mktemp("models") / "s.zarr"
    build_store(store, DATASET, KEYS, GRID, OPTIONS, n_generations=0)
    return store


def _copy(store, tmp_path):
    """A copy of the store and its inputs (the tests that change a store work on their own)."""
    dst = tmp_path / store.name
    shutil.copytree(store, dst)
    shutil.copytree(store.with_name("s.inputs"), tmp_path / "s.inputs")
    return dst


def _in_memory(store, key, point):
    """The estimator the sweep fitted at ``point``, fitted again here on the store's inputs."""
    spec = MODELS[key]
    data_path, graph_path = input_paths(str(store))
    Y = load_data(data_path)["Y"]
    est = spec.estimator_class()(**spec.constructor_args(point, options_for(spec, _plan(store).options)))
    if "k" in spec.dims:
        est.fit(Y, graph=load_graph(graph_path)[0][:, : point["k"]])
    else:
        est.fit(Y)
    return est


def test_each_finished_point_keeps_its_model_as_checksummed_arrays(swept):
    root = zarr.open_group(str(swept), mode="r")
    assert root.attrs["schema_version"] == SCHEMA_VERSION
    for key in KEYS:
        g = root[key]
        sizes = np.asarray(g[MODEL_BYTES][...])
        assert (sizes > 0).all()
        for _, point in grid_points(MODELS[key], _plan(swept).grid):
            mg = g[MODELS_GROUP][point_id(point)]
            params = json.loads(mg.attrs["params"])
            assert params["class"] == MODELS[key].estimator_class().__name__
            arrays = list(mg.arrays())
            assert arrays
            for _, arr in arrays:
                assert any(isinstance(c, Crc32cCodec) for c in arr.metadata.codecs)
                assert arr.dtype in (np.float64, np.int64, np.int8)
    assert set(model_sizes(swept)) == set(KEYS)
    assert verify_points(swept) == []


@pytest.mark.parametrize("key", KEYS)
def test_the_loaded_model_equals_an_in_memory_fit(swept, key):
    """load_model's transform (and variance) of new points equals the estimator fitted again in
    memory on the same data (1e-10); the default setting is the chosen one (as export's)."""
    rng = np.random.default_rng(3)
    Y = load_data(input_paths(str(swept))[0])["Y"]
    Y_new = Y[:7] + 0.05 * rng.standard_normal((7, Y.shape[1]))
    point = {"k": 8, "latent_dim": 2, "seed": 1}
    point = {d: point[d] for d in MODELS[key].dims}
    est = load_model(swept, key, point)
    ref = _in_memory(swept, key, point)
    np.testing.assert_allclose(est.embedding_, ref.embedding_, rtol=0, atol=1e-10)
    got, want = est.transform(Y_new, return_var=True), ref.transform(Y_new, return_var=True)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    from tasks.results.selection import select

    chosen = select(str(swept), key)["setting"]
    np.testing.assert_array_equal(
        load_model(swept, key).embedding_, load_model(swept, key, chosen).embedding_
    )


def test_a_damaged_model_array_is_named_by_verify_and_repaired_by_a_rerun(swept, tmp_path, capsys):
    store = _copy(swept, tmp_path)
    point = {"latent_dim": 2, "seed": 0}
    before, _ = read_model(store, "bgplvm_rbf", point)
    mdir = store / "bgplvm_rbf" / MODELS_GROUP / point_id(point)
    chunk = next(p for p in sorted(mdir.rglob("*")) if p.is_file() and "c" in p.relative_to(mdir).parts)
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    bad = verify_points(store)
    assert len(bad) == 1 and bad[0]["point"] == point
    assert "model array" in bad[0]["what"] and "crc32c" in bad[0]["what"], bad[0]["what"]
    with pytest.raises(ValueError, match="fails its crc32c checksum.*run the same"):
        load_model(store, "bgplvm_rbf", point)
    assert cli_main(["verify", str(store)]) == 2
    err = capsys.readouterr().err
    assert f"bgplvm_rbf/models/{point_id(point)}/" in err and "run the same `embed-sweep run`" in err
    # the run's repair: the damaged point set pending, then run again (flows.sweep: verify, mark, run)
    mark_pending(store, bad)
    plan = _plan(store)
    data_path, graph_path = input_paths(str(store))
    spec = MODELS["bgplvm_rbf"]
    items = [(bad[0]["index"], point)]
    assert run_points(spec.key, options_for(spec, plan.options), data_path, graph_path, items, str(store),
                      plan.store_layout()) == ["done"]  # fmt: skip
    assert verify_points(store) == []
    after, _ = read_model(store, "bgplvm_rbf", point)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


def test_keep_models_chosen_keeps_the_chosen_settings_model_only(swept, tmp_path):
    from tasks.results.selection import select

    store = _copy(swept, tmp_path)
    removed = keep_chosen_models(store)
    assert removed == {key: 1 for key in KEYS}
    for key in KEYS:
        chosen = select(str(store), key)["setting"]
        left = sorted(p.name for p in (store / key / MODELS_GROUP).iterdir() if p.is_dir())
        assert left == [point_id(chosen)]
        load_model(store, key)  # the chosen one loads
        other = dict(chosen, seed=1 - chosen["seed"])
        with pytest.raises(ValueError, match="keeps no model.*--keep-models"):
            load_model(store, key, other)
    assert verify_points(store) == []  # removed on purpose: not damage


def _make_old(store, keys=KEYS) -> None:
    """The store as this code's predecessor wrote it: no models, no model_bytes, no schema version."""
    root = zarr.open_group(str(store), mode="r+")
    for key in keys:
        shutil.rmtree(store / key / MODELS_GROUP)
        shutil.rmtree(store / key / MODEL_BYTES)
    del root.attrs["schema_version"]


def test_an_old_store_opens_as_before_is_refused_by_load_model_and_refit_adds_its_models(swept, tmp_path):
    store = _copy(swept, tmp_path)
    _make_old(store)
    assert verify_points(store) == []
    open_results(store)  # show / export / report read it as before
    with pytest.raises(ValueError) as e:
        load_model(store, "ppca")
    assert str(e.value) == (
        f"{store} holds no fitted models (written before models were kept); add them with: {REFIT_FIX}"
    )
    assert "\n" not in str(e.value)
    # --refit-models: the finished points fitted again, their models kept, the embeddings unmoved
    plan = _plan(store)
    data_path, graph_path = input_paths(str(store))
    from tasks.store import prepare_store

    prepare_store(str(store), plan.identity, plan.specs, plan.grid, plan.store_layout(), {})
    emb = {k: np.asarray(zarr.open_group(str(store))[k]["embedding"][...]) for k in KEYS}
    for spec in plan.specs:
        todo = points_without_models(str(store), spec, grid_points(spec, plan.grid))
        assert len(todo) == 2
        states = refit_points(spec.key, options_for(spec, plan.options), data_path, graph_path, todo,
                              str(store), plan.store_layout())  # fmt: skip
        moved = [float(s.removeprefix("refit ")) for s in states]
        assert max(moved) <= 1e-8, (spec.key, states)
        np.testing.assert_array_equal(zarr.open_group(str(store))[spec.key]["embedding"][...], emb[spec.key])
    assert verify_points(store) == []
    ref = load_model(swept, "bgplvm_rbf")
    got = load_model(store, "bgplvm_rbf")
    np.testing.assert_allclose(got.embedding_, ref.embedding_, rtol=0, atol=1e-10)


def test_the_preprocessing_is_kept_with_the_inputs(tmp_path):
    """An .h5ad read through normalize_total, log1p and a PCA of its own: the data store keeps the
    genes, the mask, the PCA's mean and loadings, and they give back the fitted matrix (the scores:
    (Z - mean) @ components.T, Z the normalised, logged counts), with scanpy's / scikit-learn's
    definitions as the reference."""
    ad = pytest.importorskip("anndata")
    import pandas as pd
    from sklearn.decomposition import PCA

    from tasks.ingest import ingest_dataset

    rng = np.random.default_rng(0)
    counts = rng.poisson(2.0, size=(60, 12)).astype(np.float64)
    genes = [f"g{j}" for j in range(12)]
    hv = np.zeros(12, dtype=bool)
    hv[[0, 2, 3, 5, 7, 8, 11]] = True
    a = ad.AnnData(counts, var=pd.DataFrame({"highly_variable": hv}, index=genes))
    a.obs_names = [f"c{i}" for i in range(60)]
    path = tmp_path / "d.h5ad"
    a.write_h5ad(path)
    store = tmp_path / "p.zarr"
    pre = {"normalize_total": 1e4, "log1p": True, "pca": 3, "pca_solver": "covariance"}
    data_path = tmp_path / "p.inputs" / "data.zarr"
    data_path.parent.mkdir()
    ingest_dataset({"path": str(path), "preprocess": pre}, str(data_path))
    store.mkdir()  # read_preprocessing names the store; its inputs are beside it
    (store / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    prep = read_preprocessing(store)["X"]
    assert prep["var_names"] == genes
    assert prep["pca"]["columns"] == np.flatnonzero(hv).tolist()
    assert prep["preprocess"]["pca"] == 3 and prep["use_rep"] == "X"
    Z = np.log1p(counts / counts.sum(axis=1, keepdims=True) * 1e4)[:, hv]
    sk = PCA(n_components=3, svd_solver="full").fit(Z)
    comp = prep["pca"]["components"]
    np.testing.assert_allclose(prep["pca"]["mean"], sk.mean_, rtol=0, atol=1e-12)
    sign = np.sign((comp * sk.components_).sum(axis=1))
    np.testing.assert_allclose(comp, sk.components_ * sign[:, None], rtol=0, atol=1e-8)
    Y = load_data(str(data_path))["Y"]
    np.testing.assert_allclose(Y, (Z - prep["pca"]["mean"]) @ comp.T, rtol=0, atol=1e-10)
    # inputs ingested before the preprocessing was kept: reused as they are by a run, written again
    # (the same numbers) by --refit-models' ingest
    from tasks.ingest import preprocessing_missing, stored_fingerprint

    fp = stored_fingerprint(data_path)
    shutil.rmtree(data_path / "preprocessing")  # the group and its mark: a store from before
    assert preprocessing_missing(data_path) and read_preprocessing(store)["X"]["pca"] is None
    spec = {"path": str(path), "preprocess": pre}
    ingest_dataset(spec, str(data_path), fp)
    assert preprocessing_missing(data_path)
    ingest_dataset(spec, str(data_path), fp, keep_preprocessing=True)
    assert not preprocessing_missing(data_path)
    np.testing.assert_array_equal(read_preprocessing(store)["X"]["pca"]["components"], comp)
    np.testing.assert_array_equal(load_data(str(data_path))["Y"], Y)


@pytest.fixture(scope="module")
def api(prefect_api):
    """This module's CLI runs on the test run's Prefect server (no server start per command)."""
    from tests.prefect_server import pointed_at

    with pointed_at(prefect_api):
        yield prefect_api


@pytest.mark.slow  # two sweeps through the CLI on the test run's Prefect server (~27 s on a loaded machine)
def test_keep_models_chosen_then_refit_models_by_the_cli(api, sweep_cluster, tmp_path, capfd, caplog):
    """`run --keep-models chosen` keeps one model per model group; on a store written without
    models, `run --refit-models` fits its finished points again, keeps their models and says that
    no embedding moved by more than 1e-8."""
    grid = json.dumps({"latent_dim": [2], "seed": [0, 1]})
    argv = ["run", "--out", str(tmp_path), "--store", "c.zarr", "--no-report", "--models", "ppca"]
    argv += ["--grid", grid, "--dataset", json.dumps(DATASET), "--cluster", sweep_cluster]
    assert cli_main([*argv, "--keep-models", "chosen"]) == 0
    store = tmp_path / "c.zarr"
    kept = [p.name for p in (store / "ppca" / MODELS_GROUP).iterdir() if p.is_dir()]
    assert len(kept) == 1 and zarr.open_group(str(store)).attrs["keep_models"] == "chosen"
    assert cli_main(["verify", str(store)]) == 0
    _make_old(store, ["ppca"])
    capfd.readouterr()
    caplog.clear()
    assert cli_main([*argv, "--refit-models"]) == 0
    got = capfd.readouterr()
    out = got.out + got.err + caplog.text  # the flow's prints are its run's log records
    assert "ppca: 2 finished grid point(s) fitted again, their models kept" in out and "(within 1e-08)" in out
    assert sorted(p.name for p in (store / "ppca" / MODELS_GROUP).iterdir() if p.is_dir()) == [
        "latent_dim=2,seed=0",
        "latent_dim=2,seed=1",
    ]
    assert verify_points(store) == []
