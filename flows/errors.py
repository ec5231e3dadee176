"""Failures at the terminal as one line each: while `embed-sweep run` runs its sweeps, the Prefect flow
and task runs' failure records (each with its traceback, repeated by every flow that re-raises it)
go to a log file beside the store instead of the console. The CLI then prints the failure's one
line and the log's path. The records still reach the Prefect API, so the runs end Failed there
with their reason, and nothing is filtered out of an unexpected error's own traceback.

The local cluster's worker processes write to the terminal too: they load this module as a Dask
preload and divert their task runs' failure records to the log named by ``$EMBED_SWEEP_RUN_LOG``,
which the CLI sets before the cluster starts."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

#: exit codes: every grid point done; refused input (before any work) or a damaged store; some grid
#: point failed; the store cannot be written (a full disk, an unwritable chunk: a re-run resumes);
#: interrupted (SIGINT / SIGTERM)
EXIT_OK, EXIT_REFUSED, EXIT_POINTS_FAILED, EXIT_UNWRITABLE, EXIT_INTERRUPTED = 0, 2, 3, 4, 130

#: the log file a worker process diverts its task runs' failure records to (set by the CLI)
LOG_ENV = "EMBED_SWEEP_RUN_LOG"
#: the loggers of Prefect's flow and task runs (the engines' records and ``get_run_logger``'s)
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
#: how a run's failed end state is logged (at INFO for a flow run): the failure said once more
FAILED_END = "Finished in state Failed"
#: how a crashed run (interrupted, its process killed) is logged: one line each, no traceback, kept
#: on the terminal beside the CLI's own line for an interrupt
CRASHED = ("Crash detected", "Finished in state Crashed")


def run_log_path(stores: list[str], out: Path) -> Path:
    """The log of one `run` command: ``x.log`` beside a single store ``x.zarr``, else ``embed-sweep.log``
    in the output folder (several sweeps share one cluster, whose workers write to one file)."""
    if len(stores) == 1:
        return Path(stores[0]).with_suffix(".log")
    return Path(out) / "embed-sweep.log"


def is_failure_record(record: logging.LogRecord) -> bool:
    """A flow or task run's record of a failure: an error (with its traceback) or a failed end state;
    not a crash's lines."""
    if not record.name.startswith(RUN_LOGGERS):
        return False
    message = record.getMessage()
    if message.startswith(CRASHED):
        return False
    return record.levelno >= logging.ERROR or message.startswith(FAILED_END)


class ToRunLog(logging.Filter):
    """On the console handlers: a failure record goes to ``log`` (a handler), once however many
    console handlers pass it on, and not to the console."""

    def __init__(self, log: logging.Handler):
        super().__init__()
        self.log = log
        self.last: logging.LogRecord | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if not is_failure_record(record):
            return True
        if record is not self.last:  # each console handler sees the same record in turn
            self.last = record
            self.log.handle(record)
        return False


def console_handlers() -> list[logging.Handler]:
    """The root logger's handlers that write to the terminal (Prefect's console handler; not a file's,
    nor pytest's capture)."""
    return [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.StreamHandler)
        and not isinstance(h, logging.FileHandler)
        and not type(h).__module__.startswith("_pytest")
    ]


def divert(path: Path) -> tuple[logging.Handler, list[tuple[logging.Handler, ToRunLog]]]:
    """Send this process's run failure records to ``path`` (appended; the file is made at the first
    record) instead of the console. Returns what :func:`restore` undoes."""
    consoles = console_handlers()
    log = logging.FileHandler(path, mode="a", delay=True, encoding="utf-8")
    log.setFormatter(consoles[0].formatter if consoles else logging.Formatter(logging.BASIC_FORMAT))
    one = ToRunLog(log)
    for h in consoles:
        h.addFilter(one)
    return log, [(h, one) for h in consoles]


def restore(log: logging.Handler, filters) -> None:
    for h, f in filters:
        h.removeFilter(f)
    log.close()


#: the log this process diverted failure records to last (for the CLI's last line)
_LAST: list[Path] = []


@contextlib.contextmanager
def failures_to_log(path: Path):
    """For the duration: this process's run failure records to ``path``, and ``$EMBED_SWEEP_RUN_LOG``
    set for the local worker processes started meanwhile."""
    path = Path(path)
    _LAST[:] = [path]
    old = os.environ.get(LOG_ENV)
    os.environ[LOG_ENV] = str(path)
    log, filters = divert(path)
    try:
        yield path
    finally:
        restore(log, filters)
        if old is None:
            os.environ.pop(LOG_ENV, None)
        else:
            os.environ[LOG_ENV] = old


def written_log() -> Path | None:
    """The log :func:`failures_to_log` last wrote to, if a failure record reached it."""
    if _LAST and _LAST[0].exists() and _LAST[0].stat().st_size > 0:
        return _LAST[0]
    return None


def forget_log() -> None:
    _LAST.clear()


def dask_setup(worker) -> None:
    """Worker preload: divert this worker's task run failure records to ``$EMBED_SWEEP_RUN_LOG``."""
    path = os.environ.get(LOG_ENV)
    if path:
        import prefect.main  # noqa: F401  (Prefect makes its console handler when this is imported)

        divert(Path(path))
