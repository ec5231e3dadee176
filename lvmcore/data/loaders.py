"""Named data sets and user files as xarray Datasets, and their zarr stores.

A loaded data set is an ``xarray.Dataset`` with

- ``Y`` (point, feature): the data every single-view model fits (for multi-view data the
  concatenation of the views);
- ``view_<v>`` (point, feature_<v>) for multi-view data, listed in ``attrs["views"]``;
- optional ``label`` (point) int classes, ``color`` (point) the manifold parameter used for
  colouring, ``truth`` (point, truth_dim) the true latent coordinates (``attrs["truth_metric"]``
  names the distance to compare with: ``euclidean`` or ``cityblock`` for tree codes);
- attributes ``name``, ``source``, ``params`` (JSON of the generator options), ``seed`` and
  ``code_version``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import xarray as xr

from lvmcore import __version__
from lvmcore.data import synthetic

__all__ = [
    "load",
    "ingest",
    "describe",
    "open_dataset",
    "list_datasets",
    "DATASETS",
    "views_of",
    "fingerprint",
    "recipe",
    "recipe_fingerprint",
    "write_store",
    "MAX_FEATURES",
]

#: the version of the named generators' recipes: change it when a generator draws other data for
#: the same options (a store ingested from the old recipe is then rebuilt, a result store refused)
GENERATOR_VERSION = "2026-11-24.1"

log = logging.getLogger("lvmcore.data")

#: the width limit: the models fit a dense N x D float64 matrix, so data wider than this many
#: features (a transcriptome of 2-3 x 10^4 genes) is refused before any work unless it is reduced
#: ("use_rep": "X_pca", or "preprocess": {"pca": 50}); a data-set option "max_features": D raises it
MAX_FEATURES = 10_000


def _finish(
    Y, *, name, source, params, label=None, color=None, truth=None, truth_metric="euclidean", views=None
):
    Y = np.asarray(Y, dtype=np.float64)
    data = {"Y": (("point", "feature"), Y)}
    if views is not None:
        for v, Yv in enumerate(views):
            data[f"view_{v}"] = ((("point", f"feature_{v}")), np.asarray(Yv, dtype=np.float64))
    if label is not None:
        data["label"] = ("point", np.asarray(label, dtype=np.int64))
    if color is not None:
        data["color"] = ("point", np.asarray(color, dtype=np.float64))
    if truth is not None:
        data["truth"] = (("point", "truth_dim"), np.asarray(truth, dtype=np.float64))
    attrs = _attrs(
        name=name,
        source=source,
        params=params,
        truth_metric=truth_metric,
        n_views=len(views) if views is not None else 0,
    )
    return xr.Dataset(data, attrs=attrs)


def _attrs(*, name, source, params, truth_metric="euclidean", n_views=0) -> dict:
    """A loaded data set's attributes (shared with the block-wise file reader, lvmcore.data.stream)."""
    return {
        "name": name,
        "source": source,
        "params": json.dumps(params, sort_keys=True, default=str),
        "seed": -1 if params.get("seed") is None else int(params["seed"]),
        "code_version": __version__,
        "truth_metric": truth_metric,
        "views": [f"view_{v}" for v in range(n_views)],
    }


def _gen_manifold(fn, default_n, color_col=0):
    def make(n=default_n, seed=0):
        Y, lat = fn(n, seed)[:2]
        return dict(Y=Y, truth=lat, color=lat[:, color_col])

    return make


def _lllvm_roll(n=400, seed=0):
    Y, lat, iso = synthetic.lllvm_swiss_roll(n, seed)
    return dict(Y=Y, truth=iso, color=lat[:, 0])


def _tree(depth=4, n_per_node=20, seed=0):
    Y, node, codes, depth_label = synthetic.binary_tree(depth, n_per_node, seed)
    return dict(Y=Y, truth=codes[node], truth_metric="cityblock", label=depth_label, color=depth_label)


def _mrd_toy(n=100, seed=0, noise=0.1):
    views, signals = synthetic.mrd_toy(n, seed, noise)
    return dict(Y=np.hstack(views), views=views, truth=signals, color=np.linspace(0, 4 * np.pi, n))


def _digits(classes=5, n_per_class=None, seed=0):
    """scikit-learn's bundled 8x8 digits (no download); the first ``classes`` digit classes,
    optionally ``n_per_class`` drawn per class with ``seed``."""
    from sklearn.datasets import load_digits

    if not 2 <= int(classes) <= 10:
        raise ValueError(f"digits: classes must be in 2..10, got {classes}")
    d = load_digits()
    keep = np.flatnonzero(d.target < int(classes))
    if n_per_class is not None:
        rng = np.random.default_rng(seed)
        keep = np.concatenate(
            [
                rng.choice(np.flatnonzero(d.target == c), size=int(n_per_class), replace=False)
                for c in range(int(classes))
            ]
        )
        keep.sort()
    return dict(Y=d.data[keep] / 16.0, label=d.target[keep], color=d.target[keep])


#: name -> (maker, description)
DATASETS = {
    "swiss_roll": (_gen_manifold(synthetic.swiss_roll, 1000), "scikit-learn Swiss roll (paper 001); n, seed"),
    "lllvm_swiss_roll": (_lllvm_roll, "LL-LVM authors' Swiss roll (papers 000/003); n, seed"),
    "s_curve": (_gen_manifold(synthetic.s_curve, 1000), "scikit-learn S-curve (paper 001); n, seed"),
    "swiss_hole": (_gen_manifold(synthetic.swiss_hole, 1000), "Swiss roll with a hole (paper 001); n, seed"),
    "severed_bowl": (_gen_manifold(synthetic.severed_bowl, 1000), "severed bowl (paper 001); n, seed"),
    "gaussian_blob": (_gen_manifold(synthetic.gaussian_blob, 800), "3-D Gaussian bump (paper 000); n, seed"),
    "binary_tree": (_tree, "synthetic binary tree (paper 002); depth, n_per_node, seed"),
    "mrd_toy": (_mrd_toy, "two-view sine/cosine toy (paper 004); n, seed, noise"),
    "digits": (_digits, "scikit-learn 8x8 digits, bundled; classes, n_per_class, seed"),
}


def list_datasets() -> dict[str, str]:
    """Names that :func:`load` accepts, with a one-line description each."""
    return {k: v[1] for k, v in DATASETS.items()}


def _check_finite(ds: xr.Dataset, where: str):
    for name in ["Y", *ds.attrs.get("views", [])]:
        a = ds[name].values
        if not np.all(np.isfinite(a)):
            r, c = np.argwhere(~np.isfinite(a))[0]
            raise ValueError(
                f"{where}: {name} contains NaN or inf (first at row {r}, column {c}, "
                f"{int((~np.isfinite(a)).sum())} values in all); remove or impute them before loading"
            )


def replace_dir(tmp: Path, path: Path) -> None:
    """Put the finished store ``tmp`` at ``path``: a reader sees the old store or the new one, never
    a half-written one (an old store is moved aside first, then removed)."""
    if path.exists():
        old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(path)


def check_npy_magic(path: Path) -> None:
    """Refuse a file without NumPy's header before NumPy reads it (a pickle renamed to .npy)."""
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":
        raise ValueError(
            f"{path} is not a readable .npy file (no NumPy header; a pickle or another format "
            "renamed to .npy?); save the array with np.save(path, np.asarray(data, dtype=float))"
        )


def _load_file(path: Path, options):
    suffix = "".join(path.suffixes[-1:]).lower()
    if not path.exists():
        raise ValueError(f"data file {str(path)!r} does not exist; check the path")
    if suffix == ".npy":
        check_npy_magic(path)
        try:
            Y = np.load(path, allow_pickle=False)
        except ValueError as e:
            if "pickle" not in str(e):
                msg = f"{path} is not a readable .npy file ({e}); re-export it with np.save"
                raise ValueError(msg) from e
            raise ValueError(
                f"{path} holds pickled Python objects, not a numeric array; save it with "
                "np.save(path, np.asarray(data, dtype=float))"
            ) from e
        except Exception as e:  # truncated or corrupt header
            raise ValueError(f"{path} is not a readable .npy file ({e}); re-export it with np.save") from e
        if Y.dtype.kind not in "fiu":
            raise ValueError(f"{path} holds dtype {Y.dtype}; a numeric (float or int) array is needed")
        if Y.ndim != 2:
            raise ValueError(f"{path} holds an array of shape {Y.shape}; an (N, D) array is needed")
        from lvmcore.data.stream import _plain_options

        applied = _plain_options(path, options, int(Y.shape[1]))
        return dict(Y=Y, applied=applied)
    if suffix == ".csv":
        return _load_csv(path, options)
    raise ValueError(f"unsupported file type {suffix!r} for {path}; use .npy, .csv, .zarr, .h5ad or .h5mu")


CSV_OPTIONS = ("label_column", "color_column", "header", "max_features")


def _load_csv(path: Path, options: dict) -> dict:
    """A numeric CSV file: ``label_column`` / ``color_column`` name columns (labels as codes, -1
    where empty, names kept); ``header`` ``"auto"`` (a first row with any non-number names the
    columns), true or false. A first column with no name holding 0 .. N-1 (pandas' ``to_csv``
    index) is dropped, with a log line. ``options`` is emptied of what was applied, which is
    returned under ``"applied"``."""
    import pandas as pd

    from lvmcore.checks import check_options
    from lvmcore.data.labels import check_label_column, encode_color, encode_labels
    from lvmcore.data.sources import check_width, max_features

    check_options(options, CSV_OPTIONS, f"data-set ({path.name})")
    label_column = options.pop("label_column", None)
    color_column = options.pop("color_column", None)
    header = options.pop("header", "auto")
    limit = max_features(options, str(path))
    had_limit = options.pop("max_features", None) is not None
    if header not in ("auto", True, False):
        raise ValueError(f"header must be 'auto', true or false, got {header!r}")
    if header == "auto":
        header = _csv_first_row_is_header(path)
    try:
        df = pd.read_csv(path, header=0 if header else None)
    except Exception as e:
        raise ValueError(f"{path} is not a readable CSV file ({e})") from e
    applied = {"header": bool(header)}
    if header and len(df.columns) and _is_pandas_index(path, df):
        log.info("%s: first column has no name and holds 0..%d (a pandas index): dropped", path, len(df) - 1)
        df = df.iloc[:, 1:]
        applied["dropped_index_column"] = True
    out = {}
    for col, what in ((label_column, "label_column"), (color_column, "color_column")):
        if col is not None and col not in df.columns:
            raise ValueError(
                f"{what} {col!r} not in {path}; columns: {list(df.columns)}"
                + ("" if header else " (no header row: name the column by its 0-based number)")
            )
    if label_column is not None:
        check_label_column(df[label_column], label_column, str(path))
        out["label"], names = encode_labels(df[label_column])
        out["label_names"], out["label_column"] = names, label_column
        applied["label_column"] = label_column
    if color_column is not None:
        out["color"], cnames = encode_color(df[color_column])
        out["color_column"], out["color_names"] = color_column, cnames
        applied["color_column"] = color_column
    df = df.drop(columns=[c for c in {label_column, color_column} if c is not None])
    bad = [c for c in df.columns if df[c].dtype.kind not in "fiu"]
    if bad:
        raise ValueError(
            f"{path}: non-numeric columns {bad}; drop them or name the label column with label_column=..."
        )
    check_width(df.shape[1], limit, str(path), reducible=False)
    if had_limit:
        applied["max_features"] = limit
    out["Y"] = df.to_numpy(dtype=np.float64)
    out["applied"] = applied
    log.info("%s: %s", path, "header row read as column names" if header else "no header row")
    return out


def _is_pandas_index(path: Path, df) -> bool:
    """Whether the first column is pandas' default ``to_csv`` index: an empty header field
    (read as ``Unnamed: 0``) over the integers 0 .. N-1."""
    import csv

    with open(path, newline="") as f:
        first = next(csv.reader(f), [])
    if not first or first[0].strip() != "":
        return False
    col = df.iloc[:, 0]
    return col.dtype.kind in "iu" and np.array_equal(col.to_numpy(), np.arange(len(df)))


def _csv_first_row_is_header(path: Path) -> bool:
    """Whether a CSV file's first row names its columns: it does unless every field of it reads
    as a number (a numeric first row is data, e.g. ``np.savetxt(..., delimiter=",")`` output)."""
    import csv

    with open(path, newline="") as f:
        try:
            first = next(csv.reader(f), [])
        except (csv.Error, UnicodeDecodeError):
            return True  # let pandas report what is wrong
    if not first:
        return True
    try:
        [float(x) for x in first]
    except ValueError:
        return True
    return False


def fingerprint(ds: xr.Dataset) -> str:
    """Content hash of a data set: every data variable's name, dtype, shape and bytes. Derived
    inputs (the kNN graph, evaluation ranks, the result store) record it, and one that does not
    match the data is rebuilt or refused, never reused."""
    h = hashlib.sha256()
    for name in sorted(ds.data_vars):
        a = np.ascontiguousarray(ds[name].values)
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:32]


def _maker_params(name: str, options: dict) -> dict:
    """Every option of the named generator ``name``, defaults filled in (ValueError for options it
    does not take): ``{"n": 1000}`` and ``{"n": 1000, "seed": 0}`` draw the same data."""
    import inspect

    sig = inspect.signature(DATASETS[name][0])
    try:
        bound = sig.bind(**options)
    except TypeError as e:
        raise ValueError(f"bad options {options} for data set {name!r}: {e}") from e
    bound.apply_defaults()
    return dict(bound.arguments)


def recipe(name: str, **options) -> dict:
    """The canonical recipe of a named data set: its name, every generator option (defaults filled
    in), :data:`GENERATOR_VERSION` and the versions of the libraries that draw it (NumPy's bit
    generators, scikit-learn's sheets). Equal recipes draw equal data."""
    import sklearn

    if name not in DATASETS:
        raise ValueError(f"{name!r} is not a named data set; known names: {', '.join(DATASETS)}")
    params = json.loads(json.dumps(_maker_params(name, options), sort_keys=True, default=str))
    return {
        "name": name,
        "params": params,
        "generator_version": GENERATOR_VERSION,
        "numpy": np.__version__,
        "scikit-learn": sklearn.__version__,
    }


def recipe_fingerprint(name: str, **options) -> str:
    """The fingerprint of a named data set: a hash of its :func:`recipe`, known without drawing
    the data (a sweep plans from it; the worker that ingests draws the data). The store records
    it as its ``fingerprint`` beside the drawn data's ``content_fingerprint``."""
    blob = json.dumps(recipe(name, **options), sort_keys=True).encode()
    return "recipe-" + hashlib.sha256(blob).hexdigest()[:25]


#: the option that sets a named generator's number of rows, and the value a probe draws with
_ROWS_OPTION = {"n": 16, "n_per_node": 1}


def _describe_named(name: str, options: dict) -> dict:
    """:func:`describe` of a named data set without drawing it: the generator runs at a probe size
    (16 rows, or one sample per tree node) for the variables, dimensions and attributes, and the
    row count is scaled to the asked size (every generator here draws exactly ``n`` rows, or
    ``n_per_node`` per node). Options it cannot take are refused as :func:`load` refuses them."""
    params = _maker_params(name, options)  # ValueError for an option the generator lacks
    probe = dict(options)
    for opt, small in _ROWS_OPTION.items():
        value = params.get(opt)
        if (
            opt in params
            and isinstance(value, (int, np.integer))
            and not isinstance(value, bool)
            and value > small
        ):
            probe[opt] = small
            ds = load(name, **probe)
            rows = ds.sizes["point"] // small * int(value)
            break
    else:  # a small or an invalid size: draw it (small), or let the generator refuse it
        ds = load(name, **options)
        rows = ds.sizes["point"]
    attrs = dict(ds.attrs)
    attrs.update({k: v for k, v in load_attrs(name, options).items() if k in ("params", "seed")})
    return {
        "sizes": {**dict(ds.sizes), "point": rows},
        "attrs": attrs,
        "fingerprint": recipe_fingerprint(name, **options),
    }


def load_attrs(name: str, options: dict) -> dict:
    """The ``params`` and ``seed`` attributes :func:`load` gives the named data set ``name``."""
    maker = DATASETS[name][0]
    params = dict(options)
    params.setdefault("seed", 0 if "seed" in maker.__code__.co_varnames else None)
    return _attrs(name=name, source=f"generator:{name}", params=params)


def load(name_or_path, **options) -> xr.Dataset:
    """Load a named data set (see :func:`list_datasets`) or a user file as an xarray Dataset.

    Named sets take their generator options (``n``, ``seed``, ``depth`` ...). Files: ``.npy``
    (loaded with ``allow_pickle=False``), ``.csv`` (numeric columns; ``label_column=`` names a
    label column), ``.zarr`` (a store written by :func:`ingest`), ``.h5ad`` / ``.h5mu`` and
    ``load("views", views=[...])`` (lvmcore.data.sources: use_rep, layer, preprocess, modalities,
    view, label_column, color_column, max_features). Unknown options are refused.
    """
    from lvmcore.data import sources

    src = str(name_or_path)
    if sources.handles(src, options):
        ds = _load_source(src, options)
        log.info("%s: read %d rows x %d columns", src, ds.sizes["point"], ds.sizes["feature"])
        return ds
    if src in DATASETS:
        maker = DATASETS[src][0]
        _check_named_options(src, options)
        try:
            parts = maker(**options)
        except TypeError as e:
            raise ValueError(f"bad options {options} for data set {src!r}: {e}") from e
        params = dict(options)
        params.setdefault("seed", 0 if "seed" in maker.__code__.co_varnames else None)
        ds = _finish(name=src, source=f"generator:{src}", params=params, **parts)
    else:
        path = Path(src)
        if path.suffix.lower() == ".zarr" or (path.is_dir() and (path / "zarr.json").exists()):
            ds = open_dataset(path)
            from lvmcore.data.stream import _plain_options

            _plain_options(path, dict(options), int(ds.sizes.get("feature", 0)))
            log.info("%s: read %d rows x %d columns", src, ds.sizes["point"], ds.sizes["feature"])
            return ds
        if path.suffix == "" and not path.exists():
            raise ValueError(
                f"unknown data set {src!r}; known names: {', '.join(DATASETS)}; "
                "or give a .npy/.csv/.zarr/.h5ad/.h5mu path"
            )
        opts = dict(options)
        parts = _load_file(path, opts)
        applied = parts.pop("applied", {})
        extra = {
            k: parts.pop(k)
            for k in ("label_names", "label_column", "color_column", "color_names")
            if k in parts
        }
        ds = _finish(name=path.stem, source=f"file:{path.resolve()}", params=applied, **parts)
        for k, v in extra.items():
            if v is not None:
                ds.attrs[k] = json.dumps(v) if isinstance(v, list) else v
        from lvmcore.data.stream import _source_info

        ds.attrs["source_info"] = _source_info(path, path.suffix.lower().lstrip("."), applied)
    _check_finite(ds, src)
    log.info("%s: read %d rows x %d columns", src, ds.sizes["point"], ds.sizes["feature"])
    return ds


def _load_source(src, options) -> xr.Dataset:
    """A .h5ad / .h5mu file or a list of view files read whole (lvmcore.data.sources)."""
    from lvmcore.data import sources

    source, fp = sources.open_source(src, **options)
    data = {
        name: (v.dims, np.asarray(v.read(0, v.shape[0]), dtype=v.dtype))
        for name, v in source.variables.items()
    }
    ds = xr.Dataset(data, attrs={**source.attrs, "fingerprint": fp})
    _check_finite(ds, str(src))
    return ds


def _check_named_options(name: str, options: dict) -> None:
    """Unknown options of a named data set refused (naming them and the accepted ones), and the
    limits of the bundled sets checked against the options."""
    import inspect

    from lvmcore.checks import check_options

    check_options(options, inspect.signature(DATASETS[name][0]).parameters, f"data-set ({name})")
    if name == "digits" and options.get("n_per_class") is not None:
        from sklearn.datasets import load_digits

        classes = options.get("classes", 5)
        n = options["n_per_class"]
        if isinstance(classes, int) and 2 <= classes <= 10 and isinstance(n, int) and not isinstance(n, bool):
            counts = np.bincount(load_digits().target)[:classes]
            if n > counts.min() or n < 1:
                raise ValueError(
                    f"digits: n_per_class = {n} is out of range: the first {classes} classes have "
                    f"{counts.min()} to {counts.max()} samples each, so n_per_class must be 1 .. "
                    f"{counts.min()}; lower n_per_class (or leave it out for every sample)"
                )


def views_of(ds: xr.Dataset) -> list[np.ndarray]:
    """The views of a multi-view data set as arrays (a single-view set gives [Y])."""
    names = list(ds.attrs.get("views", []))
    return [ds[v].values for v in names] if names else [ds["Y"].values]


def open_dataset(path, *, dask: bool = True) -> xr.Dataset:
    """Open a data store written by :func:`ingest`, with a clear error if it is not one.

    ``dask=False`` opens it with lazily indexed numpy-backed variables instead of Dask arrays:
    use it for reads inside a Dask task, where computing a Dask array makes the task secede from
    the worker's thread pool and lets the worker start its next task beside it."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"data store {str(path)!r} does not exist; run ingest first")
    try:
        ds = xr.open_zarr(path, consolidated=False, **({} if dask else {"chunks": None}))
    except Exception as e:
        raise ValueError(
            f"{path} is not a readable zarr data store ({type(e).__name__}: {e}); delete it and ingest again"
        ) from e
    if "Y" not in ds:
        raise ValueError(f"{path} has no 'Y' variable; it was not written by lvmcore.data.ingest")
    if isinstance(ds.attrs.get("views"), str):
        ds.attrs["views"] = json.loads(ds.attrs["views"])
    return ds


def describe(name_or_path, **options) -> dict:
    """``{"sizes": {dim: size}, "attrs": ..., "fingerprint": ...}`` of what :func:`load` would give,
    without holding a large file: .npy, .zarr and .h5ad files are read in row blocks
    (lvmcore.data.stream); a named data set is not drawn (its fingerprint is its
    :func:`recipe_fingerprint`, its sizes come from a small probe); .csv files are loaded,
    described and dropped."""
    from lvmcore.data import stream

    if str(name_or_path) in DATASETS:
        _check_named_options(str(name_or_path), options)
        return _describe_named(str(name_or_path), dict(options))
    if stream.is_streamable(name_or_path, options):
        return stream.describe(name_or_path, **options)
    ds = load(name_or_path, **options)
    return {"sizes": dict(ds.sizes), "attrs": dict(ds.attrs), "fingerprint": fingerprint(ds)}


def ingest(ds_or_name, path, *, chunk_rows: int = 4096, overwrite: bool = False, **options) -> Path:
    """Write a data set to a chunked zarr store at ``path`` (row chunks of ``chunk_rows``).

    The store is written beside the target under a temporary name and renamed into place once
    complete, so a crash never leaves a half-written store under the final name. An existing
    store is kept unless ``overwrite=True``. A .npy, .zarr or .h5ad file is copied in row blocks
    (lvmcore.data.stream.ingest_stream: memory-mapped, chunk by chunk, backed), never held whole.
    A named data set is drawn here and recorded with its :func:`recipe_fingerprint` (what
    :func:`describe` gives for it).
    """
    from lvmcore.data import stream

    if not isinstance(ds_or_name, xr.Dataset) and str(ds_or_name) not in DATASETS:
        if stream.is_streamable(ds_or_name, options):
            return stream.ingest_stream(
                ds_or_name, path, chunk_rows=chunk_rows, overwrite=overwrite, **options
            )[0]
    ds = ds_or_name if isinstance(ds_or_name, xr.Dataset) else load(ds_or_name, **options)
    named = not isinstance(ds_or_name, xr.Dataset) and str(ds_or_name) in DATASETS
    fp = recipe_fingerprint(str(ds_or_name), **options) if named else None
    return write_store(ds, path, fp, chunk_rows=chunk_rows, overwrite=overwrite)


def write_store(
    ds: xr.Dataset,
    path,
    fp: str | None = None,
    *,
    chunk_rows: int = 4096,
    overwrite: bool = False,
    content: str | None = None,
) -> Path:
    """Write ``ds`` to a data store at ``path`` (see :func:`ingest`), recording ``fp`` as its
    ``fingerprint`` (None: the data's content fingerprint) and the content fingerprint as
    ``content_fingerprint`` (``content``, if the caller computed it already)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists; pass overwrite=True or choose another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    encoding = {}
    for name, var in ds.data_vars.items():
        chunks = tuple(min(chunk_rows, s) if d == "point" else s for d, s in zip(var.dims, var.shape))
        encoding[name] = {"chunks": chunks}
    out = ds.copy()
    out.attrs = {k: (json.dumps(v) if isinstance(v, list) else v) for k, v in ds.attrs.items()}
    content = content or fingerprint(ds)
    # a file read through lvmcore.data.sources is identified by its plan (files and options)
    info = ds.attrs.get("source_info")
    kind = json.loads(info).get("kind") if isinstance(info, str) else None
    planned = ds.attrs.get("fingerprint") if kind in ("h5ad", "h5mu", "views") else None
    out.attrs["fingerprint"] = fp or planned or content
    out.attrs["content_fingerprint"] = content
    try:
        out.to_zarr(tmp, mode="w", encoding=encoding, consolidated=False, zarr_format=3)
        replace_dir(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path
