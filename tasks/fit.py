"""Fit one model at one grid point."""

from __future__ import annotations

import contextlib
import inspect
import time
import traceback

import numpy as np

from lvmcore.data.rowsource import ZarrRows
from lvmcore.rows import attach
from tasks.inputs import load_data, load_graph
from tasks.registry import COV_SCALES, DIAGNOSTICS, EXTRAS_FLAG, MODELS
from tasks.store import PointResult


def _dask_context(est):
    """For a fit that partitions its own work on Dask (``chunks`` set) inside a Dask worker: secede
    via ``worker_client`` so that work runs on the same cluster without deadlocking the single
    worker thread (shared/STACK.md). Any other fit keeps its thread slot: a seceded task frees the
    slot, the worker starts its next task beside it, and every queued batch would run at once on
    the worker's one core (measured: 8 LL-LVM fits at a time, each 8x slower)."""
    if getattr(est, "chunks", None) is None:
        return contextlib.nullcontext()
    try:
        from distributed import get_worker, worker_client

        get_worker()
    except (ImportError, ValueError):
        return contextlib.nullcontext()
    return worker_client(separate_thread=True)


def _cluster_args(method, client) -> dict:
    """The Dask ``client`` (from :func:`_dask_context`) and this worker's address (``worker``: its
    tasks go to the other workers) for an estimator method that takes them, e.g. GLLE's fit and
    sample; nothing outside a Dask task."""
    if client is None:
        return {}
    from distributed import get_worker  # as in _dask_context: distributed only inside a worker

    params = inspect.signature(method).parameters
    return {k: v for k, v in (("client", client), ("worker", get_worker().address)) if k in params}


def _memory_args(method) -> dict:
    """``memory_bytes`` for an estimator method that takes it (LL-LVM's fit, whose sparse solvers
    refuse work that cannot fit it): the memory available, inside a Dask worker at most its memory
    limit."""
    if "memory_bytes" not in inspect.signature(method).parameters:
        return {}
    from tasks.knn import memory_budget  # the same budget a kNN search on this worker gets

    return {"memory_bytes": memory_budget()}


def _with_sources(data: dict, data_path: str, graph, graph_path):
    """The data and graph this fit read from the ingested stores, each carrying where it is stored
    (:mod:`lvmcore.rows`): chunked work on the cluster reads its rows there, not from this task.
    Returns (Y, views, graph)."""
    fp = data["stamps"]
    Y = attach(data["Y"], ZarrRows(data_path, "Y", expect=fp))
    views = [attach(v, ZarrRows(data_path, f"view_{i}", expect=fp)) for i, v in enumerate(data["views"])]
    if graph is not None:
        at = {"data_fingerprint": data["fingerprint"]}
        graph = attach(
            graph, ZarrRows(graph_path, "indices", dtype=np.int64, columns=graph.shape[1], expect=at)
        )
    return Y, views, graph


def fitted_model(est) -> tuple[tuple | None, str]:
    """The fitted estimator as plain arrays and params (``to_arrays()``, kept in the result store:
    tasks.store.models), or None and why an estimator refused (the point's embedding and metrics
    are kept either way; loading its model then names the reason)."""
    try:
        arrays, params = est.to_arrays()
    except (NotImplementedError, TypeError, AttributeError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}"
    odd = [name for name, a in arrays.items() if np.asarray(a).dtype.kind not in "biuf"]
    if odd:  # the store keeps numbers only
        return None, f"to_arrays gave arrays that are not numbers: {odd}"
    return (arrays, params), ""


def fit_point(
    key: str,
    options: dict,
    data_path: str,
    graph_path: str | None,
    index: tuple,
    point: dict,
    n_generations: int = 0,
) -> PointResult:
    """Fit model ``key`` at grid ``point``; exceptions become a failed result with the error.

    ``n_generations`` > 0: GLLE's diagnostics (``DIAGNOSTICS``: that many generations and the
    covariance-scale study, seeded by the point's seed) are computed after the fit, and its
    ``EXTRAS_FLAG`` is 1; with 0 they are left out (flag 0). Neither the embedding nor any metric
    depends on them, and ``fit_seconds`` is the fit's alone."""
    spec = MODELS[key]
    res = PointResult(key=key, index=tuple(index), point=dict(point), status="failed")
    try:
        data = load_data(data_path)
        est = spec.estimator_class()(**spec.constructor_args(point, options))
        graph = None
        if not spec.multiview and "k" in spec.dims:
            graph = load_graph(graph_path)[0][:, : point["k"]]
        t0 = time.perf_counter()
        Y, views, graph = _with_sources(data, data_path, graph, graph_path)
        with _dask_context(est) as client:
            fit_args = {**_cluster_args(est.fit, client), **_memory_args(est.fit)}
            if spec.multiview:
                est.fit(views, **fit_args)
            elif graph is not None:
                est.fit(Y, graph=graph, **fit_args)
            else:
                est.fit(Y, **fit_args)
            res.fit_seconds = time.perf_counter() - t0
            if EXTRAS_FLAG in spec.extras:  # paper 001's diagnostics computed, or left out (arrays NaN)
                res.extras[EXTRAS_FLAG] = float(n_generations > 0)
            if "generations" in spec.extras and n_generations > 0:
                res.extras["generations"] = np.asarray(
                    est.sample(
                        n_generations, random_state=point.get("seed", 0), **_cluster_args(est.sample, client)
                    )
                )
            if "scale_study" in spec.extras and n_generations > 0:  # paper 001 section VI-C
                seed = point.get("seed", 0)
                # one call: with chunks on a cluster its eigenproblems are solved at once
                study = est.sample(
                    1, random_state=seed, cov_scale=COV_SCALES, **_cluster_args(est.sample, client)
                )
                res.extras["scale_study"] = study[:, 0]
        res.embedding = np.asarray(est.embedding_, dtype=np.float64)
        if not np.all(np.isfinite(res.embedding)):
            raise FloatingPointError("the fitted embedding contains NaN or inf")
        var = getattr(est, "embedding_var_", None)
        if var is not None:
            var = np.asarray(var, dtype=np.float64)
            if var.ndim == 3:  # full (N, Q, Q) posterior covariances: keep the marginal variances
                var = np.diagonal(var, axis1=1, axis2=2)
            res.embedding_var = np.broadcast_to(var, res.embedding.shape)
        res.elbo = float(est.elbo_)
        res.elbo_trace = np.asarray(getattr(est, "elbo_trace_", [res.elbo]), dtype=np.float64)
        res.n_iter = float(getattr(est, "n_iter_", len(res.elbo_trace)))
        res.converged = float(bool(est.converged_)) if hasattr(est, "converged_") else float("nan")
        for name in spec.extras:  # learned quantities the registry asks for, e.g. ard_weights_, alpha_
            if name not in (*DIAGNOSTICS, EXTRAS_FLAG) and getattr(est, name + "_", None) is not None:
                res.extras[name] = np.asarray(getattr(est, name + "_"), dtype=np.float64)
        res.model, res.model_error = fitted_model(est)
        res.status = "done"
    except Exception as e:  # recorded per grid point; the sweep goes on
        last = traceback.extract_tb(e.__traceback__)[-1]
        res.error = f"{type(e).__name__}: {e} [{last.filename.rsplit('/', 1)[-1]}:{last.lineno}]"
        res.status = "failed"
    return res
