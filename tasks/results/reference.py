"""The reference side of a map (``embed-sweep map``): what the reference sweep read (its views,
their genes, label column and stored preprocessing), the width each model was fitted on, its
labels, and the fitted model of a setting with its reference scores, read once per process.
:mod:`tasks.results.mapping` plans and runs a map against it."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import zarr

from lvmcore.data import label_names, source_info
from lvmcore.models._base import REFERENCE_SCORE_CELLS, LatentModel
from tasks.inputs import load_data
from tasks.results.models import load_model, read_preprocessing
from tasks.results.selection import store_data_path


def reference_views(store) -> dict:
    """What the reference sweep read: ``{"kind": "h5ad" | "h5mu" | other | None, "fitted": "concat"
    | a modality's name, "label_column", "views": [{"name", "group", "use_rep", "layer",
    "preprocess", "target_sum", "var_names" (None for an obsm representation), "pca" ({"mean",
    "components", "columns"}: the loadings, as scanpy's varm["PCs"].T, or None), "width"}]}``."""
    data_path = store_data_path(store)
    if not data_path.exists():
        raise ValueError(
            f"the ingested data of {store} is missing ({data_path}); re-run the sweep to restore it"
        )
    info = source_info(str(data_path)) or {}
    attrs = _data_attrs(data_path)
    prep = read_preprocessing(store) or {}
    kind = info.get("kind")
    opts = info.get("options") or {}
    if kind == "h5mu":
        mods = opts.get("modalities") or {m: {} for m in info.get("modalities", [])}
        # the views' order is the ingest's list (the options' keys come back sorted from JSON)
        names, fitted = list(info.get("modalities") or mods), opts.get("view", "concat")
    else:
        mods, names, fitted = {"X": opts}, ["X"], "X"
    views = []
    for name in names:
        o = mods.get(name) or {}
        p = dict(prep.get(name) or (prep if kind != "h5mu" else {}))
        view = {
            "name": name,
            "group": f"mod/{name}" if kind == "h5mu" else "",
            "use_rep": o.get("use_rep") or p.get("use_rep") or "X",
            "layer": o.get("layer") if "layer" in o else p.get("layer"),
            "preprocess": o.get("preprocess") if "preprocess" in o else p.get("preprocess"),
            "target_sum": p.get("target_sum"),
            "var_names": p.get("var_names"),
            "pca": p.get("pca"),
        }
        views.append(view)
    return {"kind": kind, "fitted": fitted, "label_column": attrs.get("label_column"), "views": views}


def _data_attrs(data_path) -> dict:
    try:
        return json.loads((Path(data_path) / "zarr.json").read_text()).get("attributes", {})
    except (OSError, ValueError):
        return {}


@functools.lru_cache(maxsize=8)
def reference_model(
    store: str, model: str, setting: str, score_reference: str | None = None, views: tuple | None = None
):
    """The fitted model of ``model`` at ``setting`` (JSON text) with its reference scores, read once
    per process; a damaged array or a store without models refused in one line (tasks.results.models).
    ``score_reference``: the scores' JSON text as the plan computed them (``plan_map``), set rather
    than computed again. ``views``: the indices of the reference views the query is observed in
    (MRD scores its training rows on those only). Scoring is announced on standard output: for the
    GP-LVMs it is a solve per training cell (minutes for some), once per process."""
    est = load_model(store, model, json.loads(setting))
    cannot = f"model {model} ({type(est).__name__}) cannot score new cells, so it gives no mapping score"
    if type(est).score_samples is LatentModel.score_samples:
        raise ValueError(f"{cannot}; leave it out with --model")
    if score_reference is not None:
        est.score_reference_ = json.loads(score_reference)
    if not getattr(est, "score_reference_", None):
        data = load_data(str(store_data_path(store)))
        mrd = type(est).__name__ == "MRD"
        train = data["views"] if mrd else data["Y"]
        n = len(train[0]) if mrd else len(train)
        print(
            f"{model}: scoring {min(n, REFERENCE_SCORE_CELLS):,} reference cells (the mapping score's "
            "median and MAD)",
            flush=True,
        )
        try:
            if mrd and views is not None:
                est.reference_score_stats(train, subsets=[views])
            else:
                est.reference_score_stats(train)
        except NotImplementedError as e:
            raise ValueError(f"{cannot} ({e}); leave it out with --model") from e
    return est


def reference_widths(store) -> dict:
    """{view name: the width the reference's models were fitted on} (its ingested views), and
    ``"Y"``: the single-view models' matrix."""
    g = zarr.open_group(str(store_data_path(store)), mode="r")
    names = [v["name"] for v in reference_views(store)["views"]]
    out = {"Y": int(g["Y"].shape[1])}
    views = [k for k in sorted(g.array_keys()) if k.startswith("view_")]
    if views and len(views) == len(names):
        out.update({n: int(g[f"view_{i}"].shape[1]) for i, n in enumerate(names)})
    elif len(names) == 1:
        out[names[0]] = out["Y"]
    return out


def reference_labels(store) -> tuple[np.ndarray | None, list[str] | None]:
    """(label codes of the reference cells, -1 none; category names) or (None, None)."""
    data_path = store_data_path(store)
    codes = load_data(str(data_path))["label"]
    if codes is None:
        return None, None
    codes = np.asarray(codes).astype(np.int64)
    names = label_names(str(data_path))
    if names is None:
        names = [str(i) for i in range(int(codes.max()) + 1 if (codes >= 0).any() else 0)]
    return codes, names


def reference_var_names(store, modality: str, width: int) -> list[str]:
    """The reference's gene names of ``modality`` (a view fitted on its genes), else placeholders."""
    for v in reference_views(store)["views"]:
        if v["name"] == modality and v["var_names"] is not None and v["pca"] is None:
            return [str(g) for g in v["var_names"]]
    return [f"{modality}_{j}" for j in range(width)]
