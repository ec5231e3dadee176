"""The users' own objects back (issue 33, items 5 and 6; issue 36, W7): a sweep through the CLI on
scanpy's bundled pbmc68k_reduced (an .h5ad: use_rep X_pca, labels from bulk_labels), exported into
a copy of that file and read back with scanpy, which runs its neighbours graph, an embedding plot
and UMAP on it; the refusals of the export (a moved or changed source, another file's cells, a
store being written); a MuData exported into a copy of its .h5mu; the report's legend of the label
names. Real files, a real Prefect server and a real Dask cluster; scanpy and mudata read back."""

from __future__ import annotations

import importlib.resources
import json
import shutil
import warnings
from pathlib import Path

import anndata as ad
import numpy as np
import pytest
import zarr

from embed_sweep import select, to_anndata
from flows.cli import main as cli_main
from lvmcore.checks import MISSING_LABEL
from lvmcore.data import file_fingerprint, label_names, obs_names
from tests.cli_checks import refused
from tests.prefect_server import pointed_at
from tests.results_store import build_store, hold_lock

sc = pytest.importorskip("scanpy")  # a pinned test dependency (the [test] extra)
# the bundled file is in anndata's old format, and anndata says so on every read of it
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*without encoding metadata", "ignore:.*very old version of AnnData", "ignore::FutureWarning"
)

ROOT = Path(__file__).resolve().parents[1]
PBMC = importlib.resources.files("scanpy") / "datasets" / "10x_pbmc68k_reduced.h5ad"
MODELS = ("ppca", "glle_em")


def read_h5ad(path):
    with warnings.catch_warnings():  # the bundled file is in anndata's old format: it says so
        warnings.simplefilter("ignore")
        return sc.read_h5ad(path)


@pytest.fixture(scope="module")
def pbmc(prefect_api, sweep_cluster, tmp_path_factory):
    """One CLI sweep over a copy of the bundled file: (source file, store)."""
    home = tmp_path_factory.mktemp("pbmc")
    src = home / "pbmc.h5ad"
    shutil.copyfile(PBMC, src)
    dataset = {"path": str(src), "use_rep": "X_pca", "label_column": "bulk_labels"}
    argv = ["run", "--out", str(home / "results"), "--no-report", "--cluster", sweep_cluster]
    argv += ["--dataset", json.dumps(dataset), "--models", ",".join(MODELS), "--store", "pbmc"]
    argv += ["--grid", '{"k": [10], "latent_dim": [2], "seed": [0]}']
    with pointed_at(prefect_api):
        assert cli_main(argv) == 0
    return src, home / "results" / "pbmc.zarr"


@pytest.fixture(scope="module")
def exported(pbmc, tmp_path_factory):
    src, store = pbmc
    out = tmp_path_factory.mktemp("pbmc-out") / "pbmc_embedded.h5ad"
    assert cli_main(["export", str(store), "--to", str(out)]) == 0
    return out


def test_the_export_is_the_users_file_with_the_embeddings_added(pbmc, exported, capsys):
    src, store = pbmc
    before, after = read_h5ad(PBMC), read_h5ad(exported)
    # everything of the input unchanged: every obs column (values and dtypes), names, X, obsm
    assert list(after.obs.columns) == list(before.obs.columns)
    assert after.obs.equals(before.obs)
    assert (after.obs_names == before.obs_names).all() and (after.var_names == before.var_names).all()
    assert after.var.equals(before.var)
    np.testing.assert_array_equal(after.X, before.X)
    for key in before.obsm:
        np.testing.assert_array_equal(after.obsm[key], before.obsm[key])
    assert set(before.uns) < set(after.uns)
    # the embeddings: the store's chosen points, on the file's cells
    for m in MODELS:
        chosen = select(store, m)
        np.testing.assert_array_equal(after.obsm[f"X_{m}"], chosen["embedding"])
        info = after.uns["embed_sweep"]["models"][m]
        assert info["criterion"] == chosen["criterion"] and info["elbo"] == chosen["elbo"]
    np.testing.assert_array_equal(after.obsm["X_ppca_var"], select(store, "ppca")["embedding_var"])
    assert "X_glle_em_var" not in after.obsm  # GLLE has no posterior variances
    prov = after.uns["embed_sweep"]["source"]
    assert prov["path"] == str(src) and prov["fingerprint"] == file_fingerprint(src)
    assert dict(prov["options"]) == {"label_column": "bulk_labels", "use_rep": "X_pca"}
    assert file_fingerprint(src) == file_fingerprint(PBMC)  # the user's file itself is untouched
    # scanpy works on it as on any AnnData
    sc.pp.neighbors(after, use_rep="X_glle_em", n_neighbors=10)
    assert after.obsp["connectivities"].shape == (700, 700)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = sc.pl.embedding(after, basis="X_glle_em", color="bulk_labels", show=False)
    assert len(ax.get_legend_handles_labels()[1]) == len(before.obs["bulk_labels"].cat.categories)
    plt.close("all")
    # to_anndata gives the same object in Python
    obj = to_anndata(store)
    assert obj.obs.equals(before.obs) and set(obj.obsm) == set(after.obsm)
    np.testing.assert_array_equal(obj.obsm["X_glle_em"], after.obsm["X_glle_em"])


@pytest.mark.slow  # UMAP compiles its numba functions on first use in a fresh environment
def test_umap_runs_on_the_exported_embedding(exported):
    a = read_h5ad(exported)
    sc.pp.neighbors(a, use_rep="X_ppca", n_neighbors=15)
    sc.tl.umap(a, random_state=0)
    assert a.obsm["X_umap"].shape == (700, 2) and np.isfinite(a.obsm["X_umap"]).all()



def test_a_moved_or_changed_source_is_refused_naming_from(pbmc, tmp_path, capsys):
    src, store = pbmc
    out = tmp_path / "out.h5ad"
    export = ["export", str(store), "--to", str(out)]
    keep = tmp_path / "kept.h5ad"
    shutil.copyfile(src, keep)
    try:
        src.unlink()  # the file moved
        refused(export, capsys, f"the file the sweep read, {src}, is missing", "--from FILE")
        assert not out.exists()
        assert cli_main([*export, "--from", str(keep)]) == 0
        assert read_h5ad(out).uns["embed_sweep"]["source"]["path"] == str(keep)
        out.unlink()
        # the file changed in place: a new obs column (its cells are the same)
        a = read_h5ad(keep)
        a.obs["donor"] = "d1"
        a.write_h5ad(src)
        refused(export, capsys, f"{src} changed since the sweep read it", "--from FILE")
        assert not out.exists()
        # named with --from, the changed file is written into: its cells are the sweep's
        assert cli_main([*export, "--from", str(src)]) == 0
        got = read_h5ad(out)
        assert "donor" in got.obs and "X_glle_em" in got.obsm
        prov = got.uns["embed_sweep"]["source"]
        assert prov["fingerprint"] == file_fingerprint(src) != prov["sweep_fingerprint"]
    finally:
        shutil.copyfile(keep, src)
    assert file_fingerprint(src) == file_fingerprint(PBMC)


def test_a_file_with_other_cells_isrefused(pbmc, tmp_path, capsys):
    src, store = pbmc
    out = tmp_path / "out.h5ad"
    a = read_h5ad(src)
    fewer, more = tmp_path / "fewer.h5ad", tmp_path / "more.h5ad"
    a[:600].copy().write_h5ad(fewer)
    extra = a[:5].copy()
    extra.obs_names = [f"extra-{i}" for i in range(5)]
    ad.concat([a, extra], merge="same").write_h5ad(more)
    renamed = tmp_path / "renamed.h5ad"
    b = a.copy()
    b.obs_names = [f"cell-{i}" for i in range(a.n_obs)]
    b.write_h5ad(renamed)
    export = ["export", str(store), "--to", str(out), "--from"]
    refused([*export, str(fewer)], capsys, "lacks 100 of the sweep's 700 cells")
    refused([*export, str(more)], capsys, "has 5 cells the sweep did not fit", "extra-0")
    refused([*export, str(renamed)], capsys, "lacks 700 of the sweep's 700 cells")
    # the same cells in another order are the same cells: each gets its own row
    shuffled = tmp_path / "shuffled.h5ad"
    order = np.random.default_rng(0).permutation(a.n_obs)
    a[order].copy().write_h5ad(shuffled)
    assert cli_main([*export, str(shuffled)]) == 0
    got = read_h5ad(out)
    np.testing.assert_array_equal(got.obsm["X_ppca"], select(store, "ppca")["embedding"][order])
    # and these are refused too: the user's own file as --to, the wrong kind of file
    out.unlink()
    refused(["export", str(store), "--to", str(src)], capsys, "that is the file the sweep read")
    refused(["export", str(store), "--to", str(tmp_path / "x.h5mu")], capsys, "must end in .h5ad")
    refused([*export, str(tmp_path / "nothing.h5ad")], capsys, "no such file")
    assert not out.exists()


def test_a_store_being_written_is_exported_only_with_partial(pbmc, tmp_path, capsys):
    """Issue 36, W7: a live sweep's lock, or pending points, refuse the export unless --partial."""
    from tasks.store import inputs_dir

    src, store = pbmc
    out = tmp_path / "out.h5ad"
    holder = hold_lock(store)
    try:
        refused(
            ["export", str(store), "--to", str(out)],
            capsys,
            f"a sweep is running on {store} (pid {holder.pid}",
            "0 of its 2 grid points are pending",
            "--partial",
        )
        assert not out.exists()
        assert cli_main(["export", str(store), "--to", str(out), "--partial"]) == 0
        said = capsys.readouterr().out
        assert f"partial export: a sweep is running on the store (pid {holder.pid})" in said
    finally:
        holder.kill()
        holder.wait()
    # pending points (an interrupted sweep's store, no live holder: the dead one's lock is stale)
    copy = tmp_path / "copy.zarr"
    shutil.copytree(store, copy)
    shutil.copytree(inputs_dir(store), inputs_dir(copy))
    zarr.open_group(str(copy), mode="r+")["glle_em"]["status"][...] = 0
    refused(
        ["export", str(copy), "--to", str(out)],
        capsys,
        "has 1 of its 2 grid points pending",
        "run the sweep again",
        "--partial",
    )
    out = tmp_path / "out_pending.h5ad"  # a new file: out.h5ad is the first export (kept, not replaced)
    assert cli_main(["export", str(copy), "--to", str(out), "--partial"]) == 0
    assert "partial export: 1 of 2 grid points pending" in capsys.readouterr().out
    got = read_h5ad(out)
    assert "X_ppca" in got.obsm and "X_glle_em" not in got.obsm
    assert got.uns["embed_sweep"]["models"]["glle_em"]["status"] == "no finished point"
    assert dict(got.uns["embed_sweep"]["partial"]) == {"pending": 1, "total": 2}
    with pytest.raises(ValueError, match="pass --partial"):
        to_anndata(copy)


def test_the_report_colours_by_the_label_names_with_a_legend(pbmc, tmp_path, monkeypatch):
    from tasks.report import _category_rgba, make_report
    from tests.test_report import recording_subplots

    src, store = pbmc
    data_path = store.parent / "pbmc.inputs" / "data.zarr"
    made = recording_subplots(monkeypatch)
    index = make_report(store, tmp_path / "report")
    fig, axes = made[0]  # the chosen embeddings, one panel per model
    names = label_names(data_path)
    assert names == list(read_h5ad(PBMC).obs["bulk_labels"].cat.categories)
    (legend,) = fig.legends
    assert legend.get_title().get_text() == "bulk_labels"
    assert [t.get_text() for t in legend.get_texts()] == names
    # each point has its own label's colour, in the stored (file) order of the cells
    codes = read_h5ad(PBMC).obs["bulk_labels"].cat.codes.to_numpy().astype(float)
    assert (obs_names(data_path) == read_h5ad(PBMC).obs_names).all()
    face = axes.ravel()[0].collections[0].get_facecolors()
    np.testing.assert_allclose(face, _category_rgba(codes, len(names)))
    assert "coloured by bulk_labels; light grey: no value" in Path(index).read_text()


def test_csv_labels_come_back_as_names_with_missing_values_empty(tmp_path):
    """Data from a CSV: the export keeps the label column's name and its category names (not
    codes); an empty label is a missing value, not a class. A numeric colour column comes back
    under its name, and the report colours by it (on viridis) rather than by the labels."""
    import pandas as pd

    from tasks.report import colouring

    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(40, 3)), columns=["a", "b", "c"])
    df["cell_type"] = np.where(np.arange(40) % 2 == 0, "T cell", "B cell")
    df.loc[3, "cell_type"] = ""
    df["time"] = rng.random(40)
    f = tmp_path / "cells.csv"
    df.to_csv(f, index=False)
    store = tmp_path / "cells.zarr"
    dataset = {"path": str(f), "label_column": "cell_type", "color_column": "time"}
    build_store(store, dataset, ["ppca"], {"latent_dim": [1], "seed": [0]})
    data = xr_data(store)
    assert data["label"][3] == MISSING_LABEL
    a = to_anndata(store)
    got = a.obs["cell_type"]
    assert list(got.cat.categories) == ["B cell", "T cell"]
    assert got.isna().tolist() == [i == 3 for i in range(40)]
    assert got.dropna().astype(str).tolist() == df["cell_type"].drop(3).tolist()
    assert a.obsm["X_ppca"].shape == (40, 1)
    np.testing.assert_array_equal(a.obs["time"].to_numpy(), df["time"].to_numpy())
    col = colouring(store)
    assert col["title"] == "time" and col["names"] is None
    np.testing.assert_array_equal(col["values"], df["time"].to_numpy())


def xr_data(store):
    import xarray as xr

    return xr.open_zarr(store.parent / f"{store.stem}.inputs" / "data.zarr", consolidated=False).load()


def test_a_mudata_is_exported_into_a_copy_of_its_h5mu(tmp_path, capsys):
    """Two modalities, 20 cells missing from one: the export is the MuData with the embeddings in
    its own obsm, on its own cells (the 20 the join dropped: NaN rows), the modalities as they were."""
    import mudata as md

    rng = np.random.default_rng(1)
    pbmc = read_h5ad(PBMC)
    rna = ad.AnnData(X=pbmc.obsm["X_pca"][:, :10].copy(), obs=pbmc.obs[["bulk_labels"]].copy())
    rna.var_names = [f"pc{i}" for i in range(10)]
    keep = np.sort(rng.choice(700, 680, replace=False))
    prot = ad.AnnData(X=rng.normal(size=(680, 4)), obs=pbmc.obs.iloc[keep][["phase"]].copy())
    prot.var_names = [f"adt{i}" for i in range(4)]
    f = tmp_path / "cite.h5mu"
    md.MuData({"rna": rna, "prot": prot}).write(f)
    store = tmp_path / "cite.zarr"
    build_store(
        store, {"path": str(f), "label_column": "rna:bulk_labels"}, ["ppca"], {"latent_dim": [2], "seed": [0]}
    )
    out = tmp_path / "cite_embedded.h5mu"
    refused(["export", str(store), "--to", str(tmp_path / "x.h5ad")], capsys, "must end in .h5mu")
    assert cli_main(["export", str(store), "--to", str(out)]) == 0
    assert "20 cells of it were not in every modality" in capsys.readouterr().out
    before, after = md.read_h5mu(f), md.read_h5mu(out)
    assert list(after.mod) == ["rna", "prot"] and (after.obs_names == before.obs_names).all()
    for m in after.mod:
        np.testing.assert_array_equal(after[m].X, before[m].X)
        assert after[m].obs.equals(before[m].obs)
    X = after.obsm["X_ppca"]
    names = obs_names(store.parent / "cite.inputs" / "data.zarr")
    row = {n: i for i, n in enumerate(after.obs_names)}
    at = np.array([row[n] for n in names])
    np.testing.assert_array_equal(X[at], select(store, "ppca")["embedding"])
    assert np.isnan(X).any(axis=1).sum() == 20 and set(after.obs_names[np.isnan(X[:, 0])]).isdisjoint(names)
    assert type(to_anndata(store)).__name__ == "MuData"
