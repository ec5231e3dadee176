"""Ingest a data set into the sweep's data store (once per sweep)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from lvmcore.data import (
    DATASETS,
    VIEWS_SOURCE,
    fingerprint,
    ingest_source,
    load,
    open_dataset,
    preprocessing_kept,
    recipe,
    recipe_fingerprint,
    source_info,
    write_store,
)


def dataset_spec(dataset) -> tuple[str, dict]:
    """(name or path, options) from a flow parameter: a string, or a dict with ``name`` / ``path``."""
    if isinstance(dataset, str):
        return dataset, {}
    if isinstance(dataset, dict):
        d = dict(dataset)
        src = d.pop("name", None) or d.pop("path", None)
        if not src and "views" in d:  # a list of view files: {"views": ["rna.npy", "adt.npy"]}
            return VIEWS_SOURCE, d
        if not src:
            raise ValueError(f"dataset {dataset!r} needs a 'name', a 'path' or 'views'")
        return str(src), d
    raise ValueError(f"dataset must be a name, a path or a dict, got {type(dataset).__name__}")


def stored_fingerprint(data_path, which: str = "fingerprint") -> str | None:
    """The fingerprint an ingested data store records (None if it has none): ``fingerprint`` (what
    the sweep planned with: a named set's recipe, a file's content) or ``content_fingerprint``."""
    try:
        return open_dataset(data_path).attrs.get(which)
    except ValueError:
        return None


@contextlib.contextmanager
def preprocessing_client():
    """The Dask client a data set's preprocessing (its PCA passes, lvmcore.data.pca_stream) runs
    on: inside a Dask task the worker's own (``worker_client``: the task secedes and its work runs
    on the same cluster without deadlocking a one-thread worker, shared/STACK.md); elsewhere a
    client registered in this process; else None (the passes run here)."""
    try:
        from distributed import get_worker, worker_client

        get_worker()
    except (ImportError, ValueError):
        # the client is found first and yielded outside the try: an error of the caller's block
        # (a ValueError refusing the data) must come out as itself, not be caught here
        try:
            from distributed import default_client

            client = default_client()
        except (ImportError, ValueError):
            client = None
        yield client
        return
    with worker_client(separate_thread=True) as client:
        yield client


def preprocessing_missing(data_path) -> bool:
    """Whether the ingested store of an .h5ad / .h5mu file was written before the ingest kept the
    preprocessing (genes, PCA loadings and mean: lvmcore.data.store.write_preprocessing)."""
    try:
        open_dataset(data_path)
    except ValueError:
        return False
    kind = (source_info(str(data_path)) or {}).get("kind")
    return kind in ("h5ad", "h5mu") and not preprocessing_kept(data_path)


def ingest_dataset(
    dataset, data_path: str, expect: str | None = None, keep_preprocessing: bool = False
) -> str:
    """Write the data set to ``data_path`` unless a store with the same content fingerprint is
    already there (a store made from other data, or one without a fingerprint, is rewritten).

    ``expect``: the fingerprint the sweep planned with; data that loads differently now (a file
    changed between planning and ingest) is refused rather than fitted.

    A file (or a list of view files) is copied in row blocks through its source
    (lvmcore.data.ingest_source), never held whole: the worker that ingests holds one block at a
    time; a preprocessing PCA runs its passes on this worker's cluster (:func:`preprocessing_client`).
    An .h5ad / .h5mu file's store records its plan's fingerprint (the file's content and the
    options, lvmcore.data.sources.planned): a store with it is reused as it is, its preprocessing
    (PCA) included, when the sweep resumes or grows. A named data set is drawn here, on the
    worker (the flow planned from its recipe, lvmcore.data.recipe_fingerprint): a store is reused
    only if it records this recipe and the content just drawn.

    ``keep_preprocessing`` (``--refit-models``): a file's store written before the preprocessing was
    kept with it is written again, so that it is (the refit then says if any embedding moved)."""
    src, opts = dataset_spec(dataset)
    p = Path(data_path)
    if src not in DATASETS:
        if expect is not None and p.exists() and stored_fingerprint(p) == expect:
            if not (keep_preprocessing and preprocessing_missing(p)):
                return str(p)
        with preprocessing_client() as client:
            _, fp = ingest_source(src, p, overwrite=True, client=client, **opts)
        if expect is not None and fp != expect:
            shutil.rmtree(p, ignore_errors=True)
            raise ValueError(
                f"the data {src!r} changed while the sweep started (fingerprint {fp}, planned {expect}); "
                "run the sweep again"
            )
        return str(p)
    fp = recipe_fingerprint(src, **opts)
    if expect is not None and fp != expect:
        raise ValueError(
            f"the data set {src!r} has recipe fingerprint {fp} on this worker, the sweep planned "
            f"{expect} (this worker's recipe: {recipe(src, **opts)}); give the flow process and "
            "the workers the same embed-sweep, NumPy and scikit-learn versions"
        )
    want = load(src, **opts)
    content = fingerprint(want)
    if p.exists() and stored_fingerprint(p) == fp and stored_fingerprint(p, "content_fingerprint") == content:
        return str(p)
    write_store(want, p, fp, overwrite=True, content=content)
    return str(p)


def ingested_attrs(data_path) -> dict:
    """What only the ingest knows, for the result store's attributes: ``data_preprocess`` (per
    view: the settings, the explained variance and its ratio, the target sum and the PCA route)
    where the data were preprocessed; empty otherwise."""
    try:
        attrs = open_dataset(data_path).attrs
    except ValueError:
        return {}
    return {"data_preprocess": attrs["preprocess"]} if "preprocess" in attrs else {}
