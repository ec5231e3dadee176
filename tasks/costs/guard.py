"""The run-time stop of a grid point: a fit that has used ``overrun.factor`` times its predicted CPU
time (and at least ``overrun.min_seconds``, both from the cost data) is stopped:
:func:`overrun_guard` raises :class:`PointOverrun` inside the fitting thread (through CPython's
``PyThreadState_SetAsyncExc``), which the fit records as the point's error. A cost entry with
``upper`` terms (data of high intrinsic dimension: :mod:`tasks.costs.model`) holds a fit to those."""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time

from tasks import inputs
from tasks.costs.model import fmt_seconds, load_costs, predict
from tasks.registry import MODELS


class PointOverrun(Exception):
    """A grid point ran past its predicted time by the set factor and was stopped."""


#: the run-time guard trusts a prediction for data at most this many times wider (D, the widest
#: view) than the widest data its cost entry was measured on: most entries were measured on 3-D
#: data, and terms without D (GLLE's) under-predict 50-D data several-fold (bench/README.md, atlas)
WIDTH_MARGIN = 2.0


def within_measured_width(entry_name: str, dims: list[int]) -> bool:
    """Whether data of ``dims`` (one width per view) is within ``WIDTH_MARGIN`` times the widest
    data the cost entry ``entry_name`` was measured on."""
    measured = load_costs()["models"].get(entry_name, {}).get("measured", [])
    widest = max((float(m["d"]) for m in measured), default=0.0)
    return max(dims) <= WIDTH_MARGIN * widest


def point_limit(key: str, options: dict, point: dict, data_path: str, n_generations: int = 0):
    """(seconds a grid point may run, its predicted seconds): ``overrun.factor`` x the prediction
    (the entry's ``upper`` one where it has it: see :mod:`tasks.costs.model`), at least
    ``overrun.min_seconds``; None where there is no prediction to hold the fit to (no cost
    data for the model's regime, data wider than its measurements allow: see
    ``within_measured_width``, or the data cannot be read: the fit reports that itself)."""
    try:
        spec = MODELS[key]
        data = inputs.load_data(data_path)  # cached per process: the fit reads the same
        if spec.multiview:
            n, dims = data["views"][0].shape[0], [v.shape[1] for v in data["views"]]
        else:
            n, dims = data["Y"].shape[0], [data["Y"].shape[1]]
        p = predict(key, spec.constructor_args(point, options), n, dims, n_generations)
    except Exception:
        return None
    if p is None or not within_measured_width(p.entry, dims):
        return None
    ov = load_costs().get("overrun", {})
    held = p.seconds if p.upper_seconds is None else p.upper_seconds
    return max(float(ov.get("factor", 4.0)) * held, float(ov.get("min_seconds", 300.0))), held


def point_guard(key: str, options: dict, point: dict, data_path: str, n_generations: int = 0):
    """:func:`overrun_guard` for one grid point of a sweep (tasks.point.run_point)."""
    return overrun_guard(point_limit(key, options, point, data_path, n_generations), f"{key} at {point}")


def _set_async_exc(tid: int, exc) -> None:
    """Raise ``exc`` (an exception class) in thread ``tid`` at its next Python operation; None
    withdraws one not yet raised. (CPython's C API; no argtypes set on the shared function.)"""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(tid), None if exc is None else ctypes.py_object(exc)
    )


@contextlib.contextmanager
def overrun_guard(limit, what: str):
    """Stop the code inside once it has used ``limit`` = (limit seconds, predicted seconds) of CPU
    time (this process's, the unit of the predictions: a loaded machine's slower wall clock does not
    stop a fit), or ten times that of wall time (a fit that hangs): a watcher raises
    :class:`PointOverrun` in this thread, delivered between Python operations (a single long
    numerical call finishes first). ``limit`` None: no stop. A stop that fires as the code ends is
    withdrawn before this returns (never raised after it)."""
    if limit is None:
        yield
        return
    seconds, predicted = limit
    message = (
        f"{what} stopped after {fmt_seconds(seconds)} of CPU time, past "
        f"{seconds / max(predicted, 1e-9):.1f}x its predicted {fmt_seconds(predicted)} (tasks/costs; "
        "on a slower machine run `python -m tasks.costs calibrate`)"
    )
    # the exception class the watcher raises (CPython instantiates it with no arguments)
    stop = type(
        "PointOverrun", (PointOverrun,), {"__init__": lambda self, *a: PointOverrun.__init__(self, message)}
    )
    tid = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}
    ended = threading.Event()
    cpu0, wall0 = time.process_time(), time.perf_counter()

    def watch():
        while not ended.wait(min(1.0, max(seconds / 20, 0.005))):
            if time.process_time() - cpu0 > seconds or time.perf_counter() - wall0 > 10 * seconds:
                with lock:
                    if not state["done"]:
                        state["fired"] = True
                        _set_async_exc(tid, stop)
                return

    watcher = threading.Thread(target=watch, daemon=True, name="overrun-guard")
    try:  # a stop that fires while the watcher starts (a tiny limit) is raised from inside too
        watcher.start()
        yield
    finally:
        ended.set()
        with lock:
            state["done"] = True
            if state["fired"]:  # a stop not yet delivered is withdrawn (NULL clears it)
                _set_async_exc(tid, None)
