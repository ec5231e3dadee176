"""Data sets: named generators and bundled sets, user files (one reader per format, each giving a
row-block source: lvmcore.data.sources), their preprocessing, and the ingested zarr store.

Contract of the ingested data store (what the export and the report read back; every function
takes ``data_path``, the store written by :func:`ingest`, e.g. ``x.inputs/data.zarr``):

- :func:`source_info` ``(data_path) -> dict | None``: for data from a file ``{"kind": "h5ad" |
  "h5mu" | "npy" | "csv" | "zarr" | "views", "path": the source file's absolute path (a list for
  "views"), "fingerprint": :func:`file_fingerprint` of it at ingest (a list for "views"),
  "options": the data-set options applied (defaults filled in), "modalities": [names] (h5mu),
  "dropped": {modality: cells left out by the inner join on obs_names} (h5mu)}``; None for a
  named data set.
- :func:`file_fingerprint` ``(path) -> str``: ``"sha256:<size>:<hex>"`` of the file's bytes (a
  directory: of its files), the same value ``source_info`` records, so a copy can be checked.
- :func:`obs_names` ``(data_path) -> np.ndarray[str] | None``: the cells' names in stored row
  order (None where the source has none).
- :func:`label_names` ``(data_path) -> list[str] | None``: category names by label code (code -1:
  no label, lvmcore.checks.MISSING_LABEL); :func:`color_names` likewise for a categorical colour.
- attributes ``label_column`` and ``color_column`` of the store: the obs / CSV columns they came
  from (absent when none was given).
"""

from lvmcore.data.fingerprint import fingerprint
from lvmcore.data.loaders import BLOCK_ROWS, check_input, describe, ingest, ingest_source, load, views_of
from lvmcore.data.provenance import color_names, file_fingerprint, label_names, obs_names, source_info
from lvmcore.data.sources import open_source
from lvmcore.data.sources.base import MAX_FEATURES
from lvmcore.data.sources.hdf5 import read_obs, read_var
from lvmcore.data.sources.named import DATASETS, list_datasets, recipe, recipe_fingerprint
from lvmcore.data.sources.views import VIEWS_SOURCE
from lvmcore.data.store import open_dataset, preprocessing_kept, read_preprocessing, write_store

__all__ = [
    "BLOCK_ROWS",
    "DATASETS",
    "MAX_FEATURES",
    "VIEWS_SOURCE",
    "check_input",
    "color_names",
    "describe",
    "file_fingerprint",
    "fingerprint",
    "ingest",
    "ingest_source",
    "label_names",
    "list_datasets",
    "load",
    "obs_names",
    "open_dataset",
    "open_source",
    "preprocessing_kept",
    "read_obs",
    "read_preprocessing",
    "read_var",
    "recipe",
    "recipe_fingerprint",
    "source_info",
    "views_of",
    "write_store",
]
