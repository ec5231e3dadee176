"""The store's process lock: one sweep writes a store at a time; a lock left by a process that no
longer runs is taken over."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid

import psutil

from tasks.store.paths import lock_path, store_path


def _proc_start(pid: int) -> float | None:
    """Start time of process ``pid`` (None if there is none): tells a live holder from a reused pid."""
    try:
        return psutil.Process(pid).create_time()
    except Exception:
        return None


def record_flow_run(store, flow_run_id: str) -> None:
    """Add a flow run to the lock this process holds, so that if this process dies without a word
    (SIGKILL), the run that takes the stale lock over can mark that flow run crashed."""
    path = lock_path(store)
    try:
        have = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if have.get("pid") != os.getpid():
        return
    have["flow_runs"] = [*have.get("flow_runs", []), str(flow_run_id)]
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(have))
    os.replace(tmp, path)


def holder_alive(have: dict) -> bool:
    """Whether the lock record ``have`` ({"pid", "start", "host"}) names a live process: one on
    another host (it cannot be checked from here), or here with that pid and the same process start
    time (a reused pid is not the holder)."""
    if have.get("host") != socket.gethostname():
        return True
    started = _proc_start(int(have.get("pid", -1)))
    return started is not None and (have.get("start") is None or abs(started - have["start"]) < 1e-3)


class StoreLockedError(ValueError):
    """Another live process is writing the store."""


@contextlib.contextmanager
def store_lock(store):
    """Hold ``<store>.lock`` while a sweep writes the store.

    The lock file holds the holder's pid, process start time and host. A second sweep on the same
    store is refused with them; a lock left by a process that no longer runs (same host, pid gone or
    reused) is stale and taken over. Re-entrant within one process (the CLI takes it before the
    server starts, the flow again). Yields the stale holders it took over (their lock contents,
    with the flow runs they recorded, for the caller to mark crashed once an API is up)."""
    path = lock_path(store)
    stale: list[dict] = []
    path.parent.mkdir(parents=True, exist_ok=True)
    me = {"pid": os.getpid(), "start": _proc_start(os.getpid()), "host": socket.gethostname()}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                have = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                have = {}
            if not have:  # being written by its holder this instant, or a torn write: look again
                time.sleep(0.2)
                try:
                    have = json.loads(path.read_text() or "{}")
                except (OSError, ValueError):
                    have = {"pid": -1, "host": me["host"], "start": None}
            if have.get("pid") == me["pid"] and have.get("host") == me["host"]:
                yield []  # this process holds it already
                return
            if holder_alive(have):
                raise StoreLockedError(
                    f"{store_path(store)} is being written by another sweep (pid {have.get('pid')} on host "
                    f"{have.get('host')}, since {have.get('since', '?')}); wait for it to finish, or if "
                    f"that process is gone, delete {path}"
                ) from None
            aside = path.with_name(f"{path.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:6]}")
            try:  # only one of several processes taking over a stale lock wins this rename
                path.rename(aside)
                aside.unlink()
                stale.append(have)
                print(
                    f"{store_path(store)}: removed a stale lock of pid {have.get('pid')} (no longer running)"
                )
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({**me, "since": time.strftime("%Y-%m-%d %H:%M:%S")}, f)
        try:
            yield stale
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return
    raise StoreLockedError(f"could not take the lock {path}; another sweep is starting on this store")
