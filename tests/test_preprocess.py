"""Streamed preprocessing (issue 33, item 3): normalize_total / log1p / PCA over the file's row
blocks equal scanpy's (pp.normalize_total, pp.log1p, pp.pca with mask_var=None, float64, ARPACK)
by every route (covariance, block Lanczos, ARPACK, randomised):
the principal subspace, the explained variance (over N - 1) and its ratio, and the scores; no
sparse block is densified; the result is fingerprinted with the file and the settings, recorded in
the ingested store and reused, not recomputed, when the sweep resumes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.linalg import subspace_angles

from lvmcore.data import describe, load, pca_stream
from lvmcore.data import preprocess as pp
from tests.polling import wait_until

sc = pytest.importorskip("scanpy")
ad = pytest.importorskip("anndata")


def _counts(tmp_path, n=400, D=150, latent=3, seed=0, name="x.h5ad"):
    """Poisson counts with a low-rank log-rate, CSR, about a third non-zero."""
    rng = np.random.default_rng(seed)
    rate = np.exp(0.8 * rng.normal(size=(n, latent)) @ rng.normal(size=(latent, D)) / np.sqrt(latent) - 1)
    X = sp.csr_matrix(rng.poisson(rate).astype(np.float64))
    a = ad.AnnData(X=X)
    a.obs_names = [f"c{i}" for i in range(n)]
    a.var_names = [f"g{j}" for j in range(D)]
    path = tmp_path / name
    a.write_h5ad(path)
    return path, a


def _scanpy(a, target_sum, n_comps):
    b = a.copy()
    sc.pp.normalize_total(b, target_sum=target_sum)
    sc.pp.log1p(b)
    sc.pp.pca(b, n_comps=n_comps, mask_var=None, dtype="float64", svd_solver="arpack")
    return b


def _check(ds, b, tol=1e-6):
    info = json.loads(ds.attrs["preprocess"])["X"]
    Y, want = ds["Y"].values, b.obsm["X_pca"]
    assert subspace_angles(Y, want).max() < tol
    np.testing.assert_allclose(info["explained_variance"], b.uns["pca"]["variance"], rtol=tol)
    np.testing.assert_allclose(info["explained_variance_ratio"], b.uns["pca"]["variance_ratio"], rtol=tol)
    signs = np.sign(np.sum(Y * want, axis=0))  # each component up to its sign
    np.testing.assert_allclose(Y * signs, want, atol=tol * np.abs(want).max())
    return info


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Passes of 64 rows: several blocks and a short tail joined to the block before it."""
    monkeypatch.setattr(pca_stream, "PASS_ROWS", 64)


@pytest.mark.parametrize("target, ours", [(1e4, 1e4), (None, True)])
def test_exact_route_equals_scanpy(tmp_path, target, ours):
    path, a = _counts(tmp_path)
    ds = load(
        str(path), preprocess={"normalize_total": ours, "log1p": True, "pca": 10, "pca_solver": "covariance"}
    )
    info = _check(ds, _scanpy(a, target, 10))
    assert info["solver"] == "covariance"
    assert info["settings"] == {
        "normalize_total": "median" if ours is True else 1e4,
        "log1p": True,
        "pca": 10,
        "pca_solver": "covariance",
        "pca_iter": 7,
        "pca_seed": 0,
        "pca_tol": pp.LANCZOS_TOL,
        "pca_block": pp.LANCZOS_BLOCK,
    }
    if ours is True:
        assert info["target_sum"] == pytest.approx(np.median(np.asarray(a.X.sum(axis=1)).ravel()))


@pytest.mark.parametrize("solver", ["lanczos", "arpack", "randomized"])
def test_lanczos_arpack_and_randomised_routes_equal_scanpy(tmp_path, solver):
    """D = 400 features, 5 components: block Lanczos and ARPACK on the covariance operator, and the
    randomised route whose Krylov space (15 columns x 8 rounds = 120) is far from spanning the
    data, so its agreement is the method's, not a full basis's."""
    path, a = _counts(tmp_path, n=500, D=400, latent=5, seed=1)
    pre = {"normalize_total": 1e4, "log1p": True, "pca": 5, "pca_solver": solver}
    ds = load(str(path), preprocess=pre)
    assert _check(ds, _scanpy(a, 1e4, 5))["solver"] == solver


def test_no_sparse_block_is_densified(tmp_path, monkeypatch):
    path, a = _counts(tmp_path)

    def refuse(self, *args, **kwargs):
        raise AssertionError("a sparse block was densified")

    monkeypatch.setattr(sp.csr_matrix, "toarray", refuse)
    monkeypatch.setattr(sp.csr_matrix, "todense", refuse)
    for solver in ("covariance", "lanczos", "arpack", "randomized"):
        ds = load(
            str(path), preprocess={"normalize_total": 1e4, "log1p": True, "pca": 4, "pca_solver": solver}
        )
        assert ds["Y"].shape == (400, 4)


def test_normalise_and_log_without_pca_equal_scanpy(tmp_path):
    path, a = _counts(tmp_path, D=60)
    ds = load(str(path), preprocess={"normalize_total": 1e4, "log1p": True})
    b = a.copy()
    sc.pp.normalize_total(b, target_sum=1e4)
    sc.pp.log1p(b)
    np.testing.assert_allclose(ds["Y"].values, b.X.toarray(), rtol=1e-12)


def test_settings_are_checked_before_any_work(tmp_path):
    path, _ = _counts(tmp_path, n=30, D=20)
    for pre, message in [
        (
            {"pca": 50, "bogus": 1},
            "unknown .*preprocess option 'bogus'; accepted: log1p, mask_var, normalize_total, pca",
        ),
        ({"normalize_total": -1}, "normalize_total must be a positive number"),
        ({"pca": 0}, "pca must be a positive number of components"),
        ({"pca": 5, "pca_solver": "lobpcg"}, "pca_solver must be one of"),
        ({"pca": 5, "pca_tol": 0}, r"pca_tol must be a number in \(0, 1\)"),
        ({"pca": 5, "pca_block": 0}, "pca_block must be a positive integer"),
        ({"log1p": True, "pca_tol": 1e-8}, "need pca"),
        ({"pca": 25}, r"pca = 25 components needs at most min\(N - 1, D\) = 20"),
        ({"log1p": False}, "does nothing"),
    ]:
        with pytest.raises(ValueError, match=message):
            describe(str(path), preprocess=pre)


def test_the_reduction_is_fingerprinted_recorded_and_reused_on_resume(tmp_path, monkeypatch):
    from tasks.ingest import ingest_dataset

    path, _ = _counts(tmp_path)
    spec = {"path": str(path), "preprocess": {"normalize_total": 1e4, "log1p": True, "pca": 8}}
    fp = describe(str(path), preprocess=spec["preprocess"])["fingerprint"]
    other = describe(str(path), preprocess={**spec["preprocess"], "pca": 7})["fingerprint"]
    assert fp != other  # the settings are in the fingerprint
    data = tmp_path / "inputs" / "data.zarr"
    ingest_dataset(spec, str(data), fp)
    from lvmcore.data import open_dataset, source_info

    ds = open_dataset(data)
    assert ds.attrs["fingerprint"] == fp and ds["Y"].shape == (400, 8)
    rec = json.loads(ds.attrs["preprocess"])["X"]
    assert len(rec["explained_variance"]) == 8 and rec["settings"]["pca"] == 8
    assert source_info(data)["options"]["preprocess"]["pca"] == 8

    def no_second_pca(*args, **kwargs):
        raise AssertionError("the PCA ran again on resume")

    monkeypatch.setattr(pca_stream, "run_pca", no_second_pca)
    ingest_dataset(spec, str(data), fp)  # resume: the stored reduction is reused
    # the file changed: a new plan fingerprint, so the sweep would plan again, never reuse it
    monkeypatch.undo()
    _counts(tmp_path, seed=5)
    assert describe(str(path), preprocess=spec["preprocess"])["fingerprint"] != fp


def test_preprocessing_runs_on_the_cluster_from_inside_a_task(tmp_path, cluster_client):
    """The ingest task runs on a Dask worker; its passes go to the same cluster (worker_client)."""
    from tasks.ingest import ingest_dataset

    path, a = _counts(tmp_path)
    spec = {"path": str(path), "preprocess": {"normalize_total": 1e4, "log1p": True, "pca": 10}}
    fp = describe(str(path), preprocess=spec["preprocess"])["fingerprint"]
    data = tmp_path / "data.zarr"
    cluster_client.submit(ingest_dataset, spec, str(data), fp, pure=False).result()
    from lvmcore.data import open_dataset

    _check(open_dataset(data).load(), _scanpy(a, 1e4, 10))


def test_every_route_runs_on_the_cluster_shares_and_frees_them(tmp_path, cluster_client, monkeypatch):
    """With a cluster (the client passed in) the held blocks are actors, one contiguous share
    per worker (64-row passes: 7 blocks in two shares); every route equals scanpy through them,
    and no share outlives the PCA: its blocks are dropped before load returns, and the actors
    leave the workers once the scheduler has processed the release of their keys (a message,
    which lagged past 10 s once on a loaded CI machine)."""
    path, a = _counts(tmp_path, n=500, D=400, latent=5, seed=1)
    want = _scanpy(a, 1e4, 5)
    shares = []
    init = pca_stream._Blocks.__init__

    def spy(self, *args):
        init(self, *args)
        shares.append(list(self.spans))

    monkeypatch.setattr(pca_stream._Blocks, "__init__", spy)
    # when the actors' keys are released, the actors (still on their workers) hold no blocks
    at_cancel, cancel = [], cluster_client.cancel

    def counted_cancel(futures, *args, **kwargs):
        # the cluster is the run's shared one: another test's actors (a fit's ChunkHost, released
        # when its model is collected) may still be on it; the PCA's share actors hold blocks
        at_cancel.append(
            cluster_client.run(
                lambda dask_worker: [
                    len(a.blocks) for a in dask_worker.state.actors.values() if hasattr(a, "blocks")
                ]
            )
        )
        return cancel(futures, *args, **kwargs)

    monkeypatch.setattr(cluster_client, "cancel", counted_cancel)
    for solver in ("covariance", "lanczos", "arpack", "randomized"):
        pre = {"normalize_total": 1e4, "log1p": True, "pca": 5, "pca_solver": solver}
        assert _check(load(str(path), preprocess=pre, client=cluster_client), want)["solver"] == solver
    assert shares == [[(0, 256), (256, 500)]] * 4
    assert [sorted(sum(c.values(), [])) for c in at_cancel] == [[0, 0]] * 4, at_cancel
    held = lambda: set(  # noqa: E731
        cluster_client.run(
            lambda dask_worker: sum(hasattr(a, "blocks") for a in dask_worker.state.actors.values())
        ).values()
    )
    wait_until(lambda: held() == {0}, 60.0, "the workers to drop the preprocessing actors")


def test_auto_is_block_lanczos_above_the_covariance_width_and_restarts_keep_it_exact(tmp_path, monkeypatch):
    """Above COVARIANCE_MAX_D features "auto" is block Lanczos. A basis of at most 3 k vectors
    forces thick restarts (D = 400 and 10 components need more than 30 vectors): the answer
    still equals scanpy's; and it stops on its residual test well before its basis spans the data
    (a pass count below D / pca_block)."""
    path, a = _counts(tmp_path, n=500, D=400, latent=5, seed=1)
    want = _scanpy(a, 1e4, 10)
    monkeypatch.setattr(pca_stream, "COVARIANCE_MAX_D", 100)
    runs = []
    real = pca_stream.block_lanczos

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        runs.append(out[2])
        return out

    monkeypatch.setattr(pca_stream, "block_lanczos", spy)
    pre = {"normalize_total": 1e4, "log1p": True, "pca": 10}
    assert _check(load(str(path), preprocess=pre), want)["solver"] == "lanczos"
    monkeypatch.setattr(pca_stream, "LANCZOS_BASIS", 3)
    assert _check(load(str(path), preprocess=pre), want)["solver"] == "lanczos"
    assert runs[0]["restarts"] == 0 and runs[1]["restarts"] > 0
    for r in runs:
        assert 0 < r["residual"] <= pp.LANCZOS_TOL and r["passes"] < 400 / pp.LANCZOS_BLOCK


def test_block_lanczos_finds_the_top_eigenpairs_of_a_hard_spectrum():
    """A dense operator with a cluster of close eigenvalues at the k-th (relative gaps 1e-3) and a
    flat tail: block Lanczos with thick restarts gives the k largest eigenvalues to 1e-12 and
    their subspace to the residual over the gap (here within 1e-7), at every block size."""
    rng = np.random.default_rng(3)
    D, k = 300, 12
    lam = np.concatenate(
        [[50.0, 20.0, 10.0], 2.0 * (1 + 1e-3 * np.arange(20, 0, -1)), np.linspace(1.5, 0.1, D - 23)]
    )
    U, _ = np.linalg.qr(rng.normal(size=(D, D)))
    C = (U * lam) @ U.T
    for block in (1, 4, 8):
        theta, V, info = pca_stream.block_lanczos(
            lambda X: C @ X, D, k, block, 1e-11, np.random.default_rng(0), 6 * k
        )
        np.testing.assert_allclose(theta, lam[:k], rtol=1e-12)
        assert subspace_angles(V, U[:, :k]).max() < 1e-7
        np.testing.assert_allclose(V.T @ V, np.eye(k), atol=1e-12)


def test_values_that_are_not_counts_are_refused_before_any_work_and_as_blocks_are_read(tmp_path, monkeypatch):
    """normalize_total and log1p take counts: scaled data (negative values) is refused by the plan from
    its first rows, naming the file's layers, and a negative value further down by the read itself
    (the row named); pca alone takes any values."""
    from lvmcore.data.sources import h5ad

    path, a = _counts(tmp_path, n=120, D=30)
    scaled = a.copy()
    scaled.X = sp.csr_matrix((a.X.toarray() - a.X.toarray().mean(axis=0)) / (a.X.toarray().std(axis=0) + 1))
    scaled.layers["counts"] = a.X.copy()
    scaled_path = tmp_path / "scaled.h5ad"
    scaled.write_h5ad(scaled_path)
    log_pca = {"log1p": True, "pca": 5}
    for pre, steps in [({"normalize_total": 1e4}, "normalize_total takes"), (log_pca, "log1p takes")]:
        with pytest.raises(ValueError, match=rf"X has negative .*{steps} counts.*layers: \['counts'\]"):
            describe(str(scaled_path), preprocess=pre)
    assert describe(str(scaled_path), preprocess={"pca": 5})["sizes"]["feature"] == 5
    assert describe(str(scaled_path), layer="counts", preprocess=log_pca)["sizes"]["feature"] == 5

    late = a.copy()
    X = late.X.toarray()
    X[100, 7] = -3.0
    late.X = sp.csr_matrix(X)
    late_path = tmp_path / "late.h5ad"
    late.write_h5ad(late_path)
    monkeypatch.setattr(h5ad, "COUNTS_CHECK_ROWS", 50)
    describe(str(late_path), preprocess=log_pca)  # the plan reads rows 0-49 only
    with pytest.raises(ValueError, match=r"negative values \(the smallest -3; first in row 100, 1 of rows"):
        load(str(late_path), preprocess=log_pca)


def test_mask_var_takes_scanpys_highly_variable_genes_by_default_and_equals_scanpy(tmp_path):
    """scanpy's pca uses var["highly_variable"] when the file has it (its default mask_var): so does
    preprocess, after normalize_total over every gene; mask_var names another boolean column, null
    takes every gene; bad masks are refused before any work."""
    path, a = _counts(tmp_path, n=300, D=80)
    rng = np.random.default_rng(5)
    a.var["highly_variable"] = rng.random(80) < 0.4
    a.var["mine"] = rng.random(80) < 0.5
    a.var["score"] = rng.random(80)
    a.write_h5ad(path)
    pre = {"normalize_total": 1e4, "log1p": True, "pca": 6}
    for mask, want_mask in [("auto", "highly_variable"), ("mine", "mine"), (None, None)]:
        b = a.copy()
        sc.pp.normalize_total(b, target_sum=1e4)
        sc.pp.log1p(b)
        sc.pp.pca(b, n_comps=6, mask_var=want_mask, dtype="float64", svd_solver="arpack")
        ds = load(str(path), preprocess=pre if mask == "auto" else {**pre, "mask_var": mask})
        info = _check(ds, b)
        assert info["settings"].get("mask_var") == want_mask  # recorded only when genes were masked
    for bad, message in [
        ("score", r"mask_var 'score' is not a boolean var column; boolean var columns: \['highly_var"),
        (3, "mask_var must be a boolean var column's name or null"),
    ]:
        with pytest.raises(ValueError, match=message):
            describe(str(path), preprocess={**pre, "mask_var": bad})
    with pytest.raises(ValueError, match="need pca"):
        describe(str(path), preprocess={"log1p": True, "mask_var": "mine"})


def test_the_cli_plan_says_which_genes_the_pca_uses(tmp_path, capsys):
    """The default mask is said where the user sees it: among the plan's lines, before any server
    starts (the data code logs it at INFO, below the root logger's level)."""
    from flows.run import plan_all

    path, a = _counts(tmp_path, n=60, D=20)
    a.var["highly_variable"] = np.arange(20) % 2 == 0
    a.write_h5ad(path)
    sweep = {"models": ["ppca"], "grid": {"latent_dim": [2], "seed": [0]}}
    for pre, said in [({"pca": 5}, True), ({"pca": 5, "mask_var": None}, False)]:
        plan = {**sweep, "dataset": {"path": str(path), "preprocess": pre}}
        plan_all([plan], [str(tmp_path / "s.zarr")], False)
        out = capsys.readouterr().out
        assert (f"note: {path}: PCA on var['highly_variable'] (scanpy's default" in out) is said, out
