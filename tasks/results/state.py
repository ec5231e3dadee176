"""Whether a result store is complete: a live sweep writing it (its lock), grid points pending; the
refusal of an export of an incomplete store unless it is asked for as partial, and the line that
says what a partial export is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import zarr

from tasks.store.integrity import open_results
from tasks.store.lock import holder_alive
from tasks.store.paths import lock_path, store_path
from tasks.store.schema import STATUS_PENDING


def write_state(store) -> dict:
    """Whether the store is being written: ``{"holder": the live lock holder's {"pid", "host",
    "since"} or None, "pending": grid points not yet run, "total": grid points}``.

    The lock is the one a running sweep holds (tasks.store.store_lock); a lock left by a process
    that no longer runs is not a holder. Reading takes no lock: it never stops a sweep."""
    path = store_path(store) if not Path(store).exists() else Path(store)
    open_results(path)  # a missing path, or one that is not a result store, is refused here
    holder = None
    try:
        have = json.loads(lock_path(path).read_text() or "{}")
    except (OSError, ValueError):
        have = {}
    if have and holder_alive(have):
        holder = {k: have.get(k) for k in ("pid", "host", "since")}
    root = zarr.open_group(str(path), mode="r")
    pending = total = 0
    for key in json.loads(root.attrs.get("groups") or "null") or list(root.group_keys()):
        if key in root:
            st = np.asarray(root[key]["status"][...])
            pending += int((st == STATUS_PENDING).sum())
            total += int(st.size)
    return {"holder": holder, "pending": pending, "total": total}


def check_complete(store, partial: bool = False) -> dict:
    """The store's :func:`write_state`, refusing (ValueError) a store that a running sweep is
    writing or that has grid points pending, unless ``partial``: what is exported from it would
    be the best of the points finished so far, not of the sweep."""
    state = write_state(store)
    if partial or (state["holder"] is None and state["pending"] == 0):
        return state
    fix = "pass --partial to export the best of the points finished so far"
    h = state["holder"]
    if h is not None:
        raise ValueError(
            f"a sweep is running on {store} (pid {h['pid']} on host {h['host']}, since {h['since']}): "
            f"{state['pending']} of its {state['total']} grid points are pending; wait for it to "
            f"finish, or {fix}"
        )
    raise ValueError(
        f"{store} has {state['pending']} of its {state['total']} grid points pending (its sweep was "
        f"interrupted or grown and not run); run the sweep again to finish them, or {fix}"
    )


def partial_note(state: dict) -> str | None:
    """One line saying what a partial export is, or None for a complete store."""
    if state["holder"] is None and state["pending"] == 0:
        return None
    running = (
        f"a sweep is running on the store (pid {state['holder']['pid']}); "
        if state["holder"] is not None
        else ""
    )
    return (
        f"partial export: {running}{state['pending']} of {state['total']} grid points pending; the "
        "embeddings are the best of the points finished so far"
    )
