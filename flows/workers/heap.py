"""Dask worker preload: glibc heap thresholds for the worker process (no Dask import: ctypes).

A Dask nanny starts its worker with ``MALLOC_TRIM_THRESHOLD_`` set (65536), which also fixes glibc's
mmap threshold at 128 KiB: every XLA buffer above that is then mapped, unmapped and page-faulted
afresh at every call, and the psi statistics ran 3-4x slower in a worker than in process
(bench/README.md, "worker heap"). Raising the mmap and trim thresholds to 32 MiB / 128 MiB at
worker start restores the in-process speed; memory above them is still returned to the system.
Process tuning belongs here, at the program's edge, not in the numerics (``lvmcore``)."""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 128 << 20


def keep_heap() -> bool:
    """Raise glibc's mmap and trim thresholds if this process was started with
    ``MALLOC_TRIM_THRESHOLD_`` set (as a Dask nanny starts its workers). Returns whether it did."""
    if os.environ.get("MALLOC_TRIM_THRESHOLD_") is None:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    except (OSError, AttributeError):  # not glibc
        return False
    return True


def dask_setup(worker) -> None:
    keep_heap()
