"""AnnData input by scanpy's conventions (issue 33, items 1, 2, 5; issue 36 W4, W8, T3): use_rep,
layer, label and colour columns (missing -> -1, names kept), obs_names kept, CSC refused, the width
limit, every data-set option known or refused before any server starts (CLI exit 2, one line), the
options recorded being the options applied, and pandas' index column in a CSV dropped."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from flows.cli import main as cli_main
from lvmcore.checks import MISSING_LABEL
from lvmcore.data import describe, ingest, label_names, load, obs_names, source_info
from lvmcore.data.provenance import color_names, file_fingerprint

ad = pytest.importorskip("anndata")

G1 = '{"latent_dim": [2], "seed": [0]}'


def _adata(tmp_path, n=60, name="cells.h5ad", csc=False):
    rng = np.random.default_rng(0)
    counts = sp.random(n, 12, density=0.4, format="csr", random_state=1, dtype=np.float64)
    counts.data = np.round(counts.data * 20) + 1
    X = np.log1p(counts.toarray())
    cell_type = pd.Categorical(rng.choice(["T", "B", "NK"], n), categories=["T", "B", "NK", "unused"])
    cell_type[:5] = np.nan
    stage = rng.choice(["early", "late"], n).astype(object)
    stage[[7, 9]] = ""
    pseudotime = rng.uniform(size=n)
    pseudotime[3] = np.nan
    obs = pd.DataFrame(
        {"cell_type": cell_type, "stage": stage, "dpt_pseudotime": pseudotime},
        index=[f"AAAC-{i}" for i in range(n)],
    )
    a = ad.AnnData(
        X=X,
        obs=obs,
        layers={"counts": counts.tocsc() if csc else counts},
        obsm={"X_pca": rng.normal(size=(n, 5))},
    )
    path = tmp_path / name
    a.write_h5ad(path)
    return path, a


def test_use_rep_layer_labels_and_names(tmp_path):
    path, a = _adata(tmp_path)
    ds = load(str(path), use_rep="X_pca", label_column="cell_type", color_column="dpt_pseudotime")
    np.testing.assert_array_equal(ds["Y"].values, a.obsm["X_pca"])
    codes = ds["label"].values
    assert (codes[:5] == MISSING_LABEL).all()  # missing is unlabelled, not a class
    names = json.loads(ds.attrs["label_names"])
    assert names == ["T", "B", "NK", "unused"]  # the categories, in their order, by code
    np.testing.assert_array_equal(np.array(names)[codes[5:]], a.obs["cell_type"].to_numpy()[5:].astype(str))
    np.testing.assert_array_equal(ds["color"].values, a.obs["dpt_pseudotime"].to_numpy())
    np.testing.assert_array_equal(ds["obs_names"].values, a.obs_names.to_numpy())
    assert json.loads(ds.attrs["params"]) == {
        "use_rep": "X_pca",
        "label_column": "cell_type",
        "color_column": "dpt_pseudotime",
    }
    counts = load(str(path), layer="counts", label_column="stage")
    np.testing.assert_array_equal(counts["Y"].values, a.layers["counts"].toarray())
    assert json.loads(counts.attrs["label_names"]) == ["early", "late"]
    assert (counts["label"].values[[7, 9]] == MISSING_LABEL).all()
    np.testing.assert_array_equal(load(str(path))["Y"].values, a.X)  # X by default


def test_the_ingested_store_records_source_names_and_labels(tmp_path):
    path, a = _adata(tmp_path)
    store = ingest(
        str(path), tmp_path / "data.zarr", use_rep="X_pca", label_column="stage", color_column="stage"
    )
    info = source_info(store)
    assert info == {
        "kind": "h5ad",
        "path": str(path.resolve()),
        "fingerprint": file_fingerprint(path),
        "options": {"use_rep": "X_pca", "label_column": "stage", "color_column": "stage"},
        "modalities": [],
        "dropped": {},
    }
    assert file_fingerprint(path).startswith(f"sha256:{os.path.getsize(path)}:")
    # the data are identified by content and options, not by the path's spelling
    import shutil

    copy = tmp_path / "elsewhere" / "copy.h5ad"
    copy.parent.mkdir()
    shutil.copy(path, copy)
    opts = {"use_rep": "X_pca", "label_column": "stage"}
    assert describe(str(copy), **opts)["fingerprint"] == describe(str(path), **opts)["fingerprint"]
    assert describe(str(copy), use_rep="X_pca")["fingerprint"] != describe(str(path), **opts)["fingerprint"]
    np.testing.assert_array_equal(obs_names(store), a.obs_names.to_numpy())
    assert label_names(store) == ["early", "late"] and color_names(store) == ["early", "late"]
    import zarr

    attrs = zarr.open_group(str(store), mode="r").attrs
    assert attrs["label_column"] == "stage" and attrs["color_column"] == "stage"
    assert source_info(ingest("swiss_roll", tmp_path / "roll.zarr", n=50)) is None
    assert obs_names(tmp_path / "roll.zarr") is None and label_names(tmp_path / "roll.zarr") is None


def test_bad_representations_are_refused_naming_the_fix(tmp_path):
    path, _ = _adata(tmp_path)
    for opts, message in [
        ({"use_rep": "X_umap"}, r"use_rep 'X_umap' is not in obsm; obsm keys: \['X_pca'\]"),
        ({"layer": "spliced"}, r"layer 'spliced' is not in the file; layers: \['counts'\]"),
        ({"layer": "raw"}, r"layer 'raw' is not in the file; layers: \['counts'\]; \.raw is not read as"),
        ({"use_rep": "X_pca", "layer": "counts"}, "both given"),
        ({"label_column": "celltype"}, "label_column 'celltype' is not an obs column"),
        (
            {"label_column": "dpt_pseudotime"},
            "label_column 'dpt_pseudotime' holds numbers that are not whole .*give it as color_column",
        ),
        (
            {"bogus_option": 3},
            "unknown data-set .* option 'bogus_option'; accepted: color_column, label_column",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            describe(str(path), **opts)
    csc, _ = _adata(tmp_path, name="csc.h5ad", csc=True)
    with pytest.raises(ValueError, match=r"column by column \(CSC\).*tocsr\(\)"):
        describe(str(csc), layer="counts")


def test_the_width_limit(tmp_path):
    path, _ = _adata(tmp_path)
    with pytest.raises(
        ValueError, match=r'12 features wide, above the width limit of 10 .*"max_features": 12'
    ):
        describe(str(path), max_features=10)
    assert describe(str(path), max_features=12)["sizes"]["feature"] == 12
    assert describe(str(path), max_features=10, preprocess={"pca": 4})["sizes"]["feature"] == 4
    wide = ad.AnnData(X=sp.random(20, 10_001, density=0.001, format="csr", random_state=0))
    wide.write_h5ad(tmp_path / "wide.h5ad")
    with pytest.raises(
        ValueError, match=r"10,001 features wide, above the width limit of 10,000.*preprocess"
    ):
        describe(str(tmp_path / "wide.h5ad"))
    np.save(tmp_path / "wide.npy", np.zeros((5, 30)))
    with pytest.raises(ValueError, match="30 features wide"):
        describe(str(tmp_path / "wide.npy"), max_features=20)


def test_a_pandas_index_column_is_dropped_and_missing_labels_are_unlabelled(tmp_path, caplog):
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(30, 3)), columns=["a", "b", "c"])
    df["cell_type"] = rng.choice(["x", "y"], 30)
    df.loc[[2, 4], "cell_type"] = np.nan
    df.to_csv(tmp_path / "t.csv")  # pandas' default: an unnamed index column 0..N-1
    with caplog.at_level(logging.INFO, logger="lvmcore.data"):
        ds = load(str(tmp_path / "t.csv"), label_column="cell_type")
    assert "a pandas index): dropped" in caplog.text
    np.testing.assert_array_equal(ds["Y"].values, df[["a", "b", "c"]].to_numpy())
    assert (ds["label"].values[[2, 4]] == MISSING_LABEL).all() and json.loads(ds.attrs["label_names"]) == [
        "x",
        "y",
    ]
    assert json.loads(ds.attrs["params"]) == {
        "header": True,
        "dropped_index_column": True,
        "label_column": "cell_type",
    }
    # a first column that is data (named, or not 0..N-1) is kept
    df.to_csv(tmp_path / "named.csv", index_label="id")
    assert load(str(tmp_path / "named.csv"), label_column="cell_type").sizes["feature"] == 4


def _pbmc():
    sc = pytest.importorskip("scanpy")
    return os.path.join(os.path.dirname(sc.__file__), "datasets", "10x_pbmc68k_reduced.h5ad")


def test_the_recorded_options_are_the_applied_ones_pbmc(tmp_path):
    """scanpy's bundled pbmc68k_reduced: use_rep X_pca is fitted (50 columns, not X's 765) and the
    plan records it, with the label names."""
    from flows.sweep import plan_sweep

    spec = {"path": _pbmc(), "use_rep": "X_pca", "label_column": "bulk_labels"}
    plan = plan_sweep(
        spec, ["ppca"], {"latent_dim": [2], "seed": [0]}, str(tmp_path / "x.zarr"), None, 0, "auto"
    )
    assert plan.size == [700, 50]
    assert json.loads(plan.provenance["params"]) == {"use_rep": "X_pca", "label_column": "bulk_labels"}
    assert "CD14+ Monocyte" in json.loads(plan.provenance["label_names"])
    assert json.loads(plan.provenance["source_info"])["kind"] == "h5ad"


def test_bad_data_set_options_exit_2_before_any_server_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    path, _ = _adata(tmp_path)
    for dataset, message in [
        ({"path": _pbmc(), "bogus_option": 3}, "option 'bogus_option'; accepted: color_column"),
        ({"path": str(path), "max_features": 10}, "12 features wide, above the width limit of 10"),
        ({"path": str(path), "preprocess": {"pca": 4, "hvg": 100}}, "preprocess option 'hvg'"),
        ({"name": "digits", "classes": 3, "n_per_class": 500}, "n_per_class = 500 is out of range"),
        ({"name": "swiss_roll", "colour": 3}, "option 'colour'; accepted: n, seed"),
    ]:
        out = tmp_path / "out"
        argv = ["run", "--out", str(out), "--no-report", "--models", "ppca", "--grid", G1]
        rc = cli_main([*argv, "--dataset", json.dumps(dataset)])
        err = capsys.readouterr().err
        assert rc == 2, (dataset, err)
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert not (out / "prefect-server.log").exists()


def test_numeric_label_columns_are_classes_only_when_few_and_whole(tmp_path):
    """Cluster ids stored as numbers (floats with NaN included) are classes; a count per cell (whole
    numbers, most of them distinct) is a quantity and refused, pointing at color_column."""
    path, a = _adata(tmp_path, n=60)
    rng = np.random.default_rng(3)
    a.obs["leiden"] = rng.integers(0, 4, 60).astype(np.float64)
    a.obs.loc[a.obs_names[:3], "leiden"] = np.nan
    a.obs["n_counts"] = rng.permutation(np.arange(1000, 1060)).astype(np.float32)
    a.write_h5ad(path)
    codes = load(str(path), use_rep="X_pca", label_column="leiden")["label"].values
    assert (codes[:3] == -1).all() and set(codes[3:]) <= {0, 1, 2, 3}
    with pytest.raises(ValueError, match=r"'n_counts' holds whole numbers, most of them distinct \(60"):
        describe(str(path), use_rep="X_pca", label_column="n_counts")
    assert describe(str(path), use_rep="X_pca", color_column="n_counts")["sizes"]["point"] == 60
