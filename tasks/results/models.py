"""The fitted models a finished sweep kept, back as estimators (:func:`load_model`), and the
preprocessing that made the matrix they were fitted on (:func:`read_preprocessing`).

    >>> from embed_sweep import load_model
    >>> est = load_model("results/pbmc.zarr", "bgplvm_rbf")          # the chosen setting
    >>> X_new, var = est.transform(Y_new, return_var=True)

A model is rebuilt from plain arrays and JSON params (tasks.store.models; no pickle), by the
class its params name among lvmcore's public estimators (lvmcore.models.persist); the families
that keep the training rows or the kNN graph out of the store (GLLE, LL-LVM) get them back from the
store's fingerprinted inputs."""

from __future__ import annotations

import json

import numpy as np

from lvmcore.data import read_preprocessing as read_kept
from lvmcore.data import source_info
from lvmcore.models.persist import model_from_arrays
from tasks.inputs import load_data, load_graph
from tasks.results.selection import select, store_data_path
from tasks.store import (
    MODEL_BYTES,
    MODELS_SCHEMA,
    POINTS_FIX,
    ModelArrayError,
    check_metadata,
    existing_store,
    has_model,
    inputs_dir,
    open_root,
    point_name,
    prune_models,
    read_model,
    stored_model_ids,
    write_store_attrs,
)

#: how a store without models gets them (the refusal's fix)
REFIT_FIX = "embed-sweep run ... --refit-models"
#: the fix for a store's missing inputs
RESTORE = "re-run the sweep to restore it"


def no_models(path) -> str:
    """The one-line refusal of a store written before models were kept."""
    return f"{path} holds no fitted models (written before models were kept); add them with: {REFIT_FIX}"


def holds_models(path, model: str | None = None) -> bool:
    """Whether the store (or its group ``model``) keeps any fitted model."""
    root = open_root(path)
    if int(root.attrs.get("schema_version", 1)) < MODELS_SCHEMA:
        return False
    keys = [model] if model else json.loads(root.attrs.get("groups", "[]"))
    return any(stored_model_ids(path, k) for k in keys)


def training_inputs(store, needs) -> dict:
    """The store's fingerprinted inputs a family needs back (``data``: the training rows as
    fitted; ``graph``: the kNN indices at the sweep's largest k, which the family cuts to its own
    ``n_neighbors``), each refused if it no longer matches the data the sweep recorded."""
    data_path = store_data_path(store)
    out = {}
    if not needs:
        return out
    if not data_path.exists():
        raise ValueError(f"the ingested data of {store} is missing ({data_path}); {RESTORE}")
    try:
        want = json.loads(open_root(store).attrs.get("identity", "{}")).get("data_fingerprint")
    except ValueError:
        want = None
    have = _data_attrs(data_path).get("fingerprint")
    if want and have and want != have:
        raise ValueError(
            f"the ingested data of {store} ({data_path}) is not the data its models were fitted on "
            f"(fingerprint {have}, the store recorded {want}); re-run the sweep to restore it"
        )
    if "data" in needs:
        out["data"] = load_data(str(data_path))["Y"]
    if "graph" in needs:
        graph_path = inputs_dir(store) / "graph.zarr"
        if not graph_path.exists():
            raise ValueError(f"the kNN graph of {store} is missing ({graph_path}); {RESTORE}")
        out["graph"] = load_graph(str(graph_path))[0]
    return out


def load_model(store, model: str, setting=None):
    """The fitted estimator of ``model`` (a group key of the store, e.g. ``bgplvm_rbf``) at
    ``setting`` (``"k=8,latent_dim=2,seed=0"``, a dict, or None: the chosen setting, as ``export``
    chooses it; a partial setting lets the criterion choose among the rest). Every output equals
    the estimator's that the sweep fitted (``transform``, ``predict``, ``inverse_transform``).

    Refused (ValueError, one line): a store written before models were kept (naming
    ``--refit-models``), a model or setting the store lacks, a point whose model was not kept,
    and a damaged model array (named, with the fix)."""
    path = existing_store(store)
    check_metadata(path)
    if not holds_models(path):
        raise ValueError(no_models(path))
    chosen = select(str(path), model, setting)
    if chosen["setting"] is None:
        raise ValueError(f"{model} of {path} has no finished grid point to load ({chosen['status']})")
    point = chosen["setting"]
    where = point_name(model, point)
    if not has_model(path, model, point):
        root = open_root(path)
        g = root[model]
        kept = _model_bytes(g, point)
        if kept == 0:
            raise ValueError(
                f"{path} keeps no model for {where} (only the chosen setting's were kept: --keep-models "
                f"chosen); load the chosen setting, or keep every model with: {REFIT_FIX}"
            )
        raise ValueError(
            f"{path} holds no fitted model for {where} (written before models were kept); add them "
            f"with: {REFIT_FIX}"
        )
    try:
        arrays, params = read_model(path, model, point)
    except ModelArrayError as e:
        raise ValueError(f"{where}: its fitted model is damaged: {e}; {POINTS_FIX}") from None
    except LookupError as e:
        raise ValueError(f"{where}: {e}") from None
    return model_from_arrays(arrays, params, **training_inputs(path, params.get("needs_inputs", [])))


def _model_bytes(group, point: dict) -> float:
    """The point's recorded ``model_bytes`` (NaN where the store did not record one)."""
    if MODEL_BYTES not in group:
        return float("nan")
    arr = group[MODEL_BYTES]
    dims = list(arr.metadata.dimension_names or [])
    idx = []
    for d in dims:
        values = [v.item() for v in group[d][...]]
        idx.append(values.index(point[d]))
    return float(arr[tuple(idx)])


def read_preprocessing(store) -> dict:
    """What made the matrix the store's models were fitted on, per view of the ingested data (an
    .h5ad's one view is ``"X"``, a MuData's are its modalities): ``{view: {"use_rep", "layer",
    "preprocess" (the settings: normalize_total, log1p, pca, ...), "target_sum", "var_names"
    (the view's genes, None where its columns are not genes), "pca" ({"mean" (D,), "components"
    (k, D): the loadings, as scanpy's varm["PCs"].T, "columns": the genes of mask_var among
    var_names, None for every gene} or None)}}``; empty for data that is not an AnnData / MuData
    file (a named data set, .npy, .csv)."""
    data_path = store_data_path(existing_store(store))
    info = source_info(str(data_path)) or {}
    kind = info.get("kind")
    if kind not in ("h5ad", "h5mu"):
        return {}
    attrs = _data_attrs(data_path)
    try:
        recorded = json.loads(attrs.get("preprocess") or "{}")
    except ValueError:
        recorded = {}
    arrays = read_kept(str(data_path))
    opts = info.get("options") or {}
    if kind == "h5mu":
        views = {m: (o or {}) for m, o in (opts.get("modalities") or {}).items()}
        views = views or {m: {} for m in info.get("modalities", [])}
    else:
        views = {"X": opts}
    out = {}
    for name, o in views.items():
        rec, kept = recorded.get(name) or {}, arrays.get(name) or {}
        settings = o.get("preprocess") or rec.get("settings")
        pca = None
        if "components" in kept:
            cols = kept.get("columns")
            pca = {
                "mean": kept["mean"],
                "components": kept["components"],
                "columns": None if cols is None else cols.tolist(),
            }
        out[name] = {
            "use_rep": o.get("use_rep") or "X",
            "layer": o.get("layer"),
            "preprocess": settings,
            "target_sum": rec.get("target_sum"),
            "var_names": kept.get("var_names"),
            "pca": pca,
        }
    return out


def _data_attrs(data_path) -> dict:
    try:
        return json.loads((data_path / "zarr.json").read_text()).get("attributes", {})
    except (OSError, ValueError):
        return {}


def keep_chosen_models(store) -> dict:
    """``--keep-models chosen``: after the sweep's selection, remove every stored model but the
    chosen setting's of each model group (as ``export`` chooses); returns ``{model: removed}``."""
    path = existing_store(store)
    root = open_root(path)
    out = {}
    for key in json.loads(root.attrs.get("groups", "[]")):
        if key not in root:
            continue
        chosen = select(str(path), key)
        out[key] = prune_models(path, key, chosen["setting"])
    write_store_attrs(path, {"keep_models": "chosen"})
    return out


def model_sizes(store) -> dict:
    """``{model: (bytes on disk per kept model, the median over its points; how many points keep
    one)}`` for the model groups that keep any (the report's "model MiB/point")."""
    path = existing_store(store)
    root = open_root(path)
    out = {}
    for key in json.loads(root.attrs.get("groups", "[]")):
        if key not in root or MODEL_BYTES not in root[key]:
            continue
        sizes = np.asarray(root[key][MODEL_BYTES][...], dtype=np.float64).ravel()
        kept = sizes[np.isfinite(sizes) & (sizes > 0)]
        if kept.size:
            out[key] = (float(np.median(kept)), int(kept.size))
    return out
