"""Waiting in tests for something another process does in its own time."""

from __future__ import annotations

import time


def wait_until(cond, timeout: float, what: str, every: float = 0.05) -> None:
    """Return once ``cond()`` is true; an AssertionError naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(every)
    if not cond():
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
