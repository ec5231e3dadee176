"""Dask worker preload for local clusters: pin each worker process to one CPU core.

XLA's CPU runtime sizes its thread pool from the process's CPU affinity and ignores the thread
environment variables (measured here: a "single-threaded" jax worker used 1.8 cores, so a second
worker process on a 2-core machine gave no speed-up). Setting the affinity before the worker
imports jax is the documented way to bound it (jax-ml/jax#1539). Worker ``i`` (LocalCluster names
its workers 0, 1, ...) gets core ``i mod n_cores`` of the cores this process may use."""

from __future__ import annotations

import os


def dask_setup(worker) -> None:
    try:
        index = int(worker.name)
    except (TypeError, ValueError):
        return
    if not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(0, {cores[index % len(cores)]})
