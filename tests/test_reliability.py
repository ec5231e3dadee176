"""Nothing silently wrong on real inputs (issue 36), through the CLI where a user meets it: a
damaged store (a deleted chunk, a NaN in a finished point, a flipped byte caught by its chunk's
crc32c checksum, a truncated zarr.json) named by every reader and repaired by a re-run where the
sweep's definition allows; config keys known or refused; missing and rare labels; a sweep with
failed points ends Failed in Prefect; a full disk; the same file by another path; a store from
another version of the numerics. Real zarr stores, a real Prefect server, real Dask clusters; one
finished small store is shared by the tests that damage a copy of it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr

from flows.cli import main as cli_main
from lvmcore.checks import MISSING_LABEL
from tasks.store import inputs_dir, read_status
from tests.failing_sweep import FAILED_MESSAGE, assert_failed_in_prefect, write_plane_csv
from tests.prefect_server import pointed_at

D = '{"name": "swiss_roll", "n": 120, "seed": 0}'
G = '{"k": [6, 8], "latent_dim": [2], "seed": [0]}'
#: the point the damage tests break: glle_em at k = 8 (index 1 along k)
K8 = "glle_em k=8 latent_dim=2 seed=0"


@pytest.fixture(scope="module")
def server(prefect_api):
    with pointed_at(prefect_api) as env:
        yield env


def _run(out, cluster, *extra, dataset=D, models="glle_em,ppca", grid=G, store="s.zarr"):
    argv = ["run", "--out", str(out), "--no-report", "--cluster", cluster, "--dataset", dataset]
    return cli_main([*argv, "--models", models, "--grid", grid, "--store", store, *extra])


@pytest.fixture(scope="module")
def finished(server, sweep_cluster, tmp_path_factory):
    """One finished store (glle_em at k = 6, 8 and ppca), copied by each test that damages it."""
    out = tmp_path_factory.mktemp("finished")
    assert _run(out, sweep_cluster) == 0
    return out


def _copy(finished: Path, to: Path) -> Path:
    shutil.copytree(finished / "s.zarr", to / "s.zarr")
    shutil.copytree(inputs_dir(finished / "s.zarr"), inputs_dir(to / "s.zarr"))
    return to / "s.zarr"


def _said(capfd, caplog) -> str:
    """What a run said: its own lines (stdout, stderr) and its flow runs' log records."""
    got = capfd.readouterr()
    text = got.out + got.err + "\n" + caplog.text
    caplog.clear()
    return text


def _readers(store: Path, capfd, *expected):
    """show, export, report and verify each refuse the store (exit 2, one line naming ``expected``)."""
    h5ad = store.with_suffix(".h5ad")
    for argv in (
        ["show", str(store)],
        ["export", str(store), "--to", str(h5ad)],
        ["report", str(store)],
        ["verify", str(store)],
    ):
        rc = cli_main(argv)
        err = capfd.readouterr().err
        assert rc == 2, (argv, err)
        assert all(e in err for e in expected), (argv, err)
        assert "Traceback" not in err, err
    assert not h5ad.exists()


# ---------------------------------------------------------------- a damaged store (W3, T2)


def _flip_byte(f: Path) -> None:
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0x01
    f.write_bytes(bytes(b))


def _strip_checksums(store: Path) -> None:
    """Make ``store`` what embed-sweep wrote before checksums: no crc32c codec in any array's
    metadata, no 4 checksum bytes at the end of any chunk file."""
    for meta in store.rglob("zarr.json"):
        m = json.loads(meta.read_text())
        if m.get("node_type") != "array":
            continue
        m["codecs"] = [c for c in m["codecs"] if c.get("name") != "crc32c"]
        meta.write_text(json.dumps(m))
        for f in (meta.parent / "c").rglob("*") if (meta.parent / "c").exists() else ():
            if f.is_file():
                f.write_bytes(f.read_bytes()[:-4])


@pytest.mark.parametrize("damage", ["deleted chunk", "NaN", "flipped byte"])
def test_a_damaged_point_is_named_by_every_reader_and_recomputed_by_a_rerun(
    damage, finished, sweep_cluster, tmp_path, capfd, caplog
):
    store = _copy(finished, tmp_path)
    g = zarr.open_group(str(store), mode="r+")["glle_em"]
    before = g["embedding"][1, 0, 0].copy()
    if damage == "deleted chunk":
        (store / "glle_em/embedding/c/1/0/0/0/0").unlink()
        what = "chunk file embedding/c/1/0/0/0/0 is missing"
    elif damage == "NaN":
        g["embedding"][1, 0, 0, 17, 1] = np.nan
        what = "embedding holds nan at point 17, component 1"
    else:  # one bit of the chunk file changed on disk: only its crc32c checksum tells
        _flip_byte(store / "glle_em/embedding/c/1/0/0/0/0")
        what = "chunk file embedding/c/1/0/0/0/0 fails its crc32c checksum (its bytes changed after it was "
        what += "written)"
    _readers(store, capfd, K8, what, "run the same `embed-sweep run` command again")
    assert _run(tmp_path, sweep_cluster) == 0
    out = _said(capfd, caplog)
    assert f"1 finished grid point(s) are damaged: {K8} ({what}); running them again" in out
    assert "2 of 3 grid points already in" in out and "1 to run" in out
    assert cli_main(["verify", str(store)]) == 0
    assert "sound (3 finished grid points" in capfd.readouterr().out
    # recomputed, not patched: the same seed gives the same embedding
    np.testing.assert_allclose(zarr.open_group(str(store), mode="r")["glle_em"]["embedding"][1, 0, 0], before)


def test_a_truncated_root_zarr_json_is_named_with_the_fix_before_any_server_starts(
    finished, sweep_cluster, tmp_path, capfd
):
    store = _copy(finished, tmp_path)
    meta = store / "zarr.json"  # the sweep's identity: only a backup or --replace restores it
    meta.write_bytes(meta.read_bytes()[:100])
    _readers(store, capfd, str(meta), "is damaged", "--replace")
    assert _run(tmp_path, sweep_cluster) == 2
    err = capfd.readouterr().err
    assert str(meta) in err and "--replace" in err and "Traceback" not in err
    assert not (tmp_path / "prefect-server.log").exists()  # refused before the server started
    assert _run(tmp_path, sweep_cluster, "--replace") == 0  # the fix: moved aside, run afresh
    assert read_status(str(store), "glle_em").ravel().tolist() == [1, 1]
    assert len(list(tmp_path.glob("s.zarr.replaced-*"))) == 1


@pytest.mark.parametrize("damaged, ran", [("glle_em/zarr.json", 0), ("glle_em/embedding/zarr.json", 2)])
def test_a_damaged_group_or_array_zarr_json_is_rebuilt_by_a_plain_rerun(
    damaged, ran, finished, sweep_cluster, tmp_path, capfd, caplog
):
    """A model group's own metadata (its attributes) and a per-point array's follow from the sweep's
    definition: every reader refuses the store naming the file, and the same command rebuilds it; a
    rebuilt array's chunks are dropped and the points it held recomputed (the group's keep theirs)."""
    store = _copy(finished, tmp_path)
    before = zarr.open_group(str(store), mode="r")["glle_em"]["embedding"][...]
    good = (store / damaged).read_bytes()
    (store / damaged).write_bytes(good[:100])
    _readers(store, capfd, str(store / damaged), "is damaged", "run the same `embed-sweep run` command again")
    assert _run(tmp_path, sweep_cluster) == 0
    out = _said(capfd, caplog)
    assert f"{store / damaged} is damaged" in out and "this run rebuilds it" in out
    assert f"{3 - ran} of 3 grid points already in" in out and f"{ran} to run" in out
    assert json.loads((store / damaged).read_bytes()) == json.loads(good)  # as the sweep first wrote it
    assert cli_main(["verify", str(store)]) == 0
    assert "sound (3 finished grid points" in capfd.readouterr().out
    after = zarr.open_group(str(store), mode="r")["glle_em"]["embedding"][...]
    np.testing.assert_allclose(after, before)  # recomputed with the same seeds, or kept


def test_a_store_written_before_checksums_opens_verifies_and_resumes(
    finished, sweep_cluster, tmp_path, capfd, caplog
):
    store = _copy(finished, tmp_path)
    _strip_checksums(store)
    assert cli_main(["verify", str(store)]) == 0
    out = capfd.readouterr().out
    assert "sound (3 finished grid points" in out and "no checksums: written before" in out
    assert cli_main(["show", str(store)]) == 0
    assert _run(tmp_path, sweep_cluster) == 0  # no migration: resumed as it is
    assert "3 of 3 grid points already in" in _said(capfd, caplog)


# ---------------------------------------------------------------- not a store (issue 51 T3, U6)


@pytest.mark.parametrize("command", ["show", "export", "report", "verify"])
def test_a_file_or_a_folder_that_is_not_a_store_is_named_in_one_line(command, tmp_path, capfd):
    """A regular file (an .h5ad where a store is expected) and an empty folder: exit 2, one line
    saying what the path is, no traceback, no --replace advice; nothing written beside them."""
    import anndata as ad

    h5ad = tmp_path / "pbmc68k_reduced.h5ad"
    ad.AnnData(np.ones((3, 2))).write_h5ad(h5ad)
    empty = tmp_path / "empty"
    empty.mkdir()
    out = ["--to", str(tmp_path / "out.h5ad")] if command == "export" else []
    for path, line in (
        (h5ad, f"{h5ad} is a file, not a result store (a store is a folder ending .zarr written by "),
        (empty, f"{empty} is not a result store (no zarr.json)"),
    ):
        assert cli_main([command, str(path), *out]) == 2
        err = capfd.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"embed-sweep: error: {line}"), err
        assert "Traceback" not in err and "--replace" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "pbmc68k_reduced.h5ad"]
    assert not list(empty.iterdir())


# ---------------------------------------------------------------- config keys (W5)


@pytest.mark.parametrize(
    "cfg, message",
    [
        (
            {"dataset": {"name": "mrd_toy", "n": 40}, "model": ["mrd"], "store": "a.zarr"},
            "unknown --config option 'model'; accepted: dataset, grid, model_options, models, store",
        ),
        (
            {"sweeps": [{"dataset": "swiss_roll", "models": ["ppca"], "gird": {"seed": [0]}}]},
            "unknown --config sweeps[0] option 'gird'; accepted: dataset, grid, model_options, models, store",
        ),
        (
            {"sweeps": [{"dataset": "swiss_roll"}], "store": "a.zarr"},
            "unknown --config option 'store'; accepted: sweeps",
        ),
    ],
)
def test_every_config_key_is_known_or_refused(cfg, message, tmp_path, capfd):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    assert cli_main(["run", "--out", str(tmp_path), "--config", str(path)]) == 2
    err = capfd.readouterr().err
    assert message in err, err
    assert not (tmp_path / "prefect-server.log").exists()


# ---------------------------------------------------------------- labels (W4)


def _labelled_csv(path, labels):
    from sklearn.datasets import make_swiss_roll

    Y, _ = make_swiss_roll(len(labels), random_state=0)
    df = pd.DataFrame(Y, columns=["x", "y", "z"])
    df["cell_type"] = labels
    df.to_csv(path, index=False)
    return json.dumps({"path": str(path), "label_column": "cell_type"})


def test_missing_labels_are_left_out_and_a_metric_that_cannot_be_computed_is_said_once(
    server, sweep_cluster, tmp_path, capfd, caplog
):
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.neighbors import KNeighborsClassifier

    rng = np.random.default_rng(0)
    labels = rng.choice(["a", "b", "c"], 200).astype(object)
    labels[rng.choice(200, 30, replace=False)] = None
    grid = '{"latent_dim": [2], "seed": [0]}'
    data = _labelled_csv(tmp_path / "cells.csv", labels)
    assert _run(tmp_path, sweep_cluster, dataset=data, models="ppca", grid=grid, store="m.zarr") == 0
    out = _said(capfd, caplog)
    note = "note: 30 of 200 evaluated points have no label: left out of knn_accuracy"
    assert out.count(note) == 2  # said when the evaluation starts and under the summary
    store = str(tmp_path / "m.zarr")
    assert cli_main(["show", store]) == 0 and note in capfd.readouterr().out
    codes = zarr.open_group(str(inputs_dir(store) / "data.zarr"), mode="r")["label"][...]
    assert (codes == MISSING_LABEL).sum() == 30
    g = zarr.open_group(store, mode="r")["ppca"]
    keep = codes != MISSING_LABEL
    emb = g["embedding"][0, 0][keep]
    cv = StratifiedKFold(n_splits=5, shuffle=True, random_state=0)
    want = cross_val_score(KNeighborsClassifier(n_neighbors=1), emb, codes[keep], cv=cv).mean()
    assert g["knn_accuracy"][0, 0] == pytest.approx(want, abs=1e-12)

    single = labels.copy()
    single[single == None] = "a"  # noqa: E711
    single[0] = "alone"  # a class with one member: stratified cross-validation is undefined
    data = _labelled_csv(tmp_path / "single.csv", single)
    assert _run(tmp_path, sweep_cluster, dataset=data, models="ppca", grid=grid, store="s1.zarr") == 0
    out = _said(capfd, caplog)
    said = "label class(es) ['alone'] have a single labelled point among the evaluated ones (1 in all): left"
    assert out.count(said) == 2, out  # once in the run's output, once under its summary
    g = zarr.open_group(str(tmp_path / "s1.zarr"), mode="r")["ppca"]
    assert str(g["error"][0, 0]) == ""
    codes = zarr.open_group(str(inputs_dir(str(tmp_path / "s1.zarr")) / "data.zarr"), mode="r")["label"][...]
    keep = codes != codes[0]  # the other classes' points: the metric of the rest, not NaN
    emb = g["embedding"][0, 0][keep]
    want = cross_val_score(KNeighborsClassifier(n_neighbors=1), emb, codes[keep], cv=cv).mean()
    assert g["knn_accuracy"][0, 0] == pytest.approx(want, abs=1e-12)
    assert cli_main(["show", str(tmp_path / "s1.zarr")]) == 0 and said in capfd.readouterr().out


def test_classes_of_one_are_left_out_of_knn_accuracy_and_fewer_than_two_classes_leave_it_undefined():
    from tasks.evaluate import knn_rows, label_notes

    lab = np.array([0, 0, 1, 2, 2, MISSING_LABEL, 3])
    np.testing.assert_array_equal(knn_rows(lab), [True, True, False, True, True, False, False])
    ok, notes = label_notes(lab, np.arange(len(lab)), names=["a", "b", "c", "d"])
    assert ok and notes[1].startswith("label class(es) ['b', 'd'] have a single labelled point")
    ok, notes = label_notes(np.array([0, 0, 1]), np.arange(3), names=["a", "b"])
    assert not ok and notes[-1].startswith("knn_accuracy cannot be computed: 1 label class(es) with two")


def test_the_evaluation_subset_is_stratified_so_rare_classes_keep_members():
    from tasks.evaluate import MAX_EVAL_POINTS, MIN_PER_CLASS, eval_subset

    labels = np.r_[np.zeros(9000, int), np.ones(12, int), np.full(3, 2), np.full(985, MISSING_LABEL)]
    labels = np.random.default_rng(1).permutation(labels)
    sel = eval_subset(len(labels), labels)
    assert len(sel) == MAX_EVAL_POINTS == len(np.unique(sel))
    counts = {c: int((labels[sel] == c).sum()) for c in (0, 1, 2, MISSING_LABEL)}
    assert counts[1] == MIN_PER_CLASS and counts[2] == 3  # a uniform draw keeps ~2.4 and ~0.6
    assert abs(counts[MISSING_LABEL] - 985 * MAX_EVAL_POINTS / len(labels)) <= 2
    np.testing.assert_array_equal(sel, eval_subset(len(labels), labels))  # seeded


# ---------------------------------------------------------------- Prefect's state (W6)


def test_a_sweep_with_failed_points_ends_failed_in_prefect_with_counts_and_reasons(
    server, sweep_cluster, tmp_path
):
    from prefect import get_client

    from flows.sweep import PointsFailed, embed_sweep, outcome

    store = str(tmp_path / "p.zarr")
    kw = dict(dataset=write_plane_csv(tmp_path / "plane.csv"), models=["ppca"], store=store, report=False)
    state = embed_sweep(
        grid={"latent_dim": [2], "seed": [0, 1]}, cluster=sweep_cluster, return_state=True, **kw
    )
    assert state.is_failed() and state.message == FAILED_MESSAGE
    assert outcome(state)["failed"] == 2
    with pytest.raises(PointsFailed, match="2 of 2 grid points failed"):
        embed_sweep(grid={"latent_dim": [2], "seed": [0, 1]}, cluster=sweep_cluster, **kw)
    with get_client(sync_client=True) as client:
        assert_failed_in_prefect(client, state.state_details.flow_run_id, store)
    # a sweep whose points are all done ends Completed
    ok = embed_sweep(grid={"latent_dim": [1], "seed": [0]}, cluster=sweep_cluster, return_state=True,
                     **{**kw, "store": str(tmp_path / "ok.zarr")})  # fmt: skip
    assert ok.is_completed() and ok.result()["done"] == 1


# ---------------------------------------------------------------- a full disk (T1)


def test_a_full_disk_is_one_line_with_an_exit_code_and_the_rerun_resumes(
    server, sweep_cluster, tmp_path, capfd, caplog
):
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs here (the test needs root): {r.stderr.decode().strip()}")
    try:
        data = '{"name": "swiss_roll", "n": 2000, "seed": 0}'
        grid = '{"k": [6, 8, 10, 12], "latent_dim": [2], "seed": [0, 1]}'
        kw = dict(dataset=data, models="glle_em", grid=grid, store="full.zarr")
        assert _run(disk, sweep_cluster, **kw) == 4
        err = capfd.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("embed-sweep: error:")]
        assert len(lines) == 1, err
        assert "No space left on device" in lines[0] and "MiB free there" in lines[0]
        assert "run the same command again to resume" in lines[0] and str(disk) in lines[0]
        assert "Traceback" not in err, err
        store = str(disk / "full.zarr")
        kept = int((read_status(store, "glle_em") == 1).sum())
        assert 0 < kept < 8
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        assert _run(disk, sweep_cluster, **kw) == 0
        assert f"{kept} of 8 grid points already in" in _said(capfd, caplog)
        assert (read_status(store, "glle_em") == 1).all()
        assert cli_main(["verify", store]) == 0
    finally:
        subprocess.run(["umount", str(disk)], check=True)


# ---------------------------------------------------------------- identity (T4) and code version (12)


def test_the_same_file_by_another_path_is_the_same_sweep(
    server, sweep_cluster, tmp_path, capfd, monkeypatch, caplog
):
    np.save(tmp_path / "d.npy", np.random.default_rng(0).normal(size=(80, 4)))
    grid = '{"latent_dim": [1], "seed": [0]}'
    monkeypatch.chdir(tmp_path)
    assert _run(tmp_path, sweep_cluster, dataset="d.npy", models="ppca", grid=grid, store="t.zarr") == 0
    capfd.readouterr()
    absolute = str(tmp_path / "d.npy")
    assert _run(tmp_path, sweep_cluster, dataset=absolute, models="ppca", grid=grid, store="t.zarr") == 0
    assert "1 of 1 grid points already in" in _said(capfd, caplog)
    shutil.copy(tmp_path / "d.npy", tmp_path / "copy.npy")  # the same content elsewhere: the same data
    assert _run(tmp_path, sweep_cluster, dataset="copy.npy", models="ppca", grid=grid, store="t.zarr") == 0
    assert "1 of 1 grid points already in" in _said(capfd, caplog)


def test_a_store_from_another_version_of_the_numerics_is_refused_with_the_fix(
    finished, sweep_cluster, tmp_path, capfd
):
    from tasks.store import numerics_version

    store = _copy(finished, tmp_path)
    g = zarr.open_group(str(store), mode="r+")["glle_em"]
    assert g["numerics"][...].ravel().tolist() == [numerics_version()] * 2  # recorded per point
    g["numerics"][0, 0, 0] = "0123456789abcdef"
    assert _run(tmp_path, sweep_cluster) == 2
    err = capfd.readouterr().err
    assert "another version of the numerics (1 by numerics 0123456789abcdef" in err
    assert "--replace" in err and not (tmp_path / "prefect-server.log").exists()
    assert _run(tmp_path, sweep_cluster, "--replace") == 0
    assert zarr.open_group(str(store), mode="r")["glle_em"]["numerics"][0, 0, 0] == numerics_version()
