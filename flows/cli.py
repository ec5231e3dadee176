"""`embed-sweep` command line: run, show, report, datasets."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

#: the README's main job: small real sweeps over every available model, a few minutes on 2 cores
DEFAULT_SWEEPS = [
    {
        "dataset": {"name": "swiss_roll", "n": 400, "seed": 0},
        "models": ["ppca", "lllvm", "glle", "bgplvm"],
        "grid": {"k": [8, 12], "latent_dim": [2], "seed": [0]},
        "store": "roll.zarr",
        "model_options": {"lllvm": {"max_iter": 30}, "bgplvm": {"max_iter": 300, "n_inducing": 20}},
    },
    {
        "dataset": {"name": "binary_tree", "depth": 4, "seed": 0},
        "models": ["ppca", "hgplvm"],
        "grid": {"latent_dim": [2], "kappa": [10.0, 30.0, 100.0], "seed": [0]},
        "store": "tree.zarr",
        "model_options": {"hgplvm": {"max_iter": 300}},
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
        raise SystemExit(f"--{what}: not valid JSON ({e}): {text!r}") from e


def cmd_run(a) -> int:
    _env_defaults()
    from flows.cluster import normalise_cluster, start_cluster
    from flows.server import local_server
    from flows.sweep import check_store, embed_sweep, plan_sweep
    from tasks.report import summary_table

    out = Path(a.out)
    cfg = _json_arg(a.config, "config") or {}
    if "sweeps" in cfg:  # several sweeps in one run, sharing one local cluster
        if a.dataset or a.models or a.grid or a.store:
            raise ValueError("a --config 'sweeps' list takes none of --dataset, --models, --grid, --store")
        sweeps = [_sweep_entry(sw, i) for i, sw in enumerate(cfg["sweeps"])]
    elif a.dataset or a.models or a.grid or a.config:
        sweeps = [
            {
                "dataset": _json_arg(a.dataset, "dataset")
                if a.dataset and a.dataset.startswith("{")
                else (a.dataset or cfg.get("dataset", "swiss_roll")),
                "models": a.models.split(",") if a.models else cfg.get("models", "all"),
                "grid": _json_arg(a.grid, "grid") if a.grid else cfg.get("grid"),
                "store": a.store or cfg.get("store", "sweep.zarr"),
                "model_options": _json_arg(a.options, "options") if a.options else cfg.get("model_options"),
            }
        ]
    else:
        sweeps = default_sweeps()
    cluster = _json_arg(a.cluster, "cluster") if a.cluster and a.cluster.startswith("{") else a.cluster
    if isinstance(cluster, str) and cluster.isdigit():
        cluster = {"type": "local", "n_workers": int(cluster)}
    spec = normalise_cluster(cluster)
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    stores = [str(out / sw["store"]) if not Path(sw["store"]).is_absolute() else sw["store"] for sw in sweeps]
    identities = []  # every sweep's errors before any work starts
    for sw, store in zip(sweeps, stores):
        plan = plan_sweep(sw["dataset"], sw["models"], sw["grid"], store, sw.get("model_options"), 3, "auto")
        identities.append(plan["identity"])
        if not a.replace:
            check_store(store, plan["identity"])
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(local_server(out / "prefect-server.log"))
        print(f"Prefect API: {url}")
        if spec["type"] == "local" and len(sweeps) > 1:
            # one local cluster for all the sweeps (its start and stop cost seconds per sweep); the
            # sweeps reach it by address, as they would a user's scheduler
            address, dashboard, _ = stack.enter_context(start_cluster(spec))
            print(f"Dask dashboard: {dashboard}")
            cluster = address
        for sw, store, identity in zip(sweeps, stores, identities):
            print(f"\n== sweep {sw['dataset']} -> {store}")
            if a.replace:
                _set_aside_if_different(store, identity)
            res = embed_sweep(
                dataset=sw["dataset"],
                models=sw["models"],
                grid=sw["grid"],
                store=store,
                model_options=sw.get("model_options"),
                cluster=cluster,
                report=not a.no_report,
            )
            print(summary_table(store).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
            if res.get("report"):
                print(f"report: {res['report']}")
    print(f"\nall sweeps finished in {time.perf_counter() - t0:.0f} s; results under {out}/")
    return 0


def _sweep_entry(sw, i: int) -> dict:
    """One item of a config's "sweeps" list, with the keys a sweep needs."""
    if not isinstance(sw, dict) or "dataset" not in sw:
        raise ValueError(f"--config sweeps[{i}] must be an object with at least a 'dataset'; got {sw!r}")
    unknown = set(sw) - {"dataset", "models", "grid", "store", "model_options"}
    if unknown:
        raise ValueError(f"--config sweeps[{i}] has unknown keys {sorted(unknown)}")
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
    from flows.sweep import check_store

    if not Path(store).exists():
        return
    try:
        check_store(store, identity)
    except ValueError as e:
        if "different sweep" not in str(e):
            raise
        aside = f"{store}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        Path(store).rename(aside)
        if Path(store + ".inputs").exists():
            Path(store + ".inputs").rename(aside + ".inputs")
        print(f"{store} held a different sweep; moved it to {aside}")


def cmd_show(a) -> int:
    import pandas as pd

    from tasks.report import summary_table

    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary_table(a.store).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


def cmd_report(a) -> int:
    from tasks.report import make_report

    print(make_report(a.store, a.out))
    return 0


def cmd_export(a) -> int:
    """`export STORE --to FILE.h5ad`: the chosen embeddings of a store as AnnData (tasks.results)."""
    from tasks.results import export_h5ad, parse_setting

    setting = parse_setting(a.setting)  # bad text is refused before anything is read
    adata = export_h5ad(a.store, a.to, a.model.split(",") if a.model else None, setting)
    print(f"wrote {a.to}: {adata.n_obs} points, obsm {sorted(adata.obsm)}")
    for key, info in adata.uns["embed_sweep"]["models"].items():
        print(
            f"  X_{key}: "
            + (f"{info['setting']} (chosen by {info['criterion']})" if "setting" in info else info["status"])
        )
    return 0


def cmd_datasets(a) -> int:
    from lvmcore.data import list_datasets

    for name, desc in list_datasets().items():
        print(f"{name:18s} {desc}")
    print("files: .npy, .csv (label_column=...), .zarr (from ingest), .h5ad (with anndata)")
    return 0


def _add_export_parser(sub) -> None:
    e = sub.add_parser("export", help="chosen embeddings of a result store as an AnnData .h5ad file")
    e.add_argument("store")
    e.add_argument("--to", required=True, help="output file, FILE.h5ad")
    e.add_argument("--model", help="comma-separated model keys (default every model in the store)")
    e.add_argument(
        "--setting",
        help="named setting, e.g. k=8,latent_dim=2,seed=0 (dimensions a model does not sweep are "
        "ignored for it; what is left open is chosen by the model's criterion)",
    )
    e.set_defaults(fn=cmd_export)


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
    r.add_argument("--out", default="results", help="output folder (default results/)")
    r.add_argument("--no-report", action="store_true")
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
    _add_export_parser(sub)
    d = sub.add_parser("datasets", help="what can be loaded")
    d.set_defaults(fn=cmd_datasets)
    a = p.parse_args(argv)
    try:
        return a.fn(a)
    except ValueError as e:
        print(f"embed-sweep: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
