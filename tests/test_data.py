"""Generators, loaders, zarr stores and every bad-input case of lvmcore.data."""

import json
import pickle

import numpy as np
import pytest
import xarray as xr
import zarr
from scipy.integrate import quad

from lvmcore import __version__
from lvmcore.data import DATASETS, describe, ingest, list_datasets, load, open_dataset, synthetic, views_of

# ---------------------------------------------------------------- generators: shapes and seeds

GENERATORS = [
    ("lllvm_swiss_roll", lambda s: synthetic.lllvm_swiss_roll(150, s)),
    ("gaussian_blob", lambda s: synthetic.gaussian_blob(150, s)),
    ("s_curve", lambda s: synthetic.s_curve(150, s)),
    ("swiss_roll", lambda s: synthetic.swiss_roll(150, s)),
    ("swiss_hole", lambda s: synthetic.swiss_hole(150, s)),
    ("severed_bowl", lambda s: synthetic.severed_bowl(150, s)),
    ("binary_tree", lambda s: synthetic.binary_tree(3, 20, s)),
    ("mrd_toy", lambda s: synthetic.mrd_toy(60, s)),
]


def _flat(out):
    arrays = []
    for o in out:
        arrays.extend(o if isinstance(o, list) else [o])
    return [np.asarray(a) for a in arrays]


@pytest.mark.parametrize("name,gen", GENERATORS, ids=[g[0] for g in GENERATORS])
def test_generator_seeds_reproducible(name, gen):
    a, b, c = _flat(gen(3)), _flat(gen(3)), _flat(gen(4))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    # a different seed changes the data (the tree's root rows and codes stay the same)
    assert not np.array_equal(a[0], c[0])
    for x in a:
        assert np.all(np.isfinite(x))
        if x.dtype.kind == "f":
            assert x.dtype == np.float64


def test_generator_seed_is_not_global():
    np.random.seed(0)
    a = synthetic.swiss_roll(50, 1)[0]
    np.random.seed(99)
    b = synthetic.swiss_roll(50, 1)[0]
    np.testing.assert_array_equal(a, b)


def test_lllvm_roll_truth():
    Y, lat, iso = synthetic.lllvm_swiss_roll(200, 0)
    assert Y.shape == (200, 3) and lat.shape == (200, 2) and iso.shape == (200, 2)
    t, h = lat.T
    assert t.min() >= 1.25 * np.pi and t.max() <= 3.75 * np.pi
    assert h.min() >= 0 and h.max() <= 10
    np.testing.assert_allclose(Y, np.column_stack([0.35 * t * np.cos(t), h, 0.35 * t * np.sin(t)]))
    # isometric coordinate = arc length of the spiral, by quadrature of |d/dt (0.35 t cos t, 0.35 t sin t)|
    speed = lambda u: np.hypot(0.35 * (np.cos(u) - u * np.sin(u)), 0.35 * (np.sin(u) + u * np.cos(u)))
    for i in range(0, 200, 37):
        np.testing.assert_allclose(iso[i, 0], quad(speed, 0.0, t[i])[0], rtol=1e-9)
    np.testing.assert_array_equal(iso[:, 1], h)


def test_gaussian_blob_truth():
    Y, lat = synthetic.gaussian_blob(300, 2)
    assert Y.shape == (300, 3)
    np.testing.assert_array_equal(Y[:, :2], lat)
    np.testing.assert_allclose(Y[:, 2], np.exp(-0.5 * (lat**2).sum(1)) / (2 * np.pi))


def test_s_curve_and_swiss_roll_truth():
    Y, lat = synthetic.s_curve(300, 1)
    t = lat[:, 0]
    assert Y.shape == (300, 3) and lat.shape == (300, 2)
    np.testing.assert_allclose(Y[:, 0], np.sin(t))
    np.testing.assert_allclose(Y[:, 2], np.sign(t) * (np.cos(t) - 1))
    np.testing.assert_array_equal(Y[:, 1], lat[:, 1])
    Y, lat = synthetic.swiss_roll(300, 1)
    t = lat[:, 0]
    np.testing.assert_allclose(Y[:, 0], t * np.cos(t))
    np.testing.assert_allclose(Y[:, 2], t * np.sin(t))
    np.testing.assert_array_equal(Y[:, 1], lat[:, 1])


def test_swiss_hole_truth_and_hole():
    Y, lat = synthetic.swiss_hole(2000, 0)
    assert Y.shape == (2000, 3) and lat.shape == (2000, 2)
    t, yy = lat.T
    np.testing.assert_allclose(Y, np.column_stack([t * np.cos(t), yy, t * np.sin(t)]))
    x, y, z = Y.T
    assert not np.any((x > -10) & (x < -5) & (z > -4) & (z < 7) & (y > 5) & (y < 15))
    assert t.min() >= 1.5 * np.pi and t.max() <= 4.5 * np.pi and y.min() >= 0 and y.max() <= 21
    # the hole region of the parameter box is really populated around it (so the cut did something)
    near = (x > -12) & (x < -3) & (z > -6) & (z < 9)
    assert near.sum() > 20


def test_severed_bowl_truth():
    Y, lat = synthetic.severed_bowl(500, 3)
    assert Y.shape == (500, 3)
    p, t = lat.T
    assert np.all((t > np.pi / 3) & (t < 4 * np.pi / 5)) and np.all((p >= 0) & (p <= 2 * np.pi - 1))
    np.testing.assert_allclose(np.linalg.norm(Y, axis=1), 1.0)
    np.testing.assert_allclose(Y, np.column_stack([np.sin(t) * np.cos(p), np.sin(t) * np.sin(p), np.cos(t)]))


def _tree_distance(u, v):
    """Edges between heap nodes u and v (independent of the codes)."""

    def path(a):
        out = [a]
        while a > 0:
            a = (a - 1) // 2
            out.append(a)
        return out

    pu, pv = path(u), path(v)
    common = set(pu) & set(pv)
    return min(pu.index(c) + pv.index(c) for c in common)


@pytest.mark.parametrize("depth,shape", [(4, (300, 15)), (5, (620, 31)), (6, (1260, 63))])
def test_binary_tree_sizes_codes_and_samples(depth, shape):
    Y, node, codes, depth_label = synthetic.binary_tree(depth, 20, seed=1)
    n_nodes = 2**depth - 1
    assert Y.shape == shape and codes.shape == (n_nodes, n_nodes)
    np.testing.assert_array_equal(node, np.repeat(np.arange(n_nodes), 20))
    # labels: 0 for the root, else the node's depth
    expect_depth = np.array([len(bin(v + 1)) - 3 for v in range(n_nodes)])
    np.testing.assert_array_equal(depth_label, expect_depth[node])
    # codes: a 1 at the node and each ancestor, so Hamming distance between codes = tree distance
    np.testing.assert_array_equal(codes.sum(1), expect_depth + 1)
    rng = np.random.default_rng(0)
    for u, v in rng.integers(0, n_nodes, size=(40, 2)):
        assert np.abs(codes[u] - codes[v]).sum() == _tree_distance(u, v)
    # root samples are the bare code, all identical
    root = Y[node == 0]
    np.testing.assert_array_equal(root, np.tile(codes[0], (20, 1)))
    # every other sample: root bit 1; per level, (ancestor bit, sibling bit) = (cos t, sin t), t in [0, pi/4]
    for i in rng.choice(np.flatnonzero(node > 0), size=60, replace=False):
        v, y = node[i], Y[i]
        touched = {0}
        assert y[0] == 1.0
        a = v
        while a > 0:
            s = a + 1 if a % 2 == 1 else a - 1
            np.testing.assert_allclose(y[a] ** 2 + y[s] ** 2, 1.0)
            assert np.cos(np.pi / 4) - 1e-12 <= y[a] <= 1.0 and 0.0 <= y[s] <= np.sin(np.pi / 4) + 1e-12
            touched |= {a, s}
            a = (a - 1) // 2
        others = np.setdiff1d(np.arange(n_nodes), list(touched))
        np.testing.assert_array_equal(y[others], 0.0)
    # the angles are drawn per sample: two samples of one leaf differ
    leaf = n_nodes - 1
    rows = Y[node == leaf]
    assert not np.allclose(rows[0], rows[1])


def test_mrd_toy_structure():
    views, sig = synthetic.mrd_toy(100, 5, noise=0.0)
    assert [v.shape for v in views] == [(100, 15), (100, 15)] and sig.shape == (100, 3)
    t = np.linspace(0, 4 * np.pi, 100)
    np.testing.assert_allclose(sig, np.column_stack([np.cos(t), np.sin(t), np.cos(t) ** 2]))
    # without noise: private block = private signal times a row, shared block = cos^2 t times a row
    for v, private in enumerate([np.cos(t), np.sin(t)]):
        for block, s in [(views[v][:, :10], private), (views[v][:, 10:], np.cos(t) ** 2)]:
            w = np.linalg.lstsq(s[:, None], block, rcond=None)[0]
            np.testing.assert_allclose(s[:, None] @ w, block, atol=1e-12)
    noisy, _ = synthetic.mrd_toy(100, 5, noise=0.1)
    resid = noisy[0] - views[0]
    assert 0.08 < resid.std() < 0.12


def test_generator_argument_errors():
    with pytest.raises(ValueError, match="n must be an integer"):
        synthetic.swiss_roll(1, 0)
    with pytest.raises(ValueError, match="depth"):
        synthetic.binary_tree(0)


# ---------------------------------------------------------------- load / named sets


def test_load_named_sets():
    assert set(list_datasets()) == set(DATASETS)
    ds = load("lllvm_swiss_roll", n=120, seed=4)
    Y, _, iso = synthetic.lllvm_swiss_roll(120, 4)
    np.testing.assert_array_equal(ds["Y"].values, Y)
    np.testing.assert_array_equal(ds["truth"].values, iso)
    assert ds.attrs["seed"] == 4 and json.loads(ds.attrs["params"]) == {"n": 120, "seed": 4}
    assert ds.attrs["source"] == "generator:lllvm_swiss_roll" and ds.attrs["code_version"] == __version__
    tree = load("binary_tree", depth=4)
    assert tree["Y"].shape == (300, 15) and tree.attrs["truth_metric"] == "cityblock"
    _, node, codes, _ = synthetic.binary_tree(4, 20, 0)
    np.testing.assert_array_equal(tree["truth"].values, codes[node])
    mrd = load("mrd_toy", n=50)
    v0, v1 = views_of(mrd)
    assert v0.shape == (50, 15) and v1.shape == (50, 15)
    np.testing.assert_array_equal(mrd["Y"].values, np.hstack([v0, v1]))
    digits = load("digits")
    assert digits["Y"].shape == (901, 64) and set(np.unique(digits["label"].values)) == set(range(5))
    assert digits["Y"].values.max() <= 1.0
    sub = load("digits", classes=3, n_per_class=10, seed=2)
    assert sub["Y"].shape == (30, 64) and np.bincount(sub["label"].values).tolist() == [10, 10, 10]


def test_load_user_files(tmp_path):
    rng = np.random.default_rng(0)
    Y = rng.normal(size=(30, 4))
    np.save(tmp_path / "a.npy", Y)
    ds = load(tmp_path / "a.npy")
    np.testing.assert_array_equal(ds["Y"].values, Y)
    assert ds.attrs["source"].startswith("file:") and ds.attrs["name"] == "a"
    import pandas as pd

    df = pd.DataFrame(Y, columns=list("abcd"))
    df["cls"] = ["x", "y", "z"] * 10
    df.to_csv(tmp_path / "b.csv", index=False)
    ds = load(tmp_path / "b.csv", label_column="cls")
    np.testing.assert_allclose(ds["Y"].values, Y)
    np.testing.assert_array_equal(ds["label"].values, [0, 1, 2] * 10)


# ---------------------------------------------------------------- store round trip


def test_ingest_round_trip(tmp_path):
    ds = load("mrd_toy", n=70, seed=3)
    path = ingest(ds, tmp_path / "mrd.zarr", chunk_rows=32)
    back = xr.open_zarr(path, consolidated=False)
    for name in ["Y", "view_0", "view_1", "truth", "color"]:
        np.testing.assert_array_equal(back[name].values, ds[name].values)
        assert back[name].dims == ds[name].dims
    assert back["Y"].encoding["chunks"] == (32, 30)
    group = zarr.open_group(str(path), mode="r")
    assert group["Y"].metadata.dimension_names == ("point", "feature")
    assert group["view_1"].metadata.dimension_names == ("point", "feature_1")
    for key in ["name", "source", "params", "seed", "code_version"]:
        assert back.attrs[key] == ds.attrs[key]
    assert json.loads(back.attrs["params"]) == {"n": 70, "seed": 3}
    # open_dataset / load restore the list-valued attrs
    again = load(path)
    assert again.attrs["views"] == ["view_0", "view_1"]
    np.testing.assert_array_equal(views_of(again)[1], ds["view_1"].values)
    # ingest by name with options, and refusing to overwrite an existing store
    p2 = ingest("binary_tree", tmp_path / "tree.zarr", depth=4, seed=1)
    t = open_dataset(p2)
    assert t["Y"].shape == (300, 15) and t.attrs["seed"] == 1
    with pytest.raises(ValueError, match="already exists"):
        ingest("binary_tree", p2, depth=4)
    ingest("binary_tree", p2, depth=5, overwrite=True)
    assert open_dataset(p2)["Y"].shape == (620, 31)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mrd.zarr", "tree.zarr"]


def _crash_midway(monkeypatch):
    real = xr.Dataset.to_zarr

    def broken(self, store, *args, **kwargs):
        real(self[["Y"]], store, *args, **{**kwargs, "encoding": {"Y": kwargs["encoding"]["Y"]}})
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(xr.Dataset, "to_zarr", broken)


def test_ingest_crash_leaves_no_store(tmp_path, monkeypatch):
    _crash_midway(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        ingest("swiss_roll", tmp_path / "roll.zarr", n=50)
    assert list(tmp_path.iterdir()) == []


def test_ingest_crash_keeps_existing_store(tmp_path, monkeypatch):
    path = ingest("swiss_roll", tmp_path / "roll.zarr", n=50, seed=1)
    before = open_dataset(path)["Y"].values.copy()
    _crash_midway(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        ingest("swiss_roll", path, n=80, seed=2, overwrite=True)
    monkeypatch.undo()
    np.testing.assert_array_equal(open_dataset(path)["Y"].values, before)
    assert [p.name for p in tmp_path.iterdir()] == ["roll.zarr"]


# ---------------------------------------------------------------- bad input


def test_unknown_name():
    with pytest.raises(ValueError, match=r"unknown data set 'swiss_rol'.*swiss_roll"):
        load("swiss_rol")


def test_bad_generator_options():
    with pytest.raises(ValueError, match=r"unknown data-set \(swiss_roll\) option 'colour'; accepted: n, se"):
        load("swiss_roll", colour=3)
    with pytest.raises(ValueError, match="n_per_class = 500 is out of range.*must be 1 .. 17[0-9]"):
        describe("digits", classes=3, n_per_class=500)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load(tmp_path / "nope.npy")
    with pytest.raises(ValueError, match="does not exist"):
        open_dataset(tmp_path / "nope.zarr")


def test_unsupported_suffix(tmp_path):
    (tmp_path / "x.txt").write_text("1 2 3")
    with pytest.raises(ValueError, match=r"unsupported file type '.txt'"):
        load(tmp_path / "x.txt")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_inf_npy_and_csv(tmp_path, bad):
    Y = np.ones((10, 3))
    Y[4, 2] = bad
    np.save(tmp_path / "a.npy", Y)
    with pytest.raises(ValueError, match=r"NaN or inf \(first at row 4, column 2"):
        load(tmp_path / "a.npy")
    np.savetxt(tmp_path / "a.csv", Y, delimiter=",", header="a,b,c", comments="")
    with pytest.raises(ValueError, match="NaN or inf"):
        load(tmp_path / "a.csv")


def test_pickled_npy_refused(tmp_path):
    obj = np.empty(2, dtype=object)
    obj[0], obj[1] = {"a": 1}, [1, 2]
    np.save(tmp_path / "p.npy", obj, allow_pickle=True)
    with pytest.raises(ValueError, match="pickled Python objects"):
        load(tmp_path / "p.npy")
    # a raw pickle renamed to .npy is not an array either
    (tmp_path / "q.npy").write_bytes(pickle.dumps(np.ones((3, 3))))
    with pytest.raises(ValueError, match="q.npy"):
        load(tmp_path / "q.npy")


def test_corrupt_npy(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((100, 5)))
    raw = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "trunc.npy").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="trunc.npy"):
        load(tmp_path / "trunc.npy")
    (tmp_path / "junk.npy").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match="not a readable .npy file"):
        load(tmp_path / "junk.npy")


@pytest.mark.parametrize("shape", [(10,), (2, 3, 4)])
def test_wrong_dimensionality_npy(tmp_path, shape):
    np.save(tmp_path / "a.npy", np.ones(shape))
    with pytest.raises(ValueError, match=rf"shape {shape!r}".replace("(", r"\(").replace(")", r"\)")):
        load(tmp_path / "a.npy")


def test_non_numeric_npy_and_csv(tmp_path):
    np.save(tmp_path / "s.npy", np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(ValueError, match="numeric"):
        load(tmp_path / "s.npy")
    (tmp_path / "s.csv").write_text("a,b\n1,x\n2,y\n")
    with pytest.raises(ValueError, match=r"non-numeric columns \['b'\]"):
        load(tmp_path / "s.csv")
    (tmp_path / "l.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="label_column 'c'"):
        load(tmp_path / "l.csv", label_column="c")


def test_corrupt_csv(tmp_path):
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00\x01\x02" * 50)
    with pytest.raises(ValueError, match="bin.csv"):
        load(tmp_path / "bin.csv")


def test_corrupt_zarr_store(tmp_path):
    path = ingest("swiss_roll", tmp_path / "roll.zarr", n=40)
    (path / "zarr.json").write_text("{ this is not json")
    with pytest.raises(ValueError, match="not a readable zarr data store"):
        load(path)
    other = tmp_path / "other.zarr"
    xr.Dataset({"Z": ("a", np.arange(3.0))}).to_zarr(other, consolidated=False)
    with pytest.raises(ValueError, match="no 'Y' variable"):
        open_dataset(other)
