"""``python -m flows.workers.pdeath PARENT_PID CMD...``: run CMD so that it ends when PARENT_PID dies,
however it dies (SIGKILL included), through Linux's parent-death signal (prctl PR_SET_PDEATHSIG),
which survives the exec. Used to start helper processes (the Prefect server) without a
``preexec_fn``, whose fork of a multithreaded parent (JAX's threads) can deadlock."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    parent, cmd = int(argv[0]), argv[1:]
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the caller's context managers still stop it
        pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        sys.exit(1)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
