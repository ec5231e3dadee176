"""How a running sweep tells its story: a progress bar with counts and the estimated time left on a
terminal (one plain line per finished grid point otherwise), and the same progress as a Prefect
progress artifact (flows.artifacts) that the UI shows while the run goes on."""

from __future__ import annotations

import shutil
import sys
import time

BAR = 24


def _clock(seconds: float) -> str:
    s = int(round(max(seconds, 0)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """Counts finished grid points of one sweep and shows them.

    ``tty`` (default: whether ``stream`` is a terminal): one line redrawn in place with a bar,
    done / failed counts, elapsed time and the estimated time left (elapsed per finished point
    times the points left); a failed point is also printed on its own line above the bar.
    Otherwise one plain line per point, through ``print`` (so Prefect's ``log_prints`` records it).
    ``on_update(fraction)`` is called after every batch (the Prefect progress artifact)."""

    def __init__(
        self,
        total: int,
        label: str = "",
        stream=None,
        tty: bool | None = None,
        on_update=None,
        predicted=None,
    ):
        self.total, self.label = int(total), label
        #: the plan's predicted seconds for the points (tasks.costs): the time left before one finishes
        self.predicted = predicted
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(tty if tty is not None else getattr(self.stream, "isatty", lambda: False)())
        self.on_update = on_update
        self.done = self.failed = 0
        self.t0 = time.perf_counter()
        if predicted is not None and self.total:  # shown until the first point finishes
            if self.tty:
                self.stream.write("\r\033[K" + self.line("(as predicted)"))
                self.stream.flush()
            else:
                print(f"predicted (upper bound): about {_clock(predicted)} for {self.total} grid points")

    @property
    def finished(self) -> int:
        return self.done + self.failed

    def eta(self) -> float | None:
        """Seconds left at the mean pace so far; before the first point, what is left of the
        plan's prediction (None without one)."""
        if self.finished == 0:
            return (
                None if self.predicted is None else max(self.predicted - (time.perf_counter() - self.t0), 0.0)
            )
        return (time.perf_counter() - self.t0) / self.finished * (self.total - self.finished)

    def line(self, last: str = "") -> str:
        frac = self.finished / self.total if self.total else 1.0
        fill = int(round(BAR * frac))
        eta = self.eta()
        text = (
            f"{self.label}[{'#' * fill}{'.' * (BAR - fill)}] {self.finished}/{self.total}"
            f" ({self.done} done, {self.failed} failed) {_clock(time.perf_counter() - self.t0)} elapsed"
            + (f", about {_clock(eta)} left" if eta is not None and self.finished < self.total else "")
        )
        if last:
            text += f"  {last}"
        width = shutil.get_terminal_size((120, 20)).columns - 1
        return text[:width]

    def point(self, key: str, point: dict, state: str) -> None:
        """One grid point finished (``state``: done, failed or skipped)."""
        if state == "skipped":
            self.total -= 1
            return
        self.done += state == "done"
        self.failed += state == "failed"
        desc = f"{key} {point} {state}"
        if self.tty:
            if state == "failed":
                self.stream.write("\r\033[K" + f"failed: {desc}\n")
            self.stream.write("\r\033[K" + self.line(desc))
            self.stream.flush()
        else:
            print(f"[{self.finished}/{self.total}] {desc} ({time.perf_counter() - self.t0:.1f} s)")

    def batch_done(self) -> None:
        if self.on_update is not None:
            self.on_update(self.finished / self.total if self.total else 1.0)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self.line() + "\n")
            self.stream.flush()
