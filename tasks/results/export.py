"""The chosen embeddings of a result store handed to AnnData (scanpy's format) or MuData: in memory
(``to_anndata``) or written to a file (``export``), which never replaces a file of the user's
unasked: an existing ``--to`` is refused unless it is an earlier export of the same data (then the
new keys are added to it) or ``replace_file`` moves it aside.

    >>> from embed_sweep import export, to_anndata
    >>> adata = to_anndata("results/roll.zarr")  # obsm["X_glle_em"], obsm["X_bgplvm_rbf_var"], ...
    >>> export("results/roll.zarr", "roll.h5ad")
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import zarr

from lvmcore.checks import MISSING_LABEL
from lvmcore.data import color_names, label_names, obs_names
from tasks.inputs import load_data
from tasks.registry import EXTRAS_FLAG
from tasks.results.extras import carries_extras
from tasks.results.selection import model_groups, open_store, select, store_data_path
from tasks.results.state import check_complete, partial_note
from tasks.results.userfile import (
    existing_keys,
    export_records,
    file_obs_names,
    on_rows,
    recorded_source,
    rows_of,
    source_of,
    write_into_copy,
)
from tasks.store.integrity import existing_store

#: the uns key of an export's record; with key_added NAME: "embed_sweep_NAME" (and obsm "X_<model>_NAME")
UNS_KEY = "embed_sweep"
#: what --key-added may be: it becomes part of HDF5 names, so no "/" and no spaces
KEY_ADDED = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


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
        flags = carries_extras(groups[m])  # GLLE: whether the chosen point carries paper 001's diagnostics
        if flags is not None:
            chosen[m][EXTRAS_FLAG] = int(bool(flags.sel(s["setting"])))
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
    import anndata as ad  # loaded only where an AnnData is built (about a second)

    key_added = _check_key_added(key_added)
    state = check_complete(store, partial)
    src = source_of(store, source)
    rows, _, dropped = rows_of(src) if src is not None else (None, 0, None)
    tree, obsm, chosen = _chosen(store, models, setting, key_added)
    uns_key = _uns_key(key_added)
    if src is not None:
        _clashes(src["path"], obsm, uns_key, chosen, key_added, overwrite)
    uns = _provenance(tree, store, chosen, src, state, dropped, key_added)
    if src is None:
        return _new_anndata(store, obsm, uns, uns_key)
    if src["kind"] == "h5mu":
        import mudata  # loaded only for a MuData's export

        obj = mudata.read_h5mu(src["path"])
    else:
        obj = ad.read_h5ad(src["path"])
    for k, v in on_rows(obsm, rows).items():
        obj.obsm[k] = v
    obj.uns[uns_key] = uns
    return obj


def _clashes(path, obsm: dict, uns_key: str, chosen: dict, key_added, overwrite: bool) -> dict:
    """The keys of the export (``obsm``'s, ``uns_key``) that the user's file ``path`` already has,
    ``{"obsm": [...], "uns": [...]}``: refused (ValueError, naming them and both fixes) unless
    ``overwrite``, which replaces them."""
    have_obsm, have_uns = existing_keys(path)
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
    import anndata as ad  # loaded only where an AnnData is built (about a second)

    data_path = store_data_path(store)
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
    names = obs_names(str(data_path))
    return None if names is None else [str(n) for n in names]


def _label_categorical(data_path, codes):
    """Label codes (MISSING_LABEL: none) as a pandas Categorical of the data's category names."""
    codes = np.asarray(codes).astype(np.int64)
    names = label_names(str(data_path))
    if names is None:  # a data set without names: its codes are its names
        names = [str(i) for i in range(int(codes.max()) + 1 if (codes >= 0).any() else 0)]
    return pd.Categorical.from_codes(np.where(codes == MISSING_LABEL, -1, codes), categories=list(names))


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
    replace_file: bool = False,
) -> dict:
    """Write the store's chosen embeddings to ``path`` and say what was written: ``{"path",
    "n_obs", "obsm" (keys written), "uns_key", "added" and "replaced" ({"obsm": [...], "uns":
    [...]}: the keys new to the file, and those of the user's file replaced with ``overwrite``),
    "models" (uns entries), "into" (the user's file copied, or None), "earlier" (True where the keys
    were added to an earlier export at ``path``), "moved_aside" (where ``replace_file`` moved the
    file that was at ``path``, or None), "cells_without" (cells of that file with no embedding),
    "partial" (a line, or None)}``.

    Data from an .h5ad / .h5mu file: ``path`` (same suffix) is a copy of that file (obs, var,
    names, layers, uns, existing obsm, X as they are, never loaded) with ``obsm["X_<model>"]``,
    ``obsm["X_<model>_var"]`` and ``uns["embed_sweep"]`` added (with ``key_added`` NAME:
    ``obsm["X_<model>_NAME"]``, ``obsm["X_<model>_NAME_var"]``, ``uns["embed_sweep_NAME"]``).
    The file must be where the sweep read it and unchanged, or ``source`` names a copy (or the
    changed file: its cells must be the store's). Other data: :func:`to_anndata`'s AnnData.

    A file of the user's is never replaced unasked. Where ``path`` exists and is an earlier export
    of the same data (its ``uns`` records an export of the same source: the user's file the sweep
    read, by its fingerprint, or for other data the same data fingerprint; and its cells are the
    store's), the keys are added to it and everything in it is kept. Any other existing file is
    refused unless ``replace_file``, which moves it aside (renamed, never deleted) and writes the
    export in its place. Refused before writing anything: a store being written (unless
    ``partial``), a missing or changed source, another file's cells, a key the file already has
    (unless ``overwrite``: then it is replaced, and said so)."""
    out = Path(path)
    key_added = _check_key_added(key_added)
    state = check_complete(store, partial)
    info = recorded_source(store)
    want = f".{info['kind']}" if info is not None else ".h5ad"
    if out.suffix.lower() != want:
        why = f"the sweep's data came from a {want} file" if info is not None else "an AnnData file"
        raise ValueError(f"--to {str(path)!r}: the file name must end in {want} ({why})")
    if info is not None and out.resolve() == Path(info["path"]).resolve():
        raise ValueError(
            f"--to {path}: that is the file the sweep read; name a new file (the export writes a copy "
            "and never changes the original)"
        )
    earlier = False
    if out.is_dir():
        raise ValueError(f"--to {path}: that is a folder; name a file (FILE{want})")
    if out.exists() and not replace_file:
        why = not_an_earlier_export(store, out, info)
        if why is not None:
            raise ValueError(
                f"--to {path}: that file exists and is not an earlier export of this store's data ({why}); "
                "name a new file, or pass --replace-file to move it aside (renamed, never deleted)"
            )
        if source is not None and Path(source).expanduser().resolve() != out.resolve():
            raise ValueError(
                f"--to {path} is an earlier export of this data, which the export adds to; leave --from "
                "out (or name a new --to to write a copy of --from)"
            )
        earlier = True
    src = source_of(store, out if earlier and info is not None else source)
    rows, extra, dropped = rows_of(src) if src is not None else (None, 0, None)
    tree, obsm, chosen = _chosen(store, models, setting, key_added)
    uns_key = _uns_key(key_added)
    base = src["path"] if src is not None else (str(out) if earlier else None)
    replaced = {"obsm": [], "uns": []}
    if base is not None:
        replaced = _clashes(base, obsm, uns_key, chosen, key_added, overwrite)
    uns = _provenance(tree, store, chosen, src, state, dropped, key_added)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.writing-{os.getpid()}")
    aside = None
    try:
        if src is not None:
            write_into_copy(src, tmp, on_rows(obsm, rows), uns_key, uns, replaced)
            n_obs = len(rows)
        elif earlier:  # other data: the earlier export's cells are the store's, in its order
            write_into_copy({"path": str(out)}, tmp, obsm, uns_key, uns, replaced)
            n_obs = len(next(iter(obsm.values()))) if obsm else len(file_obs_names(str(out)))
        else:
            adata = _new_anndata(store, obsm, uns, uns_key)
            adata.write_h5ad(tmp)
            n_obs = adata.n_obs
        if out.exists() and replace_file:
            aside = aside_name(out)
            out.rename(aside)
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
        "earlier": earlier,
        "moved_aside": None if aside is None else str(aside),
        "cells_without": extra,
        "partial": partial_note(state),
    }


def not_an_earlier_export(store, path: Path, info: dict | None) -> str | None:
    """None where the file at ``path`` is an earlier export of the store's data, else why not: its
    ``uns`` records an export (:func:`~tasks.results.userfile.export_records`) of the same source
    (for data from the user's file ``info``, that file's fingerprint as the sweep read it; for other
    data, the sweep's data fingerprint), and its cells (obs_names) are the store's."""
    try:
        records = export_records(str(path), UNS_KEY)
    except OSError:
        return "it is not an AnnData / MuData file"
    if not records:
        return "it records no export of embed-sweep"
    if info is not None:
        same = any(r["sweep_fingerprint"] == str(info["fingerprint"]) for r in records)
    else:
        mine = _data_fingerprint(zarr.open_group(str(existing_store(store)), mode="r").attrs.get("identity"))
        same = mine is not None and any(_data_fingerprint(r["identity"]) == mine for r in records)
    if not same:
        return "its exports are of other data"
    data_path = store_data_path(store)
    names = _names_of(data_path)
    if names is None:
        names = [str(i) for i in range(zarr.open_group(str(data_path), mode="r")["Y"].shape[0])]
    have = [str(n) for n in file_obs_names(str(path))]
    if info is None:  # written as the store's rows: the same cells in the same order
        same_cells = have == names
    elif info["kind"] == "h5mu":  # a MuData's export also holds the cells its join dropped
        same_cells = set(names) <= set(have)
    else:  # a copy of the user's file: its cells, in its order (rows_of lays the embeddings out)
        same_cells = len(have) == len(names) and set(have) == set(names)
    return None if same_cells else "its cells are not the store's"


def _data_fingerprint(identity) -> str | None:
    """The data fingerprint in a sweep's identity (its JSON text), or None."""
    try:
        return json.loads(identity).get("data_fingerprint") if identity else None
    except (TypeError, ValueError, AttributeError):
        return None


def aside_name(path: Path) -> Path:
    """Where ``replace_file`` moves an existing file: ``x.h5ad`` -> ``x.replaced-<date-time>.h5ad``
    beside it (``-2``, ``-3``, ... where that name is taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        cand = path.with_name(f"{path.stem}.replaced-{stamp}{'' if n == 1 else f'-{n}'}{path.suffix}")
        if not cand.exists():
            return cand
