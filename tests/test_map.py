"""`embed-sweep map`: new cells onto a finished sweep, through the CLI on scanpy's pbmc68k_reduced
(one sweep of PPCA and the Bayesian GP-LVM on a stratified 80% of the cells, one map of the other
20% onto both, shared by the module), the library's parts against independent references (label
transfer against a per-cell loop, the reference's preprocessing against scanpy / scikit-learn),
one solve of each cell's q(x*) per map (counted), a score that fails raising, the refusals, and
MRD's --predict of the count modality of the two-modality generator (lvmcore.data.synthetic
.cite_seq_toy)."""

from __future__ import annotations

import json
import os

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import zarr

from flows.cli import main as cli_main
from lvmcore import newpoints
from tasks.results import mapping, reference
from tests.cli_checks import refused

sc = pytest.importorskip("scanpy")
PBMC = os.path.join(os.path.dirname(sc.__file__), "datasets", "10x_pbmc68k_reduced.h5ad")
LABEL = "bulk_labels"
G1 = json.dumps({"latent_dim": [5], "seed": [0]})
#: small fits: the test budget (bench/map/accuracy.py runs the 5 splits at the sweep's defaults)
OPTIONS = json.dumps({"bgplvm": {"n_inducing": 20, "max_iter": 150}})
#: the models of the module's one reference sweep, all mapped by its one map
MODELS = ("ppca", "bgplvm_rbf")


def split(adata, frac=0.8, seed=0, leave_out=None):
    """(reference rows, query rows): a stratified ``frac`` of each label category in the reference;
    ``leave_out``: a category none of whose cells is in the reference (all of them in the query)."""
    rng = np.random.default_rng(seed)
    ref, qry = [], []
    for cat in adata.obs[LABEL].cat.categories:
        rows = rng.permutation(np.flatnonzero((adata.obs[LABEL] == cat).to_numpy()))
        if cat == leave_out:
            qry += rows.tolist()
            continue
        cut = int(round(frac * len(rows)))
        ref += rows[:cut].tolist()
        qry += rows[cut:].tolist()
    return np.sort(ref), np.sort(qry)


def _files(tmp, leave_out=None, seed=0):
    a = ad.read_h5ad(PBMC)
    a.obs_names_make_unique()
    ref, qry = split(a, seed=seed, leave_out=leave_out)
    rp, qp = tmp / "ref.h5ad", tmp / "query.h5ad"
    a[ref].copy().write_h5ad(rp)
    a[qry].copy().write_h5ad(qp)
    return rp, qp, a, ref, qry


def _sweep(tmp, ref_path, models, cluster, dataset=None, grid=G1):
    spec = dataset or {"path": str(ref_path), "use_rep": "X_pca", "label_column": LABEL}
    argv = ["run", "--out", str(tmp), "--store", "ref.zarr", "--no-report", "--models", models]
    argv += ["--grid", grid, "--dataset", json.dumps(spec), "--cluster", cluster]
    if "bgplvm" in models:
        argv += ["--options", OPTIONS]
    assert cli_main(argv) == 0
    return tmp / "ref.zarr"


@pytest.fixture(scope="module")
def api(prefect_api):
    """This module's CLI runs on the test run's Prefect server (no server start per command)."""
    from tests.prefect_server import pointed_at

    with pointed_at(prefect_api):
        yield prefect_api


@pytest.fixture(scope="module")
def mapped(tmp_path_factory, api, sweep_cluster):
    """One sweep of PPCA and the Bayesian GP-LVM on 80% of pbmc68k_reduced (X_pca) and the other
    20% mapped onto both by one ``map``: every CLI test of the module reads these."""
    tmp = tmp_path_factory.mktemp("map")
    rp, qp, a, ref, qry = _files(tmp)
    store = _sweep(tmp, rp, ",".join(MODELS), sweep_cluster)
    out = tmp / "mapped.h5ad"
    argv = ["map", str(store), "--dataset", str(qp), "--to", str(out), "--cluster", sweep_cluster]
    assert cli_main(argv) == 0
    return {
        "store": store,
        "query": qp,
        "out": out,
        "adata": a,
        "ref": ref,
        "qry": qry,
        "tmp": tmp,
        "cluster": sweep_cluster,
    }


def test_map_writes_a_copy_of_the_query_with_embeddings_scores_and_labels(mapped):
    out = ad.read_h5ad(mapped["out"])
    q = ad.read_h5ad(mapped["query"])
    assert (out.obs_names == q.obs_names).all()
    np.testing.assert_array_equal(out.obsm["X_pca"], q.obsm["X_pca"])  # the user's keys kept
    uns = out.uns[mapping.UNS_KEY]
    assert set(uns["models"]) == set(MODELS) and uns["label_column"] == LABEL
    assert uns["sweep_id"] == zarr.open_group(str(mapped["store"]), mode="r").attrs["sweep_id"]
    for m in MODELS:
        assert out.obsm[f"X_{m}"].shape == (q.n_obs, 5)
        assert (out.obsm[f"X_{m}_var"] > 0).all()
        score = out.obs[f"{m}_mapping_score"].to_numpy()
        assert np.isfinite(score).all()
        conf = out.obs[f"{LABEL}_{m}_confidence"].to_numpy()
        assert ((conf > 0) & (conf <= 1)).all()
        assert set(out.obs[f"{LABEL}_{m}"].cat.categories) == set(q.obs[LABEL].cat.categories)


def test_chunked_map_equals_the_loaded_model_on_all_cells_at_once(mapped, monkeypatch):
    """The flow's chunks on the cluster change nothing: each model's output equals the loaded
    model's place, variance and mapping score of the whole query in this process (per-cell
    answers), and map_cells solves each cell's q(x*) once for all three (the Bayesian GP-LVM's
    optimiser ``newpoints.maximise`` runs once for the chunk, not once for the place and again for
    the score)."""
    calls = _count(monkeypatch, newpoints, "maximise")
    n = len(mapped["qry"])
    assert _same_as_in_process(mapped, MODELS, calls) == {"ppca": [], "bgplvm_rbf": [n]}  # PPCA: closed form


def _count(monkeypatch, module, name) -> list:
    """The calls of ``module.name`` from here on (each one's row count), the function still run."""
    calls, real = [], getattr(module, name)

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(len(out[0]))
        return out

    monkeypatch.setattr(module, name, counted)
    return calls


def _model_setting(out, m) -> str:
    setting = dict(out.uns[mapping.UNS_KEY]["models"][m]["setting"])
    setting = {k: (v.item() if hasattr(v, "item") else v) for k, v in setting.items()}
    return json.dumps(setting, sort_keys=True)


def _same_as_in_process(mapped, models, calls=None) -> dict:
    """{model: ``calls`` (a ``_count`` list) made by its map_cells}, each model's answers checked."""
    out = ad.read_h5ad(mapped["out"])
    Y = ad.read_h5ad(mapped["query"]).obsm["X_pca"].astype(np.float64)
    made = {}
    for m in models:
        est = reference.reference_model(str(mapped["store"]), m, _model_setting(out, m))
        first = len(calls) if calls is not None else 0
        got = mapping.map_cells(est, Y)
        made[m] = [] if calls is None else calls[first:]
        np.testing.assert_allclose(out.obsm[f"X_{m}"], got["mean"], rtol=0, atol=1e-8)
        np.testing.assert_allclose(out.obsm[f"X_{m}_var"], got["var"], rtol=0, atol=1e-8)
        np.testing.assert_allclose(out.obs[f"{m}_mapping_score"], got["score"], rtol=0, atol=1e-8)
        # the same numbers as the contract's separate calls (each of which solves on its own)
        mean, var = est.transform(Y, return_var=True)
        np.testing.assert_allclose(got["mean"], mean, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got["var"], var, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got["score"], est.mapping_score(Y), rtol=0, atol=1e-12)
    return made


def test_a_chunk_given_the_plans_reference_scores_does_not_score_the_training_cells(mapped, monkeypatch):
    """The plan computes each model's reference scores once and hands them to the chunks' tasks:
    a chunk given them never calls reference_score_stats (a Newton solve per training cell, in
    each worker process otherwise) and returns the numbers of a chunk that computed them."""
    out = ad.read_h5ad(mapped["out"])
    Y = ad.read_h5ad(mapped["query"]).obsm["X_pca"].astype(np.float64)[:30]
    for m in MODELS:
        setting = json.loads(_model_setting(out, m))
        own = reference.reference_model(str(mapped["store"]), m, json.dumps(setting, sort_keys=True))
        want = mapping.map_cells(own, Y)
        given = [float(v) for v in own.score_reference_]

        def refuse(self, *args, **kwargs):
            raise AssertionError("reference_score_stats called although the plan gave the scores")

        with monkeypatch.context() as mp:
            mp.setattr(type(own), "reference_score_stats", refuse)
            got = mapping.map_chunk(str(mapped["store"]), m, setting, Y, None, given)
        for key in ("mean", "var", "score"):
            np.testing.assert_array_equal(got[key], want[key])


def test_a_score_that_fails_raises_and_its_model_is_refused_before_work(mapped, monkeypatch, capsys):
    """map_cells never turns a failing score into NaN: a model without reference scores raises
    (ValueError), one that cannot score raises (NotImplementedError); and ``map`` refuses a model
    that cannot score in its plan, naming it (exit 2, one line, before any server)."""
    from lvmcore.models import PPCA

    a = mapped["adata"]
    Y = a.obsm["X_pca"].astype(np.float64)
    est = PPCA(n_components=5).fit(Y[mapped["ref"]])
    with pytest.raises(ValueError, match="no reference scores"):
        mapping.map_cells(est, Y[mapped["qry"]])
    est.reference_score_stats(Y[mapped["ref"]])

    def cannot(self, Y_new):
        raise NotImplementedError("PPCA has no score_samples")

    monkeypatch.setattr(PPCA, "score_samples", cannot)
    with pytest.raises(NotImplementedError):
        mapping.map_cells(est, Y[mapped["qry"]])
    monkeypatch.setattr(mapping, "reference_model", reference.reference_model.__wrapped__)  # no cache
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    out = mapped["tmp"] / "never.h5ad"
    argv = ["map", str(mapped["store"]), "--dataset", str(mapped["query"]), "--to", str(out)]
    refused([*argv, "--model", "ppca"], capsys, "model ppca", "cannot score")
    assert not out.exists()


def _knn_accuracy(est_all, labels, ref, qry):
    """The accuracy of the same label transfer when the query cells were fitted with the reference."""
    X = est_all.embedding_
    codes = labels.cat.codes.to_numpy()
    cat, _ = mapping.transfer_labels(X[ref], codes[ref], list(labels.cat.categories), X[qry])
    return float((np.asarray(cat) == labels.to_numpy()[qry]).mean())


def test_transferred_labels_as_accurate_as_fitting_the_cells_with_the_reference(mapped):
    """One split here (bench/map/accuracy.py: five); the same model fitted on all 700 cells gives
    the kNN accuracy the mapped cells' transferred labels must be within 0.02 of."""
    from lvmcore.models import PPCA

    _accuracy(mapped, "ppca", PPCA(n_components=5))


def _accuracy(mapped, key, est):
    a, ref, qry = mapped["adata"], mapped["ref"], mapped["qry"]
    out = ad.read_h5ad(mapped["out"])
    truth = a.obs[LABEL].to_numpy()[qry]
    mapped_acc = float((out.obs[f"{LABEL}_{key}"].to_numpy() == truth).mean())
    fitted_acc = _knn_accuracy(est.fit(a.obsm["X_pca"].astype(np.float64)), a.obs[LABEL], ref, qry)
    assert mapped_acc >= fitted_acc - 0.02, (key, mapped_acc, fitted_acc)


@pytest.mark.slow  # a Bayesian GP-LVM fit on all 700 cells (SLOWSEC)
def test_bgplvm_transferred_labels_as_accurate_as_fitting_the_cells_with_the_reference(mapped):
    from lvmcore.models import BayesianGPLVM

    est = BayesianGPLVM(kernel="rbf", n_components=5, n_inducing=20, max_iter=150, random_state=0)
    _accuracy(mapped, "bgplvm_rbf", est)


def test_transfer_labels_equals_a_per_cell_loop():
    rng = np.random.default_rng(0)
    X, Q = rng.normal(size=(60, 3)), rng.normal(size=(9, 3))
    codes = rng.integers(0, 4, 60)
    codes[:5] = -1  # unlabelled reference cells do not vote
    names = ["a", "b", "c", "d"]
    cat, conf = mapping.transfer_labels(X, codes, names, Q, k=7)
    for i, q in enumerate(Q):
        lab = codes >= 0
        d = np.linalg.norm(X[lab] - q, axis=1)
        nn = np.argsort(d)[:7]
        votes = np.zeros(4)
        for j in nn:
            votes[codes[lab][j]] += 1 / d[j]
        assert cat[i] == names[votes.argmax()]
        assert abs(conf[i] - votes.max() / votes.sum()) < 1e-12


def test_the_reference_preprocessing_is_applied_not_refitted():
    """Counts through the reference's normalize_total target, log1p and PCA loadings (fitted with
    scikit-learn on the reference only): equal to scanpy's normalize_total + log1p of the query
    projected on those loadings, with two genes the query lacks filled with zeros."""
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(1)
    genes = [f"g{j}" for j in range(30)]
    R = rng.poisson(3.0, size=(80, 30)).astype(np.float64)
    Qfull = rng.poisson(3.0, size=(10, 30)).astype(np.float64)
    norm = lambda M: np.log1p(M / M.sum(axis=1, keepdims=True) * 1e4)  # noqa: E731
    pca = PCA(n_components=4, svd_solver="full").fit(norm(R))
    ref = {
        "preprocess": {"normalize_total": 1e4, "log1p": True, "pca": 4},
        "target_sum": 1e4,
        "pca": {"mean": pca.mean_, "components": pca.components_, "columns": None},
    }
    Qgenes = [g for g in genes if g not in ("g3", "g7")] + ["extra"]
    Qm = np.hstack([np.delete(Qfull, [3, 7], axis=1), np.ones((10, 1))])
    cols = pd.Index(Qgenes).get_indexer(genes)
    got = mapping.preprocessed_block(Qm, {"columns": cols.tolist()}, ref, 0)
    want_in = Qfull.copy()
    want_in[:, [3, 7]] = 0.0
    a = ad.AnnData(want_in)
    sc.pp.normalize_total(a, target_sum=1e4)
    sc.pp.log1p(a)
    np.testing.assert_allclose(got, pca.transform(a.X), rtol=0, atol=1e-10)


def test_refusals_exit_2_with_one_line_before_any_server(mapped, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    store, qp = str(mapped["store"]), mapped["query"]
    out = tmp_path / "o.h5ad"
    base = ["map", store, "--to", str(out)]
    # a query of another width
    q = ad.read_h5ad(qp)
    q.obsm["X_pca"] = q.obsm["X_pca"][:, :40]
    narrow = tmp_path / "narrow.h5ad"
    q.write_h5ad(narrow)
    refused([*base, "--dataset", str(narrow)], capsys, "40 columns", "fitted on 50")
    # a query without the reference's representation
    del q.obsm["X_pca"]
    bare = tmp_path / "bare.h5ad"
    q.write_h5ad(bare)
    refused([*base, "--dataset", str(bare)], capsys, "obsm['X_pca']", "reference's coordinates")
    # --predict on a model that cannot predict, and a modality the reference lacks
    refused([*base, "--dataset", str(qp), "--predict", "X", "--model", "ppca"], capsys, "cannot predict")
    refused([*base, "--dataset", str(qp), "--predict", "prot"], capsys, "no such modality")
    # an existing --to, a key the query file has
    out.write_text("mine")
    refused([*base, "--dataset", str(qp)], capsys, "--replace-file")
    out.unlink()
    refused(["map", store, "--to", str(out), "--dataset", str(mapped["out"])], capsys, "--overwrite")
    # a store written without models, and a damaged model array: copies of the store
    import shutil

    for what in ("none", "damaged"):
        copy = tmp_path / what / "ref.zarr"
        shutil.copytree(store, copy)
        shutil.copytree(mapped["store"].parent / "ref.inputs", copy.parent / "ref.inputs")
        kept = copy / "ppca" / "models"
        if what == "none":  # every group's models gone, as a store written before they were kept
            for m in MODELS:
                shutil.rmtree(copy / m / "models")
            words = ("holds no fitted models", "--refit-models")
        else:
            chunk = next(p for p in sorted(kept.rglob("*")) if p.is_file() and "/c/" in str(p))
            chunk.write_bytes(b"\0" * len(chunk.read_bytes()))
            words = ("ppca", "damaged")
        refused(["map", str(copy), "--to", str(out), "--dataset", str(qp)], capsys, *words)
    assert not out.exists() and not (tmp_path / "prefect-server.log").exists()


def test_missing_genes_refused_or_filled_and_the_pca_is_the_references(mapped, capsys):
    """A reference fitted on X's genes through a PCA of its own (preprocess pca; its store written
    by the sweep's steps in process: ``map`` itself is the module's CLI map): a query lacking 5 of
    its genes is refused naming the count and --fill-missing zeros; with it, planned with the 5
    counted as filled, and its PPCA input is the reference's PCA of the query (scikit-learn's PCA
    fitted on the reference)."""
    from sklearn.decomposition import PCA

    from tests.results_store import build_store

    tmp = mapped["tmp"] / "genes"
    tmp.mkdir()
    a = mapped["adata"]
    rp = tmp / "ref.h5ad"
    a[mapped["ref"]].copy().write_h5ad(rp)
    spec = {"path": str(rp), "preprocess": {"pca": 10, "mask_var": None}, "label_column": LABEL}
    store = build_store(tmp / "ref.zarr", spec, ["ppca"], json.loads(G1), n_generations=0)
    q = a[mapped["qry"]].copy()
    drop = q.var_names[:5]
    qp = tmp / "q.h5ad"
    q[:, [g not in set(drop) for g in q.var_names]].copy().write_h5ad(qp)
    out = tmp / "o.h5ad"
    refused(
        ["map", str(store), "--dataset", str(qp), "--to", str(out)],
        capsys,
        "lacks 5 of",
        "--fill-missing zeros",
    )
    plan = mapping.plan_map(str(store), str(qp), out, fill_missing="zeros")
    assert mapping.provenance(plan)["genes_filled"]["X"] == 5
    Yq = mapping.read_query(plan)["views"]["X"]
    Xr = np.asarray(a[mapped["ref"]].X, dtype=np.float64)
    pca = PCA(n_components=10, svd_solver="full").fit(Xr)
    Xq = np.asarray(q.X, dtype=np.float64)
    Xq[:, :5] = 0.0
    want = pca.transform(Xq)
    sign = np.sign((Yq * want).sum(axis=0))  # a component's sign is the reference's own choice
    np.testing.assert_allclose(Yq, want * sign, rtol=0, atol=1e-6)
    got = mapping.map_cells(reference.reference_model(str(store), "ppca", _model_setting_of(plan)), Yq)
    assert np.isfinite(got["score"]).all() and got["mean"].shape == (len(Yq), 5)


def _model_setting_of(plan) -> str:
    return json.dumps(plan["models"]["ppca"]["setting"], sort_keys=True)


def _auroc(score_new, score_kept) -> float:
    """P(a new cell scores below a kept one), ties one half: the AUROC of -score for "new"."""
    lower = (score_new[:, None] < score_kept[None, :]).mean()
    ties = (score_new[:, None] == score_kept[None, :]).mean()
    return float(lower + 0.5 * ties)


def _novel_auroc(est, left_out):
    a = ad.read_h5ad(PBMC)
    Y = a.obsm["X_pca"].astype(np.float64)
    ref, qry = split(a, leave_out=left_out)
    est.fit(Y[ref])
    est.reference_score_stats(Y[ref])
    score = mapping.map_cells(est, Y[qry])["score"]
    new = a.obs[LABEL].to_numpy()[qry] == left_out
    return _auroc(score[new], score[~new])


@pytest.mark.parametrize("left_out", ["CD19+ B", "CD34+"])
def test_the_mapping_score_flags_cells_of_a_kind_the_reference_lacks_ppca(left_out):
    from lvmcore.models import PPCA

    assert _novel_auroc(PPCA(n_components=5), left_out) >= 0.9


@pytest.mark.slow  # two Bayesian GP-LVM fits (bench/map/accuracy.py gives every model's figure)
@pytest.mark.parametrize("left_out", ["CD19+ B", "CD34+"])
def test_the_mapping_score_flags_cells_of_a_kind_the_reference_lacks_bgplvm(left_out):
    from lvmcore.models import BayesianGPLVM

    est = BayesianGPLVM(kernel="rbf", n_components=5, n_inducing=20, max_iter=150, random_state=0)
    assert _novel_auroc(est, left_out) >= 0.9


@pytest.mark.slow  # an MRD sweep and its map (SLOWSEC)
def test_predict_the_count_modality_with_mrd(api, sweep_cluster, tmp_path, monkeypatch):
    """The two-modality generator (lvmcore.data.synthetic.cite_seq_toy: RNA counts and a protein
    panel, both non-linear in one shared trajectory, a private programme each) as a .h5mu; a sweep
    of MRD on 80% of the cells (rna log1p as the sweep preprocesses it, prot as it is), then the
    other 20% given only prot, with --predict rna. In the space rna was fitted in (log1p counts),
    over every gene: the prediction's median per-feature r is at least 10-NN regression's and
    ridge regression's from prot on the same split, and its 95% interval covers 92-98% of the
    held-out values. The map's output equals the loaded model's in process, where each cell's
    q(x*) is solved once for its place, score and prediction."""
    import mudata
    from sklearn.linear_model import RidgeCV
    from sklearn.neighbors import KNeighborsRegressor

    from lvmcore.data.synthetic import cite_seq_toy

    n = 200
    rna, prot, _ = cite_seq_toy(n, seed=0)
    names = [f"c{i}" for i in range(n)]
    perm = np.random.default_rng(0).permutation(n)
    tr, te = np.sort(perm[: int(0.8 * n)]), np.sort(perm[int(0.8 * n) :])

    def mod(M, rows, p):
        var = pd.DataFrame(index=[f"{p}{j}" for j in range(M.shape[1])])
        return ad.AnnData(M[rows], obs=pd.DataFrame(index=[names[i] for i in rows]), var=var)

    ref = tmp_path / "ref.h5mu"
    mudata.MuData({"rna": mod(rna, tr, "gene"), "prot": mod(prot, tr, "prot")}).write(ref)
    qry = tmp_path / "query.h5mu"
    mudata.MuData({"prot": mod(prot, te, "prot")}).write(qry)
    spec = {"path": str(ref), "modalities": {"rna": {"preprocess": {"log1p": True}}, "prot": {}}}
    argv = ["run", "--out", str(tmp_path), "--store", "ref.zarr", "--no-report", "--models", "mrd"]
    argv += ["--grid", json.dumps({"latent_dim": [4], "seed": [0]}), "--cluster", sweep_cluster]
    # smaller than the sweep's MRD defaults (M = 30, 500 iterations): the test budget
    argv += ["--options", json.dumps({"mrd": {"n_inducing": 20, "max_iter": 100}})]
    assert cli_main([*argv, "--dataset", json.dumps(spec)]) == 0
    out = tmp_path / "mapped.h5mu"
    argv = ["map", str(tmp_path / "ref.zarr"), "--dataset", str(qry), "--to", str(out), "--predict", "rna"]
    from lvmcore.models import MRD

    scored, real_score = [], MRD.score_samples  # the plan scores the training rows here, in process

    def score(self, Y_new):
        scored.append(sorted(Y_new))
        return real_score(self, Y_new)

    monkeypatch.setattr(MRD, "score_samples", score)
    assert cli_main([*argv, "--cluster", sweep_cluster]) == 0
    monkeypatch.setattr(MRD, "score_samples", real_score)
    got = mudata.read_h5mu(out)
    pred = got.mod["rna"]
    assert list(pred.var_names) == [f"gene{j}" for j in range(rna.shape[1])]
    mean, var = np.asarray(pred.layers["mean"]), np.asarray(pred.layers["var"])
    np.testing.assert_array_equal(np.asarray(pred.X), mean)

    R = np.log1p(rna)  # the space the rna view was fitted in

    def median_r(P):
        return np.median([np.corrcoef(P[:, j], R[te][:, j])[0, 1] for j in range(R.shape[1])])

    knn = KNeighborsRegressor(10).fit(prot[tr], R[tr]).predict(prot[te])
    ridge = RidgeCV().fit(prot[tr], R[tr]).predict(prot[te])
    r = median_r(mean)
    assert r >= median_r(knn) and r >= median_r(ridge), (r, median_r(knn), median_r(ridge))
    cover = float((np.abs(mean - R[te]) <= 1.959964 * np.sqrt(var)).mean())
    assert 0.92 <= cover <= 0.98, cover
    # one solve per cell: place, score and prediction from the same q(x*), the map's numbers
    store = str(tmp_path / "ref.zarr")
    est = reference.reference_model(store, "mrd", _model_setting(got, "mrd"))
    views = [v["name"] for v in reference.reference_views(store)["views"]]
    assert scored == [[views.index("prot")]], scored  # on the query's one view, not every subset
    calls = _count(monkeypatch, newpoints, "maximise")
    again = mapping.map_cells(est, {views.index("prot"): prot[te]}, views.index("rna"))
    assert calls == [len(te)], calls
    np.testing.assert_allclose(again["predicted"][0], mean, rtol=0, atol=1e-8)
    np.testing.assert_allclose(again["predicted"][1], var, rtol=0, atol=1e-8)
    np.testing.assert_allclose(got.obs["mrd_mapping_score"], again["score"], rtol=0, atol=1e-8)
    np.testing.assert_allclose(got.obsm["X_mrd"], again["mean"], rtol=0, atol=1e-8)
