"""One reader per file format, each giving a :class:`~lvmcore.data.sources.base.Source` (the
protocol: variables read in row blocks, and attributes), and :func:`open_source`, the one entry
that picks the reader.

=========  ==========================================  ================================
kind       what                                        reader
=========  ==========================================  ================================
named      a generator or bundled set, by name         :mod:`.named` (drawn in memory)
npy        an N x D ``.npy`` array                     :mod:`.npy` (row blocks)
csv        a numeric ``.csv`` table                    :mod:`.csv` (parsed whole)
zarr       a store written by lvmcore.data.ingest      :mod:`.zarrstore` (chunks)
h5ad       an AnnData file, with options               :mod:`.h5ad` -> :mod:`.plan`
h5mu       a MuData file, with options                 :mod:`.h5mu` -> :mod:`.plan`
views      ``{"views": [file, ...]}``                  :mod:`.views` -> :mod:`.plan`
=========  ==========================================  ================================

The last three are planned first (:func:`plan`: metadata, ``obs`` and ``var`` only; the plan's
fingerprint is known before any data pass), then read (:func:`lvmcore.data.sources.planned.plan_source`,
where preprocessing runs on the client the caller passes).
"""

from __future__ import annotations

from pathlib import Path

from lvmcore.data.sources import hdf5, named
from lvmcore.data.sources.base import Source
from lvmcore.data.sources.csv import csv_source
from lvmcore.data.sources.h5ad import plan_h5ad
from lvmcore.data.sources.h5mu import plan_h5mu
from lvmcore.data.sources.npy import npy_source
from lvmcore.data.sources.planned import Plan, plan_source
from lvmcore.data.sources.views import VIEWS_SOURCE, plan_views
from lvmcore.data.sources.zarrstore import store_source

__all__ = ["PLANNED", "kind_of", "plan", "open_source", "Source", "Plan"]

#: the kinds read through a plan (a file with options; lvmcore.data.sources.planned)
PLANNED = ("h5ad", "h5mu", "views")


def kind_of(src, options: dict) -> str:
    """Which reader ``src`` (a name or a path) with ``options`` is for (the table above); a
    ValueError naming the fix where none is."""
    s = str(src)
    if s == VIEWS_SOURCE and "views" in options:
        return "views"
    path = Path(s)
    suffix = path.suffix.lower()
    if suffix in (".h5ad", ".h5mu"):
        return suffix[1:]
    if s in named.DATASETS:
        return "named"
    if suffix == ".zarr" or (path.is_dir() and (path / "zarr.json").exists()):
        return "zarr"
    if suffix == "" and not path.exists():
        raise ValueError(
            f"unknown data set {s!r}; known names: {', '.join(named.DATASETS)}; "
            "or give a .npy/.csv/.zarr/.h5ad/.h5mu path"
        )
    if not path.exists():
        raise ValueError(f"data file {s!r} does not exist; check the path")
    if suffix in (".npy", ".csv"):
        return suffix[1:]
    raise ValueError(f"unsupported file type {suffix!r} for {path}; use .npy, .csv, .zarr, .h5ad or .h5mu")


def plan(src, **options) -> Plan:
    """The plan of a .h5ad / .h5mu file or a list of view files (metadata, obs and var only); an
    HDF5 file that cannot be read is refused naming its cause (lvmcore.data.sources.hdf5)."""
    opts = dict(options)
    if str(src) == VIEWS_SOURCE and "views" in opts:
        return plan_views(opts)
    path = Path(str(src))
    if not path.exists():
        raise ValueError(f"data file {str(path)!r} does not exist; check the path")
    try:
        if path.suffix.lower() == ".h5ad":
            return plan_h5ad(path, opts)
        return plan_h5mu(path, opts)
    except OSError as e:
        raise hdf5.hdf5_refusal(path, e) from e


def open_source(src, *, client=None, **options) -> Source:
    """``src`` (a named data set, a file's path, or ``"views"`` with ``views=[...]``) with its
    ``options`` as a :class:`Source`; unknown options and bad values refused naming the fix.
    ``client``: the Dask client a view's preprocessing (PCA) runs its passes on (None: in this
    process)."""
    kind = kind_of(src, options)
    if kind == "named":
        return named.named_source(str(src), dict(options))
    if kind in PLANNED:
        return plan_source(plan(src, **options), str(src), client)
    path = Path(str(src))
    if kind == "zarr":
        return store_source(path, dict(options))
    if kind == "npy":
        return npy_source(path, dict(options))
    return csv_source(path, dict(options))
