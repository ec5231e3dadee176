"""AnnData (.h5ad) files by scanpy's conventions: the plan of the matrix a file is read for
(``use_rep``, ``layer``, ``preprocess``), its ``obs`` (names, labels, colours) and its checks.

Options (every other key refused before any work, lvmcore.checks.check_options): ``use_rep`` (an
``obsm`` key, or ``"X"``: the default), ``layer`` (a layer instead of ``X``), ``preprocess``
(lvmcore.data.preprocess), ``label_column`` / ``color_column`` (``obs`` columns), ``max_features``
(the width limit, lvmcore.data.MAX_FEATURES). A MuData modality is planned with the same
:func:`matrix_view` (lvmcore.data.sources.h5mu).
"""

from __future__ import annotations

from pathlib import Path

from lvmcore.checks import check_options
from lvmcore.data import preprocess as pp
from lvmcore.data.sources import hdf5
from lvmcore.data.sources.base import check_extent, check_width, max_features
from lvmcore.data.sources.planned import Plan, View, apply_labels

__all__ = [
    "MATRIX_OPTIONS",
    "H5AD_OPTIONS",
    "COUNTS_CHECK_ROWS",
    "resolve_matrix",
    "matrix_view",
    "plan_h5ad",
]

MATRIX_OPTIONS = ("use_rep", "layer", "preprocess")
#: rows of a matrix that normalize_total / log1p will treat as counts read by the plan to refuse
#: negative values before any work (the ingest checks every row block again as it reads it)
COUNTS_CHECK_ROWS = 2000
H5AD_OPTIONS = (*MATRIX_OPTIONS, "label_column", "color_column", "max_features")
#: the fix for a matrix with no columns: an .h5ad's own (False), a MuData modality's (True)
_EMPTY_FIX = {
    False: "give a matrix with features (another use_rep or layer)",
    True: "leave this modality out (modalities: {name: {...}} naming the others) or give it features",
}


def resolve_matrix(path: str, group: str, o: dict, where: str):
    use_rep, layer = o.get("use_rep"), o.get("layer")
    if use_rep is not None and not isinstance(use_rep, str):
        raise ValueError(f"{where}: use_rep must be an obsm key or 'X', got {use_rep!r}")
    if layer is not None and not isinstance(layer, str):
        raise ValueError(f"{where}: layer must be a layer's name, got {layer!r}")
    prefix = f"{group}/" if group else ""
    if use_rep not in (None, "X"):
        if layer is not None:
            raise ValueError(
                f"{where}: use_rep {use_rep!r} and layer {layer!r} both given; use_rep names an obsm "
                "representation, layer a matrix in place of X: give one"
            )
        try:
            return hdf5.open_matrix(path, f"{prefix}obsm/{use_rep}", f"{where}: obsm[{use_rep!r}]")
        except KeyError:
            raise ValueError(
                f"{where}: use_rep {use_rep!r} is not in obsm; obsm keys: {hdf5.obsm_keys(path, group)} "
                "(or 'X')"
            ) from None
    if layer is not None:
        try:
            return hdf5.open_matrix(path, f"{prefix}layers/{layer}", f"{where}: layers[{layer!r}]")
        except KeyError:
            raw = ""
            if layer == "raw":  # AnnData's .raw is a group of its own (other genes), not a layer
                raw = (
                    "; .raw is not read as a layer: store the matrix you want as one "
                    "(adata.layers['counts'] = ...) and name it"
                )
            raise ValueError(
                f"{where}: layer {layer!r} is not in the file; layers: {hdf5.layer_keys(path, group)}{raw}"
            ) from None
    try:
        return hdf5.open_matrix(path, f"{prefix}X", f"{where}: X")
    except KeyError:
        raise ValueError(
            f"{where} has no X matrix; name a representation with use_rep or a layer with layer"
        ) from None


def matrix_view(name, path, group, o, where, limit) -> View:
    m = resolve_matrix(path, group, o, where)
    what = m.where() if hasattr(m, "where") else where
    check_extent(m.shape, what, _EMPTY_FIX.get(bool(group), ""))
    settings = pp.normalise_settings(o.get("preprocess"), where)
    genes = o.get("use_rep") in (None, "X")  # X or a layer: columns are the var table's genes
    pca = bool(settings) and settings.get("pca") is not None  # var is read only for a PCA's mask
    columns = pp.resolve_mask(settings, hdf5.read_var(path, group) if genes and pca else None, where)
    width = pp.output_width(settings, m.shape[1])
    D = m.shape[1] if columns is None else len(columns)
    if settings and settings.get("pca") is not None and settings["pca"] > min(m.shape[0] - 1, D):
        raise ValueError(
            f"{where}: preprocess pca = {settings['pca']} components needs at most min(N - 1, D) = "
            f"{min(m.shape[0] - 1, D)}"
            + (f" (D: the genes of mask_var {settings['mask_var']!r})" if columns is not None else "")
            + "; lower pca"
        )
    check_width(width, limit, what)
    if pp.needs_counts(settings):  # the first rows before any work; every block again as it is read
        layers = hdf5.layer_keys(path, group)
        fix = f" with layer (this file's layers: {layers})" if layers else " with layer (the file has none)"
        pp.check_counts(m.read(0, min(m.shape[0], COUNTS_CHECK_ROWS)), settings, what, 0, fix)
    applied = {"use_rep": o.get("use_rep") or "X"}
    if o.get("layer") is not None:
        applied["layer"] = o["layer"]
    if settings:
        applied["preprocess"] = settings
    return View(name, m, settings, width, applied, columns)


def plan_h5ad(path: Path, opts: dict) -> Plan:
    where = str(path)
    check_options(opts, H5AD_OPTIONS, f"data-set ({path.name})")
    limit = max_features(opts, where)
    view = matrix_view("X", str(path), "", opts, where, limit)
    obs = hdf5.read_obs(str(path))
    if len(obs) != view.matrix.shape[0]:
        raise ValueError(
            f"{where}: obs has {len(obs)} rows, the matrix {view.matrix.shape[0]}; the file is damaged"
        )
    applied = dict(view.options)
    plan = Plan("h5ad", [str(path.resolve())], applied, [view], view.name)
    plan.obs_names = obs.index.astype(str).to_numpy()
    apply_labels(plan, obs, opts, where)
    if "max_features" in opts:
        applied["max_features"] = limit
    return plan
