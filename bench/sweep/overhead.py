"""Sweep overhead and speed-up: a 48-point grid on a 1,000-point Swiss roll, run

  (a) as plain function calls in a loop in one process (fit + evaluate per grid point: the anchor),
  (b) through the embed-sweep flow on a 2-process LocalCluster (ingest, kNN, fit, evaluate,
      region writes to the zarr store, Prefect task states through a real local API server),
  (c) as the same plain calls on a pool of 2 processes (started and warmed beforehand, one point
      per message, no Dask, no Prefect, no store): what 2 cores give with no orchestration at all.

Prints the overhead per grid point, (2 * T_flow - T_loop) / 48 worker-seconds, and the speed-up
T_loop / T_flow. Targets: overhead < 0.5 s per grid point, speed-up >= 1.6x on 2 cores. Also
T_loop / T_pool (the hardware's own 2-process speed-up: two fits at once each run slower than one
alone) and the orchestration's share, (2 * T_flow - 2 * T_pool) / 48.

    .venv/bin/python -m bench.sweep.overhead [--models glle_em,lllvm,ppca] [--n 1000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import quiet_prefect

quiet_prefect()


def grid_for(spec) -> dict:
    if "k" in spec.dims:
        return {"k": [6, 7, 8, 9, 10, 12], "latent_dim": [1, 2], "seed": [0, 1, 2, 3]}
    if "kappa" in spec.dims:
        return {"kappa": [10.0, 30.0, 100.0], "latent_dim": [1, 2], "seed": list(range(8))}
    return {"latent_dim": [1, 2], "seed": list(range(24))}


def _pool_init():
    import tasks.evaluate  # noqa: F401
    import tasks.fit  # noqa: F401


def _plain_point(args) -> str:
    from tasks.evaluate import evaluate_point
    from tasks.fit import fit_point

    model, data_path, gp, idx, point = args
    return evaluate_point(fit_point(model, {}, data_path, gp, idx, point), data_path).status


def run_plain(model, dataset, grid, tmp, pool=None) -> tuple[float, int]:
    """Ingest, kNN, then fit + evaluate of every grid point as plain calls: (a) the anchor, in a
    loop in this process (``pool=None``); (c) on a warm process pool, one point per message."""
    from flows.sweep import input_paths
    from tasks.ingest import ingest_dataset
    from tasks.knn import build_graph
    from tasks.registry import MODELS, grid_points

    spec = MODELS[model]
    data_path, graph_path = input_paths(str(tmp / f"{'loop' if pool is None else 'pool'}-{model}.zarr"))
    Path(data_path).parent.mkdir(parents=True)
    t0 = time.perf_counter()
    ingest_dataset(dataset, data_path)
    gp = build_graph(data_path, max(grid.get("k", [0])), graph_path) if "k" in spec.dims else None
    args = [(model, data_path, gp, idx, point) for idx, point in grid_points(spec, grid)]
    states = map(_plain_point, args) if pool is None else pool.imap_unordered(_plain_point, args, chunksize=1)
    failed = sum(s != "done" for s in states)
    return time.perf_counter() - t0, failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="glle_em,lllvm", help="comma-separated model keys")
    ap.add_argument("--n", type=int, default=1000)
    a = ap.parse_args()

    import multiprocessing

    from flows.server import local_server
    from flows.sweep import embed_sweep
    from tasks.registry import MODELS, grid_points

    dataset = {"name": "swiss_roll", "n": a.n, "seed": 0}
    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    rows = []
    with local_server(tmp / "server.log"):
        embed_sweep(
            dataset=dataset,
            models=["ppca"],
            grid={"latent_dim": [2], "seed": [0]},
            store=str(tmp / "warm.zarr"),
            report=False,
            n_generations=0,
        )  # warm-up: server, imports and caches, not timed
        for model in a.models.split(","):
            grid = grid_for(MODELS[model])
            n = len(list(grid_points(MODELS[model], grid)))
            assert n == 48, n
            t_loop, failed = run_plain(model, dataset, grid, tmp)
            with multiprocessing.get_context("spawn").Pool(2, initializer=_pool_init) as pool:
                pool.map(abs, range(2))  # both processes up and imported before the timing
                t_pool, failed_pool = run_plain(model, dataset, grid, tmp, pool)
            # (b) the flow on a 2-process LocalCluster (started and stopped inside the timing)
            t0 = time.perf_counter()
            res = embed_sweep(
                dataset=dataset,
                models=[model],
                grid=grid,
                store=str(tmp / f"flow-{model}.zarr"),
                report=False,
                n_generations=0,
                cluster={"type": "local", "n_workers": 2},
            )
            t_flow = time.perf_counter() - t0
            rows.append((model, n, t_loop, t_flow, t_pool, failed + failed_pool, res["failed"]))
            print(f"{model}: loop {t_loop:.1f} s, pool {t_pool:.1f} s, flow {t_flow:.1f} s", flush=True)
    print(f"\nSwiss roll n = {a.n}, 48 grid points per model; flow on a 2-process LocalCluster")
    print(
        "model          T_loop   per point   T_flow   overhead/point   speed-up"
        "   T_pool  pool speed-up  orchestration/point   failed (loop+pool/flow)"
    )
    for model, n, t_loop, t_flow, t_pool, f1, f2 in rows:
        print(
            f"{model:12s} {t_loop:8.1f} s {t_loop / n:8.3f} s {t_flow:7.1f} s "
            f"{(2 * t_flow - t_loop) / n:12.3f} s {t_loop / t_flow:9.2f}x {t_pool:7.1f} s "
            f"{t_loop / t_pool:12.2f}x {2 * (t_flow - t_pool) / n:16.3f} s   {f1}/{f2}"
        )
    print("targets: overhead (2*T_flow - T_loop)/48 < 0.5 s per grid point; speed-up T_loop/T_flow >= 1.6x")
    print("T_pool: the same calls on a warm 2-process pool, no orchestration (the hardware's own speed-up)")


if __name__ == "__main__":
    main()
