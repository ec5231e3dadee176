"""AnnData export and the choice of "best": `embed-sweep export` read back with anndata.read_h5ad,
named settings, refusals, and the selection criterion checked on data with known truth."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pytest
import xarray as xr
from scipy.stats import spearmanr

from embed_sweep import export, open_store, select, to_anndata
from flows.cli import main as cli_main
from tasks.results.selection import criterion_of, geodesic_agreement, parse_setting
from tests.cli_checks import refused
from tests.results_store import build_store

ROLL = {"name": "swiss_roll", "n": 150, "seed": 1}
GRID = {"k": [6, 9, 12], "latent_dim": [1, 2], "seed": [0, 1]}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "roll.zarr"
    return build_store(path, ROLL, ["ppca", "glle_em", "lllvm"], GRID, {"lllvm": {"max_iter": 4}})


@pytest.mark.slow  # the module's store (three models, 32 grid points, JAX compiles) is built here
def test_export_writes_every_model_with_provenance_and_reads_back(store, tmp_path, capsys):
    out = tmp_path / "roll.h5ad"
    assert cli_main(["export", str(store), "--to", str(out)]) == 0
    assert "X_glle_em" in capsys.readouterr().out
    a = ad.read_h5ad(out)
    tree = open_store(store)
    data = xr.open_zarr(store.parent / "roll.inputs" / "data.zarr", consolidated=False)
    assert a.shape == (150, 3)
    np.testing.assert_array_equal(a.X, data["Y"].values)
    np.testing.assert_array_equal(a.obs["manifold_parameter"].values, data["color"].values)
    uns = a.uns["embed_sweep"]
    assert uns["sweep_id"] == tree.attrs["sweep_id"] and uns["identity"] == tree.attrs["identity"]
    assert set(uns["models"]) == {"ppca", "glle_em", "lllvm"}
    for key in ("ppca", "glle_em", "lllvm"):
        info = uns["models"][key]
        setting = {d: (v.item() if hasattr(v, "item") else v) for d, v in info["setting"].items()}
        cell = tree[key].ds.sel(setting)
        q = setting["latent_dim"]
        assert a.obsm[f"X_{key}"].shape == (150, q)
        np.testing.assert_array_equal(a.obsm[f"X_{key}"], cell["embedding"].values[:, :q])
        assert info["elbo"] == float(cell["elbo"])
        assert info["metrics"]["trustworthiness"] == float(cell["trustworthiness"])
        assert info["criterion"] == select(store, key)["criterion"]
    # posterior variances only where the model has them (PPCA, LL-LVM), same shape, positive
    assert "X_glle_em_var" not in a.obsm
    for key in ("ppca", "lllvm"):
        assert a.obsm[f"X_{key}_var"].shape == a.obsm[f"X_{key}"].shape
        assert (a.obsm[f"X_{key}_var"] > 0).all()


def test_export_of_a_named_setting_and_one_model(store, tmp_path):
    out = tmp_path / "one.h5ad"
    argv = [
        "export",
        str(store),
        "--to",
        str(out),
        "--model",
        "glle_em",
        "--setting",
        "k=6,latent_dim=1,seed=1",
    ]
    assert cli_main(argv) == 0
    a = ad.read_h5ad(out)
    assert [k for k in a.obsm if k.startswith("X_")] == ["X_glle_em"]
    want = open_store(store)["glle_em"].ds["embedding"].sel(k=6, latent_dim=1, seed=1).values[:, :1]
    np.testing.assert_array_equal(a.obsm["X_glle_em"], want)
    assert dict(a.uns["embed_sweep"]["models"]["glle_em"]["setting"]) == {"k": 6, "latent_dim": 1, "seed": 1}
    # a partial setting: the criterion chooses what is left open, within the named slice
    part = select(store, "glle_em", "k=9")
    assert part["setting"]["k"] == 9 and part["criterion"].startswith("named (k=9)")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--setting", "k=7"], "k=7 is not in the grid; its values are [6, 9, 12]"),
        (["--setting", "depth=3"], "write dimension=value"),
        (["--setting", "k=eight"], "'eight' is not a number"),
        (["--model", "umap"], "models ['umap'] are not in"),
        (["--from", "mine.h5ad"], "--from mine.h5ad: the data of"),  # a named data set has no file
        (["--to-csv"], None),
    ],
)
def test_bad_export_requests_are_refused_before_writing(store, tmp_path, capsys, argv, message):
    out = tmp_path / "x.h5ad"
    if message is None:  # a file name that is not .h5ad
        assert cli_main(["export", str(store), "--to", str(tmp_path / "x.csv")]) == 2
        assert "must end in .h5ad" in capsys.readouterr().err
        return
    assert cli_main(["export", str(store), "--to", str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(ValueError, match="does not exist"):
        to_anndata(tmp_path / "nothing.zarr")


def test_parse_setting():
    assert parse_setting("k=8, latent_dim=2,seed=0,kappa=30") == {
        "k": 8,
        "latent_dim": 2,
        "seed": 0,
        "kappa": 30.0,
    }
    assert parse_setting(None) == {}


def test_glle_bound_is_not_comparable_across_k_so_geodesic_agreement_chooses(store):
    """Known truth on the Swiss roll: GLLE's log-likelihood grows with k for every latent_dim and
    seed (more neighbours, more reconstruction freedom), so the bound cannot choose k; the
    summary's criterion says so, and its pick is the geodesic agreement's argmax over the
    bound's per-k winners."""
    ds = open_store(store)["glle_em"].ds
    elbo = ds["elbo"].transpose("latent_dim", "seed", "k").values
    assert (np.diff(elbo, axis=-1) > 0).all(), elbo
    crit = criterion_of(ds, "glle_em")
    assert crit["by_quality"] == ["k", "latent_dim"] and crit["by_bound"] == ["seed"]
    chosen = select(store, "glle_em")
    data = store.parent / "roll.inputs" / "data.zarr"
    best = max(
        (
            geodesic_agreement(
                data,
                ds["embedding"]
                .sel(
                    k=k,
                    latent_dim=q,
                    seed=int(ds["seed"].values[np.argmax(ds["elbo"].sel(k=k, latent_dim=q).values)]),
                )
                .values,
            ),
            (k, q),
        )
        for k in GRID["k"]
        for q in GRID["latent_dim"]
    )
    assert (chosen["setting"]["k"], chosen["setting"]["latent_dim"]) == best[1]
    assert chosen["metrics"]["geodesic_agreement"] == pytest.approx(best[0])
    # the same choice from the opened tree (README's `select(open_store(path), ...)`) as from the path
    from_tree = select(open_store(store), "glle_em")
    assert from_tree["setting"] == chosen["setting"] and from_tree["criterion"] == chosen["criterion"]
    # PPCA's likelihood grows with latent_dim (nested models): not comparable there either
    ppca = open_store(store)["ppca"].ds["elbo"]
    assert (ppca.sel(latent_dim=2) > ppca.sel(latent_dim=1)).all()


@pytest.mark.parametrize("name", ["swiss_roll", "s_curve"])
def test_geodesic_agreement_equals_isomap_reference_and_ranks_the_truth_first(tmp_path, name):
    """The criterion against an independent implementation (scikit-learn Isomap's graph distances
    at the same k and scipy's spearmanr), and on known truth: the manifold's intrinsic coordinates
    (for the roll: arc length along the spiral and height; the stored (t, height) is not isometric,
    arc length grows as t^2 / 2) agree with the data's geodesics better than its linear projection
    does (far better on the roll, which a projection cannot unroll)."""
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial.distance import pdist, squareform
    from sklearn.manifold import Isomap
    from sklearn.neighbors import kneighbors_graph

    from tasks.ingest import ingest_dataset

    path = tmp_path / "data.zarr"
    ingest_dataset({"name": name, "n": 300, "seed": 1}, str(path))
    data = xr.open_zarr(path, consolidated=False)
    Y, truth = data["Y"].values, data["truth"].values
    if name == "swiss_roll":
        t = truth[:, 0]
        truth = np.column_stack([0.5 * (t * np.sqrt(1 + t**2) + np.arcsinh(t)), truth[:, 1]])
    k = next(k for k in range(3, 31) if connected_components(kneighbors_graph(Y, k))[0] == 1)
    G = Isomap(n_neighbors=k, n_components=2).fit(Y).dist_matrix_
    iu = np.triu_indices(len(Y), k=1)
    ref = spearmanr(squareform(pdist(truth))[iu], G[iu])[0]
    assert geodesic_agreement(path, truth) == pytest.approx(ref, abs=1e-12)
    pca = Y @ np.linalg.svd(Y - Y.mean(0), full_matrices=False)[2][:2].T
    margin = 0.1 if name == "swiss_roll" else 0.01
    assert geodesic_agreement(path, truth) > 0.9
    assert geodesic_agreement(path, truth) > geodesic_agreement(path, pca) + margin


def test_store_records_whether_each_fit_converged(store):
    """`converged` per grid point, checked against the stored traces: 1 where the fit ended by its
    own rule (PPCA: a closed form; GLLE's EM and LL-LVM's variational EM: the last relative change
    of the objective at most tol), 0 where it ran out of iterations (LL-LVM at max_iter 4 here);
    select() returns the chosen point's flag and the summary counts the finished points without."""
    from lvmcore.models import GLLE, LLLVM
    from tasks.results.selection import summary_rows

    tree = open_store(store)
    tols = {"glle_em": GLLE().tol, "lllvm": LLLVM().tol}
    seen = set()
    for key in ("ppca", "glle_em", "lllvm"):
        ds = tree[key].ds
        conv = ds["converged"].values.ravel()
        traces = ds["elbo_trace"].values.reshape(conv.size, -1)
        for flag, tr in zip(conv, traces, strict=True):
            t = tr[np.isfinite(tr)]
            if key == "ppca":
                want = True
            else:
                want = len(t) > 1 and abs(t[-1] - t[-2]) <= tols[key] * abs(t[-1])
            assert flag == float(want), (key, flag, t[-3:])
            seen.add((key, bool(flag)))
        chosen = select(store, key)
        cell = ds.sel(chosen["setting"])
        assert chosen["converged"] is bool(cell["converged"])
    assert {("ppca", True), ("glle_em", True), ("lllvm", False)} <= seen
    rows = {r["model"]: r for r in summary_rows(store)}
    for key in ("ppca", "glle_em", "lllvm"):
        assert rows[key]["not converged"] == int((tree[key].ds["converged"].values == 0).sum())
    assert rows["lllvm"]["not converged"] > 0


# ---- the user's own entries: never replaced unasked (review of the export into the user's file) ----
# scanpy's bundled pbmc68k_reduced, saved by the user with their own obsm["X_ppca"] (7 columns)
# and an earlier uns["embed_sweep"]: the sweep reads that file, the export writes a copy of it.

PBMC_DATASET = {"use_rep": "X_pca", "label_column": "bulk_labels"}


def _read(path):
    import warnings

    sc = pytest.importorskip("scanpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sc.read_h5ad(path)


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """(the user's file, sweep A's store, sweep B's store): two PPCA sweeps over the same file."""
    import importlib.resources

    pytest.importorskip("scanpy")
    home = tmp_path_factory.mktemp("own")
    pbmc = _read(importlib.resources.files("scanpy") / "datasets" / "10x_pbmc68k_reduced.h5ad")
    pbmc.obsm["X_ppca"] = np.arange(pbmc.n_obs * 7, dtype=np.float64).reshape(-1, 7)
    pbmc.uns["embed_sweep"] = {"previous_sweep": "keep me"}
    src = home / "pbmc_own.h5ad"
    pbmc.write_h5ad(src)
    dataset = {"path": str(src), **PBMC_DATASET}
    a = build_store(home / "a.zarr", dataset, ["ppca"], {"latent_dim": [2], "seed": [0]})
    b = build_store(home / "b.zarr", dataset, ["ppca"], {"latent_dim": [3], "seed": [0]})
    return src, a, b


def test_a_clash_with_the_users_own_keys_is_refused_before_writing(own, tmp_path, capsys):
    from lvmcore.data import file_fingerprint

    src, a, _ = own
    before = file_fingerprint(src)
    out = tmp_path / "out.h5ad"
    err = refused(
        ["export", str(a), "--to", str(out)],
        capsys,
        "obsm ['X_ppca']",
        "uns ['embed_sweep']",
        "--key-added NAME",
        "obsm['X_ppca_NAME']",
        "uns['embed_sweep_NAME']",
        "--overwrite",
    )
    assert "X_ppca_var" not in err  # the file has no such key: only the clashing ones are named
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing written, not even partly
    # an existing --to is left as it was (it is not an earlier export: refused as such, issue 51 SW1)
    out.write_bytes(b"an earlier file")
    refused(["export", str(a), "--to", str(out)], capsys, str(out), "not an earlier export", "--replace-file")
    assert out.read_bytes() == b"an earlier file"
    assert file_fingerprint(src) == before
    # the same rule in Python
    with pytest.raises(ValueError, match=r"already has obsm \['X_ppca'\]"):
        to_anndata(a)


def test_key_added_keeps_the_users_entries_and_adds_named_ones(own, tmp_path, capsys):
    src, a, _ = own
    user = _read(src)
    out = tmp_path / "named.h5ad"
    assert cli_main(["export", str(a), "--to", str(out), "--key-added", "sweepA"]) == 0
    said = capsys.readouterr().out
    assert "added obsm ['X_ppca_sweepA', 'X_ppca_sweepA_var'] and uns ['embed_sweep_sweepA']" in said
    assert "everything in it kept" in said and "replaced" not in said
    got = _read(out)
    np.testing.assert_array_equal(got.obsm["X_ppca"], user.obsm["X_ppca"])  # the user's, 7 columns
    assert got.uns["embed_sweep"] == {"previous_sweep": "keep me"}
    chosen = select(a, "ppca")
    np.testing.assert_array_equal(got.obsm["X_ppca_sweepA"], chosen["embedding"])
    np.testing.assert_array_equal(got.obsm["X_ppca_sweepA_var"], chosen["embedding_var"])
    prov = got.uns["embed_sweep_sweepA"]
    assert prov["key_added"] == "sweepA" and prov["models"]["ppca"]["obsm_key"] == "X_ppca_sweepA"
    assert prov["source"]["options"] == {"use_rep": "X_pca", "label_column": "bulk_labels"}  # a mapping
    assert set(got.obsm) == set(user.obsm) | {"X_ppca_sweepA", "X_ppca_sweepA_var"}
    assert set(got.uns) == set(user.uns) | {"embed_sweep_sweepA"}
    # the same export again into a fresh file: the same bytes
    again = tmp_path / "again.h5ad"
    assert cli_main(["export", str(a), "--to", str(again), "--key-added", "sweepA"]) == 0
    assert again.read_bytes() == out.read_bytes()
    # scanpy uses the named key as any other
    sc = pytest.importorskip("scanpy")
    sc.pp.neighbors(got, use_rep="X_ppca_sweepA", n_neighbors=10)
    # names that cannot be a key are refused
    for bad in ("a/b", "", "two words"):
        refused(
            ["export", str(a), "--to", str(tmp_path / "x.h5ad"), "--key-added", bad], capsys, "--key-added"
        )
    assert not (tmp_path / "x.h5ad").exists()


def test_overwrite_replaces_the_clashing_keys_and_says_which(own, tmp_path, capsys):
    src, a, _ = own
    out = tmp_path / "over.h5ad"
    assert cli_main(["export", str(a), "--to", str(out), "--overwrite"]) == 0
    said = capsys.readouterr().out
    assert "everything in it kept" not in said
    assert "replaced (--overwrite) obsm ['X_ppca'] and uns ['embed_sweep']" in said
    assert "added obsm ['X_ppca_var']" in said
    got = _read(out)
    np.testing.assert_array_equal(got.obsm["X_ppca"], select(a, "ppca")["embedding"])
    assert got.obsm["X_ppca"].shape == (700, 2)
    assert "previous_sweep" not in got.uns["embed_sweep"] and "ppca" in got.uns["embed_sweep"]["models"]
    # the other entries of the user's file are kept
    user = _read(src)
    np.testing.assert_array_equal(got.obsm["X_pca"], user.obsm["X_pca"])
    assert got.obs.equals(user.obs)


def test_chained_exports_with_key_added_keep_both_sweeps(own, tmp_path, capsys):
    src, a, b = own
    first, second = tmp_path / "a.h5ad", tmp_path / "ab.h5ad"
    assert cli_main(["export", str(a), "--to", str(first), "--key-added", "a"]) == 0
    # the second sweep into the first's output: its key is taken, and refused as such
    refused(
        ["export", str(b), "--to", str(second), "--from", str(first), "--key-added", "a"],
        capsys,
        "obsm ['X_ppca_a', 'X_ppca_a_var']",
        "uns ['embed_sweep_a']",
    )
    assert not second.exists()
    assert cli_main(["export", str(b), "--to", str(second), "--from", str(first), "--key-added", "b"]) == 0
    got = _read(second)
    np.testing.assert_array_equal(got.obsm["X_ppca"], _read(src).obsm["X_ppca"])
    np.testing.assert_array_equal(got.obsm["X_ppca_a"], select(a, "ppca")["embedding"])
    np.testing.assert_array_equal(got.obsm["X_ppca_b"], select(b, "ppca")["embedding"])
    assert got.obsm["X_ppca_a"].shape == (700, 2) and got.obsm["X_ppca_b"].shape == (700, 3)
    assert got.uns["embed_sweep"] == {"previous_sweep": "keep me"}
    assert got.uns["embed_sweep_a"]["sweep_id"] == open_store(a).attrs["sweep_id"]
    assert got.uns["embed_sweep_b"]["sweep_id"] == open_store(b).attrs["sweep_id"]
    assert got.uns["embed_sweep_b"]["source"]["path"] == str(first)


def test_the_mudata_export_keeps_the_users_keys_and_records_the_cells_the_join_dropped(tmp_path, capsys):
    """A .h5mu whose root obsm/uns already hold X_ppca and embed_sweep: refused, then --key-added
    adds beside them; the 20 cells the join dropped are named in uns."""
    import mudata as md

    rng = np.random.default_rng(1)
    n = 120
    names = [f"cell-{i}" for i in range(n)]
    rna = ad.AnnData(X=rng.normal(size=(n, 8)))
    rna.obs_names = names
    rna.obs["ct"] = np.where(np.arange(n) % 2 == 0, "T", "B")
    rna.var_names = [f"g{i}" for i in range(8)]
    keep = np.sort(rng.choice(n, n - 20, replace=False))
    prot = ad.AnnData(X=rng.normal(size=(n - 20, 4)))
    prot.obs_names = [names[i] for i in keep]
    prot.var_names = [f"adt{i}" for i in range(4)]
    mu = md.MuData({"rna": rna, "prot": prot})
    mu.obsm["X_ppca"] = np.ones((mu.n_obs, 5))
    mu.uns["embed_sweep"] = {"previous_sweep": "keep me"}
    f = tmp_path / "cite.h5mu"
    mu.write(f)
    store = build_store(
        tmp_path / "cite.zarr",
        {"path": str(f), "label_column": "rna:ct"},
        ["ppca"],
        {"latent_dim": [2], "seed": [0]},
    )
    out = tmp_path / "cite_embedded.h5mu"
    refused(
        ["export", str(store), "--to", str(out)],
        capsys,
        "obsm ['X_ppca']",
        "uns ['embed_sweep']",
        "--key-added",
    )
    assert not out.exists()
    assert cli_main(["export", str(store), "--to", str(out), "--key-added", "cite"]) == 0
    said = capsys.readouterr().out
    assert "added obsm ['X_ppca_cite', 'X_ppca_cite_var'] and uns ['embed_sweep_cite']" in said
    assert "20 cells of it were not in every modality" in said
    got = md.read_h5mu(out)
    np.testing.assert_array_equal(got.obsm["X_ppca"], np.ones((n, 5)))
    assert got.uns["embed_sweep"] == {"previous_sweep": "keep me"}
    X = got.obsm["X_ppca_cite"]
    dropped = sorted(set(names) - {names[i] for i in keep})
    assert sorted(got.obs_names[np.isnan(X[:, 0])]) == dropped
    src = got.uns["embed_sweep_cite"]["source"]
    assert dict(src["dropped"]) == {"rna": 20, "prot": 0}  # per modality: its cells left out
    assert sorted(src["dropped_obs_names"]) == dropped
    assert src["options"]["label_column"] == "rna:ct" and isinstance(src["options"], dict)
    # --overwrite replaces the root keys, and says so
    over = tmp_path / "over.h5mu"
    assert cli_main(["export", str(store), "--to", str(over), "--overwrite"]) == 0
    assert "replaced (--overwrite) obsm ['X_ppca'] and uns ['embed_sweep']" in capsys.readouterr().out
    got = md.read_h5mu(over)
    assert got.obsm["X_ppca"].shape == (n, 2) and "models" in got.uns["embed_sweep"]
    for m in ("rna", "prot"):
        assert got[m].obs.equals(mu[m].obs)


def test_chained_exports_of_the_users_file_without_from_keep_both_sweeps(own, tmp_path, capsys):
    """Issue 51 SW2: the second export into the first's output (no --from) adds its keys to it."""
    src, a, b = own
    both = tmp_path / "both.h5ad"
    assert cli_main(["export", str(a), "--to", str(both), "--key-added", "a"]) == 0
    capsys.readouterr()
    assert cli_main(["export", str(b), "--to", str(both), "--key-added", "b"]) == 0
    said = capsys.readouterr().out
    assert f"added to {both}, an earlier export of the same data (700 cells)" in said
    assert "added obsm ['X_ppca_b', 'X_ppca_b_var'] and uns ['embed_sweep_b']" in said
    assert "everything in it kept" in said
    got, user = _read(both), _read(src)
    np.testing.assert_array_equal(got.obsm["X_ppca"], user.obsm["X_ppca"])
    np.testing.assert_array_equal(got.obsm["X_ppca_a"], select(a, "ppca")["embedding"])
    np.testing.assert_array_equal(got.obsm["X_ppca_b"], select(b, "ppca")["embedding"])
    assert set(got.obsm) == set(user.obsm) | {"X_ppca_a", "X_ppca_a_var", "X_ppca_b", "X_ppca_b_var"}
    assert got.uns["embed_sweep"] == {"previous_sweep": "keep me"}
    assert got.uns["embed_sweep_a"]["sweep_id"] == open_store(a).attrs["sweep_id"]
    assert got.uns["embed_sweep_b"]["sweep_id"] == open_store(b).attrs["sweep_id"]
    assert got.obs.equals(user.obs)


# ---- an existing --to: an earlier export of the same data is added to, anything else refused ----


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two PPCA sweeps over one named data set (latent_dim 2 and 1), and one over other data."""
    home = tmp_path_factory.mktemp("pair")
    data = {"name": "swiss_roll", "n": 60, "seed": 3}
    grid = {"latent_dim": [2], "seed": [0]}
    a = build_store(home / "a.zarr", data, ["ppca"], grid)
    b = build_store(home / "b.zarr", data, ["ppca"], {"latent_dim": [1], "seed": [0]})
    other = build_store(home / "other.zarr", {**data, "seed": 4}, ["ppca"], grid)
    return a, b, other


def test_an_unrelated_file_at_to_is_refused_unchanged_and_replace_file_moves_it_aside(pair, tmp_path, capsys):
    """Issue 51 SW1: another AnnData at --to is refused byte for byte unchanged; --replace-file moves
    it aside under a printed name, never deleting it."""
    a, _, _ = pair
    mine = tmp_path / "mywork.h5ad"
    ad.AnnData(np.arange(6.0).reshape(3, 2), uns={"precious": "years of notes"}).write_h5ad(mine)
    before = mine.read_bytes()
    refused(
        ["export", str(a), "--to", str(mine)],
        capsys,
        f"--to {mine}: that file exists and is not an earlier export of this store's data",
        "--replace-file",
    )
    with pytest.raises(ValueError, match="--replace-file"):
        export(a, mine)
    assert mine.read_bytes() == before
    junk = tmp_path / "notes.h5ad"  # not even HDF5
    junk.write_bytes(b"my notes")
    refused(["export", str(a), "--to", str(junk)], capsys, "not an AnnData / MuData file", "--replace-file")
    assert junk.read_bytes() == b"my notes"
    (tmp_path / "dir.h5ad").mkdir()
    refused(["export", str(a), "--to", str(tmp_path / "dir.h5ad")], capsys, "that is a folder")
    assert cli_main(["export", str(a), "--to", str(mine), "--replace-file"]) == 0
    said = capsys.readouterr().out
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("mywork.replaced-")]
    assert len(aside) == 1 and aside[0].suffix == ".h5ad"
    assert f"moved the file that was at {mine} aside to {aside[0]} (--replace-file)" in said
    assert aside[0].read_bytes() == before
    assert ad.read_h5ad(aside[0]).uns["precious"] == "years of notes"
    got = ad.read_h5ad(mine)
    assert got.shape == (60, 3) and "precious" not in got.uns
    np.testing.assert_array_equal(got.obsm["X_ppca"], select(a, "ppca")["embedding"])


def test_chained_exports_of_two_stores_over_the_same_data_keep_both(pair, tmp_path, capsys):
    """Issue 51 SW2 for data that is not the user's file: the second export adds its keys to the
    first's file (README's chaining without --from); a clash is refused as for the user's file,
    --overwrite replaces only the clashing keys, and an export of other data is refused."""
    a, b, other = pair
    both = tmp_path / "both.h5ad"
    assert cli_main(["export", str(a), "--to", str(both)]) == 0
    first = ad.read_h5ad(both)
    before = both.read_bytes()
    refused(["export", str(b), "--to", str(both)], capsys, "obsm ['X_ppca', 'X_ppca_var']", "--key-added")
    refused(
        ["export", str(other), "--to", str(both)], capsys, "its exports are of other data", "--replace-file"
    )
    assert both.read_bytes() == before
    capsys.readouterr()
    assert cli_main(["export", str(b), "--to", str(both), "--key-added", "second"]) == 0
    said = capsys.readouterr().out
    assert f"added to {both}, an earlier export of the same data (60 cells)" in said
    assert "everything in it kept" in said
    got = ad.read_h5ad(both)
    np.testing.assert_array_equal(got.X, first.X)
    assert got.obs.equals(first.obs)
    for key in first.obsm:
        np.testing.assert_array_equal(got.obsm[key], first.obsm[key])
    np.testing.assert_array_equal(got.obsm["X_ppca"], select(a, "ppca")["embedding"])
    np.testing.assert_array_equal(got.obsm["X_ppca_second"], select(b, "ppca")["embedding"])
    assert got.obsm["X_ppca"].shape == (60, 2) and got.obsm["X_ppca_second"].shape == (60, 1)
    assert set(got.obsm) == set(first.obsm) | {"X_ppca_second", "X_ppca_second_var"}
    assert got.uns["embed_sweep"]["sweep_id"] == open_store(a).attrs["sweep_id"]
    assert got.uns["embed_sweep_second"]["sweep_id"] == open_store(b).attrs["sweep_id"]
    # --overwrite replaces the clashing keys of the earlier export and keeps the rest
    assert cli_main(["export", str(b), "--to", str(both), "--overwrite"]) == 0
    assert (
        "replaced (--overwrite) obsm ['X_ppca', 'X_ppca_var'] and uns ['embed_sweep']"
        in capsys.readouterr().out
    )
    again = ad.read_h5ad(both)
    np.testing.assert_array_equal(again.obsm["X_ppca"], select(b, "ppca")["embedding"])
    np.testing.assert_array_equal(again.obsm["X_ppca_second"], got.obsm["X_ppca_second"])
    assert again.uns["embed_sweep"]["sweep_id"] == open_store(b).attrs["sweep_id"]
    assert again.uns["embed_sweep_second"]["sweep_id"] == open_store(b).attrs["sweep_id"]


def test_the_old_import_path_warns_and_gives_the_same_objects():
    """README's former import (tasks.results) keeps working with a DeprecationWarning naming the new
    one; the objects are embed_sweep's."""
    import embed_sweep
    import tasks.results
    from tasks.results import selection

    for name in ("open_store", "select", "to_anndata"):
        with pytest.warns(DeprecationWarning, match=f"use `from embed_sweep import {name}`"):
            old = getattr(tasks.results, name)
        assert old is getattr(embed_sweep, name)
    with pytest.warns(DeprecationWarning, match="use `from tasks.results.selection import criterion_of`"):
        from tasks.results import criterion_of
    assert criterion_of is selection.criterion_of
    with pytest.raises(AttributeError):
        tasks.results.no_such_name  # noqa: B018
