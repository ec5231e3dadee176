"""Dask worker preload for local clusters: a lost scheduler is one log line, not a traceback.

When a sweep is interrupted (Ctrl-C, SIGTERM), its local cluster closes the scheduler while a busy
worker may still send a heartbeat; distributed then logs "Failed to communicate with scheduler
during heartbeat." with the closed stream's whole traceback on the worker's stderr, which is the
terminal's (the CLI promises one line on an interrupt; seen once in a fresh-clone run of
tests/test_lifecycle.py). The message is kept; only the traceback of an OSError (the
connection-level failure that message is logged for) is dropped."""

from __future__ import annotations

import logging

HEARTBEAT_LOST = "Failed to communicate with scheduler during heartbeat"


class OneLineLostScheduler(logging.Filter):
    """Drop the exception info of the heartbeat-failure record when the exception is an OSError."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, OSError) and str(record.msg).startswith(HEARTBEAT_LOST):
            record.exc_info, record.exc_text = None, None
        return True


def install() -> None:
    log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, OneLineLostScheduler) for f in log.filters):
        log.addFilter(OneLineLostScheduler())


def dask_setup(worker) -> None:
    install()
