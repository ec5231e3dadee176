"""Data sets: seeded generators (:mod:`.synthetic`), bundled and user files, zarr stores."""

from lvmcore.data.loaders import (
    DATASETS,
    describe,
    fingerprint,
    ingest,
    list_datasets,
    load,
    open_dataset,
    recipe,
    recipe_fingerprint,
    views_of,
    write_store,
)

__all__ = [
    "DATASETS",
    "describe",
    "fingerprint",
    "ingest",
    "list_datasets",
    "load",
    "open_dataset",
    "recipe",
    "recipe_fingerprint",
    "views_of",
    "write_store",
]
