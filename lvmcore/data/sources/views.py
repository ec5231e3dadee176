"""A list of view files (``{"views": ["rna.npy", "adt.csv"]}``): one view per .npy or numeric
.csv file, rows in the same order and the same count; options ``view`` (``"concat"``, the
default, or a view's name) and ``max_features``."""

from __future__ import annotations

from pathlib import Path

from lvmcore.checks import check_options
from lvmcore.data.sources.base import check_extent, check_width, max_features
from lvmcore.data.sources.csv import read_csv
from lvmcore.data.sources.npy import NpyMatrix, open_npy
from lvmcore.data.sources.planned import ArrayMatrix, Plan, View

__all__ = ["VIEWS_OPTIONS", "VIEWS_SOURCE", "plan_views"]

VIEWS_OPTIONS = ("views", "view", "max_features")
#: the source name of a list of view files ({"views": [...]} without a path)
VIEWS_SOURCE = "views"


def plan_views(opts: dict) -> Plan:
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
            m = NpyMatrix(str(p.resolve()), tuple(open_npy(p).shape))
        elif suffix == ".csv":
            m = ArrayMatrix(str(p), read_csv(p, {})["Y"])
        else:
            raise ValueError(
                f"view file {f!r}: only .npy and .csv files are views; use .h5mu for AnnData modalities"
            )
        check_extent(m.shape, str(p), "give the view's features, or leave the file out")
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
