"""The source protocol: a data set's variables, each read in row blocks, with its attributes.

Every file format has one reader (:mod:`lvmcore.data.sources`) that gives a :class:`Source`: its
``variables`` (``Y`` (point, feature), optional ``view_<v>``, ``label``, ``color``, ``truth``,
``obs_names``), each a :class:`Variable` whose ``read(a, b)`` gives rows a:b, and ``attrs``, the
attributes a loaded data set has. The in-memory load (:func:`lvmcore.data.load`) reads every
variable whole; the streamed ingest (:func:`lvmcore.data.ingest`) reads them a block at a time;
the two read the same source, so they cannot disagree.

Bad values are stopped where they are read, in the user's coordinates: a reader refuses a block
holding NaN or inf naming the file, the element (``X``, ``obsm['X_pca']``, ...) and the row and
column in it (:func:`refuse_nonfinite`), not the position in a derived array.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from lvmcore import __version__
from lvmcore.checks import check_options
from lvmcore.data.provenance import file_fingerprint

__all__ = [
    "Variable",
    "Source",
    "array_source",
    "dataset_attrs",
    "MAX_FEATURES",
    "BLOCK_ROWS",
    "max_features",
    "check_width",
    "check_extent",
    "plain_options",
    "file_source_info",
    "refuse_nonfinite",
    "blocks",
    "content_pass",
]

#: the width limit: the models fit a dense N x D float64 matrix, so data wider than this many
#: features (a transcriptome of 2-3 x 10^4 genes) is refused before any work unless it is reduced
#: ("use_rep": "X_pca", or "preprocess": {"pca": 50}); a data-set option "max_features": D raises it
MAX_FEATURES = 10_000

#: rows read and written per block (a multiple of the store's chunk rows is written per call)
BLOCK_ROWS = 65536


@dataclass
class Variable:
    dims: tuple
    shape: tuple
    dtype: np.dtype
    read: object  # (a, b) -> rows a:b as an array of ``dtype``
    whole: bool = False  # a small per-point variable held whole (h5ad labels)


@dataclass
class Source:
    """A data set's variables, read in row blocks, with the attributes a loaded data set has.
    ``fingerprint``: the planned fingerprint a store of it records (a file with options: the plan's,
    known before any data pass; a named data set: its recipe's), None where the content's is used."""

    where: str
    variables: dict
    attrs: dict
    close: object = field(default=lambda: None)
    fingerprint: str | None = None
    #: ``{view: {name: array}}`` kept beside the variables, outside the content fingerprint: what
    #: made each view's fitted matrix (lvmcore.data.store.write_preprocessing)
    preprocessing: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.variables["Y"].shape[0]

    def sizes(self) -> dict:
        out = {}
        for v in self.variables.values():
            out.update(zip(v.dims, v.shape))
        return out


def array_source(where: str, data: dict, attrs: dict, fingerprint: str | None = None) -> Source:
    """A source over arrays held in memory (a named data set drawn, a CSV file parsed): ``data``
    maps a variable's name to ``(dims, array)``."""

    def reader(arr):
        return lambda a, b: arr[a:b]

    variables = {
        name: Variable(tuple(dims), arr.shape, arr.dtype, reader(arr)) for name, (dims, arr) in data.items()
    }
    return Source(where, variables, attrs, fingerprint=fingerprint)


def dataset_attrs(*, name, source, params, truth_metric="euclidean", n_views=0) -> dict:
    """A loaded data set's attributes (``name``, ``source``, ``params`` as JSON, ``seed``,
    ``code_version``, ``truth_metric`` and ``views``)."""
    return {
        "name": name,
        "source": source,
        "params": json.dumps(params, sort_keys=True, default=str),
        "seed": -1 if params.get("seed") is None else int(params["seed"]),
        "code_version": __version__,
        "truth_metric": truth_metric,
        "views": [f"view_{v}" for v in range(n_views)],
    }


def max_features(options: dict, where: str) -> int:
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


def check_extent(shape, where: str, fix: str = "") -> None:
    """Refuse a matrix with no rows or no columns before any work (a zarr store cannot even be
    written with a chunk of 0), naming it and the fix."""
    n, d = int(shape[0]), int(shape[1]) if len(shape) > 1 else 1
    if n == 0:
        raise ValueError(f"{where} has 0 rows (no points to embed); give data with points in it")
    if d == 0:
        raise ValueError(f"{where} has 0 columns (no features); {fix or 'give data with features in it'}")


def plain_options(path: Path, options: dict, width: int) -> dict:
    """A .npy / .zarr file's options checked (only ``max_features``) and its width against the
    limit; returns the options applied."""
    check_options(options, ("max_features",), f"data-set ({path.name})")
    limit = max_features(options, str(path))
    check_width(width, limit, str(path), reducible=False)
    return {"max_features": limit} if "max_features" in options else {}


def file_source_info(path: Path, kind: str, applied: dict) -> str:
    """The ``source_info`` attribute (JSON) of data read from one file (lvmcore.data.provenance)."""
    info = {
        "kind": kind,
        "path": str(path.resolve()),
        "fingerprint": file_fingerprint(path),
        "options": applied,
        "modalities": [],
        "dropped": {},
    }
    return json.dumps(info, sort_keys=True)


def refuse_nonfinite(block, where: str, element: str, first_row: int = 0, rows=None, columns=None) -> None:
    """Refuse a row block holding NaN or inf, naming it in the user's coordinates: ``where`` the
    file, ``element`` what in it (``X``, ``obsm['X_pca']``, ``Y``), the row (``first_row`` + the
    block's row, or ``rows[block row]`` for a selection of the stored rows) and the column
    (``columns[block column]`` where the block holds some of the element's columns)."""
    values = block.data if sp.issparse(block) else np.asarray(block)
    if values.dtype.kind not in "fc" or np.isfinite(values).all():
        return
    if sp.issparse(block):
        coo = block.tocoo()
        bad = ~np.isfinite(coo.data)
        pos = np.lexsort((coo.col[bad], coo.row[bad]))
        r, c = int(coo.row[bad][pos[0]]), int(coo.col[bad][pos[0]])
        count, value = int(bad.sum()), coo.data[bad][pos[0]]
    else:
        bad = ~np.isfinite(values)
        r, c = (int(x) for x in np.argwhere(bad)[0])
        count, value = int(bad.sum()), values[r, c]
    row = int(rows[r]) if rows is not None else first_row + r
    col = int(columns[c]) if columns is not None else c
    n = block.shape[0]
    span = f"rows {first_row}-{first_row + n - 1}" if rows is None else f"the {n} rows read"
    raise ValueError(
        f"{where}: {element} contains NaN or inf (first at row {row}, column {col}, {count} values in "
        f"{span}: {element}[{row}, {col}] = {value}); remove or impute them before loading"
    )


def blocks(n: int, rows: int):
    for a in range(0, n, rows):
        yield a, min(a + rows, n)


def content_pass(source: Source, rows: int, sink=None) -> str:
    """One pass over every variable of ``source`` in fingerprint order, ``rows`` rows per block;
    returns the content fingerprint, what :func:`lvmcore.data.fingerprint` gives for the source
    read whole (the same bytes hashed in the same order). ``sink(name, a, b, block)`` receives each
    block (e.g. to write it). The readers refuse NaN and inf in the user's data as they read it; a
    fitted variable derived from it (a PCA's scores) is checked here as well."""
    h = hashlib.sha256()
    fitted = ["Y", *source.attrs.get("views", [])]
    for name in sorted(source.variables):
        v = source.variables[name]
        h.update(f"{name}|{np.dtype(v.dtype).str}|{tuple(v.shape)}|".encode())
        for a, b in blocks(v.shape[0], rows):
            block = np.ascontiguousarray(v.read(a, b), dtype=v.dtype)
            if name in fitted:
                refuse_nonfinite(block, source.where, name, a)
            h.update(block.tobytes())
            if sink is not None:
                sink(name, a, b, block)
    return h.hexdigest()[:32]
