"""Issue 23, data at scale: user files ingested in row blocks equal the in-memory ingest; the
result store's point dimension is chunked; a sweep's Dask task graphs carry no array the size of
the data (checked on the scheduler of a real multi-process cluster)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lvmcore.chunks import scheduler_workers
from lvmcore.data import describe, fingerprint, ingest, load, loaders, open_dataset


def _same_store(a, b):
    A, B = open_dataset(a, dask=False).load(), open_dataset(b, dask=False).load()
    assert sorted(A.data_vars) == sorted(B.data_vars)
    for name in A.data_vars:
        assert A[name].dims == B[name].dims and A[name].dtype == B[name].dtype
        np.testing.assert_array_equal(A[name].values, B[name].values)
    assert A.attrs == B.attrs  # the fingerprint among them
    for name in A.data_vars:  # same chunks, same metadata (fill value, codecs, dimension names)
        ma = json.loads((a / name / "zarr.json").read_text())
        mb = json.loads((b / name / "zarr.json").read_text())
        assert ma == mb, name


def _roundtrip(tmp_path, src, **opts):
    mem = ingest(load(src, **opts).load(), tmp_path / "mem.zarr", chunk_rows=64)
    streamed, fp = loaders.ingest_source(src, tmp_path / "stream.zarr", chunk_rows=64, **opts)
    _same_store(mem, streamed)
    want = load(src, **opts)
    # .h5ad / .h5mu: the plan's fingerprint (file content + options, lvmcore.data.sources)
    assert fp == (want.attrs["fingerprint"] if src.endswith((".h5ad", ".h5mu")) else fingerprint(want))
    d = describe(src, **opts)
    assert d["fingerprint"] == fp and d["sizes"] == dict(want.sizes)
    return streamed


def test_stream_ingest_npy_equals_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(loaders, "BLOCK_ROWS", 128)  # several blocks, a ragged last one
    Y = np.random.default_rng(0).normal(size=(1000, 7)).astype(np.float32)
    np.save(tmp_path / "a.npy", Y)
    out = _roundtrip(tmp_path, str(tmp_path / "a.npy"))
    assert open_dataset(out)["Y"].data.chunksize == (64, 7)
    # the top-level ingest takes the block-wise route for a file path
    p = ingest(str(tmp_path / "a.npy"), tmp_path / "top.zarr", chunk_rows=64)
    _same_store(out, p)
    # a Fortran-ordered file (columns contiguous) is read through its memory map instead
    np.save(tmp_path / "f.npy", np.asfortranarray(Y.astype(np.int32)))
    (tmp_path / "mem.zarr").rename(tmp_path / "mem1.zarr")
    (tmp_path / "stream.zarr").rename(tmp_path / "stream1.zarr")
    _roundtrip(tmp_path, str(tmp_path / "f.npy"))


def test_stream_ingest_zarr_equals_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(loaders, "BLOCK_ROWS", 64)
    src = ingest(load("mrd_toy", n=300, seed=1), tmp_path / "user.zarr", chunk_rows=50)
    _roundtrip(tmp_path, str(src))


@pytest.mark.parametrize("sparse", [False, True])
def test_stream_ingest_h5ad_equals_memory(tmp_path, monkeypatch, sparse):
    ad = pytest.importorskip("anndata")
    import pandas as pd
    import scipy.sparse as sp

    monkeypatch.setattr(loaders, "BLOCK_ROWS", 64)
    rng = np.random.default_rng(1)
    X = rng.poisson(0.7, size=(500, 12)).astype(np.float32)
    obs = pd.DataFrame({"cell": rng.choice(["a", "b", "c"], 500)}, index=[f"c{i}" for i in range(500)])
    ad.AnnData(sp.csr_matrix(X) if sparse else X, obs=obs).write_h5ad(tmp_path / "x.h5ad")
    out = _roundtrip(tmp_path, str(tmp_path / "x.h5ad"), label_column="cell")
    np.testing.assert_array_equal(open_dataset(out)["Y"].values, X.astype(np.float64))


def test_stream_refusals(tmp_path):
    Y = np.ones((300, 4))
    Y[201, 2] = np.nan
    Y[250, 0] = np.inf
    np.save(tmp_path / "nan.npy", Y)
    with pytest.raises(
        ValueError, match=r"nan.npy: Y contains NaN or inf \(first at row 201, column 2, 2 values"
    ):
        loaders.ingest_source(str(tmp_path / "nan.npy"), tmp_path / "o.zarr", chunk_rows=64)
    assert not (tmp_path / "o.zarr").exists() and not list(tmp_path.glob(".o.zarr*"))  # nothing left behind
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="pickled Python objects"):
        loaders.ingest_source(str(tmp_path / "obj.npy"), tmp_path / "o.zarr")
    raw = (tmp_path / "nan.npy").read_bytes()
    (tmp_path / "trunc.npy").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="trunc.npy is not a readable .npy file"):
        describe(str(tmp_path / "trunc.npy"))
    np.save(tmp_path / "one.npy", np.ones(10))
    with pytest.raises(ValueError, match=r"shape \(10,\); an \(N, D\) array is needed"):
        loaders.ingest_source(str(tmp_path / "one.npy"), tmp_path / "o.zarr")
    (tmp_path / "junk.zarr").mkdir()
    with pytest.raises(ValueError, match="junk.zarr is not a readable zarr data store"):
        loaders.ingest_source(str(tmp_path / "junk.zarr"), tmp_path / "o.zarr")
    (tmp_path / "bad.h5ad").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="bad.h5ad is damaged or not an HDF5 file"):
        describe(str(tmp_path / "bad.h5ad"))


# ---------------------------------------------------------------- the result store's point chunks


def test_store_point_dimension_is_chunked(tmp_path, monkeypatch):
    """A grid point's cell is several whole chunks along ``point`` (none shared with another cell),
    and the cells read back as written."""
    from tasks import store as st
    from tasks.registry import MODELS
    from tasks.store import schema

    monkeypatch.setattr(schema, "POINT_CHUNK", 100)  # read where the arrays are laid out
    spec = MODELS["bgplvm_rbf"]
    grid = {"latent_dim": [2], "seed": [0, 1]}
    layout = st.Layout(n_points=250, q_max=2, trace_len={spec.key: 5})
    path = tmp_path / "s.zarr"
    st.prepare_store(path, {"x": 1}, [spec], grid, layout, {})
    emb = json.loads((path / spec.key / "embedding" / "zarr.json").read_text())
    assert emb["chunk_grid"]["configuration"]["chunk_shape"] == [1, 1, 100, 2]
    rng = np.random.default_rng(0)
    written = {}
    for seed in (0, 1):
        res = st.PointResult(spec.key, (0, seed), {"latent_dim": 2, "seed": seed}, "done")
        res.embedding, res.embedding_var = rng.normal(size=(250, 2)), rng.random((250, 2))
        res.elbo, res.elbo_trace, res.n_iter, res.fit_seconds = -1.0, np.arange(3.0), 3.0, 0.1
        st.write_point(path, spec, res, layout)
        written[seed] = res
    chunks = sorted(
        p.relative_to(path / spec.key / "embedding" / "c").as_posix()
        for p in (path / spec.key / "embedding" / "c").rglob("*")
        if p.is_file()
    )
    assert chunks == [f"0/{s}/{r}/0" for s in (0, 1) for r in (0, 1, 2)]  # 3 row chunks per cell
    back = st.open_results(path)[spec.key].to_dataset()
    for seed, res in written.items():
        np.testing.assert_array_equal(back["embedding"].isel(latent_dim=0, seed=seed).values, res.embedding)
        np.testing.assert_array_equal(
            back["embedding_var"].isel(latent_dim=0, seed=seed).values, res.embedding_var
        )
    assert (back["status"].values == st.STATUS_DONE).all()


def test_store_of_an_earlier_version_gains_the_convergence_flag(tmp_path):
    """A store written before ``converged`` existed (its array removed here) gets the variable, all
    NaN (not recorded), when a sweep resumes it; new points then write their flag beside the old
    ones."""
    import shutil

    from tasks import store as st
    from tasks.registry import MODELS

    spec = MODELS["ppca"]
    grid = {"latent_dim": [2], "seed": [0, 1]}
    layout = st.Layout(n_points=20, q_max=2, trace_len={spec.key: 3})
    path = tmp_path / "s.zarr"
    st.prepare_store(path, {"x": 1}, [spec], grid, layout, {})

    def point(seed, flag):
        res = st.PointResult(spec.key, (0, seed), {"latent_dim": 2, "seed": seed}, "done")
        res.embedding, res.embedding_var = np.ones((20, 2)), np.ones((20, 2))
        res.elbo, res.elbo_trace, res.n_iter, res.fit_seconds = -1.0, np.arange(3.0), 3.0, 0.1
        res.converged = flag
        return res

    st.write_point(path, spec, point(0, 1.0), layout)
    first = st.open_results(path)[spec.key].ds["converged"].values
    assert first[0, 0] == 1.0 and np.isnan(first[0, 1])
    shutil.rmtree(path / spec.key / "converged")  # as an earlier version wrote it
    assert "converged" not in st.open_results(path)[spec.key].ds
    with pytest.raises(KeyError):
        st.write_point(path, spec, point(1, 0.0), layout)
    st.prepare_store(path, {"x": 1}, [spec], grid, layout, {})  # the resume
    conv = st.open_results(path)[spec.key].ds["converged"]
    assert conv.dims == ("latent_dim", "seed") and np.isnan(conv.values).all()
    st.write_point(path, spec, point(1, 0.0), layout)
    back = st.open_results(path)[spec.key].ds
    assert np.isnan(back["converged"].values[0, 0]) and back["converged"].values[0, 1] == 0.0
    assert (back["status"].values == st.STATUS_DONE).all()


def test_store_of_an_earlier_version_gains_a_per_point_extra_and_refuses_another(tmp_path):
    """hgplvm_sparse's ``minibatch`` output is newer than stores that hold the model: a resume adds
    it, all NaN (not recorded), and a new point writes its value (before, the write failed after the
    fit with KeyError 'minibatch'). An extra with dimensions of its own cannot be made up for the
    old points: the resume is refused, naming it, before the store is touched."""
    import shutil

    from tasks import store as st
    from tasks.registry import MODELS

    grid = {"latent_dim": [2], "seed": [0, 1]}
    layout = st.Layout(n_points=20, q_max=2, trace_len={"hgplvm_sparse": 3, "bgplvm_rbf": 3})
    spec = MODELS["hgplvm_sparse"]
    path = tmp_path / "s.zarr"
    st.prepare_store(path, {"x": 1}, [spec], grid, layout, {})
    shutil.rmtree(path / spec.key / "minibatch")  # as an earlier version wrote it
    st.prepare_store(path, {"x": 1}, [spec], grid, layout, {})  # the resume
    res = st.PointResult(spec.key, (0, 0, 1), {"kappa": 100.0, "latent_dim": 2, "seed": 1}, "done")
    res.embedding = np.ones((20, 2))
    res.elbo, res.elbo_trace, res.n_iter, res.fit_seconds = -1.0, np.arange(3.0), 3.0, 0.1
    res.extras = {"minibatch": 1.0}
    st.write_point(path, spec, res, layout)
    mb = st.open_results(path)[spec.key].ds["minibatch"].values.ravel()
    assert np.isnan(mb[0]) and mb[1] == 1.0

    rbf = MODELS["bgplvm_rbf"]
    other = tmp_path / "r.zarr"
    st.prepare_store(other, {"x": 1}, [rbf], grid, layout, {})
    shutil.rmtree(other / rbf.key / "ard_weights")
    grown = dict(grid, seed=[0, 1, 2])
    refusal = r"earlier embed-sweep: its bgplvm_rbf group lacks \['ard_weights'\]"
    with pytest.raises(ValueError, match=refusal):
        st.prepare_store(other, {"x": 1}, [rbf], grown, layout, {})
    assert st.store_grid(other, rbf)["seed"] == [0, 1]  # not grown before the refusal


# ---------------------------------------------------------------- task graphs without the data


class _GraphSizes:
    """Scheduler plugin: the pickled size of every task the scheduler is given (its run_spec)."""

    name = "graph-sizes"

    def __init__(self):
        self.sizes = []

    def update_graph(self, scheduler, *, tasks, **kwargs):
        from distributed.protocol.pickle import dumps

        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is not None and ts.run_spec is not None:
                self.sizes.append((len(dumps(ts.run_spec)), str(key)[:80]))


@pytest.fixture(scope="module")
def prefect_env(prefect_api):
    """This module pointed at the test run's Prefect server (tests/conftest.py)."""
    from tests.prefect_server import pointed_at

    with pointed_at(prefect_api) as env:
        yield env


@pytest.mark.slow  # a Prefect server and a cluster: about 40 s on the shared 2-core machine
def test_sweep_task_graphs_carry_no_data(tmp_path, prefect_env, shared_cluster):
    """A sweep on a 2-process cluster (a user's .npy file, exact blocked kNN, GLLE chunked over the
    cluster, PPCA): no task the scheduler receives, from the flow or from
    the fits' and kNN's own computations on the workers, comes near the data's size. The cluster is
    the test process's shared one (tests/conftest.py), its scheduler in this process, watched for
    this sweep only."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    from flows.sweep import embed_sweep
    from lvmcore.data.synthetic import swiss_roll

    class Plugin(_GraphSizes, SchedulerPlugin):
        pass

    Y, _ = swiss_roll(12000, 0)
    np.save(tmp_path / "roll.npy", Y)
    lc = shared_cluster
    plugin = Plugin()
    lc.scheduler.add_plugin(plugin, name="test-graph-sizes")
    try:
        res = embed_sweep(
            dataset={"path": str(tmp_path / "roll.npy")},
            models=["ppca", "glle_em"],
            grid={"k": [6], "latent_dim": [2], "seed": [0]},
            store=str(tmp_path / "s.zarr"),
            model_options={
                "glle_em": {"chunks": 4000, "max_iter": 2},
            },
            cluster=lc.scheduler_address,
            knn_method="exact",
            report=False,
            n_generations=0,
        )
    finally:
        lc.scheduler.remove_plugin(name="test-graph-sizes")
    assert res["done"] == 2 and res["failed"] == 0
    attrs = json.loads((tmp_path / "s.zarr" / "zarr.json").read_text())["attributes"]
    assert attrs["eval_points"] == 2000 and attrs["eval_subset"] == "uniform without replacement, seed 0"
    assert len(plugin.sizes) > 10  # the flow's tasks and the kNN tiles and merges at least
    biggest = max(plugin.sizes)
    # Prefect task calls are about 25 kB whatever the data; the data here are 288 kB
    assert biggest[0] < Y.nbytes / 4, (
        f"a task of {biggest[0]} bytes ({biggest[1]}) for {Y.nbytes} bytes of data"
    )


def test_ppca_tall_path_equals_the_full_svd():
    """PPCA on many more rows than columns (covariance eigenvectors, block-summed likelihood, no
    centred copy) against scikit-learn's full SVD, its eigenvalues taken N-normalised (the
    maximum-likelihood fit, Tipping and Bishop eqs. 15-16), and scipy's log-density."""
    from scipy.stats import multivariate_normal
    from sklearn.decomposition import PCA

    from lvmcore.linalg import chol_solve
    from lvmcore.models.ppca import PPCA

    rng = np.random.default_rng(3)
    Y = rng.normal(size=(70000, 12)) @ rng.normal(size=(12, 12)) + 5.0  # two likelihood blocks
    m = PPCA(n_components=3).fit(Y)
    ref = PCA(n_components=3, svd_solver="full").fit(Y)
    n = Y.shape[0]
    ev = ref.explained_variance_ * (n - 1) / n
    noise = (np.var(Y, axis=0).sum() - ev.sum()) / (12 - 3)
    W = ref.components_.T * np.sqrt(ev - noise)
    C = W @ W.T + noise * np.eye(12)
    np.testing.assert_allclose(m.elbo_, multivariate_normal(ref.mean_, C).logpdf(Y).sum(), rtol=1e-10)
    M = W.T @ W + noise * np.eye(3)
    want = chol_solve(np.linalg.cholesky(M), W.T @ (Y - ref.mean_).T).T
    sign = np.sign(np.sum(m.embedding_ * want, axis=0))  # each column's sign is a convention
    np.testing.assert_allclose(m.embedding_ * sign, want, rtol=1e-8, atol=1e-10)


def test_named_data_sets_are_planned_from_their_recipe_without_drawing(monkeypatch):
    """describe of a named generator: the sizes and attributes load gives, without drawing the
    data (the flow process plans from it; the worker that ingests draws it)."""
    from lvmcore.data import DATASETS, recipe_fingerprint, synthetic

    small = {
        "swiss_roll": {"n": 50},
        "lllvm_swiss_roll": {"n": 40},
        "s_curve": {"n": 30, "seed": 2},
        "swiss_hole": {"n": 40},
        "severed_bowl": {"n": 40},
        "gaussian_blob": {"n": 40},
        "binary_tree": {"depth": 3, "n_per_node": 4},
        "mrd_toy": {"n": 30, "noise": 0.2},
        "digits": {"classes": 3, "n_per_class": 5},
    }
    assert set(small) == set(DATASETS)
    for name, opts in small.items():
        d, ds = describe(name, **opts), load(name, **opts)
        assert d["sizes"] == dict(ds.sizes), name
        assert d["attrs"] == dict(ds.attrs), name
        assert d["fingerprint"] == recipe_fingerprint(name, **opts)
    drawn = []
    real = synthetic.swiss_roll
    monkeypatch.setattr(synthetic, "swiss_roll", lambda n, seed: drawn.append(n) or real(n, seed))
    from lvmcore.data.sources import named

    counted = named._gen_manifold(synthetic.swiss_roll, 1000)
    monkeypatch.setitem(named.DATASETS, "swiss_roll", (counted, ""))
    d = describe("swiss_roll", n=10**8)
    assert d["sizes"]["point"] == 10**8 and d["sizes"]["feature"] == 3 and max(drawn) <= 16
    # a bad option is refused as load refuses it, before anything is drawn at size
    msg = r"unknown data-set \(swiss_roll\) option .bogus.; accepted: n, seed"
    with pytest.raises(ValueError, match=msg):
        describe("swiss_roll", n=100, bogus=1)
    with pytest.raises(ValueError, match="n must be an integer"):
        describe("swiss_roll", n=1)


def test_recipe_fingerprint_names_the_data(monkeypatch):
    from lvmcore.data import recipe_fingerprint
    from lvmcore.data.sources import named

    fp = recipe_fingerprint("swiss_roll", n=1000)
    assert fp == recipe_fingerprint("swiss_roll", n=1000, seed=0) == recipe_fingerprint("swiss_roll")
    others = [
        recipe_fingerprint("swiss_roll", n=1001),
        recipe_fingerprint("swiss_roll", n=1000, seed=1),
        recipe_fingerprint("s_curve", n=1000),
    ]
    monkeypatch.setattr(named, "GENERATOR_VERSION", "other")
    others.append(recipe_fingerprint("swiss_roll", n=1000))
    assert len({fp, *others}) == 5


def test_ingest_of_a_named_set_rebuilds_a_stale_store(tmp_path):
    """The worker draws the named data set; a store of another recipe, or one that records this
    recipe but holds other data, is rewritten; a plan made with another recipe is refused."""
    from lvmcore.data import recipe_fingerprint, write_store
    from tasks.ingest import ingest_dataset
    from tasks.knn import build_graph, graph_matches

    spec = {"name": "swiss_roll", "n": 300, "seed": 1}
    fp = recipe_fingerprint("swiss_roll", n=300, seed=1)
    p = tmp_path / "data.zarr"
    want = load("swiss_roll", n=300, seed=1)["Y"].values

    def stored():
        ds = open_dataset(p, dask=False)
        return ds["Y"].values, ds.attrs["fingerprint"], ds.attrs["content_fingerprint"]

    ingest(load("s_curve", n=300, seed=1), p)  # other data, other recipe
    ingest_dataset(spec, str(p), fp)
    Y, f, c = stored()
    np.testing.assert_array_equal(Y, want)
    assert f == fp and c == fingerprint(load("swiss_roll", n=300, seed=1))
    mtime = (p / "zarr.json").stat().st_mtime_ns
    ingest_dataset(spec, str(p), fp)  # the same recipe and content: kept
    assert (p / "zarr.json").stat().st_mtime_ns == mtime
    write_store(load("swiss_roll", n=300, seed=2), p, fp, overwrite=True)  # this recipe's name, other data
    build_graph(str(p), 5, str(tmp_path / "g.zarr"))
    assert graph_matches(str(tmp_path / "g.zarr"), str(p), 5, "auto")
    ingest_dataset(spec, str(p), fp)
    np.testing.assert_array_equal(stored()[0], want)
    # the graph of the other data is not taken for this data's (it records the content fingerprint)
    assert not graph_matches(str(tmp_path / "g.zarr"), str(p), 5, "auto")
    with pytest.raises(ValueError, match="recipe fingerprint"):
        ingest_dataset(spec, str(p), recipe_fingerprint("swiss_roll", n=300, seed=2))
    # lvmcore.data.ingest of a name records the same fingerprint the sweep plans with
    assert open_dataset(ingest("swiss_roll", tmp_path / "b.zarr", n=300, seed=1)).attrs["fingerprint"] == fp


@pytest.mark.slow  # a 2-process cluster, two chunked fits and a killed worker: about 30 s here
def test_chunked_fits_read_their_rows_from_the_store(tmp_path, cluster_client):
    """A sweep's chunked fits run in a worker task on a real 2-process cluster (seceded under
    ``worker_client``): the Bayesian GP-LVM's row chunks are dealt to actors on both workers, which
    read their rows from the ingested store; GLLE's tasks read the data and the graph there. The
    fitting task scatters none of the data or graph (GLLE's per-point model state for its weight
    draws, computed by the fit, still goes out in slices); the results equal the in-process fits.
    Then a worker holding row chunks is killed between two evaluations: the chunks are dealt again
    and read from the store again."""
    import os
    import signal
    import time

    from lvmcore.chunks import RowChunks
    from lvmcore.data.rowsource import ZarrRows
    from lvmcore.models.bgplvm import ViewStats, bound_objective
    from lvmcore.rows import attach
    from tasks.fit import fit_point
    from tasks.knn import build_graph

    data_path, graph_path = str(tmp_path / "data.zarr"), str(tmp_path / "graph.zarr")
    ingest(load("swiss_roll", n=400, seed=0), data_path, chunk_rows=64)
    build_graph(data_path, 8, graph_path)

    def fit_recording_scatters(*args):
        """fit_point in a worker task (as a sweep runs it), with the (dtype kind, row shape) of every
        array it scatters to the cluster (through its worker_client) recorded."""
        import distributed

        from tasks.fit import fit_point

        sent, real = [], distributed.Client.scatter

        def record(self, data, *a, **kw):
            for x in data if isinstance(data, (list, tuple)) else [data]:
                x = np.asarray(x)
                sent.append((x.dtype.kind, x.shape[1:]))
            return real(self, data, *a, **kw)

        distributed.Client.scatter = record
        try:
            return fit_point(*args), sent
        finally:
            distributed.Client.scatter = real

    runs = {
        "glle_em": ({"k": 8, "latent_dim": 2, "seed": 0}, {}),
        "bgplvm_rbf": ({"latent_dim": 2, "seed": 0}, {"max_iter": 4, "init_iters": 2, "n_inducing": 10}),
    }
    from distributed import get_task_stream

    hosts = set()
    for key, (point, opts) in runs.items():
        plain = fit_point(key, opts, data_path, graph_path, (0, 0), point)
        args = (key, {**opts, "chunks": 150}, data_path, graph_path, (0, 0), point)
        with get_task_stream(cluster_client) as stream:
            chunked, sent = cluster_client.submit(fit_recording_scatters, *args, pure=False).result()
        hosts |= {t["worker"] for t in stream.data if "ChunkHost" in str(t["key"])}
        assert plain.status == chunked.status == "done", (plain.error, chunked.error)
        assert not [s for s in sent if s in (("f", (3,)), ("i", (8,)))], (key, sent)  # no rows of Y or graph
        # GLLE scatters its per-point state for the weight draws (the recorder sees scatters);
        # the Bayesian GP-LVM's row chunks scatter nothing at all
        assert bool(sent) == (key == "glle_em"), (key, sent)
        np.testing.assert_allclose(chunked.elbo_trace, plain.elbo_trace, rtol=1e-7, err_msg=key)
        np.testing.assert_allclose(chunked.embedding, plain.embedding, rtol=0, atol=1e-5, err_msg=key)
    # an actor on each worker (the task stream, not the workers' logs: those are bounded and roll over)
    assert hosts == set(cluster_client.scheduler_info(n_workers=-1)["workers"]), hosts

    ds = open_dataset(data_path, dask=False)
    Y = ds["Y"].values
    mu = Y.mean(0)
    rng = np.random.default_rng(1)
    local = {"mu": rng.standard_normal((400, 2)), "logS": np.log(rng.uniform(0.1, 0.5, (400, 2)))}
    glob = {"Z": rng.standard_normal((1, 6, 2)), "kern": [{"log_var": 0.1, "log_ls": np.zeros(2)}]}
    glob["log_beta"] = np.array([0.3])
    obj = bound_objective(("rbf",), True, 400, (3,))
    want = RowChunks(ViewStats(("rbf",), True), obj, (Y - mu,)).value_and_grad(local, glob, 0.0)
    src = ZarrRows(data_path, "Y", expect={"fingerprint": ds.attrs["fingerprint"]})
    r = RowChunks(
        ViewStats(("rbf",), True), obj, (Y - mu,), 100, origin=[(attach(Y, src), mu)], client=cluster_client
    )
    assert r.sources is not None and len(set(r.placement)) == 2

    def check(got):
        assert abs(got[0] - want[0]) <= 1e-10 * abs(want[0])
        np.testing.assert_allclose(got[1]["mu"], want[1]["mu"], rtol=1e-8, atol=1e-10)

    check(r.value_and_grad(local, glob, 0.0))
    victim = r.placement[0]
    os.kill(cluster_client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while victim in scheduler_workers(cluster_client) and time.monotonic() < deadline:
        time.sleep(0.1)
    check(r.value_and_grad(local, glob, 0.0))
    assert victim not in r.placement


def test_row_sources_travel_with_their_values_and_refuse_a_rewritten_store(tmp_path):
    """A ZarrRows reads the stored rows (shifted: less the shift); a fit given the source carries
    it to the chunk engine (check_data), an array derived from those values does not; a store
    rewritten during a fit is refused."""
    from lvmcore.checks import check_data
    from lvmcore.data.rowsource import ZarrRows
    from lvmcore.rows import attach, source_of

    p = ingest(load("swiss_roll", n=50, seed=0), tmp_path / "d.zarr")
    ds = open_dataset(p, dask=False)
    Y, fp = ds["Y"].values, ds.attrs["fingerprint"]
    src = ZarrRows(p, "Y", expect={"fingerprint": fp})
    np.testing.assert_array_equal(src.read(5, 9), Y[5:9])
    np.testing.assert_array_equal(src.shifted(Y.mean(0)).read(0, 50), Y - Y.mean(0))
    got = check_data(src)  # a fit given the source: the values, carrying the source
    np.testing.assert_array_equal(got, Y)
    assert source_of(got) == src and source_of(check_data(attach(Y, src))) == src
    assert source_of(got.copy()) is None and source_of(got + 0.0) is None and source_of(got[1:]) is None
    assert source_of(Y) is None
    with pytest.raises(ValueError, match="cannot be the rows"):
        attach(Y[1:], src)
    ingest(load("swiss_roll", n=50, seed=1), p, overwrite=True)
    with pytest.raises(RuntimeError, match="changed while a fit read it"):
        src.read(0, 5)
