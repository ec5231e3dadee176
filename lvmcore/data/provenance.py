"""Where an ingested data store came from: the source file, its fingerprint, the options applied,
the cells' names and the label names (the export writes the embeddings back into that file).

Every function here takes ``data_path``, the ingested data store (``x.inputs/data.zarr`` of a
result store ``x.zarr``, or any store written by :func:`lvmcore.data.ingest`), and reads only its
metadata and small per-cell variables.

The file fingerprint (:func:`file_fingerprint`) is ``"sha256:<size>:<hex>"``: the SHA-256 of the
file's bytes (for a directory, e.g. a ``.zarr`` store: of every file's relative path, size and
bytes, in sorted path order). It is cheap next to a sweep (one sequential read, about 1 GB/s) and
faithful: any changed byte changes it, and nothing but the content (not the path, not the
modification time) enters it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import zarr

__all__ = ["file_fingerprint", "source_info", "obs_names", "label_names", "color_names", "SOURCE_KINDS"]

#: the kinds of file a data set can come from (``source_info(...)["kind"]``)
SOURCE_KINDS = ("h5ad", "h5mu", "npy", "csv", "zarr", "views")

_CACHE: dict = {}


def _stat_key(p: Path):
    st = p.stat()
    return (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


def file_fingerprint(path) -> str:
    """``"sha256:<size in bytes>:<hex digest>"`` of the file's content (a directory: every file
    under it, by relative path; ``<size>`` is then the total). ValueError if it does not exist.
    Cached per process by path, size, modification time and inode."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{str(p)!r} does not exist; check the path")
    key = _stat_key(p)
    if key in _CACHE:
        return _CACHE[key]
    h = hashlib.sha256()
    if p.is_dir():
        total = 0
        for root, dirs, files in os.walk(p):
            dirs.sort()
            for name in sorted(files):
                fp = Path(root) / name
                rel = fp.relative_to(p).as_posix()
                size = fp.stat().st_size
                total += size
                h.update(f"{rel}\0{size}\0".encode())
                with open(fp, "rb") as f:
                    h.update(hashlib.file_digest(f, "sha256").digest())
        size = total
    else:
        size = p.stat().st_size
        with open(p, "rb") as f:
            h = hashlib.file_digest(f, "sha256")
    out = f"sha256:{size}:{h.hexdigest()}"
    _CACHE[key] = out
    return out


def _attrs(data_path) -> dict:
    try:
        meta = json.loads((Path(data_path) / "zarr.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{data_path} is not a readable ingested data store ({e}); run the sweep again to ingest it"
        ) from e
    return meta.get("attributes", {})


def _json_attr(attrs: dict, name: str):
    v = attrs.get(name)
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def source_info(data_path) -> dict | None:
    """For data from a file: ``{"kind": "h5ad" | "h5mu" | "npy" | "csv" | "zarr" | "views",
    "path": absolute path of the source file (for "views": a list of them), "fingerprint":
    file_fingerprint(path) at ingest (a list for "views"), "options": the options applied (every
    default filled in), "modalities": [names] (h5mu, else []), "dropped": {modality: cells left
    out by the inner join on obs_names} (h5mu, else {})}``. None for a named (generated or
    bundled) data set."""
    info = _json_attr(_attrs(data_path), "source_info")
    return dict(info) if isinstance(info, dict) else None


def obs_names(data_path) -> np.ndarray | None:
    """The cells' names (``obs_names`` of the AnnData / MuData) in the stored row order, as a
    ``str`` array; None where the source has none (named data sets, .npy, .csv)."""
    g = zarr.open_group(str(data_path), mode="r")
    if "obs_names" not in g:
        return None
    return np.asarray(g["obs_names"][:]).astype(str)


def label_names(data_path) -> list[str] | None:
    """The label categories by code (``names[code]``; code -1 = no label), or None where the data
    has no labels or no names for them. The store's ``label_column`` attribute names the column."""
    v = _json_attr(_attrs(data_path), "label_names")
    return [str(x) for x in v] if isinstance(v, list) else None


def color_names(data_path) -> list[str] | None:
    """The categories of a categorical ``color_column`` (the colour variable holds their codes,
    NaN where missing), or None for a numeric colour or none."""
    v = _json_attr(_attrs(data_path), "color_names")
    return [str(x) for x in v] if isinstance(v, list) else None
