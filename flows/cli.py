"""`embed-sweep` command line: run, show, report, verify, export, map, datasets."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from flows.cluster import CONNECT_TIMEOUT_S
from flows.errors import forget_log, written_log

#: the README's main job: small real sweeps over every available model, a few minutes on 2 cores
DEFAULT_SWEEPS = [
    {
        "dataset": {"name": "swiss_roll", "n": 400, "seed": 0},
        "models": ["ppca", "lllvm", "glle", "bgplvm"],
        # k = 5 .. 12: the roll's kNN graph jumps between turns from k = 8 on (7 such edges at
        # k = 8, 47 at k = 12), so the grid spans graphs with and without short circuits
        "grid": {"k": [5, 6, 8, 10, 12], "latent_dim": [2], "seed": [0]},
        "store": "roll.zarr",
        "model_options": {"lllvm": {"max_iter": 30}, "bgplvm": {"max_iter": 300, "n_inducing": 20}},
    },
    {
        "dataset": {"name": "binary_tree", "depth": 4, "seed": 0},
        "models": ["ppca", "hgplvm"],
        "grid": {"latent_dim": [2], "kappa": [10.0, 30.0, 100.0], "seed": [0]},
        "store": "tree.zarr",
        # the constructors' budgets: every hGP-LVM fit here stops by its convergence rule (~70 s
        # for the nine; at 300 iterations none had converged)
    },
    {
        "dataset": {"name": "digits", "classes": 5, "n_per_class": 60, "seed": 0},
        "models": ["ppca", "lllvm", "glle", "bgplvm"],
        "grid": {"k": [10], "latent_dim": [2], "seed": [0]},
        "store": "digits.zarr",
        "model_options": {"lllvm": {"max_iter": 20}, "bgplvm": {"max_iter": 300, "n_inducing": 20}},
    },
    {
        "dataset": {"name": "mrd_toy", "n": 100, "seed": 0},
        "models": ["mrd"],
        "grid": {"latent_dim": [8], "seed": [0]},
        "store": "mrd_toy.zarr",
        "model_options": {"mrd": {"kernel": "linear", "max_iter": 1000}},
    },
]


def default_sweeps() -> list[dict]:
    """The built-in sweeps restricted to the model families this installation has."""
    from tasks.registry import available_families

    out = []
    for sw in DEFAULT_SWEEPS:
        fams = available_families(sw["models"])
        if fams:
            opts = {k: v for k, v in sw.get("model_options", {}).items() if k in fams}
            out.append(dict(sw, models=fams, model_options=opts))
    return out


def _env_defaults():
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL", "INFO")


def _json_arg(text, what):
    if text is None:
        return None
    p = Path(text)
    try:
        return json.loads(p.read_text() if p.suffix == ".json" and p.exists() else text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--{what}: not valid JSON ({e}): {text!r}") from e


#: exit codes: every grid point done; refused input (before any work) or a damaged store; some grid
#: point failed; the store cannot be written (a full disk, an unwritable chunk: a re-run resumes);
#: interrupted (SIGINT / SIGTERM)
EXIT_OK, EXIT_REFUSED, EXIT_POINTS_FAILED, EXIT_UNWRITABLE, EXIT_INTERRUPTED = 0, 2, 3, 4, 130


#: the keys of one sweep in a --config file (the file itself, or each item of its "sweeps" list)
SWEEP_KEYS = ("dataset", "models", "grid", "store", "model_options")


def _sweeps_from_args(a) -> list[dict]:
    """The sweeps a `run` command asks for, from --config / --dataset / --models / --grid / --options."""
    from lvmcore.checks import check_options

    cfg = _json_arg(a.config, "config") or {}
    if not isinstance(cfg, dict):
        raise ValueError(f"--config must hold a JSON object, got {cfg!r}")
    if "sweeps" in cfg:  # several sweeps in one run, sharing one local cluster
        check_options(cfg, ["sweeps"], "--config")
        if a.dataset or a.models or a.grid or a.store:
            raise ValueError("a --config 'sweeps' list takes none of --dataset, --models, --grid, --store")
        if not isinstance(cfg["sweeps"], list):
            raise ValueError(f"--config 'sweeps' must be a list of sweeps, got {cfg['sweeps']!r}")
        return [_sweep_entry(sw, i) for i, sw in enumerate(cfg["sweeps"])]
    check_options(cfg, SWEEP_KEYS, "--config")  # a typo ("model") is refused, not ignored
    if a.dataset or a.models or a.grid or a.config or a.options:
        grid = _json_arg(a.grid, "grid") if a.grid is not None else cfg.get("grid")
        if a.grid is not None and not isinstance(grid, dict):
            raise ValueError(
                f'--grid must be a JSON object like \'{{"k": [8, 12], "latent_dim": [2], "seed": [0]}}\', '
                f"got {a.grid!r}; leave --grid out for the built-in grid"
            )
        options = _json_arg(a.options, "options") if a.options is not None else cfg.get("model_options")
        if options is not None and not isinstance(options, dict):
            raise ValueError(
                f"--options must be a JSON object {{model: {{option: value}}}}, got {a.options!r}"
            )
        return [
            {
                "dataset": _json_arg(a.dataset, "dataset")
                if a.dataset and a.dataset.startswith("{")
                else (a.dataset or cfg.get("dataset", "swiss_roll")),
                "models": _models_arg(a.models) if a.models is not None else cfg.get("models", "all"),
                "grid": grid,
                "store": a.store or cfg.get("store", "sweep.zarr"),
                "model_options": options,
            }
        ]
    return default_sweeps()


def _models_arg(text: str) -> list[str]:
    """--models: comma-separated families or keys; an empty list is refused, never read as all."""
    models = [m.strip() for m in text.split(",") if m.strip()]
    if not models:
        raise ValueError(
            f"no models given (--models {text!r}); name families or keys, e.g. --models ppca,glle, or "
            "leave --models out for every model"
        )
    return models


def _cluster_arg(text: str | None, connect_timeout: float):
    """--cluster: a worker count, a scheduler's address or a JSON spec, as a normalised spec; an
    address gets ``connect_timeout`` (--connect-timeout) unless its spec sets one."""
    from flows.cluster import normalise_cluster

    cluster = text
    if text is not None and text.startswith("{"):
        cluster = _json_arg(text, "cluster")
    elif text is not None:
        try:
            n = int(text)
        except ValueError:
            pass
        else:
            if n < 1:
                raise ValueError(f"--cluster: the worker count must be positive, got {n}")
            cluster = {"type": "local", "n_workers": n}
    spec = normalise_cluster(cluster)
    if spec["type"] == "address":
        spec.setdefault("connect_timeout", connect_timeout)
        spec = normalise_cluster(spec)  # the timeout checked
    return spec


def unused_dimensions(grid: dict | None, specs) -> list[str]:
    """The dimensions of a user's grid that none of the sweep's models has (kappa without hGP-LVM)."""
    return [d for d in grid or {} if not any(d in s.dims for s in specs)]


class _NoteFormat(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        kind = "note" if record.levelno < logging.WARNING else record.levelname.lower()
        return f"{kind}: {record.getMessage()}"


@contextlib.contextmanager
def _data_notes():
    """The data code's log lines while the sweeps are planned (the genes a PCA uses, cells without
    a label, a dropped index column), printed as the plan's lines: the root logger's level
    (warnings) hid them. Not passed on to the root logger's handlers meanwhile (no line twice)."""
    log = logging.getLogger("lvmcore.data")
    handler, level, propagate = logging.StreamHandler(sys.stdout), log.level, log.propagate
    handler.setFormatter(_NoteFormat())
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


def _plan_all(
    sweeps, stores, replace: bool, cluster=None, max_point_hours=None, refit_models: bool = False
) -> list[dict]:
    """Every sweep's refusals before any server or cluster starts: models, options, grid, data,
    each grid point's predicted cost on ``cluster`` (tasks.costs), an existing store's identity, a
    writable location. Returns each sweep's plan (a dict, handed to the flow: the data is loaded
    and the options checked once per run)."""
    from tasks.costs import check_plan  # imported here, as the plan: the CLI starts without them
    from tasks.sweep_plan import check_store, check_writable, plan_sweep

    if len(set(stores)) != len(stores):
        raise ValueError(f"two sweeps write the same store: {stores}; give each its own 'store'")
    plans = []
    for sw, store in zip(sweeps, stores):
        with _data_notes():
            plan = plan_sweep(
                sw["dataset"], sw["models"], sw["grid"], store, sw.get("model_options"), 3, "auto"
            )
        n, d = plan.size
        print(f"data {plan.dataset[0]}: {n} rows x {d} columns -> {store}")
        for dim in unused_dimensions(sw["grid"], plan.specs):
            print(
                f"note: grid dimension {dim!r} is used by none of the models "
                f"{', '.join(s.key for s in plan.specs)}; it is ignored"
            )
        check_plan(plan, cluster or {"type": "local"}, max_point_hours)
        plans.append(plan.to_dict())
        if not replace:
            check_store(store, plan.identity, refit_models=refit_models)
        check_writable(store)
    return plans


#: the signals ``run`` received (``_on_interrupt``): the interrupt can surface wrapped in another
#: exception, so ``main`` asks this rather than the exception's type
_INTERRUPTED: list[int] = []


def _on_interrupt(signum, frame):
    """SIGINT and SIGTERM end the CLI alike: the flow run is marked crashed, the cluster and server
    stop; Dask's shutdown complaints (workers losing their scheduler) are not shown."""
    import logging

    _INTERRUPTED.append(signum)
    for name in ("distributed", "tornado", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    raise KeyboardInterrupt


def _was_terminated(e: BaseException) -> bool:
    """Whether ``e`` is, wraps or names Prefect's TerminationSignal: during a flow run Prefect puts
    its own SIGTERM handler in place, which raises it; raised inside pydantic's serialiser it comes
    out as a PydanticSerializationError (a ValueError) whose message names it, and Prefect's catch
    that would pass the signal on to ``_on_interrupt`` does not see it."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__name__ == "TerminationSignal" or "TerminationSignal" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def cmd_run(a) -> int:
    _env_defaults()
    from flows.cluster import check_scheduler, start_cluster
    from flows.errors import failures_to_log, run_log_path
    from flows.server import local_server
    from flows.sweep import embed_sweep, mark_stale, outcome
    from tasks.report import summary_table
    from tasks.store import failure_summary, store_lock, store_path

    out = Path(a.out)
    sweeps = _sweeps_from_args(a)
    spec = cluster = _cluster_arg(a.cluster, a.connect_timeout)
    if spec["type"] == "local":
        # worker processes report only errors: an interrupted run's workers otherwise print the
        # tracebacks of heartbeats to a scheduler that has already stopped
        spec.setdefault("silence_logs", logging.ERROR)
    t0 = time.perf_counter()
    stores = [
        str(store_path(out / sw["store"] if not Path(sw["store"]).is_absolute() else sw["store"]))
        for sw in sweeps
    ]
    # every sweep's errors (and points its cluster cannot run) before any work starts
    plans = _plan_all(sweeps, stores, a.replace, spec, a.max_point_hours, a.refit_models)
    if spec["type"] == "address":  # an unreachable scheduler refused before any store or server
        check_scheduler(spec["address"], spec["connect_timeout"])
    failed = {}
    with contextlib.ExitStack() as stack:
        stale = []  # holders of stale locks taken over: their flow runs are marked crashed below
        for store in stores:  # held from here to the end: a second run on a store is refused now
            stale += stack.enter_context(store_lock(store))
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(
                f"cannot create the output folder {out} ({e.strerror}); choose another --out"
            ) from e
        url = stack.enter_context(local_server(out / "prefect-server.log"))
        print(f"Prefect API: {url}")
        # the flow and task runs' failure tracebacks to a log beside the store, not the terminal
        stack.enter_context(failures_to_log(run_log_path(stores, out)))
        mark_stale(stale)
        if spec["type"] == "local" and len(sweeps) > 1:
            # one local cluster for all the sweeps (its start and stop cost seconds per sweep); the
            # sweeps reach it by address, as they would a user's scheduler
            address, dashboard, _ = stack.enter_context(start_cluster(spec))
            print(f"Dask dashboard: {dashboard}")
            cluster = address
        for sw, store, plan in zip(sweeps, stores, plans):
            print(f"\n== sweep {sw['dataset']} -> {store}")
            if a.replace:
                _set_aside_if_different(store, plan["identity"])
            state = embed_sweep(
                dataset=sw["dataset"],
                models=sw["models"],
                grid=sw["grid"],
                store=store,
                model_options=sw.get("model_options"),
                cluster=cluster,
                report=not a.no_report,
                retry_failed=a.retry_failed,
                plan=plan,
                max_point_hours=a.max_point_hours,
                keep_models=a.keep_models,
                refit_models=a.refit_models,
                return_state=True,
            )
            res = outcome(state)  # a run with failed points ends Failed in Prefect; its counts are here
            print(summary_table(store).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
            for note in store_notes(store):
                print(f"note: {note}")
            if res.get("report"):
                print(f"report: {res['report']}")
            if res.get("failed") or res.get("failed_before"):
                failed[store] = res["failed"] + res.get("failed_before", 0)
    print(f"\nall sweeps finished in {time.perf_counter() - t0:.0f} s; results under {out}/")
    if failed:
        print(f"\n{sum(failed.values())} grid point(s) failed:", file=sys.stderr)
        for store in failed:
            print(f"{store}:", file=sys.stderr)
            print("\n".join(failure_summary(store)), file=sys.stderr)
        print("re-run the same command with --retry-failed to run the failed points again", file=sys.stderr)
        return EXIT_POINTS_FAILED
    return EXIT_OK


def _sweep_entry(sw, i: int) -> dict:
    """One item of a config's "sweeps" list, with the keys a sweep needs."""
    if not isinstance(sw, dict) or "dataset" not in sw:
        raise ValueError(f"--config sweeps[{i}] must be an object with at least a 'dataset'; got {sw!r}")
    from lvmcore.checks import check_options

    check_options(sw, SWEEP_KEYS, f"--config sweeps[{i}]")
    return {
        "dataset": sw["dataset"],
        "models": sw.get("models", "all"),
        "grid": sw.get("grid"),
        "store": sw.get("store", f"sweep{i}.zarr"),
        "model_options": sw.get("model_options"),
    }


def _set_aside_if_different(store: str, identity: dict) -> None:
    """--replace: a store holding a different sweep (not ``identity``) is renamed aside (never
    deleted)."""
    from tasks.store import inputs_dir
    from tasks.sweep_plan import check_store  # imported here: the CLI starts without the pipeline

    if not Path(store).exists():
        return
    try:
        check_store(store, identity)
    except ValueError as e:  # a different sweep, or not a finished store at all (an interrupted set-up)
        aside = f"{store}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        Path(store).rename(aside)
        if inputs_dir(store).exists():
            inputs_dir(store).rename(str(inputs_dir(store)) + f".replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        print(f"{store}: {str(e).split(';')[0]}; moved it to {aside}")


def cmd_show(a) -> int:
    import pandas as pd

    from tasks.report import summary_table
    from tasks.store.integrity import existing_store

    existing_store(a.store)  # a file, or a folder that is not a store: one line
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary_table(a.store).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for note in store_notes(a.store):
        print(f"note: {note}")
    return 0


def store_notes(store) -> list[str]:
    """What the sweep said once about its evaluation (unlabelled points, a metric it cannot compute)."""
    import zarr

    from tasks.store import store_path

    return json.loads(zarr.open_group(str(store_path(store)), mode="r").attrs.get("evaluation_notes", "[]"))


def cmd_verify(a) -> int:
    """`verify STORE`: its metadata, and every finished grid point's chunks present, readable (their
    crc32c checksums hold, in a store that has them) and its embedding finite."""
    from tasks.store.integrity import (
        POINTS_FIX,
        checksum_coverage,
        describe_damage,
        existing_store,
        open_results,
        verify_points,
    )

    path = existing_store(a.store)  # a missing path, a file, a folder that is not a store: refused
    open_results(path, check=False)  # not a result store, damaged metadata: refused
    bad = verify_points(path)
    if bad:
        print(f"embed-sweep: error: {describe_damage(path, bad, len(bad))}; {POINTS_FIX}", file=sys.stderr)
        return EXIT_REFUSED
    import zarr

    root = zarr.open_group(str(path), mode="r")
    n = sum(int((root[k]["status"][...] == 1).sum()) for k in root.group_keys())
    have, arrays = checksum_coverage(path)
    if have == arrays:
        sums = "their crc32c checksums hold"
    elif have == 0:
        sums = "no checksums: written before embed-sweep stored them, so a changed byte is found only where "
        sums += "it leaves a chunk unreadable or a value non-finite"
    else:
        sums = f"the crc32c checksums of the {have} of {arrays} arrays that have them hold"
    print(f"{path}: sound ({n} finished grid points: chunks present and readable, embeddings finite; {sums})")
    return EXIT_OK


def cmd_report(a) -> int:
    from tasks.report import make_report
    from tasks.store.integrity import existing_store

    existing_store(a.store)  # refused before the report's folder is made
    print(make_report(a.store, a.out))
    return 0


def cmd_export(a) -> int:
    """`export STORE --to FILE`: the chosen embeddings of a store in an AnnData .h5ad file, or for
    data from the user's own .h5ad / .h5mu file, in a copy of that file (tasks.results.export); an
    existing --to only where it is an earlier export of the same data (the keys added to it), or
    with --replace-file (moved aside)."""
    from tasks.results.export import describe_keys, export
    from tasks.results.selection import parse_setting

    setting = parse_setting(a.setting)  # bad text is refused before anything is read
    res = export(
        a.store,
        a.to,
        a.model.split(",") if a.model else None,
        setting,
        source=a.source,
        partial=a.partial,
        key_added=a.key_added,
        overwrite=a.overwrite,
        replace_file=a.replace_file,
    )
    if res["partial"]:
        print(res["partial"])
    if res["moved_aside"]:
        print(f"moved the file that was at {a.to} aside to {res['moved_aside']} (--replace-file)")
    if res["into"] or res["earlier"]:
        if res["earlier"]:
            said = [f"added to {a.to}, an earlier export of the same data ({res['n_obs']} cells)"]
        else:
            said = [f"wrote {a.to}: a copy of {res['into']} ({res['n_obs']} cells)"]
        added, replaced = describe_keys(res["added"]), describe_keys(res["replaced"])
        if added:
            said.append(f"added {added}")
        if replaced:
            said.append(f"replaced (--overwrite) {replaced}, everything else in it kept")
        else:
            said.append("everything in it kept")
        print("; ".join(said))
        if res["cells_without"]:
            print(
                f"  {res['cells_without']} cells of it were not in every modality the sweep joined: "
                "their embedding rows are NaN"
            )
    else:
        print(f"wrote {a.to}: {res['n_obs']} points, obsm {res['obsm']} and uns ['{res['uns_key']}']")
    for key, info in res["models"].items():
        print(
            f"  {info.get('obsm_key', key)}: "
            + (f"{info['setting']} (chosen by {info['criterion']})" if "setting" in info else info["status"])
        )
    return 0


def cmd_datasets(a) -> int:
    from lvmcore.data import list_datasets

    for name, desc in list_datasets().items():
        print(f"{name:18s} {desc}")
    print(
        "files: .npy, .csv (label_column=...), .zarr (from ingest), .h5ad (use_rep, layer, label_column, "
        'color_column, preprocess, max_features), .h5mu (modalities, view), {"views": [files]}; '
        "README 'Your own data'"
    )
    return 0


def _add_export_parser(sub) -> None:
    e = sub.add_parser(
        "export",
        help="chosen embeddings of a result store as AnnData (.h5ad / .h5mu data: in a copy of the file)",
    )
    e.add_argument("store")
    e.add_argument(
        "--to",
        required=True,
        help="output file: FILE.h5ad, or FILE.h5mu for data from a .h5mu file (a copy of it with the "
        "embeddings added)",
    )
    e.add_argument("--model", help="comma-separated model keys (default every model in the store)")
    e.add_argument(
        "--setting",
        help="named setting, e.g. k=8,latent_dim=2,seed=0 (dimensions a model does not sweep are "
        "ignored for it; what is left open is chosen by the model's criterion)",
    )
    e.add_argument(
        "--from",
        dest="source",
        metavar="FILE",
        help="the .h5ad / .h5mu file to copy when the one the sweep read has moved or changed (its "
        "cells must be the sweep's)",
    )
    e.add_argument(
        "--partial",
        action="store_true",
        help="export a store that a sweep is still writing or that has pending grid points (the best "
        "of the points finished so far)",
    )
    e.add_argument(
        "--key-added",
        metavar="NAME",
        help="name this export's keys obsm['X_<model>_NAME'], obsm['X_<model>_NAME_var'] and "
        "uns['embed_sweep_NAME'] (scanpy's key_added), beside keys the file already has",
    )
    e.add_argument(
        "--overwrite",
        action="store_true",
        help="replace keys of the file that the export writes (without it, a file that already has "
        "one is refused)",
    )
    e.add_argument(
        "--replace-file",
        action="store_true",
        help="where --to names an existing file that is not an earlier export of the same data, move it "
        "aside (renamed, never deleted; the name is printed) and write the export in its place",
    )
    e.set_defaults(fn=cmd_export)


def cmd_map(a) -> int:
    """`map STORE --dataset SPEC --to OUT`: new cells onto the store's fitted models (flows.map), in a
    copy of the query file; every refusal (tasks.results.mapping.plan_map) before any server starts."""
    _env_defaults()
    from flows.server import local_server
    from tasks.results.mapping import plan_map
    from tasks.results.selection import parse_setting

    setting = parse_setting(a.setting)
    dataset = _json_arg(a.dataset, "dataset") if a.dataset.startswith("{") else a.dataset
    spec = _cluster_arg(a.cluster, a.connect_timeout)
    models = _models_arg(a.model) if a.model is not None else None
    args = dict(models=models, setting=setting, predict=a.predict, fill_missing=a.fill_missing)
    flags = dict(overwrite=a.overwrite, replace_file=a.replace_file)
    plan = plan_map(a.store, dataset, a.to, **args, **flags)
    print(f"query {plan['query'].get('path')}: mapping onto {', '.join(plan['models'])} of {plan['store']}")
    out = Path(a.to).resolve().parent
    out.mkdir(parents=True, exist_ok=True)
    from flows.map import embed_sweep_map  # Prefect's import (seconds): after every refusal

    with local_server(out / "prefect-server.log") as url:
        print(f"Prefect API: {url}")
        res = embed_sweep_map(a.store, dataset, a.to, **args, cluster=spec, **flags)
    for view, (dropped, filled) in res["genes"].items():
        print(
            f"  {view}: {dropped} query genes not in the reference dropped, "
            f"{filled} reference genes filled with zeros"
        )
    print(
        f"wrote {res['path']}: a copy of the query ({res['n_obs']} cells) with "
        + ", ".join(f"X_{m} ({s})" for m, s in res["models"].items())
        + (f"; labels {res['labels']}" if res["labels"] else "")
    )
    if res["moved_aside"]:
        print(f"moved the file that was at {a.to} aside to {res['moved_aside']} (--replace-file)")
    return EXIT_OK


def _add_map_parser(sub) -> None:
    m = sub.add_parser(
        "map", help="map new cells onto a finished sweep's fitted models (a copy of the query)"
    )
    m.add_argument("store")
    m.add_argument("--dataset", required=True, help="the query: a path or JSON, with run's data options")
    m.add_argument("--to", required=True, help="output file (.h5ad / .h5mu as the query): a copy of it")
    m.add_argument("--model", help="comma-separated model keys (default every model in the store)")
    m.add_argument("--setting", help="named setting, e.g. k=8,latent_dim=2,seed=0 (default: the chosen one)")
    m.add_argument("--predict", metavar="MODALITY", help="predict this modality the query lacks (MRD)")
    m.add_argument(
        "--fill-missing", choices=["zeros"], help="fill reference genes the query lacks with zeros"
    )
    m.add_argument("--cluster", help="number of local workers, tcp://scheduler:8786, or a JSON spec")
    m.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT_S, metavar="SECONDS")
    m.add_argument("--overwrite", action="store_true", help="replace keys of the query file the map writes")
    m.add_argument("--replace-file", action="store_true", help="move an existing --to aside (never deleted)")
    m.set_defaults(fn=cmd_map)


def _log_note() -> str:
    """Where the tasks' tracebacks of a failure went, if any did (flows.errors)."""
    log = written_log()
    return f" (the tasks' tracebacks: {log})" if log else ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="embed-sweep", description="Sweeps of probabilistic manifold-learning models"
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a sweep (default: the built-in demo sweeps over every model)")
    r.add_argument("--dataset", help='name, path, or JSON like \'{"name": "swiss_roll", "n": 1000}\'')
    r.add_argument("--models", help="comma-separated families or keys (default all)")
    r.add_argument("--grid", help='JSON, e.g. \'{"k": [8, 10], "latent_dim": [2], "seed": [0, 1]}\'')
    r.add_argument("--options", help="JSON {model: {option: value}}")
    r.add_argument(
        "--config",
        help='JSON file with dataset, models, grid, store, model_options, or {"sweeps": [{...}, ...]} '
        "for several sweeps on one local cluster",
    )
    r.add_argument("--store", help="result store name under --out (default sweep.zarr)")
    r.add_argument("--cluster", help="number of local workers, tcp://scheduler:8786, or a JSON spec")
    r.add_argument(
        "--connect-timeout",
        type=float,
        default=CONNECT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long to wait for the scheduler of --cluster tcp://... to answer (default "
        f"{CONNECT_TIMEOUT_S:g}); not the wait for Slurm or Kubernetes workers to start",
    )
    r.add_argument("--out", default="results", help="output folder (default results/)")
    r.add_argument("--no-report", action="store_true")
    r.add_argument(
        "--retry-failed", action="store_true", help="run the grid points that failed in an earlier run again"
    )
    r.add_argument(
        "--keep-models",
        choices=("all", "chosen"),
        default="all",
        help="the fitted models the store keeps: every finished point's (default), or only each model's "
        "chosen setting's (the others removed after the sweep: less space)",
    )
    r.add_argument(
        "--refit-models",
        action="store_true",
        help="fit the finished points of a store written before models were kept again and keep their "
        "models (the stored numbers unchanged); says if an embedding moved by more than 1e-8",
    )
    r.add_argument(
        "--max-point-hours",
        type=float,
        default=None,
        help="refuse a sweep with a grid point predicted to run longer (default 24; tasks/costs/plan.py)",
    )
    r.add_argument(
        "--replace",
        action="store_true",
        help="if a store holds a different sweep, move it aside (renamed, not deleted) and start fresh",
    )
    r.set_defaults(fn=cmd_run)
    s = sub.add_parser("show", help="summary table of a result store")
    s.add_argument("store")
    s.set_defaults(fn=cmd_show)
    rp = sub.add_parser("report", help="PNG figures and an HTML page for a result store")
    rp.add_argument("store")
    rp.add_argument("--out", help="folder (default beside the store)")
    rp.set_defaults(fn=cmd_report)
    v = sub.add_parser("verify", help="check a store: every finished point's files present, values finite")
    v.add_argument("store")
    v.set_defaults(fn=cmd_verify)
    _add_export_parser(sub)
    _add_map_parser(sub)
    d = sub.add_parser("datasets", help="what can be loaded")
    d.set_defaults(fn=cmd_datasets)
    a = p.parse_args(argv)
    from tasks.store import StoreWriteError

    _INTERRUPTED.clear()
    forget_log()
    if a.cmd == "run":
        old = {sig: signal.signal(sig, _on_interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    else:
        old = {}
    try:
        try:
            return a.fn(a)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            # a KeyboardInterrupt raised inside library code can come out as another exception
            # (pydantic wraps one raised in its serialiser in a PydanticSerializationError, a
            # ValueError, which read as a refusal: exit 2 instead of 130); SIGTERM during a flow
            # run can come out as Prefect's TerminationSignal, itself or so wrapped
            if a.cmd == "run" and not _INTERRUPTED and _was_terminated(e):
                _INTERRUPTED.append(signal.SIGTERM)
            if _INTERRUPTED:
                raise KeyboardInterrupt from None
            if not isinstance(e, (ValueError, StoreWriteError)) and written_log():
                # an unexpected error: its traceback follows, the tasks' are in the log
                print(f"embed-sweep: the tasks' tracebacks are in {written_log()}", file=sys.stderr)
            raise
    except ValueError as e:  # a refusal, also one reached inside a task: its one line
        print(f"embed-sweep: error: {e}{_log_note()}", file=sys.stderr)
        return EXIT_REFUSED
    except StoreWriteError as e:  # one line: what, where, the free space, and that a re-run resumes
        print(f"embed-sweep: error: {e}{_log_note()}", file=sys.stderr)
        return EXIT_UNWRITABLE
    except KeyboardInterrupt:
        print(
            "embed-sweep: interrupted; finished grid points are kept in the store, run the same command "
            "again to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
