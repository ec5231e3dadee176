"""Preprocessing by scanpy's definitions, applied to a file's row blocks as they are read.

``{"normalize_total": 1e4, "log1p": true, "pca": 50}`` means, as in scanpy 1.11:

- ``sc.pp.normalize_total(adata, target_sum=1e4)``: each cell's row divided by its total count
  and multiplied by ``target_sum`` (``true``: the median total over the cells, scanpy's
  ``target_sum=None``); a cell with no counts stays zero;
- ``sc.pp.log1p(adata)``: x -> log(1 + x), on the stored non-zeros only (log1p(0) = 0);
- ``sc.pp.pca(adata, n_comps=50)``: principal components of the centred matrix Z - 1 mu^T (of
  ``var["highly_variable"]``'s genes where the file has that column, scanpy's default
  ``mask_var``: :func:`resolve_mask`). The centring is implicit, never applied to a block: the
  cross-products are formed from the sparse blocks and corrected by the column means, e.g. (eq. P1)
  C = (Z^T Z - N mu mu^T) / (N - 1), so a sparse block is never densified. The explained variance
  is the eigenvalue of C (the N - 1 normalisation, as scikit-learn's and scanpy's), its ratio is
  over trace(C) (the total variance of every feature), the scores are Z V - 1 (mu^T V) and each
  component's sign is scikit-learn's (``svd_flip``: its largest-magnitude loading positive).

The PCA itself runs streamed over the file's row blocks (lvmcore.data.pca_stream); this module
holds the settings, the gene mask and the per-block transforms.
"""

from __future__ import annotations

import logging
import numbers

import numpy as np
import scipy.sparse as sp

from lvmcore.checks import check_options

__all__ = [
    "PREPROCESS_OPTIONS",
    "normalise_settings",
    "resolve_mask",
    "output_width",
    "needs_counts",
    "check_counts",
    "transform_block",
]

log = logging.getLogger("lvmcore.data")

PREPROCESS_OPTIONS = (
    "normalize_total",
    "log1p",
    "pca",
    "pca_solver",
    "pca_iter",
    "pca_seed",
    "pca_tol",
    "pca_block",
    "mask_var",
)
PCA_SOLVERS = ("auto", "covariance", "lanczos", "arpack", "randomized")
#: the PCA options beyond ``pca`` itself (each needs ``pca``)
PCA_TUNING = ("pca_solver", "pca_iter", "pca_seed", "pca_tol", "pca_block", "mask_var")
#: block Lanczos: a Ritz pair is converged when its residual norm ||C v - theta v|| is at most
#: ``pca_tol`` theta (ARPACK's test, which scanpy runs with tol = 0: machine precision)
LANCZOS_TOL = 1e-10
#: block Lanczos: vectors per pass over the data
LANCZOS_BLOCK = 4


def normalise_settings(pre, where: str) -> dict | None:
    """The ``preprocess`` option with every default filled in, or None for no preprocessing;
    ValueError naming the key and the fix for anything unknown or out of range."""
    if pre is None:
        return None
    if not isinstance(pre, dict):
        raise ValueError(
            f"{where}: preprocess must be a mapping like "
            f'{{"normalize_total": 1e4, "log1p": true, "pca": 50}}, got {pre!r}'
        )
    check_options(pre, PREPROCESS_OPTIONS, f"{where}: preprocess")
    out = {}
    nt = pre.get("normalize_total")
    if nt is None or nt is False:
        out["normalize_total"] = None
    elif nt is True:
        out["normalize_total"] = "median"
    elif isinstance(nt, numbers.Real) and not isinstance(nt, bool) and np.isfinite(nt) and nt > 0:
        out["normalize_total"] = float(nt)
    else:
        raise ValueError(
            f"{where}: preprocess normalize_total must be a positive number (the target sum, e.g. 1e4) or "
            f"true (the median total), got {nt!r}"
        )
    lg = pre.get("log1p", False)
    if not isinstance(lg, bool):
        raise ValueError(f"{where}: preprocess log1p must be true or false, got {lg!r}")
    out["log1p"] = lg
    pca = pre.get("pca")
    if pca is not None and (isinstance(pca, bool) or not isinstance(pca, numbers.Integral) or pca < 1):
        raise ValueError(f"{where}: preprocess pca must be a positive number of components, got {pca!r}")
    out["pca"] = None if pca is None else int(pca)
    solver = pre.get("pca_solver", "auto")
    if solver not in PCA_SOLVERS:
        raise ValueError(f"{where}: preprocess pca_solver must be one of {PCA_SOLVERS}, got {solver!r}")
    it = pre.get("pca_iter", 7)
    if isinstance(it, bool) or not isinstance(it, numbers.Integral) or it < 0:
        raise ValueError(f"{where}: preprocess pca_iter must be a non-negative integer, got {it!r}")
    seed = pre.get("pca_seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"{where}: preprocess pca_seed must be a non-negative integer, got {seed!r}")
    tol = pre.get("pca_tol", LANCZOS_TOL)
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not (0 < tol < 1):
        raise ValueError(f"{where}: preprocess pca_tol must be a number in (0, 1), e.g. 1e-10, got {tol!r}")
    block = pre.get("pca_block", LANCZOS_BLOCK)
    if isinstance(block, bool) or not isinstance(block, numbers.Integral) or block < 1:
        raise ValueError(f"{where}: preprocess pca_block must be a positive integer, got {block!r}")
    if out["pca"] is None and any(key in pre for key in PCA_TUNING):
        raise ValueError(f"{where}: preprocess {' / '.join(PCA_TUNING)} need pca (a number of components)")
    mask = pre.get("mask_var", "auto")
    if mask is not None and not isinstance(mask, str):
        raise ValueError(
            f"{where}: preprocess mask_var must be a boolean var column's name or null, got {mask!r}"
        )
    out.update(
        pca_solver=solver, pca_iter=int(it), pca_seed=int(seed), pca_tol=float(tol), pca_block=int(block)
    )
    out["mask_var"] = mask  # "auto" until the plan has read var (resolve_mask)
    if out["pca"] is None:
        for key in PCA_TUNING:
            out.pop(key)
    if out["normalize_total"] is None and not out["log1p"] and out["pca"] is None:
        raise ValueError(f"{where}: preprocess {pre!r} does nothing; give normalize_total, log1p or pca")
    return out


def resolve_mask(settings: dict | None, var, where: str) -> np.ndarray | None:
    """The genes the PCA uses, by scanpy's ``mask_var``: "auto" (not given) takes the boolean column
    ``var["highly_variable"]`` where the file has one (scanpy's default) and every gene otherwise;
    a name takes that boolean column; null takes every gene. Sets ``settings["mask_var"]`` to the
    column used, or drops it when every gene is (the settings then read as before the option
    existed). Returns the column indices, or None for every gene. ``var``: the matrix's var table,
    None when its columns are not genes (an obsm representation)."""
    if not settings or settings.get("pca") is None:
        return None
    mask = settings.pop("mask_var", None)
    if mask == "auto":
        mask = "highly_variable" if var is not None and "highly_variable" in var.columns else None
        if mask is not None:
            log.info("%s: PCA on var['highly_variable'] (scanpy's default; mask_var null: every gene)", where)
    if mask is None:
        return None
    if var is None:
        raise ValueError(
            f"{where}: preprocess mask_var {mask!r} selects genes, and an obsm representation's columns are "
            "not genes; drop mask_var, or read X or a layer"
        )
    flags = [str(c) for c in var.columns if var[c].dtype == bool]
    if mask not in var.columns or var[mask].dtype != bool:
        raise ValueError(
            f"{where}: preprocess mask_var {mask!r} is not a boolean var column; boolean var columns: "
            f"{flags} (or null for every gene)"
        )
    columns = np.flatnonzero(var[mask].to_numpy())
    if len(columns) == 0:
        raise ValueError(
            f"{where}: preprocess mask_var {mask!r} selects no gene; name another column or null"
        )
    settings["mask_var"] = mask
    return columns


def output_width(settings: dict | None, width: int) -> int:
    return width if not settings or settings.get("pca") is None else int(settings["pca"])


def needs_counts(settings: dict | None) -> bool:
    """Whether the settings transform the values as counts (normalize_total or log1p)."""
    return bool(settings) and (settings.get("normalize_total") is not None or bool(settings.get("log1p")))


def check_counts(block, settings: dict | None, where: str, first_row: int = 0, fix: str = "") -> None:
    """Refuse a row block with negative values when ``settings`` treat them as counts: normalize_total
    divides by a row total that may then be negative or near zero, log1p of a value below -1 is NaN,
    and either turns scaled or centred data (an already processed X, a PCA in obsm) into numbers
    that look like a result and mean nothing. scanpy runs on; here it is a refusal naming the rows."""
    if not needs_counts(settings):
        return
    values = block.data if sp.issparse(block) else np.asarray(block)
    smallest = np.nanmin(values) if values.size else 0.0
    if not smallest < 0:
        return
    rows_neg = (block < 0).sum(axis=1) if sp.issparse(block) else (values < 0).sum(axis=1)
    neg = np.flatnonzero(np.asarray(rows_neg).ravel())
    steps = [k for k in ("normalize_total", "log1p") if settings.get(k) not in (None, False)]
    raise ValueError(
        f"{where} has negative values (the smallest {float(smallest):.4g}; first in row "
        f"{first_row + int(neg[0])}, {len(neg)} of rows {first_row}-{first_row + block.shape[0] - 1}), "
        f"so it is not counts, and preprocess {' and '.join(steps)} {'take' if len(steps) > 1 else 'takes'} "
        f"counts: name the raw counts{fix}, or drop {' and '.join(steps)} (pca alone takes any values)"
    )


def transform_block(block, settings: dict | None, target, where: str = "the matrix", first_row: int = 0):
    """normalize_total (to ``target``) then log1p of one row block (CSR stays CSR); a block with
    negative values is refused (:func:`check_counts`; ``where`` and ``first_row`` name it)."""
    if not settings:
        return block
    check_counts(block, settings, where, first_row)
    if settings.get("normalize_total") is not None:
        totals = np.asarray(block.sum(axis=1)).ravel()
        factor = totals / target
        factor[factor == 0] = 1.0  # scanpy: a cell with no counts is left as it is
        if sp.issparse(block):
            block = block.tocsr(copy=True)
            block.data /= np.repeat(factor, np.diff(block.indptr))
        else:
            block = block / factor[:, None]
    if settings.get("log1p"):
        if sp.issparse(block):
            block = block.tocsr(copy=True) if not settings.get("normalize_total") else block
            block.data = np.log1p(block.data)
        else:
            block = np.log1p(block)
    return block
