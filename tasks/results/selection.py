"""Reading a result store from Python: open it as a DataTree, pick the best or a named setting per
model, summarise each model's grid. No Prefect, no Dask cluster.

Which setting is "best" depends on whether the model's bound can be compared across each sweep
dimension (``ModelSpec.bound_comparable`` in tasks.registry; the measurements behind it are the
selection study in bench/README.md). Along the dimensions where it can, the bound picks; along the
others (GLLE's and LL-LVM's k, every model's latent_dim where the likelihood grows with it,
...), the bound picks within each slice and the label-free *geodesic agreement* picks among the
slices' winners: the Spearman correlation between the embedding's distances and the shortest-path
distances of the data's kNN graph at the smallest k that connects it (Isomap's estimate of
distances along the manifold, Tenenbaum et al. 2000; a larger k short-circuits sparse rolls).
It needs neither labels nor the truth.

    >>> from embed_sweep import open_store, select
    >>> tree = open_store("results/roll.zarr")
    >>> sel = select(tree, "glle_em")          # {"setting": {...}, "criterion": ..., "metrics": {...}}
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import xarray as xr

from tasks.evaluate import poincare_distances
from tasks.inputs import load_data
from tasks.registry import MODELS, SWEEP_DIMS
from tasks.store.integrity import open_results
from tasks.store.schema import METRICS, STATUS_DONE, STATUS_FAILED

#: the geodesic agreement's data graph: the smallest k in this range that connects it (else the largest)
GEODESIC_NEIGHBORS = (3, 30)
#: pairwise and shortest-path distances are O(N^2): above this many points a fixed random subset
#: (its own kNN graph) is used
GEODESIC_MAX_POINTS = 1000
QUALITY = "geodesic_agreement"


def open_store(path) -> xr.DataTree:
    """The result store as an xarray DataTree, one child per model key (ValueError if not a store)."""
    return open_results(path)


def model_groups(tree: xr.DataTree) -> dict[str, xr.Dataset]:
    """{model key: its Dataset} for every model group of the store, in the registry's order."""
    order = {k: i for i, k in enumerate(MODELS)}
    names = sorted(
        (n for n, node in tree.children.items() if "status" in node.ds), key=lambda n: order.get(n, 99)
    )
    return {name: tree[name].ds for name in names}


def parse_setting(text: str | dict | None) -> dict:
    """``"k=8,latent_dim=2,seed=0"`` -> ``{"k": 8, "latent_dim": 2, "seed": 0}`` (ValueError on bad text)."""
    if text is None or isinstance(text, dict):
        return dict(text or {})
    out = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in SWEEP_DIMS:
            raise ValueError(
                f"setting {part!r}: write dimension=value with a dimension from {list(SWEEP_DIMS)}, "
                "e.g. k=8,latent_dim=2,seed=0"
            )
        try:
            out[name] = float(value) if name == "kappa" else int(value)
        except ValueError as e:
            raise ValueError(f"setting {part!r}: {value!r} is not a number") from e
    return out


def store_data_path(store) -> Path:
    p = Path(store)
    return p.parent / f"{p.name.removesuffix('.zarr')}.inputs" / "data.zarr"


@functools.lru_cache(maxsize=4)
def _geodesic_reference(data_path: str, stamp: float):
    """(subset, pair indices, finite mask, finite shortest-path distances) of the data at ``data_path``."""
    # loaded only where the geodesic agreement is needed (scikit-learn's import takes about a second)
    from scipy.sparse.csgraph import connected_components, shortest_path
    from sklearn.neighbors import kneighbors_graph

    Y = load_data(data_path)["Y"]
    n = len(Y)
    sel = np.arange(n)
    if n > GEODESIC_MAX_POINTS:
        sel = np.sort(np.random.default_rng(0).choice(n, GEODESIC_MAX_POINTS, replace=False))
    Y = Y[sel]  # the graph of the subset: its cost is bounded whatever n is
    lo, hi = GEODESIC_NEIGHBORS
    for k in range(min(lo, len(Y) - 1), min(hi, len(Y) - 1) + 1):
        G = kneighbors_graph(Y, k, mode="distance")
        if connected_components(G, directed=False)[0] == 1:
            break
    D = shortest_path(G, directed=False)
    iu = np.triu_indices(len(sel), k=1)
    d = D[iu]
    finite = np.isfinite(d)  # pairs in different components of the graph carry no distance
    return sel, iu, finite, d[finite]


def geodesic_agreement(data_path, X, hyperbolic: bool = False) -> float:
    """Spearman correlation between the embedding's pairwise distances (hyperbolic on the Poincare
    ball) and the data's kNN-graph geodesic distances (smallest connecting k): 1 = the embedding
    orders every pair of points as the manifold does. Label-free; comparable across every sweep
    dimension (it never looks at the model's own graph or likelihood)."""
    # loaded only where the geodesic agreement is needed (scipy.stats' import takes a while)
    from scipy.spatial.distance import pdist, squareform
    from scipy.stats import spearmanr

    p = Path(data_path)
    sel, iu, finite, dgeo = _geodesic_reference(str(p.resolve()), (p / "zarr.json").stat().st_mtime)
    X = np.asarray(X, dtype=np.float64)[sel]
    X = X[:, np.isfinite(X).all(axis=0)]
    DX = poincare_distances(X) if hyperbolic else squareform(pdist(X))
    return float(spearmanr(DX[iu][finite], dgeo)[0])


def _fmt(setting: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in setting.items())


def _cell_setting(ds: xr.DataArray | xr.Dataset, dims, idx) -> dict:
    return {d: ds[d].values[i].item() for d, i in zip(dims, idx)}


def _best_by_bound(ds: xr.Dataset) -> dict | None:
    elbo = ds["elbo"].where(ds["status"] == STATUS_DONE)
    if not np.isfinite(elbo.values).any():
        return None
    idx = np.unravel_index(int(np.nanargmax(elbo.values)), elbo.shape)
    return _cell_setting(ds, elbo.dims, idx)


def criterion_of(ds: xr.Dataset, key: str | None = None) -> dict:
    """How "best" is chosen for one model group: the sweep dimensions (with more than one value)
    along which the bound decides, and those along which the geodesic agreement decides."""
    key = key or ds.attrs.get("key")
    spec = MODELS.get(key)
    comparable = set(spec.bound_comparable) if spec is not None else {"seed"}
    varying = [d for d in ds["status"].dims if ds.sizes[d] > 1]
    by_quality = [d for d in varying if d not in comparable]
    by_bound = [d for d in varying if d in comparable]
    if not varying:
        text = "the only setting"
    elif not by_quality:
        text = f"bound across {', '.join(by_bound)}"
    else:
        text = f"{QUALITY} across {', '.join(by_quality)}" + (
            f"; bound across {', '.join(by_bound)}" if by_bound else ""
        )
    return {"by_bound": by_bound, "by_quality": by_quality, "text": text}


def best_setting(ds: xr.Dataset, store=None, key: str | None = None) -> tuple[dict | None, dict]:
    """(setting, criterion) of the best finished grid point of one model group.

    The bound picks within every slice of the dimensions where it is not comparable; the geodesic
    agreement (needs ``store`` for the data) picks among those slices' winners. Without ``store``,
    or when the data is not beside the store, the bound picks and the criterion says so."""
    crit = criterion_of(ds, key)
    if not crit["by_quality"]:
        return _best_by_bound(ds), crit
    data_path = store_data_path(store) if store is not None else None
    if data_path is None or not data_path.exists():
        crit = dict(crit, by_bound=crit["by_bound"] + crit["by_quality"], by_quality=[])
        crit["text"] = "bound (the data is not beside the store, so no geodesic agreement)"
        return _best_by_bound(ds), crit
    hyper = bool(ds.attrs.get("hyperbolic_embedding", 0))
    best, best_q = None, -np.inf
    shape = [ds.sizes[d] for d in crit["by_quality"]]
    for idx in np.ndindex(*shape):
        fixed = _cell_setting(ds, crit["by_quality"], idx)
        cand = _best_by_bound(ds.sel(fixed))
        if cand is None:
            continue
        setting = {**fixed, **cand}
        setting = {d: setting[d] for d in ds["status"].dims}
        q = geodesic_agreement(data_path, ds["embedding"].sel(setting).values, hyper)
        if q > best_q:
            best, best_q = setting, q
    crit = dict(crit, value=best_q)
    return best, crit


def quality_grid(ds: xr.Dataset, store) -> xr.DataArray | None:
    """The geodesic agreement of every finished grid point of one model group (NaN elsewhere), or
    None when the data is not beside the store."""
    data_path = store_data_path(store)
    if not data_path.exists():
        return None
    hyper = bool(ds.attrs.get("hyperbolic_embedding", 0))
    status = ds["status"]
    out = np.full(status.shape, np.nan)
    for idx in zip(*np.nonzero(status.values == STATUS_DONE)):
        cell = ds["embedding"].isel(dict(zip(status.dims, idx)))
        out[idx] = geodesic_agreement(data_path, cell.values, hyper)
    return xr.DataArray(out, coords={d: ds[d] for d in status.dims}, dims=status.dims, name=QUALITY)


def select(tree_or_store, model: str, setting: dict | str | None = None) -> dict:
    """The chosen grid point of ``model``: ``setting`` (a full or partial named setting; the
    criterion picks among what it leaves open) or the best by the model's criterion.

    Returns {"model", "setting", "criterion", "elbo", "fit_seconds", "converged" (True / False: the
    fit ended by its stopping rule or not; None in a store that did not record it), "metrics",
    "embedding", "embedding_var", "hyperbolic"}."""
    if isinstance(tree_or_store, xr.DataTree):
        # the store it was opened from (xarray keeps it as encoding["source"]): the data beside it
        # lets the same criterion choose as for a path; a tree built in memory has none
        tree, store = tree_or_store, tree_or_store.encoding.get("source")
    else:
        store, tree = tree_or_store, open_store(tree_or_store)
    groups = model_groups(tree)
    if model not in groups:
        raise ValueError(f"model {model!r} is not in this store; it holds {sorted(groups)}")
    ds = groups[model]
    named = parse_setting(setting)
    fixed = {}
    for d, v in named.items():
        if d not in ds.dims:
            continue  # a dimension this model does not sweep (k for a GP-LVM): not its concern
        values = ds[d].values.tolist()
        if v not in values:
            raise ValueError(f"{model}: {d}={v} is not in the grid; its values are {values}")
        fixed[d] = v
    sub = ds.sel(fixed) if fixed else ds
    chosen, crit = best_setting(sub, store, model)
    if fixed:
        crit = dict(crit, text=f"named ({_fmt(fixed)})" + (f"; {crit['text']}" if sub["status"].ndim else ""))
    if chosen is None:
        return {"model": model, "setting": None, "criterion": crit["text"], "status": "no finished point"}
    setting_full = {**fixed, **chosen}
    cell = ds.sel(setting_full)
    X = cell["embedding"].values
    keep = np.isfinite(X).all(axis=0)
    var = cell["embedding_var"].values[:, keep] if "embedding_var" in cell else None
    if var is not None and not np.isfinite(var).all():
        var = None
    metrics = {m: float(cell[m]) for m in METRICS if np.isfinite(float(cell[m]))}
    if "value" in crit:
        metrics[QUALITY] = float(crit["value"])
    return {
        "model": model,
        "setting": {d: setting_full[d] for d in ds["status"].dims},
        "criterion": crit["text"],
        "elbo": float(cell["elbo"]),
        "fit_seconds": float(cell["fit_seconds"]),
        "converged": _flag(cell["converged"]) if "converged" in cell else None,
        "metrics": metrics,
        "embedding": X[:, keep],
        "embedding_var": var,
        "hyperbolic": bool(ds.attrs.get("hyperbolic_embedding", 0)),
    }


def _flag(value) -> bool | None:
    v = float(value)
    return None if not np.isfinite(v) else bool(v)


def summary_rows(store) -> list[dict]:
    """One dict per model: counts (``not converged``: finished points whose fit ran out of
    iterations or whose optimiser gave up), the chosen setting, the criterion that chose it, its
    metrics."""
    tree = open_store(store)
    rows = []
    for name, ds in model_groups(tree).items():
        st = ds["status"].values
        row = {
            "model": name,
            "done": int((st == STATUS_DONE).sum()),
            "failed": int((st == STATUS_FAILED).sum()),
            "total": int(st.size),
        }
        if "converged" in ds:
            conv = ds["converged"].values[st == STATUS_DONE]
            row["not converged"] = int((conv == 0).sum())
        s = select(store, name) if row["done"] else None
        if s is not None and s["setting"] is not None:
            row["best"] = _fmt(s["setting"])
            row["chosen by"] = s["criterion"]
            row["elbo"] = s["elbo"]
            row["fit_s"] = s["fit_seconds"]
            row.update(s["metrics"])
        elif row["failed"]:
            errs = ds["error"].values[st == STATUS_FAILED]
            row["best"] = "all failed: " + str(errs.ravel()[0])[:80]
        rows.append(row)
    return rows
