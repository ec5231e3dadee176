"""What a result store holds: the status codes, per-point scalars and metrics, the chunking and
codecs of its arrays, the sizes of a sweep's non-sweep dimensions (``Layout``), one grid point's
result (``PointResult``) and each model group's lazy template."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import dask.array as da
import numpy as np
import xarray as xr
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from tasks.registry import COV_SCALES, DIAGNOSTICS, EXTRAS_FLAG, ModelSpec, model_grid
from tasks.store.fingerprint import NUMERICS_CHARS

#: the version of what a result store holds, one number for the whole store (root attribute
#: ``schema_version``; a store without it is version 1), raised by each change of its content:
#: 1: embeddings, variances, metrics, traces and extras per grid point;
#: 2 (issue 50): each finished point's fitted model as plain arrays (``<key>/models/<point id>/``,
#: :mod:`tasks.store.models`) with its size per point (``model_bytes``), and the preprocessing that
#: made the fitted matrix kept with the ingested inputs; and (issue 52, the same version) the graph
#: models' ``n_components_graph`` and GLLE's per-point ``has_extras`` (1: the point carries paper
#: 001's generations and covariance-scale study; 0: fitted without them, their arrays NaN there; NaN
#: in a store written before the flag, where every finished point carries them: tasks.results.extras).
#: Whatever else this turn adds to the store shares this number.
SCHEMA_VERSION = 2
#: the first schema version whose finished points keep their fitted models
MODELS_SCHEMA = 2

STATUS_PENDING, STATUS_DONE, STATUS_FAILED = 0, 1, 2
STATUS_NAMES = {STATUS_PENDING: "pending", STATUS_DONE: "done", STATUS_FAILED: "failed"}
ERROR_CHARS = 400
METRICS = (
    "trustworthiness",
    "continuity",
    "knn_accuracy",
    "distance_correlation",
    "pearson_distance_correlation",
    "shepard_goodness",
    "procrustes_disparity",
    "qlocal",
    "qglobal",
)
#: ``converged``: 1 where the fit ended by its own stopping rule (or is a closed form), 0 where it
#: ran out of iterations or its optimiser gave up (the model's ``converged_``)
SCALARS = ("elbo", "fit_seconds", "n_iter", "converged") + METRICS
#: per grid point, beside the scalars: the bytes its fitted model takes on disk (NaN: not recorded,
#: a point written before models were kept; 0: none kept, tasks.store.models)
MODEL_BYTES = "model_bytes"
MAX_TRACE = 2000

#: rows per chunk along ``point`` (embeddings, variances, generations): a grid point's cell of a
#: 10^6-point sweep is then 16 chunks of 1 MiB (latent_dim 2), not one chunk of 16 MiB that every
#: reader of a few rows must read and decompress whole
POINT_CHUNK = 65536

#: the bytes-to-bytes codecs of every array of a store this version writes: zarr's default zstd,
#: then zarr v3's crc32c codec, which appends a CRC-32C of each compressed chunk and refuses a
#: chunk whose bytes changed when it is read, so a damaged chunk is named instead of read as
#: numbers (issue 36 item 3). Stores written without it still open; ``verify`` says that their
#: chunks carry no checksum.
CHECKSUMMED = (ZstdCodec(level=0), Crc32cCodec())


@dataclass
class Layout:
    """Sizes of the non-sweep dimensions of every group of one sweep."""

    n_points: int
    q_max: int
    n_views: int = 1
    n_generations: int = 0
    trace_len: dict = field(default_factory=dict)  # key -> iterations kept
    #: the version of the numerics the points record (``numerics_version()`` of the process that
    #: planned the sweep, so every worker records the one its run is checked against)
    numerics: str = ""


@dataclass
class PointResult:
    """Everything one grid point produces; ``status`` is ``done`` or ``failed``."""

    key: str
    index: tuple
    point: dict
    status: str
    error: str = ""
    embedding: np.ndarray | None = None
    embedding_var: np.ndarray | None = None
    elbo: float = float("nan")
    elbo_trace: np.ndarray | None = None
    n_iter: float = float("nan")
    converged: float = float("nan")
    fit_seconds: float = float("nan")
    extras: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    #: the fitted model as ``to_arrays()`` gave it, (arrays, params); None where none is kept;
    #: ``model_error``: why ``to_arrays`` refused it
    model: tuple | None = None
    model_error: str = ""


def extra_shape(dims, layout: Layout):
    size = {
        "point": layout.n_points,
        "component": layout.q_max,
        "view": layout.n_views,
        "generation": layout.n_generations,
        "cov_scale": len(COV_SCALES),
    }
    return tuple(size[d] for d in dims)


def group_template(spec: ModelSpec, grid: dict, layout: Layout) -> xr.Dataset:
    """Lazy template of one model's group (nothing is computed or held in memory)."""
    g = model_grid(spec, grid)
    sdims = tuple(g)
    sshape = tuple(len(g[d]) for d in sdims)
    ones = (1,) * len(sdims)

    def lazy(extra_dims, extra_shape, fill=np.nan, dtype=np.float64):
        chunks = tuple(min(s, POINT_CHUNK) if d == "point" else s for d, s in zip(extra_dims, extra_shape))
        return (
            sdims + tuple(extra_dims),
            da.full(sshape + tuple(extra_shape), fill, dtype=dtype, chunks=ones + chunks),
        )

    n, q = layout.n_points, layout.q_max
    v = {
        "embedding": lazy(("point", "component"), (n, q)),
        "elbo_trace": lazy(("iteration",), (layout.trace_len.get(spec.key, 1),)),
        "status": lazy((), (), fill=STATUS_PENDING, dtype=np.int8),
        "error": lazy((), (), fill="", dtype=f"<U{ERROR_CHARS}"),
        "numerics": lazy((), (), fill="", dtype=f"<U{NUMERICS_CHARS}"),
    }
    if spec.has_variance:
        v["embedding_var"] = lazy(("point", "component"), (n, q))
    for name in SCALARS:
        v[name] = lazy((), ())
    v[MODEL_BYTES] = lazy((), ())
    for name, dims in stored_extras(spec, layout).items():
        v[name] = lazy(dims, extra_shape(dims, layout))
    coords = {d: g[d] for d in sdims}
    if any("cov_scale" in dims for name, dims in spec.extras.items() if name in v):
        coords["cov_scale"] = np.asarray(COV_SCALES)
    ds = xr.Dataset(v, coords=coords)
    ds["status"].attrs = {"flag_values": [0, 1, 2], "flag_meanings": "pending done failed"}
    ds.attrs = {
        "model": spec.family,
        "key": spec.key,
        "description": spec.description,
        "estimator": spec.target,
        "fixed_options": json.dumps(spec.fixed),
        "sweep_dims": list(sdims),
        "hyperbolic_embedding": int(spec.hyperbolic),
    }
    return ds


def open_root(path: Path):
    try:
        return zarr.open_group(str(path), mode="r")
    except Exception as e:
        raise ValueError(
            f"{path} exists but is not a readable zarr store ({type(e).__name__}: {e}); "
            "choose another --store path or delete it"
        ) from e


def array_dims(arr) -> list:
    """A zarr array's dimension names: xarray's ``_ARRAY_DIMENSIONS`` attribute, else the zarr v3
    metadata's ``dimension_names``."""
    return arr.attrs.get("_ARRAY_DIMENSIONS") or list(getattr(arr.metadata, "dimension_names", None) or [])


def stored_extras(spec: ModelSpec, layout: Layout) -> dict:
    """A model's extras as its group template holds them (no generation arrays, nor their per-point
    flag, without generations)."""
    skip = (*DIAGNOSTICS, EXTRAS_FLAG) if layout.n_generations == 0 else ()
    return {name: dims for name, dims in spec.extras.items() if name not in skip}


def write_template(ds: xr.Dataset, target, key: str) -> None:
    """Write a group's lazy template (metadata and coordinates), every array with ``CHECKSUMMED``."""
    ds.to_zarr(
        str(target), group=key, compute=False, mode="a", consolidated=False, zarr_format=3,
        encoding={name: {"compressors": CHECKSUMMED} for name in ds.variables},
    )  # fmt: skip
