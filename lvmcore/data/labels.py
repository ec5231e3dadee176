"""Labels and colours from a table column, in the layout every loader shares (lvmcore.checks).

Labels are integer codes ``0 .. C-1`` with :data:`lvmcore.checks.MISSING_LABEL` (-1) for a point
with no label (NaN, None or an empty string in the file): never a class of its own. The category
names are kept beside the codes (``names[code]``) and recorded as the ingested store's
``label_names`` attribute.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lvmcore.checks import MISSING_LABEL

__all__ = ["encode_labels", "encode_color", "check_label_column"]


def _missing(values) -> np.ndarray:
    s = pd.Series(values, copy=False)
    miss = s.isna().to_numpy().copy()
    if s.dtype == object or pd.api.types.is_string_dtype(s.dtype):
        miss = miss | (s.astype(str).str.strip().eq("").to_numpy() & ~miss)
    return miss


def encode_labels(values) -> tuple[np.ndarray, list[str]]:
    """(int64 codes, names) of a column: categories in their declared order for a pandas
    Categorical, else in sorted order of the values (numbers numerically); missing values get
    ``MISSING_LABEL``. Names are the categories as strings."""
    s = pd.Series(values, copy=False)
    miss = _missing(s)
    if isinstance(s.dtype, pd.CategoricalDtype):
        # declared order; an empty-string category (anndata stores text columns as categories)
        # is a missing value, not a class
        cats = pd.Index([c for c in s.cat.categories if not (isinstance(c, str) and c.strip() == "")])
        codes = cats.get_indexer(s.astype(object).where(~miss, None)).astype(np.int64)
        codes[miss] = MISSING_LABEL
        used = list(cats)
    else:
        present = s[~miss]
        cats = pd.Index(pd.unique(present.to_numpy()))
        try:
            cats = cats.sort_values()
        except TypeError:  # mixed types: order of appearance
            pass
        codes = np.full(len(s), MISSING_LABEL, dtype=np.int64)
        codes[~miss] = cats.get_indexer(present.to_numpy())
        used = list(cats)
    names = [_name(c) for c in used]
    return codes, names


def check_label_column(values, column: str, where: str) -> None:
    """Refuse a numeric label column that holds a quantity rather than classes: numbers that are not
    whole (a score, a pseudotime), or whole numbers most of which are distinct (a cell's total
    count, an index). Each distinct value would be a class of its own and the label metrics would
    measure nothing. Categorical and text columns, and numeric class ids (also floats with NaN),
    are classes."""
    s = pd.Series(values, copy=False)
    if isinstance(s.dtype, pd.CategoricalDtype) or pd.api.types.is_bool_dtype(s.dtype):
        return
    if not pd.api.types.is_numeric_dtype(s.dtype):
        return
    x = s.to_numpy(dtype=np.float64, na_value=np.nan)
    x = x[np.isfinite(x)]
    distinct, whole = len(np.unique(x)), bool(np.all(x == np.round(x)))
    if not x.size or (whole and (distinct <= 20 or 2 * distinct <= x.size)):
        return
    what = "whole numbers, most of them distinct" if whole else "numbers that are not whole"
    raise ValueError(
        f"{where}: label_column {column!r} holds {what} ({distinct} distinct values among {x.size} "
        "points): a quantity, not classes; give it as color_column to colour by it, or name a "
        "categorical column (or bin this one into one) for labels"
    )


def _name(c) -> str:
    if isinstance(c, (float, np.floating)) and float(c).is_integer():
        return str(int(c))
    return str(c)


def encode_color(values) -> tuple[np.ndarray, list[str] | None]:
    """(float64 colour values, names or None) of a column: numbers as they are (NaN where
    missing); a categorical or text column as its label codes (NaN where missing) with its names."""
    s = pd.Series(values, copy=False)
    if pd.api.types.is_numeric_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype):
        return s.to_numpy(dtype=np.float64, na_value=np.nan), None
    codes, names = encode_labels(s)
    out = codes.astype(np.float64)
    out[codes == MISSING_LABEL] = np.nan
    return out, names
