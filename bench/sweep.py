"""Sweep overhead and speed-up: a 48-point grid on a 1,000-point Swiss roll, run

  (a) as plain function calls in a loop in one process (fit + evaluate per grid point: the anchor),
  (b) through the embed-sweep flow on a 2-process LocalCluster (ingest, kNN, fit, evaluate,
      region writes to the zarr store, Prefect task states through a real local API server).

Prints the overhead per grid point, (2 * T_flow - T_loop) / 48 worker-seconds, and the speed-up
T_loop / T_flow. Targets: overhead < 0.5 s per grid point, speed-up >= 1.6x on 2 cores.

    .venv/bin/python bench/sweep.py [--model glle_em] [--n 1000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

for _k, _v in {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "PREFECT_LOGGING_LEVEL": "WARNING",
}.items():
    os.environ.setdefault(_k, _v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="glle_em")
    ap.add_argument("--n", type=int, default=1000)
    a = ap.parse_args()

    from flows.server import local_server
    from flows.sweep import embed_sweep, input_paths
    from tasks.evaluate import evaluate_point
    from tasks.fit import fit_point
    from tasks.ingest import ingest_dataset
    from tasks.knn import build_graph
    from tasks.registry import MODELS, grid_points

    spec = MODELS[a.model]
    if "k" in spec.dims:
        grid = {"k": [6, 7, 8, 9, 10, 12], "latent_dim": [1, 2], "seed": [0, 1, 2, 3]}
    elif "kappa" in spec.dims:
        grid = {"kappa": [10.0, 30.0, 100.0], "latent_dim": [1, 2], "seed": list(range(8))}
    else:
        grid = {"latent_dim": [1, 2], "seed": list(range(24))}
    dataset = {"name": "swiss_roll", "n": a.n, "seed": 0}
    points = list(grid_points(spec, grid))
    assert len(points) == 48, len(points)
    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))

    # (a) the anchor: plain calls in one process
    data_path, graph_path = input_paths(str(tmp / "loop.zarr"))
    Path(data_path).parent.mkdir(parents=True)
    t0 = time.perf_counter()
    ingest_dataset(dataset, data_path)
    gp = build_graph(data_path, max(grid.get("k", [0])), graph_path) if "k" in spec.dims else None
    failed = 0
    for idx, point in points:
        r = evaluate_point(fit_point(a.model, {}, data_path, gp, idx, point), data_path)
        failed += r.status != "done"
    t_loop = time.perf_counter() - t0

    # (b) the flow on a 2-process LocalCluster
    with local_server(tmp / "server.log"):
        embed_sweep(
            dataset=dataset,
            models=[a.model],
            grid=grid,
            store=str(tmp / "warm.zarr"),
            report=False,
            n_generations=0,
        )  # warm-up: server and imports, not timed
        t0 = time.perf_counter()
        res = embed_sweep(
            dataset=dataset,
            models=[a.model],
            grid=grid,
            store=str(tmp / "flow.zarr"),
            report=False,
            n_generations=0,
            cluster={"type": "local", "n_workers": 2},
        )
        t_flow = time.perf_counter() - t0
    n = len(points)
    print(
        f"model {a.model}, {n} grid points, Swiss roll n = {a.n}; failed: loop {failed}, flow {res['failed']}"
    )
    print(f"(a) plain loop, 1 process          : {t_loop:8.2f} s  ({t_loop / n:.3f} s per grid point)")
    print(f"(b) flow, 2-process LocalCluster   : {t_flow:8.2f} s")
    print(f"overhead per grid point (2*T_flow - T_loop)/n: {(2 * t_flow - t_loop) / n:.3f} s  (target < 0.5)")
    print(f"speed-up T_loop / T_flow: {t_loop / t_flow:.2f}x  (target >= 1.6x)")


if __name__ == "__main__":
    main()
