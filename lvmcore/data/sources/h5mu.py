"""MuData (.h5mu) files: each modality a view, planned as an AnnData's matrix
(lvmcore.data.sources.h5ad), the modalities joined on ``obs_names``.

Options (every other key refused before any work): ``modalities`` ({name: {use_rep, layer,
preprocess}}; every modality when absent, each with its ``X``), ``view`` (what single-view models
fit: ``"concat"``, the default, or a modality's name), ``label_column`` / ``color_column`` (a
column of the MuData's ``obs``, or ``"mod:column"`` of a modality's), ``max_features``. The
modalities are joined on ``obs_names`` (inner join, in the order of the first modality); the cells
each one loses are logged and recorded.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from lvmcore.checks import check_options
from lvmcore.data.sources import hdf5
from lvmcore.data.sources.base import check_width, max_features
from lvmcore.data.sources.h5ad import MATRIX_OPTIONS, matrix_view
from lvmcore.data.sources.planned import Plan, apply_labels

__all__ = ["H5MU_OPTIONS", "plan_h5mu"]

log = logging.getLogger("lvmcore.data")

H5MU_OPTIONS = ("modalities", "view", "label_column", "color_column", "max_features")


def plan_h5mu(path: Path, opts: dict) -> Plan:
    where = str(path)
    check_options(opts, H5MU_OPTIONS, f"data-set ({path.name})")
    limit = max_features(opts, where)
    names = hdf5.h5mu_modalities(str(path))
    mods = opts.get("modalities")
    if mods is None:
        mods = {m: {} for m in names}
    if isinstance(mods, list):
        mods = {m: {} for m in mods}
    if not isinstance(mods, dict) or not mods:
        raise ValueError(
            f"{where}: modalities must map modality names to options, e.g. "
            f'{{"rna": {{"use_rep": "X_pca"}}, "prot": {{}}}}, got {mods!r}'
        )
    unknown = [m for m in mods if m not in names]
    if unknown:
        raise ValueError(f"{where}: modalities {unknown} are not in the file; it has {names}")
    views, obs_by = [], {}
    for m, o in mods.items():
        o = o or {}
        if not isinstance(o, dict):
            raise ValueError(f"{where}: modality {m!r} options must be a mapping, got {o!r}")
        check_options(o, MATRIX_OPTIONS, f"modality {m!r}")
        views.append(matrix_view(m, str(path), f"mod/{m}", o, f"{where}: modality {m!r}", limit))
        obs = hdf5.read_obs(str(path), f"mod/{m}")
        if len(obs) != views[-1].matrix.shape[0]:
            raise ValueError(
                f"{where}: modality {m!r} obs has {len(obs)} rows, its matrix {views[-1].matrix.shape[0]}"
            )
        hdf5.check_unique_names(obs.index, f"{where}: modality {m!r}")
        obs_by[m] = obs
    # inner join on obs_names, in the first modality's order
    first = list(mods)[0]
    common = obs_by[first].index.astype(str)
    for m in mods:
        common = common[common.isin(obs_by[m].index.astype(str))]
    if len(common) == 0:
        raise ValueError(f"{where}: the modalities {list(mods)} share no obs_names; nothing to join")
    dropped = {}
    for v in views:
        idx = pd.Index(obs_by[v.name].index.astype(str))
        dropped[v.name] = int(len(idx) - len(common))
        rows = idx.get_indexer(common)
        if not (len(rows) == len(idx) and np.array_equal(rows, np.arange(len(idx)))):
            v.matrix = v.matrix.select(rows)
    for m, d in dropped.items():
        if d:
            log.warning(
                "%s: modality %r: %d of its cells are not in every modality and are left out", where, m, d
            )
    view = opts.get("view", "concat")
    if view != "concat" and view not in mods:
        raise ValueError(
            f"{where}: view must be 'concat' or one of the modalities {list(mods)}, got {view!r}"
        )
    applied = {"modalities": {v.name: v.options for v in views}, "view": view}
    if "max_features" in opts:
        applied["max_features"] = limit
    plan = Plan("h5mu", [str(path.resolve())], applied, views, view if len(views) > 1 else views[0].name)
    plan.modalities, plan.dropped, plan.obs_names = [v.name for v in views], dropped, common.to_numpy()
    if view == "concat" and len(views) > 1:
        check_width(sum(v.width for v in views), limit, f"{where}: the concatenation of {list(mods)}")
    glob = hdf5.read_obs(str(path)) if opts.get("label_column") or opts.get("color_column") else None

    def lookup(col, what):
        if not isinstance(col, str):
            raise ValueError(f"{where}: {what} must be an obs column's name, got {col!r}")
        if glob is not None and col in glob.columns:
            return glob[col].reindex(common)
        mod, _, c = col.partition(":")
        if c and mod in obs_by and c in obs_by[mod].columns:
            s = obs_by[mod][c]
            return s.set_axis(s.index.astype(str)).reindex(common)
        cols = list(glob.columns) if glob is not None else []
        have = [f"{m}:{col}" for m in obs_by if col in obs_by[m].columns]
        hint = f"; did you mean {have[0]!r}?" if have else ""
        raise ValueError(
            f"{where}: {what} {col!r} is neither a column of the MuData's obs ({cols}) nor 'modality:column' "
            f"of a modality's obs{hint}"
        )

    apply_labels(plan, None, opts, where, lookup)
    return plan
