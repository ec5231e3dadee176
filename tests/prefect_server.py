"""A real Prefect API server on 127.0.0.1 for the pipeline tests: one per test run (``prefect_api``
in tests/conftest.py; under pytest-xdist its controller starts it for both test processes), each
module pointed at it in turn.

A server on a fresh PREFECT_HOME spends ~7 of its ~12 CPU s to healthy creating its database
(migrations) and registering the block types; with a copy of a database that a server of the same
Prefect made and nothing has used yet (and its ``memo_store.toml``), it starts in ~5 CPU s. The
first server of a test run saves that copy (the folder named by ``$EMBED_SWEEP_TEST_PREFECT_TEMPLATE``,
made per run by tests/conftest.py) before any test uses it; :func:`seed_home` gives it to the other
fresh homes: the CLI's own servers in tests/test_lifecycle.py (and a second test process's server
when the processes start their own: without pytest-xdist's controller).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from flows.server import flush_prefect_logs, free_port, start_child, stop_child, wait_healthy

PREFECT = str(Path(sys.executable).with_name("prefect"))

#: a folder of this test run that holds an unused, migrated Prefect database once a server has
#: started (tests/conftest.py sets it)
TEMPLATE_ENV = "EMBED_SWEEP_TEST_PREFECT_TEMPLATE"
_DB, _MEMO = "prefect.db", "memo_store.toml"

#: the server's loop services that no test here uses, off in the test servers (not in the servers the
#: CLI starts for itself): each wakes every 5-60 s for the server's life (a whole test run), together
#: ~0.55 of the idle server's ~1.7 CPU s a minute. The deployments' schedules are inactive (scheduler);
#: no test pauses or cancels a run (pause expirations, cancellation clean-up), reads a late or a
#: worker's health state (late runs, foreman), or uses automations or concurrency leases (triggers,
#: repossessor). The event persister and task-run recorder stay on (flow and task runs the tests read).
SERVICES_OFF = {
    f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
    for name in (
        "SCHEDULER",
        "LATE_RUNS",
        "PAUSE_EXPIRATIONS",
        "CANCELLATION_CLEANUP",
        "FOREMAN",
        "TRIGGERS",
        "REPOSSESSOR",
    )
}


def seed_home(home: Path) -> bool:
    """Copy the run's template database into ``home`` if it has none yet and a template has been
    saved; returns whether it did. A home that already has a database is left alone (a re-run on
    the same home keeps its flow runs)."""
    src = Path(os.environ.get(TEMPLATE_ENV) or "/nonexistent")
    home = Path(home)
    if not (src / _DB).exists() or (home / _DB).exists():
        return False
    home.mkdir(parents=True, exist_ok=True)
    if (src / _MEMO).exists():
        shutil.copyfile(src / _MEMO, home / _MEMO)
    shutil.copyfile(src / _DB, home / _DB)
    return True


def _save_template(home: Path) -> None:
    """Snapshot the database of a server that has just become healthy on a fresh ``home`` (no
    test has used it) as the run's template: SQLite's online backup (consistent while the server
    runs), then an atomic rename; two processes saving at once leave one of two equal copies."""
    import sqlite3

    dst = os.environ.get(TEMPLATE_ENV)
    if not dst or not Path(dst).is_dir() or (Path(dst) / _DB).exists() or not (home / _DB).exists():
        return
    tag = f".{os.getpid()}.tmp"
    src = sqlite3.connect(f"file:{home / _DB}?mode=ro", uri=True)
    out = sqlite3.connect(Path(dst) / (_DB + tag))
    try:
        src.backup(out)
    finally:
        src.close()
        out.close()
    if (home / _MEMO).exists():  # the memo first: whoever sees the database sees a memo with it
        shutil.copyfile(home / _MEMO, Path(dst) / (_MEMO + tag))
        os.replace(Path(dst) / (_MEMO + tag), Path(dst) / _MEMO)
    os.replace(Path(dst) / (_DB + tag), Path(dst) / _DB)


def server_env(home, url: str, extra_env: dict | None = None) -> dict:
    """This process's environment pointed at the server on ``url`` with its ``home``."""
    return dict(
        os.environ,
        PREFECT_HOME=str(home),
        PREFECT_API_URL=url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        **(extra_env or {}),
    )


def start_server(home: Path, extra_env: dict | None = None):
    """Start `prefect server start` on a free loopback port without waiting for it; returns
    (process, log file, environment, whether ``home`` was seeded from the template)."""
    seeded = seed_home(home)
    port = free_port()
    env = server_env(home, f"http://127.0.0.1:{port}/api", extra_env)
    log = open(home / "server.log", "w")  # noqa: SIM115
    proc = start_child(  # ends with the process that started it, even if that is killed
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=dict(env, **SERVICES_OFF),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, log, env, seeded


def stop_server(proc, log) -> None:
    stop_child(proc, timeout=30)
    log.close()


@contextlib.contextmanager
def prefect_server(home: Path, extra_env: dict | None = None):
    """Start `prefect server start` on a free loopback port; yield the environment to use. A fresh
    ``home`` starts from the run's template database when there is one, else its own database
    becomes the template."""
    proc, log, env, seeded = start_server(home, extra_env)
    try:
        wait_healthy(env["PREFECT_API_URL"], proc)
        if not seeded:
            _save_template(home)
        yield env
    finally:
        flush_prefect_logs()
        stop_server(proc, log)


@contextlib.contextmanager
def pointed_at(env: dict, keys=("PREFECT_API_URL", "PREFECT_HOME")):
    """This process pointed at a running server (``env`` from :func:`prefect_server`): the
    variables in ``keys`` set in ``os.environ`` (restored afterwards) and Prefect's settings
    switched to its API; buffered run logs are sent before switching back."""
    from flows.server import use_api

    old = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: env[k] for k in keys})
    try:
        with use_api(env["PREFECT_API_URL"]):
            yield env
            flush_prefect_logs()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
