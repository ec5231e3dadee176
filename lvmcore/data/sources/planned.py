"""The plan of a file read with options (an .h5ad, an .h5mu, a list of view files) and its source.

A plan (:class:`Plan`, made by lvmcore.data.sources.h5ad / h5mu / views) reads only metadata,
``obs`` and ``var``: the views (a matrix each, with its preprocessing), the cells' names, labels
and colours. Its fingerprint is a hash of the source files' content fingerprints and the applied
options, known before any data pass. :func:`plan_source` then reads (and preprocesses, on the
client the caller passes) the data as a row-block source.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lvmcore.data import pca_stream
from lvmcore.data import preprocess as pp
from lvmcore.data.labels import check_label_column, encode_color, encode_labels
from lvmcore.data.provenance import file_fingerprint
from lvmcore.data.sources import hdf5, named
from lvmcore.data.sources.base import Source, Variable, dataset_attrs, refuse_nonfinite

__all__ = [
    "INPUT_VERSION",
    "PRECHECK_VALUES",
    "ArrayMatrix",
    "View",
    "Plan",
    "column",
    "apply_labels",
    "plan_source",
    "check_values",
]

log = logging.getLogger("lvmcore.data")

#: change when the same file and options give other ingested data (a store made by the old code
#: is then re-ingested, its fingerprint no longer matching)
INPUT_VERSION = "2026-11-27.1"

#: a view's matrix with at most this many stored values is read whole by the plan to refuse NaN
#: and inf before any work (about 0.5 GB of float64, a second or two); a larger one is checked as
#: the ingest reads it, block by block, in the same pass that fingerprints what it writes
PRECHECK_VALUES = 2**26


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
        block = np.asarray(self.array[a:b], dtype=np.float64)
        refuse_nonfinite(block, self.name, "Y", a)
        return block

    dense = read


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
        options = {k: v for k, v in self.applied.items() if k != "views"}  # "views": the paths
        blob = json.dumps(
            {
                "kind": self.kind,
                "files": [file_fingerprint(p) for p in self.paths],
                "options": options,
                "input_version": INPUT_VERSION,
                "generators": named.GENERATOR_VERSION,
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
        name = Path(self.paths[0]).stem if self.kind != "views" else "views"
        source = "file:" + ",".join(str(Path(p).resolve()) for p in self.paths)
        multi = len(self.views) > 1
        n_views = len(self.views) if multi else 0
        out = dataset_attrs(name=name, source=source, params=self.applied, n_views=n_views)
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


def column(obs, column, where, what):
    if not isinstance(column, str):
        raise ValueError(f"{where}: {what} must be an obs column's name, got {column!r}")
    if column not in obs.columns:
        raise ValueError(f"{where}: {what} {column!r} is not an obs column; columns: {list(obs.columns)}")
    return obs[column]


def apply_labels(plan: Plan, obs, opts: dict, where: str, lookup=None) -> None:
    get = lookup or (lambda col, what: column(obs, col, where, what))
    if opts.get("label_column") is not None:
        values = get(opts["label_column"], "label_column")
        check_label_column(values, opts["label_column"], where)
        plan.label = encode_labels(values)
        plan.label_column = opts["label_column"]
        plan.applied["label_column"] = opts["label_column"]
        n_missing = int((plan.label[0] < 0).sum())
        if n_missing:
            log.info("%s: %d cells have no %s (label -1, unlabelled)", where, n_missing, opts["label_column"])
    if opts.get("color_column") is not None:
        plan.color = encode_color(get(opts["color_column"], "color_column"))
        plan.color_column = opts["color_column"]
        plan.applied["color_column"] = opts["color_column"]


def _var_names(view: View) -> list | None:
    """The genes of a view whose columns are an AnnData's genes (X or a layer of an .h5ad or of a
    MuData modality), read from its var table; None for any other matrix (an obsm representation,
    a .npy view) or a file whose var cannot be read."""
    m = view.matrix
    if not isinstance(m, hdf5.Matrix) or view.options.get("use_rep", "X") != "X" or m.field:
        return None
    key = m.key
    group = key.split("layers/")[0] if "layers/" in key else key.removesuffix("X")
    try:
        var = hdf5.read_var(m.path, group.rstrip("/"))
    except (OSError, ValueError, KeyError):
        return None
    if var is None or len(var) != m.shape[1]:
        return None
    return var.index.astype(str).tolist()


def _dense_reader(view: View, results: dict, client, kept: dict | None = None):
    """Rows a:b of a view's fitted matrix (preprocessed as its settings say: a PCA runs here);
    ``kept`` receives the view's preprocessing arrays (genes, PCA loadings, mean, gene mask)."""
    m, s = view.matrix, view.settings
    kept = {} if kept is None else kept
    names = _var_names(view)
    if names is not None:
        kept.setdefault(view.name, {})["var_names"] = np.asarray(names, dtype=str)
    if s and s.get("pca") is not None:
        res = pca_stream.run_pca(m, s, view.columns, client)
        arrays = kept.setdefault(view.name, {})
        arrays.update(components=np.asarray(res["components"]), mean=np.asarray(res["mean"]))
        if view.columns is not None:
            arrays["columns"] = np.asarray(view.columns, dtype=np.int64)
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
        target = pca_stream.run_pca(m, s, client=client)["target_sum"]
        results[view.name] = {"target_sum": target}

        def read(a, b):
            block = pp.transform_block(m.read(a, b), s, target, m.where(), a)
            return block.toarray() if hasattr(block, "toarray") else np.asarray(block, dtype=np.float64)

        return read
    return lambda a, b: m.dense(a, b)


def plan_source(p: Plan, src: str, client=None) -> Source:
    """The planned data as a :class:`Source`, the plan's fingerprint its ``fingerprint``. A view's
    preprocessing runs here: its passes on ``client`` (a Dask client; None: in this process)."""
    results: dict = {}
    kept: dict = {}
    readers = {v.name: _dense_reader(v, results, client, kept) for v in p.views}
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
    return Source(str(src), variables, attrs, fingerprint=p.fingerprint(), preprocessing=kept)


def check_values(p: Plan) -> None:
    """Refuse NaN or inf in the planned views' matrices before any work, in the file's coordinates
    (the first found, with the count in its block): every view whose matrix stores at most
    :data:`PRECHECK_VALUES` values is read in row blocks (a larger one is checked as the ingest
    reads it)."""
    for v in p.views:
        m = v.matrix
        if _stored_values(m) > PRECHECK_VALUES:
            continue
        n = m.shape[0]
        step = max(1, PRECHECK_VALUES // (16 * max(1, m.shape[1])))
        for a in range(0, n, step):
            m.read(a, min(a + step, n))  # the reader refuses a block holding NaN or inf


def _stored_values(m) -> int:
    """The values a view's matrix stores (a sparse one: its non-zeros)."""
    stored = getattr(m, "stored_values", None)
    return int(stored()) if stored is not None else int(np.prod(m.shape))
