"""Which grid points carry GLLE's diagnostics (paper 001's generations and covariance-scale study:
tasks.registry.DIAGNOSTICS), and which must get them after a sweep's selection.

Each diagnostic is an eigensolve as costly as the fit's own embedding, and no metric that chooses
a setting reads them, so a sweep computes them where they are looked at: for the setting it
chooses (``extras="chosen"``, the default: after every point finished, :func:`extras_todo` names
the chosen points that lack them and tasks.point.add_extras computes them) or at every grid point
(``extras="all"``). A grown or resumed store whose choice moved gets them for its new chosen
point; an earlier chosen point keeps its own, flagged.

The group's per-point ``has_extras`` (tasks.registry.EXTRAS_FLAG) says which points carry them:
1 where computed, 0 where the point was fitted without them (their arrays NaN there). A store
written before the flag (NaN) computed them at every finished point: there a point carries them
where its generations hold numbers."""

from __future__ import annotations

import numpy as np
import xarray as xr

from tasks.registry import EXTRAS_FLAG, ModelSpec
from tasks.results.selection import model_groups, select
from tasks.store import STATUS_DONE, open_results


def carries_extras(ds: xr.Dataset) -> xr.DataArray | None:
    """Per grid point of one model group (its sweep dimensions), whether the point carries the
    diagnostics; None for a group that holds none (another model, or a sweep run with
    ``n_generations=0``)."""
    if "generations" not in ds:
        return None
    status = ds["status"]
    done = status.values == STATUS_DONE
    flag = ds[EXTRAS_FLAG].values if EXTRAS_FLAG in ds else np.full(status.shape, np.nan)
    out = done & (flag == 1)
    for idx in zip(*np.nonzero(done & ~np.isfinite(flag))):  # written before the flag: look at the numbers
        first = ds["generations"].isel(dict(zip(status.dims, idx))).isel(generation=0, point=0, component=0)
        out[idx] = bool(np.isfinite(float(first)))
    return xr.DataArray(out, coords={d: ds[d] for d in status.dims}, dims=status.dims, name=EXTRAS_FLAG)


def extras_settings(ds: xr.Dataset) -> list[dict] | None:
    """The settings (sweep coordinates) of the grid points that carry the diagnostics, in store
    order; None for a group that holds none."""
    flags = carries_extras(ds)
    if flags is None:
        return None
    dims = flags.dims
    return [{d: ds[d].values[i].item() for d, i in zip(dims, idx)} for idx in zip(*np.nonzero(flags.values))]


def extras_todo(store, specs: list[ModelSpec], everywhere: bool = False) -> list[tuple]:
    """The finished grid points of ``specs`` that should carry the diagnostics and do not, as
    (spec, index in store order, setting) triples: each group's chosen setting (as ``select`` and
    ``export`` choose it), or with ``everywhere`` every finished point (``extras="all"`` on a store
    whose points were fitted without them)."""
    # read once, unchecked: the sweep verified the store before its points ran (select reads the
    # data beside it through the tree's source)
    tree = open_results(store, check=False)
    groups = model_groups(tree)
    out = []
    for spec in specs:
        ds = groups.get(spec.key)
        flags = None if ds is None else carries_extras(ds)
        if flags is None:
            continue
        dims = flags.dims
        if everywhere:
            cells = zip(*np.nonzero((ds["status"].values == STATUS_DONE) & ~flags.values))
        else:
            setting = select(tree, spec.key)["setting"]
            if setting is None:
                continue
            idx = tuple(int(np.nonzero(ds[d].values == setting[d])[0][0]) for d in dims)
            cells = [] if flags.values[idx] else [idx]
        for idx in cells:
            idx = tuple(int(i) for i in idx)
            out.append((spec, idx, {d: ds[d].values[i].item() for d, i in zip(dims, idx)}))
    return out
