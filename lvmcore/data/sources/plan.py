"""User files with options: AnnData (.h5ad), MuData (.h5mu) and a list of view files.

Options (every other key refused before any work, lvmcore.checks.check_options):

- ``.h5ad``: ``use_rep`` (an ``obsm`` key, or ``"X"``: the default), ``layer`` (a layer instead
  of ``X``), ``preprocess`` (lvmcore.data.preprocess), ``label_column`` / ``color_column`` (``obs``
  columns), ``max_features`` (the width limit, lvmcore.data.MAX_FEATURES).
- ``.h5mu``: ``modalities`` ({name: {use_rep, layer, preprocess}}; every modality when absent, each
  with its ``X``), ``view`` (what single-view models fit: ``"concat"``, the default, or a modality's
  name), ``label_column`` / ``color_column`` (a column of the MuData's ``obs``, or ``"mod:column"``
  of a modality's), ``max_features``. The modalities are joined on ``obs_names`` (inner join, in the
  order of the first modality); the cells each one loses are logged and recorded.
- ``{"views": ["rna.npy", "adt.csv"]}``: one view per file (.npy or numeric .csv, rows in the
  same order, the same count), ``view`` and ``max_features`` as above.

A plan (:func:`plan`) reads only metadata and ``obs``; its fingerprint (:func:`describe`) is a hash
of the source files' content fingerprints and the applied options, known before any data pass.
:func:`open_source` then reads (and preprocesses, on the cluster) the data as a row-block source
for lvmcore.data.stream.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lvmcore.checks import check_options
from lvmcore.data import anndata_io as aio
from lvmcore.data import preprocess as pp
from lvmcore.data.labels import check_label_column, encode_color, encode_labels
from lvmcore.data.provenance import file_fingerprint

log = logging.getLogger("lvmcore.data")

#: change when the same file and options give other ingested data (a store made by the old code
#: is then re-ingested, its fingerprint no longer matching)
INPUT_VERSION = "2026-11-27.1"

MATRIX_OPTIONS = ("use_rep", "layer", "preprocess")
#: rows of a matrix that normalize_total / log1p will treat as counts read by the plan to refuse
#: negative values before any work (the ingest checks every row block again as it reads it)
COUNTS_CHECK_ROWS = 2000
H5AD_OPTIONS = (*MATRIX_OPTIONS, "label_column", "color_column", "max_features")
H5MU_OPTIONS = ("modalities", "view", "label_column", "color_column", "max_features")
VIEWS_OPTIONS = ("views", "view", "max_features")
#: the source name of a list of view files ({"views": [...]} without a path)
VIEWS_SOURCE = "views"
SUFFIXES = (".h5ad", ".h5mu")


def handles(src, options: dict) -> bool:
    """Whether this module reads ``src`` (an .h5ad / .h5mu path, or a list of view files)."""
    if str(src) == VIEWS_SOURCE and "views" in options:
        return True
    return Path(str(src)).suffix.lower() in SUFFIXES


def max_features(options: dict, where: str) -> int:
    from lvmcore.data.loaders import MAX_FEATURES

    v = options.get("max_features", MAX_FEATURES)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{where}: max_features must be a positive integer, got {v!r}")
    return int(v)


def check_width(width: int, limit: int, where: str, reducible: bool = True) -> None:
    """Refuse data wider than the width limit before any work, naming the width and the fixes."""
    if width <= limit:
        return
    fix = (
        'reduce it first: "use_rep": "<an obsm key such as X_pca>", or "preprocess": {"pca": 50} '
        '(counts: {"normalize_total": 1e4, "log1p": true, "pca": 50}); '
        if reducible
        else "reduce it first (e.g. a PCA to 50 columns); "
    )
    raise ValueError(
        f"{where} is {width:,} features wide, above the width limit of {limit:,} (lvmcore.data.MAX_FEATURES: "
        f"the models fit a dense cells x features matrix); {fix}or raise the limit with "
        f'"max_features": {width}'
    )


# ------------------------------------------------------------------ matrices that are not HDF5


@dataclass(frozen=True)
class NpyMatrix:
    """A .npy file's rows (read at their offset per block; see lvmcore.data.stream)."""

    path: str
    shape: tuple
    rows: tuple | None = None
    sparse: bool = False

    def where(self) -> str:
        return self.path

    def select(self, rows):
        return NpyMatrix(self.path, (len(rows), self.shape[1]), tuple(int(r) for r in rows))

    def read(self, a, b):
        from lvmcore.data.stream import _npy_rows, _open_npy

        Y = _open_npy(Path(self.path))
        if self.rows is None:
            return _npy_rows(Path(self.path), Y)(a, b)
        return np.asarray(Y[np.asarray(self.rows[a:b])], dtype=np.float64)

    dense = read


@dataclass(frozen=True)
class ArrayMatrix:
    """An array held in memory (a .csv view, small by nature)."""

    name: str
    array: np.ndarray = field(repr=False)
    sparse: bool = False

    @property
    def shape(self):
        return self.array.shape

    def where(self) -> str:
        return self.name

    def read(self, a, b):
        return np.asarray(self.array[a:b], dtype=np.float64)

    dense = read


# ------------------------------------------------------------------ plans


@dataclass
class View:
    name: str
    matrix: object
    settings: dict | None
    width: int
    options: dict
    columns: np.ndarray | None = None  # the genes the PCA uses (preprocess mask_var), None: all


@dataclass
class Plan:
    kind: str
    paths: list
    applied: dict
    views: list
    fitted: str  # "concat" or a view's name (the single view when there is one)
    obs_names: np.ndarray | None = None
    label: tuple | None = None  # (codes, names)
    color: tuple | None = None  # (values, names or None)
    label_column: str | None = None
    color_column: str | None = None
    modalities: list = field(default_factory=list)
    dropped: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.views[0].matrix.shape[0]

    def source_info(self) -> dict:
        many = self.kind == "views"
        fps = [file_fingerprint(p) for p in self.paths]
        return {
            "kind": self.kind,
            "path": list(self.paths) if many else self.paths[0],
            "fingerprint": fps if many else fps[0],
            "options": self.applied,
            "modalities": list(self.modalities),
            "dropped": dict(self.dropped),
        }

    def fingerprint(self) -> str:
        """A hash of the files' content fingerprints (in order), the kind and the options applied,
        not of the paths: the same file by another path is the same data (issue 36, item 11)."""
        from lvmcore.data.loaders import GENERATOR_VERSION

        options = {k: v for k, v in self.applied.items() if k != "views"}  # "views": the paths
        blob = json.dumps(
            {
                "kind": self.kind,
                "files": [file_fingerprint(p) for p in self.paths],
                "options": options,
                "input_version": INPUT_VERSION,
                "generators": GENERATOR_VERSION,
            },
            sort_keys=True,
            default=str,
        ).encode()
        return "file-" + hashlib.sha256(blob).hexdigest()[:27]

    def sizes(self) -> dict:
        out = {"point": self.n, "feature": self._y_width()}
        if len(self.views) > 1:
            out.update({f"feature_{v}": view.width for v, view in enumerate(self.views)})
        return out

    def _y_width(self) -> int:
        if self.fitted == "concat":
            return sum(v.width for v in self.views)
        return next(v.width for v in self.views if v.name == self.fitted)

    def attrs(self, results: dict | None = None) -> dict:
        from lvmcore.data.loaders import _attrs

        name = Path(self.paths[0]).stem if self.kind != "views" else "views"
        source = "file:" + ",".join(str(Path(p).resolve()) for p in self.paths)
        multi = len(self.views) > 1
        out = _attrs(name=name, source=source, params=self.applied, n_views=len(self.views) if multi else 0)
        out["source_info"] = json.dumps(self.source_info(), sort_keys=True)
        out["fitted_view"] = self.fitted
        if multi:
            out["view_names"] = [v.name for v in self.views]
        if self.label is not None:
            out["label_column"] = self.label_column
            out["label_names"] = json.dumps(self.label[1])
        if self.color is not None:
            out["color_column"] = self.color_column
            if self.color[1] is not None:
                out["color_names"] = json.dumps(self.color[1])
        pre = {}
        for v in self.views:
            if v.settings:
                pre[v.name] = {"settings": v.settings}
                if results and v.name in results:
                    pre[v.name].update(results[v.name])
        if pre:
            out["preprocess"] = json.dumps(pre, sort_keys=True)
        return out


def _resolve_matrix(path: str, group: str, o: dict, where: str):
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
            return aio.open_matrix(path, f"{prefix}obsm/{use_rep}", f"{where}: obsm[{use_rep!r}]")
        except KeyError:
            raise ValueError(
                f"{where}: use_rep {use_rep!r} is not in obsm; obsm keys: {aio.obsm_keys(path, group)} "
                "(or 'X')"
            ) from None
    if layer is not None:
        try:
            return aio.open_matrix(path, f"{prefix}layers/{layer}", f"{where}: layers[{layer!r}]")
        except KeyError:
            raw = ""
            if layer == "raw":  # AnnData's .raw is a group of its own (other genes), not a layer
                raw = (
                    "; .raw is not read as a layer: store the matrix you want as one "
                    "(adata.layers['counts'] = ...) and name it"
                )
            raise ValueError(
                f"{where}: layer {layer!r} is not in the file; layers: {aio.layer_keys(path, group)}{raw}"
            ) from None
    try:
        return aio.open_matrix(path, f"{prefix}X", f"{where}: X")
    except KeyError:
        raise ValueError(
            f"{where} has no X matrix; name a representation with use_rep or a layer with layer"
        ) from None


def _view(name, path, group, o, where, limit) -> View:
    m = _resolve_matrix(path, group, o, where)
    settings = pp.normalise_settings(o.get("preprocess"), where)
    genes = o.get("use_rep") in (None, "X")  # X or a layer: columns are the var table's genes
    columns = pp.resolve_mask(settings, aio.read_var(path, group) if genes else None, where)
    width = pp.output_width(settings, m.shape[1])
    D = m.shape[1] if columns is None else len(columns)
    if settings and settings.get("pca") is not None and settings["pca"] > min(m.shape[0] - 1, D):
        raise ValueError(
            f"{where}: preprocess pca = {settings['pca']} components needs at most min(N - 1, D) = "
            f"{min(m.shape[0] - 1, D)}"
            + (f" (D: the genes of mask_var {settings['mask_var']!r})" if columns is not None else "")
            + "; lower pca"
        )
    what = m.where() if hasattr(m, "where") else where
    check_width(width, limit, what)
    if pp.needs_counts(settings):  # the first rows before any work; every block again as it is read
        layers = aio.layer_keys(path, group)
        fix = f" with layer (this file's layers: {layers})" if layers else " with layer (the file has none)"
        pp.check_counts(m.read(0, min(m.shape[0], COUNTS_CHECK_ROWS)), settings, what, 0, fix)
    applied = {"use_rep": o.get("use_rep") or "X"}
    if o.get("layer") is not None:
        applied["layer"] = o["layer"]
    if settings:
        applied["preprocess"] = settings
    return View(name, m, settings, width, applied, columns)


def _column(obs, column, where, what):
    if not isinstance(column, str):
        raise ValueError(f"{where}: {what} must be an obs column's name, got {column!r}")
    if column not in obs.columns:
        raise ValueError(f"{where}: {what} {column!r} is not an obs column; columns: {list(obs.columns)}")
    return obs[column]


def _plan_h5ad(path: Path, opts: dict) -> Plan:
    where = str(path)
    check_options(opts, H5AD_OPTIONS, f"data-set ({path.name})")
    limit = max_features(opts, where)
    view = _view("X", str(path), "", opts, where, limit)
    obs = aio.read_obs(str(path))
    if len(obs) != view.matrix.shape[0]:
        raise ValueError(
            f"{where}: obs has {len(obs)} rows, the matrix {view.matrix.shape[0]}; the file is damaged"
        )
    applied = dict(view.options)
    plan = Plan("h5ad", [str(path.resolve())], applied, [view], view.name)
    plan.obs_names = obs.index.astype(str).to_numpy()
    _labels(plan, obs, opts, where)
    if "max_features" in opts:
        applied["max_features"] = limit
    return plan


def _labels(plan: Plan, obs, opts: dict, where: str, lookup=None) -> None:
    get = lookup or (lambda col, what: _column(obs, col, where, what))
    if opts.get("label_column") is not None:
        column = get(opts["label_column"], "label_column")
        check_label_column(column, opts["label_column"], where)
        plan.label = encode_labels(column)
        plan.label_column = opts["label_column"]
        plan.applied["label_column"] = opts["label_column"]
        n_missing = int((plan.label[0] < 0).sum())
        if n_missing:
            log.info("%s: %d cells have no %s (label -1, unlabelled)", where, n_missing, opts["label_column"])
    if opts.get("color_column") is not None:
        plan.color = encode_color(get(opts["color_column"], "color_column"))
        plan.color_column = opts["color_column"]
        plan.applied["color_column"] = opts["color_column"]


def _plan_h5mu(path: Path, opts: dict) -> Plan:
    import pandas as pd

    where = str(path)
    check_options(opts, H5MU_OPTIONS, f"data-set ({path.name})")
    limit = max_features(opts, where)
    names = aio.h5mu_modalities(str(path))
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
        views.append(_view(m, str(path), f"mod/{m}", o, f"{where}: modality {m!r}", limit))
        obs = aio.read_obs(str(path), f"mod/{m}")
        if len(obs) != views[-1].matrix.shape[0]:
            raise ValueError(
                f"{where}: modality {m!r} obs has {len(obs)} rows, its matrix {views[-1].matrix.shape[0]}"
            )
        aio.check_unique_names(obs.index, f"{where}: modality {m!r}")
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
    glob = aio.read_obs(str(path)) if opts.get("label_column") or opts.get("color_column") else None

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

    _labels(plan, None, opts, where, lookup)
    return plan


def _plan_views(opts: dict) -> Plan:
    check_options(opts, VIEWS_OPTIONS, "data-set (views)")
    files = opts["views"]
    if not isinstance(files, list) or len(files) < 1 or not all(isinstance(f, str) for f in files):
        raise ValueError(
            f'views must be a list of .npy / .csv files, e.g. ["rna.npy", "adt.npy"], got {files!r}'
        )
    limit = max_features(opts, "views")
    views, names = [], []
    for f in files:
        p = Path(f)
        if not p.exists():
            raise ValueError(f"view file {f!r} does not exist; check the path")
        suffix = p.suffix.lower()
        if suffix == ".npy":
            from lvmcore.data.stream import _open_npy

            m = NpyMatrix(str(p.resolve()), tuple(_open_npy(p).shape))
        elif suffix == ".csv":
            from lvmcore.data.loaders import _load_file

            m = ArrayMatrix(str(p), _load_file(p, {})["Y"])
        else:
            raise ValueError(
                f"view file {f!r}: only .npy and .csv files are views; use .h5mu for AnnData modalities"
            )
        name = p.stem if p.stem not in names else f"{p.stem}_{len(names)}"
        names.append(name)
        check_width(m.shape[1], limit, str(p), reducible=False)
        views.append(View(name, m, None, m.shape[1], {}))
    ns = {v.name: v.matrix.shape[0] for v in views}
    if len(set(ns.values())) > 1:
        raise ValueError(
            f"the view files have different numbers of rows {ns}; each row must be the same point"
        )
    view = opts.get("view", "concat")
    if view != "concat" and view not in names:
        raise ValueError(f"view must be 'concat' or one of the views {names}, got {view!r}")
    if view == "concat" and len(views) > 1:
        check_width(sum(v.width for v in views), limit, f"the concatenation of {names}", reducible=False)
    applied = {"views": [str(Path(f).resolve()) for f in files], "view": view, "view_names": names}
    if "max_features" in opts:
        applied["max_features"] = limit
    return Plan(
        "views", [str(Path(f).resolve()) for f in files], applied, views, view if len(views) > 1 else names[0]
    )


def plan(src, **options) -> Plan:
    """The plan of a .h5ad / .h5mu file or a list of view files (metadata and obs only)."""
    opts = dict(options)
    if str(src) == VIEWS_SOURCE and "views" in opts:
        return _plan_views(opts)
    path = Path(str(src))
    if not path.exists():
        raise ValueError(f"data file {str(path)!r} does not exist; check the path")
    try:
        if path.suffix.lower() == ".h5ad":
            return _plan_h5ad(path, opts)
        return _plan_h5mu(path, opts)
    except OSError as e:
        if "lock" in str(e).lower():  # HDF5 refuses a file another process holds open for writing
            raise ValueError(
                f"{path} is open for writing elsewhere (HDF5 could not lock it: {e}); close it there "
                "(e.g. a notebook's AnnData read with backed='r+': adata.file.close()) and run again"
            ) from e
        raise ValueError(f"{path} is not a readable {path.suffix} file ({e})") from e


def describe(src, **options) -> dict:
    p = plan(src, **options)
    return {"sizes": p.sizes(), "attrs": p.attrs(), "fingerprint": p.fingerprint()}


# ------------------------------------------------------------------ reading the data


def _dense_reader(view: View, results: dict):
    m, s = view.matrix, view.settings
    if s and s.get("pca") is not None:
        res = pp.run_pca(m, s, view.columns)
        scores = res["scores"]
        results[view.name] = {
            "explained_variance": res["explained_variance"].tolist(),
            "explained_variance_ratio": res["explained_variance_ratio"].tolist(),
            "target_sum": res["target_sum"],
            "solver": res["solver"],
        }
        log.info(
            "%s: PCA to %d components (%s route), %.1f%% of the variance",
            m.where(),
            scores.shape[1],
            res["solver"],
            100 * float(np.sum(res["explained_variance_ratio"])),
        )
        return lambda a, b: scores[a:b]
    if s:
        target = pp.run_pca(m, s)["target_sum"]
        results[view.name] = {"target_sum": target}

        def read(a, b):
            block = pp.transform_block(m.read(a, b), s, target, m.where(), a)
            return block.toarray() if hasattr(block, "toarray") else np.asarray(block, dtype=np.float64)

        return read
    return lambda a, b: m.dense(a, b)


def open_source(src, **options):
    """The data as a lvmcore.data.stream.Source (preprocessing runs here, on the cluster), with
    the plan's fingerprint as ``attrs["fingerprint"]`` for the store."""
    from lvmcore.data.stream import Source, Variable

    p = plan(src, **options)
    results: dict = {}
    readers = {v.name: _dense_reader(v, results) for v in p.views}
    n = p.n
    f64 = np.dtype(np.float64)
    variables = {}
    if len(p.views) > 1:
        for i, v in enumerate(p.views):
            variables[f"view_{i}"] = Variable(("point", f"feature_{i}"), (n, v.width), f64, readers[v.name])
    if p.fitted == "concat":
        y = lambda a, b: np.hstack([readers[v.name](a, b) for v in p.views])  # noqa: E731
    else:
        y = readers[p.fitted]
    variables["Y"] = Variable(("point", "feature"), (n, p.sizes()["feature"]), f64, y)
    if p.label is not None:
        codes = p.label[0]
        variables["label"] = Variable(("point",), codes.shape, np.dtype(np.int64), lambda a, b: codes[a:b])
    if p.color is not None:
        col = p.color[0]
        variables["color"] = Variable(("point",), col.shape, f64, lambda a, b: col[a:b])
    if p.obs_names is not None:
        names = np.asarray(p.obs_names).astype(str)
        variables["obs_names"] = Variable(("point",), names.shape, names.dtype, lambda a, b: names[a:b])
    attrs = p.attrs(results)
    return Source(str(src), variables, attrs), p.fingerprint()
