"""The embed-sweep-map flow: new cells onto a finished sweep. Plan (tasks.results.mapping.plan_map:
every refusal before the cluster starts) -> read the query in the reference's space -> each model's
chunks of cells mapped as Prefect tasks on the Dask cluster (the same ``cluster`` options as the
sweep) -> labels transferred -> a copy of the query file written. The flow only orchestrates: the
work is the library's (tasks.results.mapping)."""

from __future__ import annotations

import contextlib
import os

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.settings import PREFECT_API_URL
from prefect_dask import DaskTaskRunner

from flows.cluster import client_kwargs, normalise_cluster, start_cluster
from tasks.results import mapping, reference
from tasks.results.selection import select


@task(name="map-chunk", cache_policy=NO_CACHE, task_run_name="{model}-{first}")
def map_chunk_task(
    store: str, model: str, setting: dict, Y, predict_view: int | None, first: int = 0, score_reference=None
) -> dict:
    """One chunk of query cells through one fitted model (tasks.results.mapping.map_chunk)."""
    return mapping.map_chunk(store, model, setting, Y, predict_view, score_reference)


@flow(name="embed-sweep-map-chunks", log_prints=True)
def map_chunks(plan: dict, read: dict, chunk_cells: int) -> dict:
    """Inner flow, run with a DaskTaskRunner: every chunk of every model a task on the cluster."""
    names = [v["name"] for v in reference.reference_views(plan["store"])["views"]]
    target = names.index(plan["predict"]) if plan["predict"] is not None else None
    futures = {}
    for m, info in plan["models"].items():
        if "setting" not in info:
            continue
        Y = mapping.model_input(plan, read, m)
        n = len(next(iter(Y.values()))) if isinstance(Y, dict) else len(Y)
        futures[m] = [
            map_chunk_task.submit(
                plan["store"], m, info["setting"], mapping.rows_of(Y, a, b), target, a, info["reference"]
            )
            for a, b in mapping.chunks(n, chunk_cells)
        ]
    return {m: mapping.join([f.result() for f in futs]) for m, futs in futures.items()}


@flow(name="embed-sweep-map", log_prints=True)
def embed_sweep_map(
    store: str,
    dataset: str | dict,
    to: str,
    models: list[str] | str | None = None,
    setting: dict | str | None = None,
    predict: str | None = None,
    fill_missing: str | None = None,
    cluster: dict | str | None = None,
    overwrite: bool = False,
    replace_file: bool = False,
    chunk_cells: int = mapping.CHUNK_CELLS,
) -> dict:
    """Map the cells of ``dataset`` (any data set ``run`` accepts, with its options) onto the fitted
    models of the finished sweep ``store`` and write a copy of the query file to ``to`` with
    obsm X_<model> / X_<model>_var, obs <model>_mapping_score, the transferred labels and their
    confidence, uns["embed_sweep_map"] (and, with ``predict``, that modality's predictive mean and
    variance). ``setting``: a named setting (default each model's chosen one, as export);
    ``fill_missing``: "zeros" fills reference genes the query lacks; ``cluster``: as the sweep's."""
    plan = mapping.plan_map(
        store,
        dataset,
        to,
        models,
        setting,
        predict,
        fill_missing,
        overwrite=overwrite,
        replace_file=replace_file,
    )
    for note in plan["query"]["notes"]:
        print(f"note: {note}")
    read = mapping.read_query(plan)
    spec = normalise_cluster(cluster)
    if os.environ.get("PREFECT_API_URL") is None and PREFECT_API_URL.value():
        os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()  # worker processes talk to the same API
    with contextlib.ExitStack() as stack:
        address, dashboard, _cluster = stack.enter_context(start_cluster(spec))
        if dashboard:
            print(f"Dask dashboard: {dashboard}")
        runner = DaskTaskRunner(address=address, client_kwargs=client_kwargs(_cluster))
        results = map_chunks.with_options(task_runner=runner)(plan, read, int(chunk_cells))
    labels = {}
    codes, names = reference.reference_labels(plan["store"])
    col = plan["reference"]["label_column"]
    if codes is not None and col and (codes >= 0).any():
        for m, r in results.items():
            ref_X = select(plan["store"], m, plan["models"][m]["setting"])["embedding"]
            q = r["mean"][:, : ref_X.shape[1]]
            cat, conf = mapping.transfer_labels(ref_X, codes, names, q)
            labels[m] = (f"{col}_{m}", cat, conf)
    written = mapping.write_output(plan, results, labels, mapping.provenance(plan))
    return {
        **written,
        "models": {m: plan["models"][m]["setting"] for m in results},
        "notes": plan["query"]["notes"],
        "genes": {n: (v["dropped"], v["filled"]) for n, v in plan["query"]["views"].items()},
        "median_score": {m: float(np.nanmedian(r["score"])) for m, r in results.items()},
        "labels": sorted(c for c, _, _ in labels.values()),
    }
