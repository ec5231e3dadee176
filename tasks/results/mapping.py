"""New cells mapped onto a finished sweep (``embed-sweep map``), as plain Python: the plan and its
refusals, the query read through ``run``'s data path with its genes matched by ``var_names`` and
the reference's stored preprocessing applied (never refitted), a chunk of cells through a fitted
model (``map_chunk``: one Dask task of the flow ``embed-sweep-map``), the labels transferred in the
reference cells' embedding, and a copy of the user's query file written.

No batch correction: a query measured differently lands where its values put it; the mapping score
``(score_samples - median) / MAD`` of the reference cells' own scores says how well the reference
represents it (0: a typical reference cell; higher = better represented).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import zarr

from lvmcore.checks import MISSING_LABEL
from lvmcore.data import preprocess as pp
from lvmcore.data import read_var
from lvmcore.data.sources.h5ad import resolve_matrix
from lvmcore.data.sources.hdf5 import h5mu_modalities, obsm_keys, read_obs
from tasks.results.export import aside_name
from tasks.results.reference import (
    reference_model,
    reference_var_names,
    reference_views,
    reference_widths,
)
from tasks.results.selection import model_groups, open_store, parse_setting, select
from tasks.results.state import check_complete
from tasks.results.userfile import existing_keys
from tasks.store.integrity import existing_store

#: the neighbours of a query cell among the reference cells whose labels vote (distance-weighted)
MAP_NEIGHBORS = 15
#: the uns key of a map's record
UNS_KEY = "embed_sweep_map"
#: what --fill-missing accepts
FILL_MISSING = ("zeros",)
#: cells per Dask task of the flow (the last chunk is smaller)
CHUNK_CELLS = 2000
#: rows of the query matrix read and preprocessed at a time
READ_ROWS = 8192
REFIT = "embed-sweep run ... --refit-models (the sweep's command with --refit-models)"


# --- the plan: every refusal before any server starts ---------------------------------------------


def plan_map(
    store,
    dataset,
    to,
    models=None,
    setting=None,
    predict=None,
    fill_missing=None,
    *,
    overwrite: bool = False,
    replace_file: bool = False,
) -> dict:
    """The map's plan, a JSON-able dict, or a ValueError (one line, naming the fix) for a store
    without models, an unknown model or setting, a query of another width or lacking reference
    genes (without ``fill_missing="zeros"``), a damaged model array, ``predict`` on a model that
    cannot predict or naming a modality the reference lacks, an output that would replace a file
    or a key of the user's unasked. Reads metadata, the models and the query's var / obs only,
    and scores the training cells where a model's store keeps no reference scores."""
    from tasks.sweep_plan import data_source  # the sweep's plan module: only where a map is planned

    path = existing_store(store)
    check_complete(path, False)
    if fill_missing is not None and fill_missing not in FILL_MISSING:
        raise ValueError(f"--fill-missing {fill_missing!r}: the one choice is 'zeros'")
    src, opts = data_source(dataset)
    ref = reference_views(path)
    groups = model_groups(open_store(path))
    keys = [m for m in (models.split(",") if isinstance(models, str) else models or []) if m]
    unknown = [m for m in keys if m not in groups]
    if unknown:
        raise ValueError(f"models {unknown} are not in {path}; it holds {sorted(groups)}")
    named = parse_setting(setting)
    query = plan_query(ref, src, opts, fill_missing, predict)
    if predict is not None:
        names = [v["name"] for v in ref["views"]]
        if predict not in names:
            raise ValueError(
                f"--predict {predict!r}: the reference has no such modality; its modalities: {names}"
            )
        keys = keys or [m for m in groups if m.startswith("mrd")]
    elif query["missing_views"]:
        miss = query["missing_views"]
        raise ValueError(
            f"{src} lacks the reference's modalities {miss}; pass --predict {miss[0]} (an MRD model "
            "predicts a missing modality), or give a query with every modality"
        )
    check_widths(path, ref, query)
    # the reference views the query is observed in: MRD standardises its scores by training rows
    # scored on the same views
    observed = tuple(i for i, v in enumerate(ref["views"]) if v["name"] not in query["missing_views"])
    keys = keys or list(groups)
    chosen = {}
    for m in keys:
        s = select(path, m, named)
        if s["setting"] is None:
            chosen[m] = {"status": s["status"]}
            continue
        setting_m = {k: (float(v) if isinstance(v, float) else int(v)) for k, v in s["setting"].items()}
        est = reference_model(str(path), m, json.dumps(setting_m, sort_keys=True), views=observed)
        if predict is not None and not hasattr(est, "predict"):
            raise ValueError(
                f"--predict {predict}: model {m} cannot predict a modality (MRD can); name an MRD "
                "model with --model, or leave --predict out"
            )
        # the reference scores travel with the plan: the chunks' workers do not score the training
        # cells again (a Newton solve per cell, per process)
        chosen[m] = {"setting": setting_m, "class": type(est).__name__, "reference": est.score_reference_}
    if not any("setting" in c for c in chosen.values()):
        raise ValueError(f"no model of {path} has a finished grid point to map onto: {chosen}")
    out = check_output(to, query, list(chosen), ref["label_column"], predict, overwrite, replace_file)
    return {
        "store": str(path),
        "source": [src, opts],
        "to": str(to),
        "models": chosen,
        "predict": predict,
        "fill_missing": fill_missing,
        "query": query,
        "reference": {"kind": ref["kind"], "fitted": ref["fitted"], "label_column": ref["label_column"]},
        "replace": out,
        "replace_file": bool(replace_file),
    }


def plan_query(ref: dict, src, opts: dict, fill_missing, predict) -> dict:
    """How each reference view is read from the query: ``{"path", "kind", "n", "obs_names",
    "views": {name: {"group", "use_rep", "layer", "columns" (the query's column of each reference
    gene, -1: filled), "dropped", "filled", "width"}}, "missing_views", "notes"}``."""
    s = str(src)
    kind = Path(s).suffix.lower().lstrip(".")
    if ref["kind"] in ("h5ad", "h5mu") and kind != ref["kind"]:
        raise ValueError(
            f"--dataset {s}: the reference sweep read a .{ref['kind']} file, so the query must be one too "
            f"(its genes are matched by var_names)"
        )
    if kind not in ("h5ad", "h5mu"):
        return {"path": s, "options": opts, "kind": "other", "views": {}, "missing_views": [], "notes": []}
    if not Path(s).is_file():
        raise ValueError(f"--dataset {s}: no such file")
    mods = h5mu_modalities(s) if kind == "h5mu" else ["X"]
    views, missing, notes = {}, [], []
    for v in ref["views"]:
        if kind == "h5mu" and v["name"] not in mods:
            missing.append(v["name"])
            continue
        views[v["name"]] = _plan_view(s, v, fill_missing, notes)
    names = read_obs(s).index.astype(str).to_numpy()
    return {
        "path": str(Path(s).resolve()),
        "options": opts,
        "kind": kind,
        "n": int(len(names)),
        "views": views,
        "missing_views": missing,
        "notes": notes,
    }


def _plan_view(path: str, v: dict, fill_missing, notes: list) -> dict:
    where = f"{path}" + (f" (modality {v['name']})" if v["group"] else "")
    o = {"use_rep": v["use_rep"], "layer": v["layer"]}
    try:
        m = resolve_matrix(path, v["group"], o, where)
    except ValueError as e:
        if v["use_rep"] != "X":
            raise ValueError(
                f"{where}: the reference was fitted on obsm[{v['use_rep']!r}], which the query lacks "
                f"(obsm keys: {obsm_keys(path, v['group'])}); give the query that key, holding the "
                "reference's coordinates"
            ) from e
        raise
    out = {
        "group": v["group"],
        "use_rep": v["use_rep"],
        "layer": v["layer"],
        "columns": None,
        "dropped": 0,
        "filled": 0,
        "width": int(m.shape[1]),
    }
    if v["use_rep"] != "X":
        notes.append(
            f"obsm[{v['use_rep']!r}] of the query is used as it is: it must hold the reference's "
            "coordinates (the same PCA or integration applied to the query), not a PCA of its own"
        )
    if v["var_names"] is None:
        return out
    ref_genes = pd.Index([str(g) for g in v["var_names"]])
    var = read_var(path, v["group"])
    have = pd.Index(var.index.astype(str)) if var is not None else pd.Index([])
    cols = have.get_indexer(ref_genes)
    filled, dropped = int((cols < 0).sum()), int(len(have) - (cols >= 0).sum())
    if filled and fill_missing != "zeros":
        eg = [str(g) for g in ref_genes[cols < 0][:3]]
        raise ValueError(
            f"{where} lacks {filled} of the reference's {len(ref_genes)} genes (e.g. {eg}); pass "
            "--fill-missing zeros to fill them with zeros"
        )
    out.update(columns=cols.tolist(), dropped=dropped, filled=filled, width=len(ref_genes))
    return out


def check_widths(store, ref: dict, query: dict) -> None:
    """A query of another width than the reference's fitted matrix: refused, naming both."""
    want = reference_widths(store)
    if query["kind"] == "other":
        from lvmcore.data import describe  # the loaders: only for a query that is not an AnnData file

        src, opts = query["path"], query["options"]
        have = {"Y": int(describe(src, **opts)["sizes"]["feature"])}
    else:
        pca = {v["name"]: v["preprocess"] for v in ref["views"]}
        have = {n: int((pca[n] or {}).get("pca") or v["width"]) for n, v in query["views"].items()}
    for name, width in have.items():
        if name in want and width != want[name]:
            what = "the query" if name in ("X", "Y") else f"the query's modality {name}"
            raise ValueError(
                f"{what} has {width} columns and the reference's models were fitted on {want[name]}; "
                "give data of the reference's features (an .h5ad / .h5mu query is matched by var_names)"
            )


def check_output(
    to, query: dict, models: list, label_column, predict, overwrite: bool, replace_file: bool
) -> dict:
    """The keys of the user's query file that the map writes and the file has already:
    ``{"obsm": [...], "obs": [...], "uns": [...]}``, refused unless ``overwrite``; an existing
    ``to`` refused unless ``replace_file`` (moved aside, never deleted), as ``export`` does."""
    out = Path(to)
    want = f".{query['kind']}" if query["kind"] in ("h5ad", "h5mu") else ".h5ad"
    if out.suffix.lower() != want:
        raise ValueError(f"--to {to!r}: the file name must end in {want} (the query is a {want} file)")
    if query["kind"] in ("h5ad", "h5mu") and out.resolve() == Path(query["path"]).resolve():
        raise ValueError(f"--to {to}: that is the query file; name a new file (map writes a copy)")
    if out.is_dir():
        raise ValueError(f"--to {to}: that is a folder; name a file (FILE{want})")
    if out.exists() and not replace_file:
        raise ValueError(
            f"--to {to}: that file exists; name a new file, or pass --replace-file to move it aside "
            "(renamed, never deleted)"
        )
    keys = output_keys(models, label_column, predict, query["kind"])
    if query["kind"] not in ("h5ad", "h5mu"):
        return {"obsm": [], "obs": [], "uns": []}
    have_obsm, have_uns = existing_keys(query["path"])
    have_obs = set(read_obs(query["path"]).columns.astype(str))
    found = {
        "obsm": sorted(k for k in keys["obsm"] if k in have_obsm),
        "obs": sorted(k for k in keys["obs"] if k in have_obs),
        "uns": [UNS_KEY] if UNS_KEY in have_uns else [],
    }
    if any(found.values()) and not overwrite:
        said = " and ".join(f"{k} {v}" for k, v in found.items() if v)
        raise ValueError(
            f"{query['path']} already has {said}, which the map would replace; pass --overwrite to "
            "replace them"
        )
    return found


def output_keys(models, label_column, predict, kind) -> dict:
    obsm, obs = [], []
    for m in models:
        obsm += [f"X_{m}", f"X_{m}_var"]
        obs.append(f"{m}_mapping_score")
        if label_column:
            obs += [f"{label_column}_{m}", f"{label_column}_{m}_confidence"]
    if predict is not None and kind != "h5mu":
        obsm += [f"X_{predict}_mean", f"X_{predict}_var"]
    return {"obsm": obsm, "obs": obs}


# --- the query read: genes matched, the reference's preprocessing applied -------------------------


def read_query(plan: dict) -> dict:
    """``{"views": {name: (N, D) float64 in the space the reference fitted}, "obs_names"}`` of
    the planned query. Genes are matched by var_names (missing ones zeros where planned so);
    normalisation, log and the PCA are the reference's (its target sum, mean and loadings)."""
    q = plan["query"]
    ref = {v["name"]: v for v in reference_views(plan["store"])["views"]}
    if q["kind"] == "other":
        from lvmcore.data import load  # the loaders: only for a query that is not an AnnData file

        src, opts = plan["source"]
        data = load(src, **opts)  # read whole as ``run`` reads it, no preprocessing
        return {"views": {"X": data["Y"]}, "obs_names": None, "list": data["views"]}
    views = {}
    for name, v in q["views"].items():
        m = resolve_matrix(q["path"], v["group"], {"use_rep": v["use_rep"], "layer": v["layer"]}, q["path"])
        parts = [
            preprocessed_block(m.read(a, min(a + READ_ROWS, q["n"])), v, ref[name], a)
            for a in range(0, q["n"], READ_ROWS)
        ]
        views[name] = np.vstack(parts) if parts else np.zeros((0, v["width"]))
    return {"views": views, "obs_names": read_obs(q["path"]).index.astype(str).to_numpy()}


def preprocessed_block(block, v: dict, ref: dict, first_row: int) -> np.ndarray:
    """One row block of the query in the reference's fitted space."""
    import scipy.sparse as sp

    cols = v["columns"]
    if cols is not None:
        cols = np.asarray(cols)
        block = block.tocsr() if sp.issparse(block) else np.asarray(block, dtype=np.float64)
        take = block[:, np.maximum(cols, 0)]
        if (cols < 0).any():
            take = take.tolil() if sp.issparse(take) else take.copy()
            take[:, np.flatnonzero(cols < 0)] = 0.0
            take = take.tocsr() if sp.issparse(take) else take
        block = take
    settings = ref.get("preprocess")
    if settings:
        block = pp.transform_block(block, settings, ref.get("target_sum"), "the query", first_row)
        pca = ref.get("pca")
        if settings.get("pca") is not None:
            if pca is None:
                raise ValueError(f"the reference's PCA loadings are not in the store; add them with {REFIT}")
            if pca.get("columns") is not None:
                block = block[:, np.asarray(pca["columns"])]
            comp = np.asarray(pca["components"], dtype=np.float64)
            dense = block @ comp.T
            dense = np.asarray(dense.todense() if sp.issparse(dense) else dense)
            return dense - np.asarray(pca["mean"], dtype=np.float64) @ comp.T
    return block.toarray() if sp.issparse(block) else np.asarray(block, dtype=np.float64)


def model_input(plan: dict, read: dict, model: str):
    """What ``model`` takes: MRD its views (a dict by view index, the observed ones), the others
    the fitted matrix (the views concatenated, or the one the reference fitted)."""
    views, order = read["views"], list(plan["query"]["views"]) or ["X"]
    ref = plan["reference"]
    names = [v["name"] for v in reference_views(plan["store"])["views"]]
    if plan["models"][model].get("class") == "MRD":
        if plan["query"]["kind"] == "other":
            return dict(enumerate(read["list"]))
        return {names.index(n): views[n] for n in order}
    if ref["fitted"] == "concat" and len(names) > 1:
        return np.hstack([views[n] for n in names])
    return views[ref["fitted"]] if ref["fitted"] in views else views[order[0]]


# --- one chunk of cells: the work of a Dask task --------------------------------------------------


def map_chunk(
    store: str, model: str, setting: dict, Y, predict_view: int | None = None, score_reference=None
) -> dict:
    """One chunk of query cells mapped by the fitted ``model``: ``{"mean", "var" (or None),
    "score" (the mapping score), "predicted": (mean, var) or None}``. Each cell is its own problem
    (the estimator contract), so a cell's answer does not depend on the chunk it is in.
    ``score_reference``: the model's reference scores from the plan (else computed here)."""
    ref = None if score_reference is None else json.dumps(score_reference, sort_keys=True)
    est = reference_model(str(store), model, json.dumps(setting, sort_keys=True), ref)
    return map_cells(est, Y, predict_view)


def map_cells(est, Y, predict_view: int | None = None) -> dict:
    """``map_chunk`` for an estimator in hand (the library's test surface): one solve of each
    cell's q(x*) (``map_points``) gives its place, variance and mapping score, and MRD's
    prediction of ``predict_view`` from it. A model that cannot score raises."""
    mean, var, score = est.map_points(Y)
    predicted = None if predict_view is None else est.predict(Y, int(predict_view), at=(mean, var))
    return {
        "mean": np.asarray(mean, dtype=np.float64),
        "var": None if var is None else np.asarray(var, dtype=np.float64),
        "score": np.asarray(score, dtype=np.float64),
        "predicted": None if predicted is None else tuple(np.asarray(p, dtype=np.float64) for p in predicted),
    }


def chunks(n: int, size: int = CHUNK_CELLS) -> list[tuple[int, int]]:
    return [(a, min(a + size, n)) for a in range(0, n, max(1, int(size)))]


def rows_of(Y, a: int, b: int):
    return {k: v[a:b] for k, v in Y.items()} if isinstance(Y, dict) else Y[a:b]


def join(parts: list[dict]) -> dict:
    """The chunks' answers, in order, as one."""
    out = {
        "mean": np.vstack([p["mean"] for p in parts]),
        "score": np.concatenate([p["score"] for p in parts]),
    }
    out["var"] = None if parts[0]["var"] is None else np.vstack([p["var"] for p in parts])
    out["predicted"] = None
    if parts[0]["predicted"] is not None:
        out["predicted"] = tuple(np.vstack([p["predicted"][i] for p in parts]) for i in range(2))
    return out


# --- labels transferred from the reference cells' embedding ---------------------------------------


def transfer_labels(ref_X, ref_codes, names, query_X, k: int = MAP_NEIGHBORS):
    """kNN label transfer: each query cell's ``k`` nearest labelled reference cells in the
    embedding vote with weight 1 / distance (a cell at distance 0 takes its label alone); returns
    (labels as a pandas Categorical of ``names``, the winning label's share of the weighted vote).
    Per cell: a cell's answer depends only on the reference and itself."""
    from sklearn.neighbors import NearestNeighbors  # seconds to import: only where labels are transferred

    keep = ref_codes != MISSING_LABEL
    X, codes = np.asarray(ref_X)[keep], ref_codes[keep]
    k = min(k, len(X))
    dist, idx = NearestNeighbors(n_neighbors=k).fit(X).kneighbors(np.asarray(query_X))
    zero = dist <= 0
    w = np.where(zero.any(axis=1, keepdims=True), zero.astype(float), 1.0 / np.maximum(dist, 1e-300))
    votes = np.zeros((len(query_X), len(names)))
    np.add.at(votes, (np.repeat(np.arange(len(query_X)), k), codes[idx].ravel()), w.ravel())
    win = votes.argmax(axis=1)
    conf = votes[np.arange(len(win)), win] / votes.sum(axis=1)
    return pd.Categorical.from_codes(win, categories=list(names)), conf


# --- the output: a copy of the user's query file ---------------------------------------------------


def write_output(plan: dict, results: dict, labels: dict, uns: dict) -> dict:
    """The query file copied to ``plan["to"]`` with ``obsm`` X_<model> / X_<model>_var, ``obs``
    <model>_mapping_score and the transferred labels, ``uns["embed_sweep_map"]``, and a predicted
    modality (.h5mu: a modality of the reference's var_names, X the mean, layers mean and var;
    .h5ad: obsm X_<MODALITY>_mean / _var). Written beside the target and renamed into place."""
    import anndata as ad  # seconds to import: only where a file is written

    q, out = plan["query"], Path(plan["to"])
    if q["kind"] == "h5mu":
        import mudata  # only for a MuData query

        obj = mudata.read_h5mu(q["path"])
    elif q["kind"] == "h5ad":
        obj = ad.read_h5ad(q["path"])
    else:
        n = len(next(iter(results.values()))["mean"])
        obj = ad.AnnData(obs=pd.DataFrame(index=[str(i) for i in range(n)]))
    for m, r in results.items():
        obj.obsm[f"X_{m}"] = r["mean"]
        if r["var"] is not None:
            obj.obsm[f"X_{m}_var"] = r["var"]
        obj.obs[f"{m}_mapping_score"] = r["score"]
        if m in labels:
            col, cat, conf = labels[m]
            obj.obs[col] = pd.Categorical(np.asarray(cat), categories=cat.categories)
            obj.obs[f"{col}_confidence"] = conf
        if r["predicted"] is not None:
            mean, var = r["predicted"]
            name = plan["predict"]
            if q["kind"] == "h5mu":
                var_names = reference_var_names(plan["store"], name, mean.shape[1])
                mod = ad.AnnData(
                    X=mean, obs=pd.DataFrame(index=obj.obs_names), var=pd.DataFrame(index=var_names)
                )
                mod.layers["mean"], mod.layers["var"] = mean, var
                obj.mod[name] = mod
                obj.update()
            else:
                obj.obsm[f"X_{name}_mean"], obj.obsm[f"X_{name}_var"] = mean, var
    obj.uns[UNS_KEY] = uns
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.writing-{os.getpid()}")
    aside = None
    try:
        obj.write(tmp) if q["kind"] == "h5mu" else obj.write_h5ad(tmp)
        if out.exists() and plan["replace_file"]:
            aside = aside_name(out)
            out.rename(aside)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"path": str(out), "n_obs": int(obj.n_obs), "moved_aside": None if aside is None else str(aside)}


def provenance(plan: dict) -> dict:
    """``uns["embed_sweep_map"]``: the reference store and its fingerprint, each model's setting,
    the genes dropped and filled per view, the label column and k, the predicted modality."""
    root = zarr.open_group(plan["store"], mode="r")
    q = plan["query"]
    out = {
        "store": plan["store"],
        "sweep_id": str(root.attrs.get("sweep_id", "")),
        "identity": str(root.attrs.get("identity", "")),
        "code_version": str(root.attrs.get("code_version", "")),
        "query": str(q.get("path", "")),
        "models": {m: {"setting": c["setting"]} for m, c in plan["models"].items() if "setting" in c},
        "genes_dropped": {n: int(v["dropped"]) for n, v in q["views"].items()},
        "genes_filled": {n: int(v["filled"]) for n, v in q["views"].items()},
        "fill_missing": plan["fill_missing"] or "none",
        "neighbors": MAP_NEIGHBORS,
        "mapping_score": "(score_samples - reference median) / reference MAD; higher = better represented",
    }
    if plan["reference"]["label_column"]:
        out["label_column"] = str(plan["reference"]["label_column"])
    if plan["predict"] is not None:
        out["predicted"] = plan["predict"]
    return out
