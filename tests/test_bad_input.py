"""The bad-input corpus (issue 51, item 6): every bad input a new user's probe found, and the inputs it
found handled well, as rows of one table: the command, the exit code it must end with, and a line
it must print. A refusal is one line on stderr, no traceback, and comes before any Prefect server
starts or any store is made; an input that passes every refusal reaches the point where the server
would start (``STARTS``: the server is replaced by a stop there, so the corpus stays fast).

The files are small subsets of scanpy's ``pbmc68k_reduced`` written once per module. A new bad
input is added as a row. Besides the table: chained exports (SW2) and an unrelated file kept (SW1);
`show`, `export` and `run --replace` on a store a live sweep holds; the run log's filter; a failure
met inside a task on a real cluster (slow). Tested where a real sweep runs: a second sweep on a
running store (test_integrity), SIGINT / SIGTERM (test_lifecycle) and SIGKILL then resume
(test_lifecycle, test_faults)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import prefect.main  # noqa: F401  (Prefect's console handler made on the session's stderr, not a test's)
import pytest

from flows.cli import main as cli_main

ad = pytest.importorskip("anndata")
sc = pytest.importorskip("scanpy")
mudata = pytest.importorskip("mudata")

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*without encoding metadata", "ignore:.*very old version of AnnData", "ignore::FutureWarning"
)

ROOT = Path(__file__).resolve().parents[1]
#: scanpy's bundled file, in anndata's old on-disk format (var as one compound table)
OLD_FORMAT = str(Path(sc.__file__).parent / "datasets" / "10x_pbmc68k_reduced.h5ad")
#: the exit code of a run that passed every refusal: it got as far as starting its Prefect server
STARTS = "starts"
PPCA = ["--models", "ppca", "--grid", '{"latent_dim": [2], "seed": [0]}']


def _pbmc(n: int = 60):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = sc.datasets.pbmc68k_reduced()
    a = a[:n].copy()
    a.raw = None
    del a.uns["rank_genes_groups"], a.uns["neighbors"]
    a.obsp = {}
    return a


def _write(a, path: Path) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a.write_h5ad(path)
    return str(path)


def _truncate(src: str, dst: Path) -> str:
    data = Path(src).read_bytes()
    dst.write_bytes(data[: len(data) // 2])
    return str(dst)


def make_inputs(d: Path) -> dict[str, str]:
    """Every input file of the corpus under ``d``, by name."""
    import scipy.sparse as sp

    p: dict[str, str] = {"old": OLD_FORMAT, "dir": str(d)}
    base = _pbmc()
    p["pbmc"] = _write(base, d / "pbmc.h5ad")
    a = base.copy()
    a.X[3, 4] = np.nan
    p["nan_x"] = _write(a, d / "nan_x.h5ad")
    a = base.copy()
    a.obsm["X_pca"][7, 0] = np.nan
    p["nan_pca"] = _write(a, d / "nan_pca.h5ad")
    a = base.copy()
    a.obsm["pca_df"] = pd.DataFrame(a.obsm["X_pca"][:, :3], index=a.obs_names, columns=["a", "b", "c"])
    p["obsm_df"] = _write(a, d / "obsm_df.h5ad")
    a = base.copy()
    a.obs_names = ["cell"] * a.n_obs
    p["dup_obs"] = _write(a, d / "dup_obs.h5ad")
    a = base.copy()
    a.var_names = ["gene"] * a.n_vars
    p["dup_var"] = _write(a, d / "dup_var.h5ad")
    rng = np.random.default_rng(0)
    counts = sp.random(60, 40, density=0.3, format="csr", random_state=1, dtype=np.float64)
    counts.data = np.round(counts.data * 20) + 1
    counts = counts.astype(np.int64)
    c = ad.AnnData(X=counts)
    c.obs_names = [f"c{i}" for i in range(60)]
    p["counts"] = _write(c, d / "counts.h5ad")
    keep = np.ones(60)
    keep[[2, 5]] = 0
    z = ad.AnnData(X=sp.csr_matrix(sp.diags(keep) @ counts), obs=c.obs)
    z.X.eliminate_zeros()
    p["zero_cells"] = _write(z, d / "zero_cells.h5ad")
    a = base.copy()
    a.obs["float_nan"] = np.where(np.arange(60) % 7 == 0, np.nan, np.arange(60) % 3).astype(float)
    a.obs["flag"] = np.arange(60) % 2 == 0
    a.obs["single"] = [f"only{i}" if i < 3 else "many" for i in range(60)]
    a.obs["codes"] = (np.arange(60) % 4).astype(np.int64)
    a.obs["quantity"] = rng.integers(100, 5000, 60)
    p["labels"] = _write(a, d / "labels.h5ad")
    a = ad.AnnData(obs=base.obs.copy(), obsm={"X_pca": base.obsm["X_pca"]}, shape=base.shape)
    a.X = None
    p["x_none"] = _write(a, d / "x_none.h5ad")
    (d / "random.h5ad").write_bytes(rng.bytes(4096))
    p["random"] = str(d / "random.h5ad")
    for n in (0, 1, 2, 5):
        p[f"cells{n}"] = _write(base[:n].copy(), d / f"cells{n}.h5ad")
    a = base.copy()
    a.layers["wide"] = np.abs(a.X)
    p["layer"] = _write(a, d / "layer.h5ad")
    p["trunc_h5ad"] = _truncate(p["pbmc"], d / "trunc.h5ad")
    rna, prot = base[:, :30].copy(), ad.AnnData(X=rng.normal(size=(60, 6)), obs=base.obs[[]].copy())
    prot.var_names = [f"p{i}" for i in range(6)]
    md = mudata.MuData({"rna": rna, "prot": prot})
    p["mdata"] = str(d / "two.h5mu")
    md.write(p["mdata"])
    p["trunc_h5mu"] = _truncate(p["mdata"], d / "trunc.h5mu")
    mudata.MuData({"rna": rna, "prot": prot[:, :0].copy()}).write(str(d / "nofeat.h5mu"))
    p["no_features"] = str(d / "nofeat.h5mu")
    other = prot.copy()
    other.obs_names = [f"x{i}" for i in range(60)]
    mudata.MuData({"rna": rna, "prot": other}).write(str(d / "disjoint.h5mu"))
    p["disjoint"] = str(d / "disjoint.h5mu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mudata.MuData({"rna": rna, "prot": prot[:0].copy()}).write(str(d / "nocells.h5mu"))
    p["no_cells"] = str(d / "nocells.h5mu")
    part = prot[20:].copy()
    mudata.MuData({"rna": rna[:40].copy(), "prot": part}).write(str(d / "partial.h5mu"))
    p["partial"] = str(d / "partial.h5mu")
    p["empty_dir"] = str(d / "empty_folder")
    os.makedirs(p["empty_dir"], exist_ok=True)
    return p


def make_stores(p: dict[str, str]) -> None:
    """Two small result stores of the same cells (no server, no cluster), an unrelated AnnData, a
    shuffled copy of the sweep's file: the export's rows."""
    from tests.results_store import build_store

    d = Path(p["dir"])
    ds = {"path": p["pbmc"], "use_rep": "X_pca"}
    p["store"] = str(build_store(d / "pbmc.zarr", ds, ["ppca"], {"latent_dim": [2], "seed": [0]}))
    p["other"] = str(build_store(d / "other.zarr", ds, ["ppca"], {"latent_dim": [3], "seed": [0]}))
    mine = ad.AnnData(X=np.ones((3, 2)), uns={"precious": "years of notes"})
    p["mywork"] = _write(mine, d / "mywork.h5ad")
    a = ad.read_h5ad(p["pbmc"])
    p["shuffled"] = _write(a[np.random.default_rng(1).permutation(a.n_obs)].copy(), d / "shuffled.h5ad")


def _ds(key: str, **opts) -> str:
    return json.dumps({"path": "@" + key, **opts})


def _run(dataset: str, *rest: str) -> list[str]:
    return ["run", "--no-report", "--dataset", dataset, *(rest or PPCA)]


#: (case, command with @name for the corpus's files, exit code or STARTS, what it must print (one
#: string, or a tuple of strings that must all be there) on stderr for a refusal, else on stdout);
#: @out is the row's own output folder
CASES = [
    # the cases
    ("SW1 export onto an unrelated file", ["export", "@store", "--to", "@mywork"], 2, "--replace-file"),
    (
        "SW3 old-format var: the PCA on highly_variable",
        _run(_ds("old", preprocess={"pca": 10})),
        STARTS,
        "PCA on var['highly_variable']",
    ),
    ("T1 NaN in X", _run(_ds("nan_x")), 2, "row 3, column 4"),
    ("T1 NaN in obsm X_pca", _run(_ds("nan_pca", use_rep="X_pca")), 2, "row 7, column 0"),
    (
        "T1 NaN in X under preprocess: the input's coordinates",
        _run(_ds("nan_x", preprocess={"pca": 10})),
        2,
        "row 3, column 4",
    ),
    ("T2 a modality with 0 features", _run(_ds("no_features")), 2, "mod/prot/X has 0 columns"),
    ("T3 show on a file", ["show", "@pbmc"], 2, "not a result store"),
    ("T3 export from a file", ["export", "@pbmc", "--to", "@out/x.h5ad"], 2, "not a result store"),
    ("T3 report on a file", ["report", "@pbmc"], 2, "not a result store"),
    ("T3 verify on a file", ["verify", "@pbmc"], 2, "not a result store"),
    ("U1 a truncated .h5ad", _run(_ds("trunc_h5ad")), 2, "damaged or not an HDF5 file"),
    ("U1 a truncated .h5mu", _run(_ds("trunc_h5mu")), 2, "damaged or not an HDF5 file"),
    (
        "U2 mask_var highly_variable on an old-format file",
        _run(_ds("old", preprocess={"pca": 10, "mask_var": "highly_variable"})),
        STARTS,
        "data ",
    ),
    (
        "U3 an unreachable scheduler",
        _run(_ds("pbmc", use_rep="X_pca"), *PPCA, "--cluster", "tcp://127.0.0.1:1", "--connect-timeout", "2"),
        2,
        "cannot reach the scheduler at tcp://127.0.0.1:1 (timed out after 2 s)",
    ),
    ("U4 an empty models list", _run(_ds("pbmc"), "--models", ""), 2, "no models given"),
    (
        "U5 a negative worker count",
        _run(_ds("pbmc"), *PPCA, "--cluster", "-1"),
        2,
        "the worker count must be positive, got -1",
    ),
    ("U6 show on an empty folder", ["show", "@empty_dir"], 2, "not a result store"),
    # the cause, then after "; " the fix (the refusals' form)
    (
        "U7 use_rep naming an obsm DataFrame",
        _run(_ds("obsm_df", use_rep="pca_df")),
        2,
        ("obsm['pca_df']", "; "),
    ),
    (
        "kappa in a grid no chosen model uses",
        _run(
            _ds("pbmc", use_rep="X_pca"),
            "--models",
            "ppca,glle",
            "--grid",
            '{"k": [8], "latent_dim": [2], "kappa": [10], "seed": [0]}',
        ),
        STARTS,
        "note: grid dimension 'kappa' is used by none of the models ppca, glle_em",
    ),
    # inputs the probe found handled well
    ("duplicate obs_names", _run(_ds("dup_obs")), STARTS, "data "),
    ("duplicate var_names", _run(_ds("dup_var")), STARTS, "data "),
    (
        "integer CSR counts, normalize_total / log1p / pca",
        _run(_ds("counts", preprocess={"normalize_total": True, "log1p": True, "pca": 5})),
        STARTS,
        "data ",
    ),
    ("all-zero cells", _run(_ds("zero_cells", preprocess={"log1p": True})), STARTS, "data "),
    (
        "a float label column with NaN",
        _run(_ds("labels", use_rep="X_pca", label_column="float_nan")),
        STARTS,
        "data ",
    ),
    ("a boolean label column", _run(_ds("labels", use_rep="X_pca", label_column="flag")), STARTS, "data "),
    (
        "string labels with one-member classes",
        _run(_ds("labels", use_rep="X_pca", label_column="single")),
        STARTS,
        "data ",
    ),
    ("integer label codes", _run(_ds("labels", use_rep="X_pca", label_column="codes")), STARTS, "data "),
    (
        "a quantity given as a label",
        _run(_ds("labels", use_rep="X_pca", label_column="quantity")),
        2,
        "color_column",
    ),
    ("X None", _run(_ds("x_none")), 2, "X"),
    ("X None, use_rep X_pca", _run(_ds("x_none", use_rep="X_pca")), STARTS, "data "),
    ("a file of random bytes", _run(_ds("random")), 2, "random.h5ad"),
    ("0 cells", _run(_ds("cells0")), 2, "X has 0 rows"),
    ("1 cell", _run(_ds("cells1")), 2, "1 point"),
    ("2 cells", _run(_ds("cells2")), 2, "2 point"),
    ("5 cells", _run(_ds("cells5", use_rep="X_pca")), STARTS, "data "),
    ("a missing label_column", _run(_ds("pbmc", label_column="nope")), 2, "'nope'"),
    ("a missing color_column", _run(_ds("pbmc", color_column="nope")), 2, "'nope'"),
    ("pca >= N", _run(_ds("pbmc", preprocess={"pca": 60})), 2, "pca"),
    ("log1p on negative data", _run(_ds("pbmc", preprocess={"log1p": True})), 2, "log1p"),
    (
        "a layer wider than the width limit",
        _run(_ds("layer", layer="wide", max_features=100)),
        2,
        "width limit",
    ),
    ("MuData with disjoint cells", _run(_ds("disjoint")), 2, "share no obs_names"),
    ("MuData with a 0-cell modality", _run(_ds("no_cells")), 2, "mod/prot/X has 0 rows"),
    ("MuData with a bad modality:column", _run(_ds("mdata", label_column="rna:nope")), 2, "rna:nope"),
    ("MuData with partial overlap", _run(_ds("partial")), STARTS, "data "),
    (
        "a grid with a repeated k",
        _run(
            _ds("pbmc", use_rep="X_pca"),
            "--models",
            "glle",
            "--grid",
            '{"k": [8, 8], "latent_dim": [2], "seed": [0]}',
        ),
        2,
        "k",
    ),
    (
        "a grid with a non-positive k",
        _run(
            _ds("pbmc", use_rep="X_pca"),
            "--models",
            "glle",
            "--grid",
            '{"k": [0], "latent_dim": [2], "seed": [0]}',
        ),
        2,
        "k",
    ),
    (
        "latent_dim above the width",
        _run(_ds("pbmc", use_rep="X_pca"), "--grid", '{"latent_dim": [60], "seed": [0]}', "--models", "ppca"),
        2,
        "latent_dim",
    ),
    (
        "a non-integer seed",
        _run(
            _ds("pbmc", use_rep="X_pca"), "--models", "ppca", "--grid", '{"latent_dim": [2], "seed": [0.5]}'
        ),
        2,
        "seed",
    ),
    ("export to the sweep's own source file", ["export", "@store", "--to", "@pbmc"], 2, "pbmc.h5ad"),
    (
        "export to a folder that does not exist",
        ["export", "@store", "--to", "@out/nowhere/x.h5ad"],
        0,
        "wrote",
    ),
    (
        "export with --from the same cells shuffled",
        ["export", "@store", "--to", "@out/shuffled_out.h5ad", "--from", "@shuffled"],
        0,
        "wrote",
    ),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("bad-input"))


@pytest.fixture(scope="module")
def stores(inputs):
    make_stores(inputs)
    return inputs


#: the corpus's names that :func:`make_stores` makes
STORE_NAMES = ("@store", "@other", "@mywork", "@shuffled")


def fill(argv: list[str], p: dict[str, str], out: Path) -> list[str]:
    """The command with the corpus's paths in place of @name (longest names first)."""
    names = sorted({**p, "out": str(out)}.items(), key=lambda kv: -len(kv[0]))
    filled = []
    for arg in argv:
        for name, path in names:
            arg = arg.replace("@" + name, path)
        filled.append(arg)
    if filled[0] == "run":
        filled += ["--out", str(out)]
    return filled


class ServerStarts(Exception):
    """Raised where ``run`` would start its Prefect server: every refusal is behind it."""


@contextlib.contextmanager
def _no_server(log_path=None):
    raise ServerStarts(str(log_path))
    yield


def run_case(argv: list[str], capsys, monkeypatch) -> tuple[object, str, str]:
    """(exit code or STARTS, stdout, stderr) of one command, run in this process."""
    import flows.run

    monkeypatch.setattr(flows.run, "local_server", _no_server)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    try:
        rc = cli_main(argv)
    except ServerStarts:
        rc = STARTS
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("case,argv,code,line", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case, argv, code, line, inputs, tmp_path, capsys, monkeypatch, request):
    if any(arg.startswith(STORE_NAMES) for arg in argv):
        inputs = request.getfixturevalue("stores")
    rc, out, err = run_case(fill(argv, inputs, tmp_path), capsys, monkeypatch)
    assert rc == code, f"{case}: exit {rc}\nstdout: {out}\nstderr: {err}"
    assert "Traceback" not in err, err
    said = err if code == 2 else out
    for words in [line] if isinstance(line, str) else line:
        assert words in said, said
    if code == 2:  # one line, before any server starts or any store is made
        assert len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "prefect-server.log").exists()
        assert not list(tmp_path.glob("sweep.*")), list(tmp_path.iterdir())


def test_export_chained_without_from_keeps_the_first(stores, tmp_path, capsys):
    """SW2: a second export of the same cells into the first's file adds its keys, keeping the first's."""
    both = str(tmp_path / "both.h5ad")
    assert cli_main(["export", stores["store"], "--to", both]) == 0
    first = set(ad.read_h5ad(both).obsm)
    assert cli_main(["export", stores["other"], "--to", both, "--key-added", "second"]) == 0
    out = capsys.readouterr().out
    assert "everything in it kept" in out, out
    a = ad.read_h5ad(both)
    assert first <= set(a.obsm) and "embed_sweep" in a.uns and "embed_sweep_second" in a.uns, a


def test_an_unrelated_file_is_kept(stores, tmp_path, capsys):
    """SW1: the refused export leaves the user's file as it was."""
    mine = tmp_path / "mywork.h5ad"
    mine.write_bytes(Path(stores["mywork"]).read_bytes())
    assert cli_main(["export", stores["store"], "--to", str(mine)]) == 2
    assert ad.read_h5ad(mine).uns["precious"] == "years of notes"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ValueError", "RuntimeError"])
def test_a_failure_inside_a_task_is_one_line_with_the_tracebacks_in_the_log(
    kind, inputs, prefect_api, tmp_path, capfd, monkeypatch
):
    """Item 5: a refusal met inside a Prefect task (on a local cluster's worker) is its one line and
    the log's path; the flow and task runs' tracebacks are in the log beside the store, not on the
    terminal; the flow run still ends Failed with the reason. An unexpected error keeps its
    traceback, and the log's path is said before it."""
    from prefect import get_client

    from tests.prefect_server import pointed_at
    from tests.task_refusal import CALLS_ENV, ENV

    monkeypatch.setenv(ENV, kind)
    calls = tmp_path / "ingest_calls.txt"
    monkeypatch.setenv(CALLS_ENV, str(calls))
    spec = {"type": "local", "n_workers": 1, "preload": ["flows.tasks", "flows.errors", "tests.task_refusal"]}
    argv = fill(_run(_ds("pbmc", use_rep="X_pca")), inputs, tmp_path)
    argv += ["--cluster", json.dumps(spec), "--store", "failing"]
    log = tmp_path / "failing.log"
    with pointed_at(prefect_api):
        if kind == "ValueError":
            assert cli_main(argv) == 2
        else:
            with pytest.raises(RuntimeError, match="raised inside the ingest task"):
                cli_main(argv)
    out, err = capfd.readouterr()
    said = [line for line in err.splitlines() if line.startswith("embed-sweep:")]
    if kind == "ValueError":
        assert "Traceback" not in err, err
        line = "embed-sweep: error: ValueError raised inside the ingest task (a test)"
        assert said == [f"{line} (the tasks' tracebacks: {log})"], err
    else:
        assert said == [f"embed-sweep: the tasks' tracebacks are in {log}"], err
    text = log.read_text()
    # the task run's failure (a retried error: "Task run failed with exception ... Retries are
    # exhausted"; a refusal, not retried: its Failed state) and the raising frame itself
    refused = kind == "ValueError"
    task_failed = "Task run encountered an exception" if refused else "Task run failed with exception"
    assert task_failed in text and "Encountered exception during execution" in text
    assert "tests/task_refusal.py" in text
    # a refusal is not retried (it would say the same thing three times); another error is, twice
    assert calls.read_text().count("called") == (1 if refused else 3)
    assert f"{kind}: {kind} raised inside the ingest task" in text and "Traceback" in text
    with pointed_at(prefect_api), get_client(sync_client=True) as client:
        runs = client.read_flow_runs(limit=200)
    runs = [r for r in runs if r.parameters.get("store") == str(tmp_path / "failing.zarr")]
    assert runs and all(r.state.is_failed() for r in runs), runs
    assert any("raised inside the ingest task" in (r.state.message or "") for r in runs), runs


def test_the_run_log_takes_failures_and_leaves_the_rest_on_the_terminal(tmp_path):
    """flows.errors: a flow or task run's error (with its traceback) and failed end state go to the
    log, not the console; its other lines, a crash's lines and other loggers' records stay."""
    import logging

    from flows.errors import divert, is_failure_record, restore

    def record(name, level, msg, exc=False):
        try:
            raise ValueError("bad input")
        except ValueError:
            info = sys.exc_info() if exc else None
        r = logging.LogRecord(name, level, __file__, 1, msg, None, info)
        r.flow_run_name, r.task_run_name = "a-flow-run", "a-task-run"  # as Prefect's run loggers add
        return r

    moved = [
        record("prefect.task_runs", logging.ERROR, "Task run failed with exception", exc=True),
        record("prefect.flow_runs", logging.ERROR, "Encountered exception during execution", exc=True),
        record("prefect.flow_runs", logging.INFO, "Finished in state Failed('bad input')"),
    ]
    kept = [
        record("prefect.flow_runs", logging.INFO, "Beginning flow run 'x'"),
        record("prefect.flow_runs", logging.ERROR, "Crash detected! Execution was interrupted"),
        record("prefect.flow_runs", logging.ERROR, "Finished in state Crashed('interrupted')"),
        record("distributed.worker", logging.ERROR, "a worker's own error"),
    ]
    assert [is_failure_record(r) for r in moved + kept] == [True] * 3 + [False] * 4
    console = logging.StreamHandler(io.StringIO())
    root = logging.getLogger()
    root.addHandler(console)
    log, filters = divert(tmp_path / "run.log")
    try:
        for r in moved + kept:
            root.handle(r)
    finally:
        restore(log, filters)
        root.removeHandler(console)
    shown, text = console.stream.getvalue(), (tmp_path / "run.log").read_text()
    assert "Traceback" not in shown and "Crash detected" in shown and "Beginning flow run" in shown
    assert text.count("Traceback") == 2 and "Finished in state Failed" in text and "Crash" not in text


def test_commands_on_a_store_a_sweep_is_writing(stores, tmp_path, capsys, monkeypatch):
    """A store whose lock a live sweep holds: `show` reads it; `export` is refused naming --partial;
    a second `run --replace` is refused naming the holder, and nothing is moved aside."""
    from tests.results_store import hold_lock

    store = stores["store"]
    holder = hold_lock(store)
    try:
        rc, out, err = run_case(["show", store], capsys, monkeypatch)
        assert rc == 0 and "ppca" in out, err
        rc, out, err = run_case(["export", store, "--to", str(tmp_path / "x.h5ad")], capsys, monkeypatch)
        assert rc == 2 and f"a sweep is running on {store} (pid {holder.pid}" in err and "--partial" in err
        argv = fill(_run(_ds("pbmc", use_rep="X_pca")), stores, tmp_path)
        argv += ["--out", str(Path(store).parent), "--store", Path(store).name, "--replace"]
        rc, out, err = run_case(argv, capsys, monkeypatch)
        assert rc == 2 and "is being written by another sweep" in err and f"pid {holder.pid}" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert Path(store).exists() and not list(Path(store).parent.glob("*.replaced-*"))
    finally:
        holder.kill()
        holder.wait()
        Path(f"{store}.lock").unlink(missing_ok=True)  # the module's store, for the tests after
