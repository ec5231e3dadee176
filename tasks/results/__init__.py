"""Results of a sweep, by job: :mod:`~tasks.results.selection` (open a store, the chosen setting of
each model, the summary), :mod:`~tasks.results.state` (is the store complete),
:mod:`~tasks.results.userfile` (the user's own .h5ad / .h5mu file) and
:mod:`~tasks.results.export` (AnnData / MuData, in memory or written to a file).

The user's Python API is the package ``embed_sweep`` (``from embed_sweep import open_store, select,
to_anndata``). The names this module held before it became a package still import from here, with
a DeprecationWarning naming the new import; ``tasks.results.export`` is the export module (its
function is ``embed_sweep.export``)."""

from __future__ import annotations

import importlib
import warnings

#: the user's API: its public home is ``embed_sweep``
_PUBLIC = {"open_store": "selection", "select": "selection", "to_anndata": "export"}
#: the other names of the former module, by the sub-module that holds them now
_MOVED = {
    **dict.fromkeys(
        (
            "GEODESIC_MAX_POINTS",
            "GEODESIC_NEIGHBORS",
            "QUALITY",
            "best_setting",
            "criterion_of",
            "geodesic_agreement",
            "model_groups",
            "parse_setting",
            "quality_grid",
            "summary_rows",
        ),
        "selection",
    ),
    **dict.fromkeys(("check_complete", "partial_note", "write_state"), "state"),
    **dict.fromkeys(("KEY_ADDED", "UNS_KEY", "describe_keys"), "export"),
}


def __getattr__(name: str):
    """A name of the former ``tasks.results`` module, with a DeprecationWarning naming its new import."""
    if name in _PUBLIC:
        where, new = f"tasks.results.{_PUBLIC[name]}", f"from embed_sweep import {name}"
    elif name in _MOVED:
        where = f"tasks.results.{_MOVED[name]}"
        new = f"from {where} import {name}"
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"`from tasks.results import {name}` is deprecated; use `{new}`", DeprecationWarning, stacklevel=2
    )
    return getattr(importlib.import_module(where), name)
