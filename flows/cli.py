"""`embed-sweep` command line: run, show, report, verify, export, map, datasets."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from flows.cli_args import cluster_arg, env_defaults, json_arg, models_arg
from flows.cluster import CONNECT_TIMEOUT_S
from flows.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNWRITABLE,
    forget_log,
    written_log,
)
from flows.run import cmd_run, store_notes

#: the signals ``run`` received (``_on_interrupt``): the interrupt can surface wrapped in another
#: exception, so ``main`` asks this rather than the exception's type
_INTERRUPTED: list[int] = []


def _on_interrupt(signum, frame):
    """SIGINT and SIGTERM end the CLI alike: the flow run is marked crashed, the cluster and server
    stop; Dask's shutdown complaints (workers losing their scheduler) are not shown."""
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
    env_defaults()
    from flows.server import local_server
    from tasks.results.mapping import plan_map
    from tasks.results.selection import parse_setting

    setting = parse_setting(a.setting)
    dataset = json_arg(a.dataset, "dataset") if a.dataset.startswith("{") else a.dataset
    spec = cluster_arg(a.cluster, a.connect_timeout)
    models = models_arg(a.model) if a.model is not None else None
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
        "--extras",
        choices=("chosen", "all"),
        default="chosen",
        help="where GLLE's generations and covariance-scale study (each an eigensolve as costly as the "
        "fit's) are computed: each model's chosen setting, after the selection (default), or every point",
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
