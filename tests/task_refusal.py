"""A Dask worker preload for the tests of failures met inside a task (tests/test_bad_input.py): with
``$EMBED_SWEEP_TEST_INGEST_RAISES`` set to ValueError (a refusal of the input that only the cluster
finds) or RuntimeError (an unexpected error), the sweep's ingest task raises it on the worker."""

from __future__ import annotations

import os

import flows.tasks
import tasks.ingest

ENV = "EMBED_SWEEP_TEST_INGEST_RAISES"
#: a file the raising ingest appends one line to per call (how often the task ran, retries included)
CALLS_ENV = "EMBED_SWEEP_TEST_INGEST_CALLS"
ERRORS = {"ValueError": ValueError, "RuntimeError": RuntimeError}


def raising_ingest(*args, **kwargs):
    kind = os.environ[ENV]
    if os.environ.get(CALLS_ENV):
        with open(os.environ[CALLS_ENV], "a") as f:
            f.write("called\n")
    raise ERRORS[kind](f"{kind} raised inside the ingest task (a test)")


def dask_setup(worker) -> None:
    if os.environ.get(ENV):  # the task's function comes pickled by value, naming tasks.ingest's
        tasks.ingest.ingest_dataset = flows.tasks.ingest_dataset = raising_ingest
