"""A numeric CSV file as a source: parsed whole (a CSV file is small by nature), label and colour
columns taken out by name, pandas' index column dropped, a header row found or given."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from lvmcore.checks import check_options
from lvmcore.data.labels import check_label_column, encode_color, encode_labels
from lvmcore.data.sources.base import (
    Source,
    array_source,
    check_extent,
    check_width,
    dataset_attrs,
    file_source_info,
    max_features,
    refuse_nonfinite,
)

__all__ = ["CSV_OPTIONS", "read_csv", "csv_source"]

log = logging.getLogger("lvmcore.data")

CSV_OPTIONS = ("label_column", "color_column", "header", "max_features")


def read_csv(path: Path, options: dict) -> dict:
    """A numeric CSV file: ``label_column`` / ``color_column`` name columns (labels as codes, -1
    where empty, names kept); ``header`` ``"auto"`` (a first row with any non-number names the
    columns), true or false. A first column with no name holding 0 .. N-1 (pandas' ``to_csv``
    index) is dropped, with a log line. ``options`` is emptied of what was applied, which is
    returned under ``"applied"``."""
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
    columns = list(df.columns)
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
    out["columns"] = [columns.index(c) for c in df.columns]  # the file's column numbers
    out["applied"] = applied
    log.info("%s: %s", path, "header row read as column names" if header else "no header row")
    return out


def _is_pandas_index(path: Path, df) -> bool:
    """Whether the first column is pandas' default ``to_csv`` index: an empty header field
    (read as ``Unnamed: 0``) over the integers 0 .. N-1."""
    with open(path, newline="") as f:
        first = next(csv.reader(f), [])
    if not first or first[0].strip() != "":
        return False
    col = df.iloc[:, 0]
    return col.dtype.kind in "iu" and np.array_equal(col.to_numpy(), np.arange(len(df)))


def _csv_first_row_is_header(path: Path) -> bool:
    """Whether a CSV file's first row names its columns: it does unless every field of it reads
    as a number (a numeric first row is data, e.g. ``np.savetxt(..., delimiter=",")`` output)."""
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


def csv_source(path: Path, options: dict) -> Source:
    """The CSV file as a source (its options: :data:`CSV_OPTIONS`); NaN or inf refused naming the
    data row and the file's column."""
    parts = read_csv(path, dict(options))
    applied = parts.pop("applied", {})
    Y = parts["Y"]
    check_extent(Y.shape, str(path), "the file has no numeric column besides the label and colour columns")
    refuse_nonfinite(Y, str(path), "data", 0, columns=parts["columns"])
    data = {"Y": (("point", "feature"), Y)}
    if "label" in parts:
        data["label"] = (("point",), np.asarray(parts["label"], dtype=np.int64))
    if "color" in parts:
        data["color"] = (("point",), np.asarray(parts["color"], dtype=np.float64))
    attrs = dataset_attrs(name=path.stem, source=f"file:{path.resolve()}", params=applied)
    for k in ("label_names", "label_column", "color_column", "color_names"):
        v = parts.get(k)
        if v is not None:
            attrs[k] = json.dumps(v) if isinstance(v, list) else v
    attrs["source_info"] = file_source_info(path, "csv", applied)
    return array_source(str(path), data, attrs)
