"""Reading a result store from Python: open it as a DataTree, pick the best or a named setting per
model, hand the chosen embeddings to AnnData (scanpy's format). No Prefect, no Dask cluster.

Which setting is "best" depends on whether the model's bound can be compared across each sweep
dimension (``ModelSpec.bound_comparable`` in tasks.registry; the measurements behind it are the
selection study in bench/README.md). Along the dimensions where it can, the bound picks; along the
others (GLLE's and LL-LVM's k, every model's latent_dim where the likelihood grows with it,
...), the bound picks within each slice and the label-free *geodesic agreement* picks among the
slices' winners: the Spearman correlation between the embedding's distances and the shortest-path
distances of the data's kNN graph at the smallest k that connects it (Isomap's estimate of
distances along the manifold, Tenenbaum et al. 2000; a larger k short-circuits sparse rolls).
It needs neither labels nor the truth.

    >>> from tasks.results import open_store, select, to_anndata
    >>> tree = open_store("results/roll.zarr")
    >>> sel = select(tree, "glle_em")          # {"setting": {...}, "criterion": ..., "metrics": {...}}
    >>> adata = to_anndata("results/roll.zarr")  # obsm["X_glle_em"], obsm["X_bgplvm_rbf_var"], ...
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import numpy as np
import xarray as xr

from tasks.registry import MODELS, SWEEP_DIMS
from tasks.store import METRICS, STATUS_DONE, open_results

#: the geodesic agreement's data graph: the smallest k in this range that connects it (else the largest)
GEODESIC_NEIGHBORS = (3, 30)
#: pairwise and shortest-path distances are O(N^2): above this many points a fixed random subset
#: (its own kNN graph) is used
GEODESIC_MAX_POINTS = 1000
QUALITY = "geodesic_agreement"
#: the uns key of an export's record; with key_added NAME: "embed_sweep_NAME" (and obsm "X_<model>_NAME")
UNS_KEY = "embed_sweep"
#: what --key-added may be: it becomes part of HDF5 names, so no "/" and no spaces
KEY_ADDED = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


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


def _store_data_path(store) -> Path:
    p = Path(store)
    return p.parent / f"{p.name.removesuffix('.zarr')}.inputs" / "data.zarr"


@functools.lru_cache(maxsize=4)
def _geodesic_reference(data_path: str, stamp: float):
    """(subset, pair indices, finite mask, finite shortest-path distances) of the data at ``data_path``."""
    from scipy.sparse.csgraph import connected_components, shortest_path
    from sklearn.neighbors import kneighbors_graph

    from tasks.inputs import load_data

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
    from scipy.spatial.distance import pdist, squareform
    from scipy.stats import spearmanr

    from tasks.evaluate import poincare_distances

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
    data_path = _store_data_path(store) if store is not None else None
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
    data_path = _store_data_path(store)
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


def write_state(store) -> dict:
    """Whether the store is being written: ``{"holder": the live lock holder's {"pid", "host",
    "since"} or None, "pending": grid points not yet run, "total": grid points}``.

    The lock is the one a running sweep holds (tasks.store.store_lock); a lock left by a process
    that no longer runs is not a holder. Reading takes no lock: it never stops a sweep."""
    import zarr

    from tasks.store import STATUS_PENDING, holder_alive, lock_path, store_path

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


def _chosen(store, models, setting, key_added=None):
    """(tree, obsm {"X_<model>": (N, q), "X_<model>_var": ...}, {model: its uns entry}) of each
    model's chosen setting; with ``key_added`` NAME the keys are ``X_<model>_NAME`` and
    ``X_<model>_NAME_var``. Each model's entry names its obsm key(s)."""
    tree = open_store(store)
    groups = model_groups(tree)
    if models is None:
        models = list(groups)
    elif isinstance(models, str):
        models = [m for m in models.split(",") if m]
    unknown = [m for m in models if m not in groups]
    if unknown:
        raise ValueError(f"models {unknown} are not in {store}; it holds {sorted(groups)}")
    obsm, chosen = {}, {}
    for m in models:
        s = select(store, m, setting)
        if s["setting"] is None:
            chosen[m] = {"status": s["status"], "criterion": s["criterion"]}
            continue
        key = _obsm_key(m, key_added)
        obsm[key] = s["embedding"]
        if s["embedding_var"] is not None:
            obsm[f"{key}_var"] = s["embedding_var"]
        chosen[m] = {
            "obsm_key": key,
            "setting": {k: (float(v) if isinstance(v, float) else int(v)) for k, v in s["setting"].items()},
            "criterion": s["criterion"],
            "elbo": s["elbo"],
            "fit_seconds": s["fit_seconds"],
            "metrics": s["metrics"],
            "hyperbolic": int(s["hyperbolic"]),
        }
    return tree, obsm, chosen


def _obsm_key(model: str, key_added: str | None) -> str:
    return f"X_{model}" if key_added is None else f"X_{model}_{key_added}"


def _uns_key(key_added: str | None) -> str:
    return UNS_KEY if key_added is None else f"{UNS_KEY}_{key_added}"


def _check_key_added(key_added) -> str | None:
    """``key_added`` as given, or ValueError where it cannot be part of an obsm / uns key."""
    if key_added is None:
        return None
    if not isinstance(key_added, str) or not KEY_ADDED.fullmatch(key_added):
        raise ValueError(
            f"--key-added {key_added!r}: a name of letters, digits, '_', '.' and '-' (starting with a "
            "letter or digit) is needed; it names obsm['X_<model>_NAME'] and uns['embed_sweep_NAME'], "
            "e.g. --key-added run2"
        )
    return key_added


def _uns_value(v):
    """A provenance value as uns holds it: a mapping as a mapping (its None entries left out: unset,
    as scanpy leaves unset parameters out of ``uns[...]["params"]``), str, number and bool as they
    are, a list of strings or of numbers as an array; anything else as JSON text."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, dict):
        return {
            str(k): _uns_value(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0])) if x is not None
        }
    if isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)) and (
        all(isinstance(x, str) for x in v)
        or all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    ):
        return list(v)
    return json.dumps(v, sort_keys=True, default=str)


def _provenance(tree, store, chosen, source=None, state=None, dropped_names=None, key_added=None) -> dict:
    """``uns["embed_sweep"]``: the store, the sweep's identity, each model's choice (and obsm key);
    ``key_added`` where given; where the embeddings went into the user's own file, that file, its
    fingerprint and the options the sweep applied to it (a mapping) and, for a MuData, the cells
    its join on obs_names dropped (per modality, and the file's cells without an embedding by
    name); a partial export's counts."""
    attrs = dict(tree.attrs)
    out = {
        "store": str(Path(store).resolve()),
        "sweep_id": str(attrs.get("sweep_id", "")),
        "code_version": str(attrs.get("code_version", "")),
        "identity": str(attrs.get("identity", "")),
        "dataset": str(attrs.get("dataset", "")),
        "models": chosen,
    }
    if key_added is not None:
        out["key_added"] = key_added
    if source is not None:
        out["source"] = {
            "path": source["path"],
            "fingerprint": source["fingerprint"],
            "sweep_fingerprint": source["sweep_fingerprint"],
            "options": _uns_value(dict(source.get("options") or {})),
        }
        if source["kind"] == "h5mu":
            out["source"]["dropped"] = _uns_value(dict(source.get("dropped") or {}))
            names = [] if dropped_names is None else [str(n) for n in dropped_names]
            out["source"]["dropped_obs_names"] = np.asarray(names, dtype=object)
    if state is not None and partial_note(state):
        out["partial"] = {"pending": int(state["pending"]), "total": int(state["total"])}
    return out


def _source_of(store, source=None) -> dict | None:
    """The user's own .h5ad / .h5mu file the store's data came from, checked: ``{"kind", "path",
    "fingerprint" (now), "sweep_fingerprint" (what the sweep read), "options", "dropped",
    "obs_names" (the store's cells)}``; None for any other data.

    The sweep's source must be where it was and unchanged; ``source`` (``--from``) names another
    copy, or the file as it is now (its cells must be the store's, :func:`_rows_of`)."""
    from lvmcore.data import file_fingerprint, obs_names, source_info

    data_path = _store_data_path(store)
    info = source_info(str(data_path)) if data_path.exists() else None
    if info is None or info.get("kind") not in ("h5ad", "h5mu"):
        if source is not None:
            what = f"a .{info['kind']} file" if info else "a named data set"
            raise ValueError(
                f"--from {source}: the data of {store} came from {what}, not an AnnData or MuData "
                "file; leave --from out (the export writes a new .h5ad)"
            )
        return None
    recorded = str(info["path"])
    if source is None:
        path = Path(recorded)
        if not path.is_file():
            raise ValueError(
                f"the file the sweep read, {recorded}, is missing; pass --from FILE naming a copy of it "
                "(its cells must be the sweep's)"
            )
    else:
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"--from {source}: no such file")
        if path.suffix.lower() != f".{info['kind']}":
            kind = info["kind"]
            raise ValueError(
                f"--from {source}: the sweep read a .{kind} file ({recorded}); name a .{kind} file"
            )
    now = file_fingerprint(str(path))
    if source is None and now != info["fingerprint"]:
        raise ValueError(
            f"{recorded} changed since the sweep read it (fingerprint {now}, the sweep read "
            f"{info['fingerprint']}); pass --from FILE naming the file the sweep read, or this one to "
            "write into it as it is now (its cells must be the sweep's)"
        )
    names = obs_names(str(data_path))
    return {
        "kind": info["kind"],
        "path": str(path),
        "fingerprint": now,
        "sweep_fingerprint": str(info["fingerprint"]),
        "options": info.get("options") or {},
        "dropped": info.get("dropped") or {},
        "obs_names": np.asarray(names, dtype=object) if names is not None else None,
    }


def _file_obs_names(path: str) -> np.ndarray:
    """The obs_names of an .h5ad file or of a .h5mu file's MuData (its root ``obs``)."""
    import warnings

    from lvmcore.data.anndata_io import read_obs

    with warnings.catch_warnings():  # an old-format file's warnings are about parts not read here
        warnings.simplefilter("ignore")
        obs = read_obs(path)
    return np.asarray(obs.index.astype(str), dtype=object)


def _rows_of(src: dict) -> tuple[np.ndarray, int, np.ndarray]:
    """(for each cell of the file, its row in the store or -1; the number of cells of the file not
    in the store; their names, in the file's order).

    The store's cells must all be in the file. An .h5ad file must hold exactly them; a .h5mu
    file's MuData may also hold cells the sweep's join on obs_names dropped (those not in every
    modality it used): their rows of the embeddings are NaN. Anything else is another data set
    and is refused (ValueError)."""
    file_names = _file_obs_names(src["path"])
    mine = src["obs_names"]
    where = f"{src['path']}"
    if mine is None:
        raise ValueError(f"the store does not record the names of its cells; cannot match them to {where}")
    if len(file_names) == len(mine) and (file_names == mine).all():
        return np.arange(len(mine)), 0, file_names[:0]
    pos = {n: i for i, n in enumerate(mine)}
    if len(pos) != len(mine) or len(set(file_names)) != len(file_names):
        raise ValueError(f"{where}: its cells are not the sweep's and their obs_names are not unique")
    rows = np.array([pos.get(n, -1) for n in file_names], dtype=np.int64)
    missing = len(mine) - int((rows >= 0).sum())
    extra = int((rows < 0).sum())
    if missing:
        absent = [n for n in mine if n not in set(file_names)][:3]
        raise ValueError(
            f"{where} lacks {missing} of the sweep's {len(mine)} cells (e.g. {absent}): it is not the "
            "data the sweep ran on; pass --from FILE naming that file"
        )
    if extra and not (src["kind"] == "h5mu" and sum(int(v) for v in _counts(src["dropped"])) > 0):
        others = [n for n, r in zip(file_names, rows) if r < 0][:3]
        raise ValueError(
            f"{where} has {extra} cells the sweep did not fit (e.g. {others}): it is not the data the "
            "sweep ran on; pass --from FILE naming that file"
        )
    return rows, extra, file_names[rows < 0]


def _counts(dropped) -> list:
    """The cell counts in a source's ``dropped`` record (a count per modality, or nested)."""
    if isinstance(dropped, dict):
        return [c for v in dropped.values() for c in _counts(v)]
    if isinstance(dropped, (int, np.integer)):
        return [int(dropped)]
    if isinstance(dropped, (list, tuple)):
        return [len(dropped)]
    return []


def _on_rows(obsm: dict, rows: np.ndarray) -> dict:
    """The embeddings (store order) laid out on the file's cells: NaN where a cell is not in the store."""
    out = {}
    for k, X in obsm.items():
        Z = np.full((len(rows), X.shape[1]), np.nan)
        Z[rows >= 0] = X[rows[rows >= 0]]
        out[k] = Z
    return out


def to_anndata(
    store,
    models: list[str] | str | None = None,
    setting: dict | str | None = None,
    *,
    source=None,
    partial: bool = False,
    key_added: str | None = None,
    overwrite: bool = False,
):
    """The store's chosen embeddings in an AnnData: one ``obsm["X_<model>"]`` per model at its
    chosen setting (``obsm["X_<model>_var"]``: posterior marginal variances where the model has
    them) and the sweep's provenance and each setting's metrics in ``uns["embed_sweep"]``; with
    ``key_added`` NAME, ``obsm["X_<model>_NAME"]``, ``obsm["X_<model>_NAME_var"]`` and
    ``uns["embed_sweep_NAME"]``.

    Data that came from an .h5ad / .h5mu file: the user's own object, read from that file (or
    ``source``, another copy of it; checked as by :func:`export`) with the embeddings added (a
    MuData for .h5mu: the embeddings in its own ``obsm``). A key the object already has is refused
    (ValueError) unless ``overwrite``, as by :func:`export`. It is read into memory here;
    ``export`` writes a copy of the file without ever loading its matrices.

    Any other data: ``X`` the ingested data (the first view's for multi-view data; every view in
    ``obsm["view_<v>"]``), the labels under their column's name (``label`` for a named set's) as
    category names, missing ones NaN, the colour column likewise (``manifold_parameter`` for a named
    set's), and the cells' names where the file had them. A store being written is refused unless
    ``partial`` (:func:`check_complete`)."""
    import anndata as ad

    key_added = _check_key_added(key_added)
    state = check_complete(store, partial)
    src = _source_of(store, source)
    rows, _, dropped = _rows_of(src) if src is not None else (None, 0, None)
    tree, obsm, chosen = _chosen(store, models, setting, key_added)
    uns_key = _uns_key(key_added)
    if src is not None:
        _clashes(src["path"], obsm, uns_key, chosen, key_added, overwrite)
    uns = _provenance(tree, store, chosen, src, state, dropped, key_added)
    if src is None:
        return _new_anndata(store, obsm, uns, uns_key)
    if src["kind"] == "h5mu":
        import mudata

        obj = mudata.read_h5mu(src["path"])
    else:
        obj = ad.read_h5ad(src["path"])
    for k, v in _on_rows(obsm, rows).items():
        obj.obsm[k] = v
    obj.uns[uns_key] = uns
    return obj


def _existing_keys(path) -> tuple[set[str], set[str]]:
    """(obsm keys, uns keys) of an .h5ad file, or of a .h5mu file's MuData (its root ``obsm`` and
    ``uns``), read from the file's HDF5 tree (nothing loaded; an old-format obsm table's columns)."""
    import h5py

    with h5py.File(path, "r") as f:
        obsm, uns = f.get("obsm"), f.get("uns")
        if isinstance(obsm, h5py.Dataset):  # old format: one table, a column per key
            have_obsm = set(obsm.dtype.names or ())
        else:
            have_obsm = set(obsm.keys()) if isinstance(obsm, h5py.Group) else set()
        have_uns = set(uns.keys()) if isinstance(uns, h5py.Group) else set()
    return have_obsm, have_uns


def _clashes(path, obsm: dict, uns_key: str, chosen: dict, key_added, overwrite: bool) -> dict:
    """The keys of the export (``obsm``'s, ``uns_key``) that the user's file ``path`` already has,
    ``{"obsm": [...], "uns": [...]}``: refused (ValueError, naming them and both fixes) unless
    ``overwrite``, which replaces them."""
    have_obsm, have_uns = _existing_keys(path)
    found = {
        "obsm": sorted(k for k in obsm if k in have_obsm),
        "uns": [uns_key] if uns_key in have_uns else [],
    }
    if overwrite or not (found["obsm"] or found["uns"]):
        return found
    model = next((m for m, info in chosen.items() if "obsm_key" in info), None)
    named = ([f"obsm['X_{model}_NAME']"] if model is not None else []) + [f"uns['{UNS_KEY}_NAME']"]
    other = f" (a name other than {key_added!r})" if key_added is not None else ""
    raise ValueError(
        f"{path} already has {describe_keys(found)}, which the export would replace; pass --key-added "
        f"NAME{other} to add {' and '.join(named)} beside them, or --overwrite to replace them"
    )


def describe_keys(keys: dict) -> str:
    """``{"obsm": [...], "uns": [...]}`` as "obsm [...] and uns [...]" (the non-empty ones)."""
    return " and ".join(f"{kind} {keys[kind]}" for kind in ("obsm", "uns") if keys.get(kind))


def _new_anndata(store, obsm: dict, uns: dict, uns_key: str = UNS_KEY):
    """An AnnData of the store's ingested data (for data that did not come from an AnnData or
    MuData file) with the embeddings in ``obsm`` and ``uns[uns_key]``."""
    import anndata as ad
    import pandas as pd

    from lvmcore.data import color_names
    from tasks.inputs import load_data

    data_path = _store_data_path(store)
    if not data_path.exists():
        raise ValueError(
            f"the ingested data of {store} is missing ({data_path}); re-run the sweep to restore it"
        )
    data = load_data(str(data_path))
    attrs = _data_attrs(data_path)
    names = _names_of(data_path)
    obs = pd.DataFrame(index=names if names is not None else [str(i) for i in range(len(data["Y"]))])
    if data["label"] is not None:
        obs[str(attrs.get("label_column") or "label")] = _label_categorical(data_path, data["label"])
    if data["color"] is not None:
        col = attrs.get("color_column")
        color = np.asarray(data["color"], dtype=np.float64)
        cnames = color_names(str(data_path))
        if col and cnames is not None:
            codes = np.where(np.isfinite(color), color, -1).astype(np.int64)
            obs[str(col)] = pd.Categorical.from_codes(codes, categories=cnames)
        else:
            obs[str(col or "manifold_parameter")] = color
    extra = {}
    if data["truth"] is not None and np.asarray(data["truth"]).ndim == 2:
        extra["truth"] = np.asarray(data["truth"], dtype=np.float64)
    for v, Yv in enumerate(data["views"]):
        extra[f"view_{v}"] = np.asarray(Yv, dtype=np.float64)
    return ad.AnnData(
        X=np.asarray(data["Y"], dtype=np.float64), obs=obs, obsm={**extra, **obsm}, uns={uns_key: uns}
    )


def _data_attrs(data_path) -> dict:
    try:
        return json.loads((Path(data_path) / "zarr.json").read_text()).get("attributes", {})
    except (OSError, ValueError):
        return {}


def _names_of(data_path) -> list[str] | None:
    from lvmcore.data import obs_names

    names = obs_names(str(data_path))
    return None if names is None else [str(n) for n in names]


def _label_categorical(data_path, codes):
    """Label codes (MISSING_LABEL: none) as a pandas Categorical of the data's category names."""
    import pandas as pd

    from lvmcore.checks import MISSING_LABEL
    from lvmcore.data import label_names

    codes = np.asarray(codes).astype(np.int64)
    names = label_names(str(data_path))
    if names is None:  # a data set without names: its codes are its names
        names = [str(i) for i in range(int(codes.max()) + 1 if (codes >= 0).any() else 0)]
    return pd.Categorical.from_codes(np.where(codes == MISSING_LABEL, -1, codes), categories=list(names))


def _write_into_copy(src: dict, path: Path, obsm: dict, uns_key: str, uns: dict, replace: dict) -> None:
    """Copy the user's file to ``path`` byte for byte (its matrices are never read) and add
    ``obsm`` entries and ``uns[uns_key]`` with h5py and anndata's element writer; the keys in
    ``replace`` (``{"obsm": [...], "uns": [...]}``, from :func:`_clashes` with overwrite) are
    deleted first, and no other: another key of the export found in the copy (the file changed
    since it was checked) is refused. An old (pre-0.7) file's obsm table is rewritten as the
    current format's group, its entries kept."""
    import shutil

    import h5py
    from anndata.io import read_elem, write_elem

    shutil.copyfile(src["path"], path)
    with h5py.File(path, "r+") as f:
        if "obsm" in f and isinstance(f["obsm"], h5py.Dataset):  # old format: one table
            table = read_elem(f["obsm"])
            del f["obsm"]
            write_elem(f, "obsm", {k: np.ascontiguousarray(table[k]) for k in table.dtype.names})
        if "obsm" not in f:
            write_elem(f, "obsm", {})
        taken = [k for k in obsm if k in f["obsm"] and k not in replace["obsm"]]
        taken += [uns_key] if "uns" in f and uns_key in f["uns"] and uns_key not in replace["uns"] else []
        if taken:
            raise ValueError(f"{src['path']} changed while it was exported: it now has {taken}; export again")
        for k in replace["obsm"]:
            del f["obsm"][k]
        for k, v in obsm.items():
            write_elem(f["obsm"], k, v)
        if "uns" not in f:
            write_elem(f, "uns", {})
        for k in replace["uns"]:
            del f["uns"][k]
        write_elem(f["uns"], uns_key, uns)


def export(
    store,
    path,
    models=None,
    setting=None,
    *,
    source=None,
    partial: bool = False,
    key_added: str | None = None,
    overwrite: bool = False,
) -> dict:
    """Write the store's chosen embeddings to ``path`` and say what was written: ``{"path",
    "n_obs", "obsm" (keys written), "uns_key", "added" and "replaced" ({"obsm": [...], "uns":
    [...]}: the keys new to the file, and those of the user's file replaced with ``overwrite``),
    "models" (uns entries), "into" (the user's file copied, or None), "cells_without" (cells of
    that file with no embedding), "partial" (a line, or None)}``.

    Data from an .h5ad / .h5mu file: ``path`` (same suffix) is a copy of that file (obs, var,
    names, layers, uns, existing obsm, X as they are, never loaded) with ``obsm["X_<model>"]``,
    ``obsm["X_<model>_var"]`` and ``uns["embed_sweep"]`` added (with ``key_added`` NAME:
    ``obsm["X_<model>_NAME"]``, ``obsm["X_<model>_NAME_var"]``, ``uns["embed_sweep_NAME"]``).
    The file must be where the sweep read it and unchanged, or ``source`` names a copy (or the
    changed file: its cells must be the store's). Other data: :func:`to_anndata`'s AnnData.
    Refused before writing anything: a store being written (unless ``partial``), a missing or
    changed source, another file's cells, a key the file already has (unless ``overwrite``: then
    it is replaced, and said so)."""
    out = Path(path)
    key_added = _check_key_added(key_added)
    state = check_complete(store, partial)
    src = _source_of(store, source)
    want = f".{src['kind']}" if src is not None else ".h5ad"
    if out.suffix.lower() != want:
        why = f"the sweep's data came from a {want} file" if src is not None else "an AnnData file"
        raise ValueError(f"--to {str(path)!r}: the file name must end in {want} ({why})")
    if src is not None and out.resolve() == Path(src["path"]).resolve():
        raise ValueError(
            f"--to {path}: that is the file the sweep read; name a new file (the export writes a copy "
            "and never changes the original)"
        )
    rows, extra, dropped = _rows_of(src) if src is not None else (None, 0, None)
    tree, obsm, chosen = _chosen(store, models, setting, key_added)
    uns_key = _uns_key(key_added)
    replaced = {"obsm": [], "uns": []}
    if src is not None:
        replaced = _clashes(src["path"], obsm, uns_key, chosen, key_added, overwrite)
    uns = _provenance(tree, store, chosen, src, state, dropped, key_added)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.writing-{os.getpid()}")
    try:
        if src is not None:
            _write_into_copy(src, tmp, _on_rows(obsm, rows), uns_key, uns, replaced)
            n_obs = len(rows)
        else:
            adata = _new_anndata(store, obsm, uns, uns_key)
            adata.write_h5ad(tmp)
            n_obs = adata.n_obs
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return {
        "path": str(out),
        "n_obs": n_obs,
        "obsm": sorted(obsm),
        "uns_key": uns_key,
        "added": {
            "obsm": sorted(k for k in obsm if k not in replaced["obsm"]),
            "uns": [k for k in [uns_key] if k not in replaced["uns"]],
        },
        "replaced": replaced,
        "models": chosen,
        "into": None if src is None else src["path"],
        "cells_without": extra,
        "partial": partial_note(state),
    }


def _flag(value) -> bool | None:
    v = float(value)
    return None if not np.isfinite(v) else bool(v)


def summary_rows(store) -> list[dict]:
    """One dict per model: counts (``not converged``: finished points whose fit ran out of
    iterations or whose optimiser gave up), the chosen setting, the criterion that chose it, its
    metrics."""
    from tasks.store import STATUS_FAILED

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
