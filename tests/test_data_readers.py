"""The file readers held to anndata's own (obs, var and the matrix rows, on each on-disk format we can
produce: current anndata's writes and scanpy's bundled pre-0.7 pbmc68k_reduced), the SW3
acceptance (its PCA on var['highly_variable'] equals scanpy's), and bad values stopped at the door
in the user's coordinates: NaN / inf, empty matrices and modalities, an obsm DataFrame, a damaged
file told from one held open for writing (issue 51 items 2, 3, 4; issue 49 items 3, 9)."""

from __future__ import annotations

import importlib.resources
import logging
import subprocess
import sys
import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from lvmcore.data import describe, ingest, load, open_dataset, read_obs, read_var
from lvmcore.data.sources import hdf5, planned

PBMC = str(importlib.resources.files("scanpy") / "datasets" / "10x_pbmc68k_reduced.h5ad")


def _read_h5ad(path):
    with warnings.catch_warnings():  # the old format's own warnings
        warnings.simplefilter("ignore")
        return ad.read_h5ad(path)


def _current(tmp_path, sparse: bool):
    rng = np.random.default_rng(0)
    n, d = 50, 7
    X = rng.poisson(2.0, size=(n, d)).astype(np.float32)
    obs = pd.DataFrame(
        {
            "cell_type": pd.Categorical(rng.choice(["T", "B"], n)),
            "stage": rng.choice(["early", "late"], n).astype(object),
            "score": rng.normal(size=n),
            "flag": rng.random(n) < 0.5,
        },
        index=[f"c{i}" for i in range(n)],
    )
    var = pd.DataFrame(
        {"highly_variable": np.arange(d) % 2 == 0, "means": rng.random(d)}, index=[f"g{j}" for j in range(d)]
    )
    a = ad.AnnData(
        X=sp.csr_matrix(X) if sparse else X,
        obs=obs,
        var=var,
        obsm={"X_pca": rng.normal(size=(n, 3))},
        layers={"counts": sp.csr_matrix(X)},
    )
    path = tmp_path / f"current_{'csr' if sparse else 'dense'}.h5ad"
    a.write_h5ad(path)
    return str(path)


def _dense(x):
    return x.toarray() if sp.issparse(x) else np.asarray(x)


@pytest.mark.parametrize("which", ["current-dense", "current-csr", "pbmc68k_reduced (pre-0.7)"])
def test_each_reader_equals_anndatas_on_each_format(tmp_path, which):
    path = PBMC if which.startswith("pbmc") else _current(tmp_path, sparse=which.endswith("csr"))
    a = _read_h5ad(path)
    pd.testing.assert_frame_equal(read_obs(path), a.obs)
    pd.testing.assert_frame_equal(read_var(path), a.var)
    keys = [("X", a.X)] + [(f"obsm/{k}", a.obsm[k]) for k in a.obsm]
    keys += [(f"layers/{k}", a.layers[k]) for k in a.layers if k is not None]  # None: X itself
    for key, want in keys:
        m = hdf5.open_matrix(path, key)
        assert m.shape == want.shape, key
        for lo, hi in [(0, 7), (7, m.shape[0]), (3, 4)]:
            np.testing.assert_array_equal(_dense(m.read(lo, hi)), _dense(want[lo:hi]).astype(np.float64))
        rows = [5, 0, 9, 2]  # a selection, in any order
        np.testing.assert_array_equal(
            _dense(m.select(rows).read(0, 4)), _dense(want[rows]).astype(np.float64)
        )


def test_a_mudata_modalitys_tables_equal_mudatas(tmp_path):
    mudata = pytest.importorskip("mudata")
    rna = _read_h5ad(_current(tmp_path, sparse=True))
    prot = ad.AnnData(
        np.random.default_rng(1).normal(size=(50, 4)),
        obs=pd.DataFrame({"batch": ["a", "b"] * 25}, index=rna.obs_names),
        var=pd.DataFrame({"isotype": [False, True, False, False]}, index=[f"p{j}" for j in range(4)]),
    )
    path = tmp_path / "two.h5mu"
    mudata.MuData({"rna": rna, "prot": prot}).write(str(path))
    md = mudata.read_h5mu(str(path))
    for m in ("rna", "prot"):
        pd.testing.assert_frame_equal(read_obs(str(path), f"mod/{m}"), md[m].obs)
        pd.testing.assert_frame_equal(read_var(str(path), f"mod/{m}"), md[m].var)
        np.testing.assert_array_equal(
            _dense(hdf5.open_matrix(str(path), f"mod/{m}/X").read(0, 50)), _dense(md[m].X).astype(np.float64)
        )


# ---------------------------------------------------------------- SW3, U2: the old-format var


def test_sw3_the_ingested_pca_of_pbmc68k_reduced_is_scanpys_default(tmp_path, caplog):
    """scanpy's bundled file keeps var as one pre-0.7 table with 309 of 765 genes highly variable:
    preprocess pca = 10 uses them (the note printed), and equals scanpy's default sc.pp.pca
    (mask_var="highly_variable") computed in float64, each component up to its sign, to 1e-6."""
    sc = pytest.importorskip("scanpy")
    with caplog.at_level(logging.INFO, logger="lvmcore.data"):
        describe(PBMC, preprocess={"pca": 10})
    assert "PCA on var['highly_variable'] (scanpy's default" in caplog.text
    store = ingest(PBMC, tmp_path / "pbmc.zarr", preprocess={"pca": 10})
    got = open_dataset(store)["Y"].values
    a = sc.datasets.pbmc68k_reduced()
    a.X = a.X.astype(np.float64)
    sc.pp.pca(a, n_comps=10, dtype="float64")
    assert a.uns["pca"]["params"]["mask_var"] == "highly_variable"
    want = a.obsm["X_pca"]
    signs = np.sign(np.sum(got * want, axis=0))
    np.testing.assert_allclose(got * signs, want, rtol=0, atol=1e-6)
    # U2: the mask named explicitly is the same genes, not "an obsm representation's columns"
    explicit = load(PBMC, preprocess={"pca": 10, "mask_var": "highly_variable"})["Y"].values
    np.testing.assert_array_equal(explicit, got)


# ---------------------------------------------------------------- T1: NaN / inf at the door


def _with_bad(tmp_path, sparse=False):
    rng = np.random.default_rng(2)
    X = rng.poisson(2.0, size=(40, 6)).astype(np.float64)
    X[3, 4] = np.nan
    X[30, 1] = np.inf
    pca = rng.normal(size=(40, 3))
    pca[7, 0] = np.inf
    a = ad.AnnData(X=sp.csr_matrix(X) if sparse else X, obsm={"X_pca": pca})
    path = tmp_path / ("bad_csr.h5ad" if sparse else "bad.h5ad")
    a.write_h5ad(path)
    return str(path)


@pytest.mark.parametrize("sparse", [False, True])
def test_nonfinite_values_are_refused_in_the_files_coordinates_before_any_work(tmp_path, sparse):
    path = _with_bad(tmp_path, sparse)
    x34 = r"X contains NaN or inf \(first at row 3, column 4, 2 values in rows 0-39: X\[3, 4\] = nan\)"
    for opts in [{}, {"preprocess": {"pca": 2}}, {"preprocess": {"log1p": True}}]:
        with pytest.raises(ValueError, match=x34):
            describe(path, **opts)  # the plan, before any server or cluster starts
    with pytest.raises(
        ValueError, match=r"obsm\['X_pca'\] contains NaN or inf .*obsm\['X_pca'\]\[7, 0\] = inf"
    ):
        describe(path, use_rep="X_pca")


def test_nonfinite_values_of_a_large_file_are_refused_by_the_ingest_in_the_files_coordinates(
    tmp_path, monkeypatch
):
    """A file too large to read at plan time is checked as the ingest reads it: with preprocess, in
    X's rows and columns (the PCA's read), never the PCA output's; nothing is left behind."""
    path = _with_bad(tmp_path, sparse=True)
    monkeypatch.setattr(planned, "PRECHECK_VALUES", 0)
    assert describe(path, preprocess={"pca": 2})["sizes"]["feature"] == 2  # not read at plan time
    for opts in [{"preprocess": {"pca": 2}}, {}]:
        with pytest.raises(ValueError, match=r"X contains NaN or inf \(first at row 3, column 4.*X\[3, 4\]"):
            ingest(path, tmp_path / "o.zarr", **opts)
        assert not (tmp_path / "o.zarr").exists() and not list(tmp_path.glob(".o.zarr*"))


def test_a_modalitys_nonfinite_value_is_named_in_its_own_rows(tmp_path):
    """The join reorders the protein rows: the refusal names the modality's stored row."""
    mudata = pytest.importorskip("mudata")
    rng = np.random.default_rng(3)
    names = [f"c{i}" for i in range(30)]
    rna = ad.AnnData(rng.normal(size=(30, 5)), obs=pd.DataFrame(index=names))
    P = rng.normal(size=(30, 4))
    P[12, 2] = np.nan
    prot = ad.AnnData(P, obs=pd.DataFrame(index=names))[::-1].copy()  # stored in reverse order
    path = tmp_path / "md.h5mu"
    mudata.MuData({"rna": rna, "prot": prot}).write(str(path))
    with pytest.raises(
        ValueError, match=r"mod\['prot'\]\.X contains NaN or inf \(first at row 17, column 2.*\[17, 2\]"
    ):
        describe(str(path))


def test_a_csv_nonfinite_value_is_named_by_the_files_column(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("kind,a,b\nx,1,2\ny,3,nan\n")
    with pytest.raises(
        ValueError, match=r"data contains NaN or inf \(first at row 1, column 2, .*data\[1, 2\]"
    ):
        load(str(f), label_column="kind")


# ---------------------------------------------------------------- T2, U7: empty inputs, DataFrames


def test_empty_inputs_are_refused_naming_the_value_and_the_fix(tmp_path):
    mudata = pytest.importorskip("mudata")
    rng = np.random.default_rng(4)
    rna = ad.AnnData(rng.normal(size=(20, 5)))
    prot = ad.AnnData(rng.normal(size=(20, 3)), obs=pd.DataFrame(index=rna.obs_names))
    path = tmp_path / "empty.h5mu"
    mudata.MuData({"rna": rna, "prot": prot[:, :0].copy()}).write(str(path))
    with pytest.raises(
        ValueError, match=r"mod/prot/X has 0 columns \(no features\); leave this modality out"
    ):
        describe(str(path))
    np.save(tmp_path / "wide0.npy", np.ones((5, 0)))
    np.save(tmp_path / "long0.npy", np.ones((0, 3)))
    with pytest.raises(ValueError, match="wide0.npy has 0 columns"):
        describe(str(tmp_path / "wide0.npy"))
    with pytest.raises(ValueError, match="long0.npy has 0 rows"):
        load(str(tmp_path / "long0.npy"))
    ad.AnnData(np.ones((0, 4))).write_h5ad(tmp_path / "none.h5ad")
    with pytest.raises(ValueError, match="none.h5ad: X has 0 rows"):
        describe(str(tmp_path / "none.h5ad"))


def test_use_rep_naming_an_obsm_dataframe_says_the_fix(tmp_path):
    a = ad.AnnData(np.ones((6, 2)))
    a.obsm["scores"] = pd.DataFrame({"s1": np.arange(6.0), "s2": np.ones(6)}, index=a.obs_names)
    a.write_h5ad(tmp_path / "df.h5ad")
    fix = r"is a DataFrame.*adata\.obsm\['scores'\] = adata\.obsm\['scores'\]\.to_numpy\(\)"
    with pytest.raises(ValueError, match=fix):
        describe(str(tmp_path / "df.h5ad"), use_rep="scores")


# ---------------------------------------------------------------- U1: damaged, or held elsewhere


def test_a_damaged_file_is_not_called_open_elsewhere_and_a_held_one_is(tmp_path):
    good = tmp_path / "good.h5ad"
    ad.AnnData(np.ones((8, 3))).write_h5ad(good)
    raw = good.read_bytes()
    (tmp_path / "half.h5ad").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "noise.h5mu").write_bytes(np.random.default_rng(0).bytes(4096))
    for name, reason in [("half.h5ad", "truncated file"), ("noise.h5mu", "file signature not found")]:
        with pytest.raises(ValueError, match=rf"{name} is damaged or not an HDF5 file \(.*{reason}") as e:
            describe(str(tmp_path / name))
        assert "open for writing" not in str(e.value)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import h5py, time; f = h5py.File({str(good)!r}, 'r+'); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        holder.stdout.readline()
        with pytest.raises(ValueError, match="good.h5ad is open for writing elsewhere .*unable to lock file"):
            describe(str(good))
    finally:
        holder.kill()
        holder.wait()


def test_t1_the_cli_refuses_nonfinite_input_before_any_server_starts(tmp_path, capsys, monkeypatch):
    """T1: exit 2 with one line naming the input's own position (not the PCA output's), before the
    Prefect server or a cluster starts, within seconds."""
    import json
    import time

    from flows.cli import main as cli_main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    path = _with_bad(tmp_path)
    grid = '{"latent_dim": [2], "seed": [0]}'
    for dataset, where in [
        ({"path": path}, "X[3, 4] = nan"),
        ({"path": path, "preprocess": {"pca": 2}}, "X[3, 4] = nan"),
        ({"path": path, "use_rep": "X_pca"}, "obsm['X_pca'][7, 0] = inf"),
    ]:
        out = tmp_path / "out"
        t0 = time.perf_counter()
        rc = cli_main(["run", "--out", str(out), "--no-report", "--models", "ppca", "--grid", grid,
                       "--dataset", json.dumps(dataset)])  # fmt: skip
        err = capsys.readouterr().err
        assert rc == 2 and where in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert not (out / "prefect-server.log").exists()
        assert time.perf_counter() - t0 < 15
