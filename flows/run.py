"""`embed-sweep run`: the sweeps a command asks for (--config, --dataset, --models, --grid, or the
built-in demo sweeps), every refusal before any server or cluster starts (plan_all), then the sweeps
on one Prefect server, their failures' tracebacks in a log beside the store (flows.errors)."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from pathlib import Path

from flows.cli_args import cluster_arg, env_defaults, json_arg, models_arg
from flows.cluster import check_scheduler, start_cluster
from flows.errors import EXIT_OK, EXIT_POINTS_FAILED, failures_to_log, run_log_path
from flows.server import local_server
from lvmcore.checks import check_options
from tasks.registry import available_families

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
    out = []
    for sw in DEFAULT_SWEEPS:
        fams = available_families(sw["models"])
        if fams:
            opts = {k: v for k, v in sw.get("model_options", {}).items() if k in fams}
            out.append(dict(sw, models=fams, model_options=opts))
    return out


#: the keys of one sweep in a --config file (the file itself, or each item of its "sweeps" list)
SWEEP_KEYS = ("dataset", "models", "grid", "store", "model_options")


def sweeps_from_args(a) -> list[dict]:
    """The sweeps a `run` command asks for, from --config / --dataset / --models / --grid / --options."""
    cfg = json_arg(a.config, "config") or {}
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
        grid = json_arg(a.grid, "grid") if a.grid is not None else cfg.get("grid")
        if a.grid is not None and not isinstance(grid, dict):
            raise ValueError(
                f'--grid must be a JSON object like \'{{"k": [8, 12], "latent_dim": [2], "seed": [0]}}\', '
                f"got {a.grid!r}; leave --grid out for the built-in grid"
            )
        options = json_arg(a.options, "options") if a.options is not None else cfg.get("model_options")
        if options is not None and not isinstance(options, dict):
            raise ValueError(
                f"--options must be a JSON object {{model: {{option: value}}}}, got {a.options!r}"
            )
        return [
            {
                "dataset": json_arg(a.dataset, "dataset")
                if a.dataset and a.dataset.startswith("{")
                else (a.dataset or cfg.get("dataset", "swiss_roll")),
                "models": models_arg(a.models) if a.models is not None else cfg.get("models", "all"),
                "grid": grid,
                "store": a.store or cfg.get("store", "sweep.zarr"),
                "model_options": options,
            }
        ]
    return default_sweeps()


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


def plan_all(
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


def cmd_run(a) -> int:
    env_defaults()
    # Prefect, the flows and the store (seconds to import): after every refusal of the arguments
    from flows.sweep import embed_sweep, mark_stale, outcome
    from tasks.report import summary_table
    from tasks.store import failure_summary, store_lock, store_path

    out = Path(a.out)
    sweeps = sweeps_from_args(a)
    spec = cluster = cluster_arg(a.cluster, a.connect_timeout)
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
    plans = plan_all(sweeps, stores, a.replace, spec, a.max_point_hours, a.refit_models)
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
                extras=a.extras,
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


def store_notes(store) -> list[str]:
    """What the sweep said once about its evaluation (unlabelled points, a metric it cannot compute)."""
    import zarr

    from tasks.store import store_path

    return json.loads(zarr.open_group(str(store_path(store)), mode="r").attrs.get("evaluation_notes", "[]"))
