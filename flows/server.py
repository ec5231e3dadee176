"""A throw-away local Prefect API server for `embed-sweep run` when none is configured.

Dask worker processes each start their own temporary API server when no server is set, which
costs minutes and spews kill warnings (shared/STACK.md); a real server on 127.0.0.1 avoids it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SERVER_START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(
    url: str, proc: subprocess.Popen | None = None, timeout: float = SERVER_START_TIMEOUT_S
) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the Prefect server exited with code {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the Prefect server at {url} was not healthy after {timeout:.0f} s")


def flush_prefect_logs() -> None:
    """Send buffered run logs while the server is still up (else the exit waits on retries)."""
    try:
        from prefect._internal.concurrency.services import QueueService

        QueueService.drain_all(timeout=10)  # run logs and events
    except Exception:  # logging must never fail the run
        pass


def start_child(cmd, **kw) -> subprocess.Popen:
    """Start a helper process (the Prefect server) that ends when this process ends, however it
    ends: ``flows.workers.pdeath`` arms the parent-death signal and execs ``cmd`` (no fork-time callback
    in this multithreaded process). Only safe from the main thread: the signal follows the
    thread that started the child."""
    wrapper = [sys.executable, "-m", "flows.workers.pdeath", str(os.getpid())]
    return subprocess.Popen([*wrapper, *map(str, cmd)], **kw)


def stop_child(proc: subprocess.Popen, timeout: float = 20) -> None:
    """End a helper process: SIGTERM, up to ``timeout`` s for it to exit, then SIGKILL (reaped)."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def use_api(url: str):
    """Point this process's Prefect client at ``url`` (the settings are read at import time, so
    the environment variable alone does not reach an already-imported Prefect)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


@contextlib.contextmanager
def local_server(log_path: Path | None = None):
    """Use $PREFECT_API_URL if set; otherwise start a server on 127.0.0.1 for the duration."""
    if os.environ.get("PREFECT_API_URL"):
        with use_api(os.environ["PREFECT_API_URL"]):
            yield os.environ["PREFECT_API_URL"]
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false")
    log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
    exe = Path(sys.executable).with_name("prefect")
    cmd = [
        str(exe) if exe.exists() else "prefect",
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    proc = start_child(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(url, proc)
        os.environ["PREFECT_API_URL"] = url
        with use_api(url):
            yield url
    finally:
        flush_prefect_logs()
        os.environ.pop("PREFECT_API_URL", None)
        stop_child(proc)
        if log is not subprocess.DEVNULL:
            log.close()
