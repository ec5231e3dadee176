"""A data store written by :func:`lvmcore.data.ingest` (a ``.zarr`` folder) as a source: its
variables read chunk by chunk, its attributes as ingested (less the fingerprints, which a new
store records afresh)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lvmcore.data.sources.base import Source, Variable, check_extent, plain_options, refuse_nonfinite
from lvmcore.data.store import open_dataset

__all__ = ["store_source"]


def store_source(path: Path, options: dict) -> Source:
    """The store at ``path`` as a source (``max_features`` its only option)."""
    ds = open_dataset(path, dask=False)
    check_extent(ds["Y"].shape, str(path))
    plain_options(path, options, int(ds.sizes.get("feature", 0)))
    attrs = {k: v for k, v in ds.attrs.items() if k not in ("fingerprint", "content_fingerprint")}
    fitted = ["Y", *attrs.get("views", [])]

    def reader(name, var):
        def read(a, b):
            block = np.asarray(var[a:b].values)
            if name in fitted:
                refuse_nonfinite(block, str(path), name, a)
            return block

        return read

    variables = {
        name: Variable(var.dims, var.shape, var.dtype, reader(name, var))
        for name, var in ds.data_vars.items()
    }
    return Source(str(path), variables, attrs)
