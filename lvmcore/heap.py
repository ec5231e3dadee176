"""Process heap settings for Dask workers (no Dask import: plain ctypes on glibc)."""

from __future__ import annotations

import ctypes
import os

_kept = False


def keep_heap() -> None:
    """Once per process: raise glibc's mmap and trim thresholds if the process was started
    with ``MALLOC_TRIM_THRESHOLD_`` set (Dask's nanny sets 65536 for its workers). Setting it fixes
    the mmap threshold at 128 KiB, so every buffer of each XLA execution above that is mapped and
    unmapped per call and page-faulted on every first touch: measured 3-4x slower forward and
    backward passes of the psi statistics in a worker than in process (25,000 rows, M = 50).
    32 MiB / 128 MiB restore the in-process speed; memory is still returned above them."""
    global _kept
    if _kept:
        return
    _kept = True
    if os.environ.get("MALLOC_TRIM_THRESHOLD_") is None:
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass
