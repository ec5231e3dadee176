"""Flow processes for the fault tests (tests/test_faults.py), forked from one interpreter that has
imported ``flows.sweep`` once, instead of a fresh ``python -c "... embed_sweep(...)"`` for each (3 CPU
seconds of imports per flow, eleven flows a test run). Each flow is a process of its own as before:
its own session and process group, its own Prefect flow runs, its own local Dask cluster (whose
fork server and workers it starts itself), stdout and stderr to /dev/null; only the imports are
shared. The forking interpreter has one thread when it forks (imports start none; it never calls
Prefect or Dask itself), so each child starts as a single-threaded copy of an interpreter that has
just imported the module, the state a fresh ``python -c`` reaches after its first line.

    python -m tests.flow_fork        # reads one JSON line of embed_sweep keywords per flow
                                     # writes "started PID" and, when it ends, "ended PID RC"
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time


def _serve() -> dict:
    """The forking loop: returns (in a forked child only) the keywords of the flow to run; exits
    when its stdin closes."""
    import flows.sweep  # noqa: F401  what every flow imports first

    assert threading.active_count() == 1, threading.enumerate()  # safe to fork
    buf = b""
    while True:
        while True:  # reap the ended flows, reporting each exit status as Popen would
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            os.write(1, f"ended {pid} {os.waitstatus_to_exitcode(status)}\n".encode())
        ready, _, _ = select.select([0], [], [], 0.02)
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:  # the test process closed the pipe: no more flows
            sys.exit(0)
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            kw = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return kw
            os.write(1, f"started {pid}\n".encode())


class FlowProcess:
    """One forked flow, with the part of :class:`subprocess.Popen` the fault tests use."""

    def __init__(self, launcher: Launcher, pid: int):
        self._launcher, self.pid, self.returncode = launcher, pid, None

    def poll(self):
        self.returncode = self._launcher.returncode(self.pid)
        return self.returncode

    def wait(self, timeout=None):
        t0 = time.time()
        while self.poll() is None:
            if timeout is not None and time.time() - t0 > timeout:
                raise subprocess.TimeoutExpired(f"flow {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class Launcher:
    """The forking interpreter, started with ``env`` in ``cwd``; :meth:`start` forks a flow."""

    def __init__(self, env: dict, cwd):
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.flow_fork"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._ended: dict[int, int] = {}
        self._started: list[int] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self._proc.stdout:
            what, pid, *rc = line.split()
            with self._cond:
                if what == "started":
                    self._started.append(int(pid))
                else:
                    self._ended[int(pid)] = int(rc[0])
                self._cond.notify_all()

    def returncode(self, pid):
        with self._cond:
            return self._ended.get(pid)

    def start(self, **kw) -> FlowProcess:
        with self._cond:
            n = len(self._started)
            self._proc.stdin.write(json.dumps(kw) + "\n")
            self._proc.stdin.flush()
            if not self._cond.wait_for(lambda: len(self._started) > n or self._proc.poll() is not None, 120):
                raise AssertionError("the flow launcher did not fork in 120 s")
            assert len(self._started) > n, f"the flow launcher ended (rc {self._proc.poll()})"
            return FlowProcess(self, self._started[n])

    def close(self):
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=10)


if __name__ == "__main__":
    _kw = _serve()
    # the flow process: its own session (the tests kill its process group), output discarded
    os.setsid()
    _null = os.open(os.devnull, os.O_RDWR)
    for _fd in (0, 1, 2):
        os.dup2(_null, _fd)
    from flows.sweep import embed_sweep

    embed_sweep(**_kw)
