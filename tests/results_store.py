"""Small real result stores for the export and report tests, written by the sweep's own steps
(plan, ingest, kNN graph, store template, fit + evaluate + write per grid point) called in
process: the flow around them is tested in test_pipeline and test_artifacts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tasks.ingest import ingest_dataset
from tasks.knn import build_graph
from tasks.point import run_point
from tasks.registry import grid_points, model_grid
from tasks.store import prepare_store
from tasks.sweep_plan import input_paths, plan_sweep


def build_store(store: Path, dataset, models, grid, options=None, n_generations: int = 2) -> Path:
    """Run every grid point of a sweep into ``store`` (no Prefect server, no cluster)."""
    plan = plan_sweep(dataset, models, grid, str(store), options, n_generations, "exact")
    data_path, graph_path = input_paths(str(store))
    Path(data_path).parent.mkdir(parents=True, exist_ok=True)
    src, opts = plan.dataset
    ingest_dataset({"name": src, **opts}, data_path)
    ks = [max(model_grid(s, plan.grid)["k"]) for s in plan.specs if "k" in s.dims]
    graph = build_graph(data_path, max(ks), graph_path) if ks else None
    attrs = {"dataset": str(plan.dataset), **{f"data_{k}": v for k, v in plan.provenance.items()}}
    layout = plan.store_layout()
    prepare_store(str(store), plan.identity, plan.specs, plan.grid, layout, attrs)
    for s in plan.specs:
        opts = {**plan.options.get(s.family, {}), **plan.options.get(s.key, {})}
        for idx, point in grid_points(s, plan.grid):
            run_point(s.key, opts, data_path, graph, idx, point, str(store), layout)
    return store


def hold_lock(store) -> subprocess.Popen:
    """A live process holding the store's lock as a running sweep does (tasks.store.store_lock);
    the caller kills it."""
    code = (
        "import sys, time; from tasks.store import store_lock\n"
        "with store_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)\n"
    )
    root = Path(__file__).resolve().parents[1]
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(store)], cwd=root, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "held"
    return p
