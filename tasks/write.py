"""Write one grid point into the result store (region write; retried on I/O errors)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.registry import MODELS
from tasks.store import Layout, PointResult, write_point


@task(name="write", retries=3, retry_delay_seconds=1, cache_policy=NO_CACHE)
def write_task(res: PointResult, store: str, layout: Layout) -> str:
    write_point(store, MODELS[res.key], res, layout)
    return res.status
