"""MuData (.h5mu) and view-list input for the multi-view models (issue 33, item 4): modalities as
views joined on obs_names (inner join, the cells each modality loses counted, logged and stored),
counts preprocessed per modality, MRD's segmentation of the joined data, the single-view option."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from lvmcore.data import ingest, load, obs_names, source_info

mudata = pytest.importorskip("mudata")
ad = pytest.importorskip("anndata")


def _two_modalities(tmp_path, n=120, seed=0):
    """RNA counts (Poisson, log-rate = 4 + private cos t and shared cos^2 t mapped to genes) and a
    continuous protein panel (private sin t, shared cos^2 t); RNA has 10 cells the protein panel
    lacks, the panel 5 the RNA lacks, and the panel's cells are in another order."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    t = np.linspace(0, 4 * np.pi, n)
    shared, p_rna, p_prot = np.cos(t) ** 2, np.cos(t), np.sin(t)
    rate = 4.0 + 0.5 * np.hstack(
        [p_rna[:, None] @ rng.standard_normal((1, 20)), shared[:, None] @ rng.standard_normal((1, 10))]
    )
    counts = rng.poisson(np.exp(rate)).astype(np.float32)
    prot = np.hstack(
        [p_prot[:, None] @ rng.standard_normal((1, 8)), shared[:, None] @ rng.standard_normal((1, 4))]
    )
    prot = prot + 0.1 * rng.standard_normal(prot.shape)
    names = np.array([f"cell{i}" for i in range(n)])
    extra_rna = rng.poisson(50, size=(10, counts.shape[1])).astype(np.float32)
    rna = ad.AnnData(X=sp.csr_matrix(np.vstack([counts, extra_rna])))
    rna.obs_names = list(names) + [f"rna_only{i}" for i in range(10)]
    perm = rng.permutation(n)
    pr = ad.AnnData(X=np.vstack([prot[perm], rng.standard_normal((5, prot.shape[1]))]))
    pr.obs_names = list(names[perm]) + [f"prot_only{i}" for i in range(5)]
    rna.var_names = [f"gene{i}" for i in range(rna.n_vars)]
    pr.var_names = [f"protein{i}" for i in range(pr.n_vars)]
    md = mudata.MuData({"rna": rna, "prot": pr})
    md.obs["batch"] = "a"
    path = tmp_path / "cite.h5mu"
    md.write(str(path))
    return path, names, np.column_stack([p_rna, p_prot, shared])


OPTS = {"modalities": {"rna": {"preprocess": {"log1p": True}}, "prot": {}}}


def test_modalities_are_joined_on_obs_names_and_the_dropped_cells_counted(tmp_path, caplog):
    path, names, _ = _two_modalities(tmp_path)
    with caplog.at_level(logging.WARNING, logger="lvmcore.data"):
        ds = load(str(path), **OPTS)
    assert "'rna': 10 of its cells" in caplog.text and "'prot': 5 of its cells" in caplog.text
    assert ds.sizes["point"] == 120 and ds.attrs["views"] == ["view_0", "view_1"]
    np.testing.assert_array_equal(ds["obs_names"].values, names)  # the first modality's order
    # the protein rows follow the cells' names, not the file's row order
    md = mudata.read_h5mu(str(path))
    np.testing.assert_allclose(ds["view_1"].values, md["prot"][names].X)
    np.testing.assert_allclose(ds["view_0"].values, np.log1p(md["rna"][names].X.toarray()))
    store = ingest(str(path), tmp_path / "data.zarr", **OPTS)
    info = source_info(store)
    assert info["kind"] == "h5mu" and info["modalities"] == ["rna", "prot"]
    assert info["dropped"] == {"rna": 10, "prot": 5}
    assert info["options"]["view"] == "concat"
    np.testing.assert_array_equal(obs_names(store), names)


def test_single_view_models_fit_the_named_view_or_the_concatenation(tmp_path):
    path, _, _ = _two_modalities(tmp_path)
    both = load(str(path), **OPTS)
    assert both.sizes["feature"] == 42 and json.loads(both.attrs["params"])["view"] == "concat"
    rna = load(str(path), view="rna", **OPTS)
    np.testing.assert_array_equal(rna["Y"].values, both["view_0"].values)
    assert rna.attrs["fitted_view"] == "rna" and json.loads(rna.attrs["params"])["view"] == "rna"
    with pytest.raises(ValueError, match="view must be 'concat' or one of the modalities"):
        load(str(path), view="atac")
    with pytest.raises(ValueError, match="unknown modality 'prot' option 'pca'"):
        load(str(path), modalities={"prot": {"pca": 5}})
    with pytest.raises(ValueError, match=r"modalities \['atac'\] are not in the file"):
        load(str(path), modalities={"atac": {}})


@pytest.mark.slow
def test_mrd_recovers_the_shared_and_private_signals_of_the_joined_modalities(tmp_path):
    """Slow: one MRD fit to convergence (about 45 s on an idle 2-core machine)."""
    from lvmcore.models.mrd import MRD

    path, _, signals = _two_modalities(tmp_path)
    ds = load(str(path), **OPTS)
    views = [ds["view_0"].values, ds["view_1"].values]
    m = MRD(n_components=6, n_inducing=30, kernel="linear", random_state=0, max_iter=1000).fit(views)
    seg = m.segment(1e-3)
    assert seg["shared"] and seg["private"][0] and seg["private"][1] and not seg["partial"], seg
    X = m.embedding_

    def r2(truth, dims):  # how much of a true signal the latent dimensions ``dims`` carry
        A = np.column_stack([X[:, dims], np.ones(len(X))])
        resid = truth - A @ np.linalg.lstsq(A, truth, rcond=None)[0]
        return 1 - resid.var() / truth.var()

    # each signal sits in its own segment: cos t (RNA only), sin t (protein only), cos^2 t (both)
    assert r2(signals[:, 0], seg["private"][0]) > 0.9
    assert r2(signals[:, 1], seg["private"][1]) > 0.9
    assert r2(signals[:, 2], seg["shared"]) > 0.9
    assert r2(signals[:, 0], seg["private"][1]) < 0.1 and r2(signals[:, 1], seg["private"][0]) < 0.1


def test_a_list_of_view_files(tmp_path):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((50, 4)), rng.standard_normal((50, 3))
    np.save(tmp_path / "rna.npy", a)
    np.savetxt(tmp_path / "adt.csv", b, delimiter=",")
    ds = load("views", views=[str(tmp_path / "rna.npy"), str(tmp_path / "adt.csv")])
    np.testing.assert_array_equal(ds["view_0"].values, a)
    np.testing.assert_allclose(ds["view_1"].values, b)
    np.testing.assert_allclose(ds["Y"].values, np.hstack([a, b]))
    store = ingest("views", tmp_path / "v.zarr", views=[str(tmp_path / "rna.npy"), str(tmp_path / "adt.csv")])
    info = source_info(store)
    assert info["kind"] == "views" and len(info["path"]) == 2 and len(info["fingerprint"]) == 2
    np.save(tmp_path / "short.npy", a[:40])
    with pytest.raises(ValueError, match="different numbers of rows"):
        load("views", views=[str(tmp_path / "rna.npy"), str(tmp_path / "short.npy")])


@pytest.mark.slow
def test_mrd_and_a_single_view_model_run_on_the_h5mu_in_the_sweep(prefect_api, sweep_cluster, tmp_path):
    """The sweep on the .h5mu file: ingest on a worker (the RNA counts log1p-transformed there),
    MRD over the joined modalities, PPCA on the named view; the store says which view PPCA fit and
    how many cells each modality lost."""
    import xarray as xr

    from flows.sweep import embed_sweep, input_paths
    from tasks.store import STATUS_DONE, read_status
    from tests.prefect_server import pointed_at

    path, names, _ = _two_modalities(tmp_path)
    store = tmp_path / "cite.zarr"
    dataset = {"path": str(path), "view": "prot", **OPTS}
    with pointed_at(prefect_api):
        embed_sweep(
            dataset=dataset,
            models=["mrd", "ppca"],
            grid={"latent_dim": [4], "seed": [0]},
            store=str(store),
            model_options={"mrd": {"kernel": "linear", "max_iter": 200}},
            cluster=sweep_cluster,
            report=False,
            n_generations=0,
        )
    assert (read_status(store, "mrd") == STATUS_DONE).all() and (
        read_status(store, "ppca") == STATUS_DONE
    ).all()
    attrs = xr.open_datatree(store, engine="zarr", consolidated=False).attrs
    assert json.loads(attrs["data_params"])["view"] == "prot" and attrs["data_fitted_view"] == "prot"
    assert json.loads(attrs["data_source_info"])["dropped"] == {"rna": 10, "prot": 5}
    assert json.loads(attrs["data_preprocess"])["rna"]["settings"]["log1p"] is True  # ingest's record
    data_path, _ = input_paths(str(store))
    np.testing.assert_array_equal(obs_names(data_path), names)
    assert source_info(data_path)["options"]["view"] == "prot"


def test_a_modality_column_named_without_its_modality_is_refused_naming_the_prefixed_one(tmp_path):
    path, _, _ = _two_modalities(tmp_path)
    md = mudata.read_h5mu(str(path))
    md["rna"].obs["cell_type"] = "T"
    md.write(str(path))
    with pytest.raises(ValueError, match=r"'cell_type' is neither .*did you mean 'rna:cell_type'\?"):
        load(str(path), **OPTS, label_column="cell_type")
