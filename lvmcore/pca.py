"""Principal components, the one PCA start and the one probabilistic-PCA noise estimate of lvmcore.

* :func:`principal` - the mean, the q leading eigenvalues of the N-normalised sample covariance
  (1/N) (Y - mean)^T (Y - mean), their eigenvectors and the total variance (its trace).
* :func:`pca_start` - the PCA scores (N, q) of Y (or whitened: U_q), the one latent start of the
  GP-LVM family (hyperboloid, Bayesian, MRD, both minibatch estimators).
* :func:`ppca_noise_variance` - the maximum-likelihood noise variance of q-dimensional
  probabilistic PCA (Tipping and Bishop 1999, eq. 15): the mean of the D - q smallest eigenvalues
  of the N-normalised covariance, the zero ones included when N < D. The GP-LVM with a linear
  kernel is dual PPCA (Lawrence 2005) and has this noise at its optimum.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Principal(NamedTuple):
    mean: np.ndarray  # (D,)
    values: np.ndarray  # (q,) leading eigenvalues of the N-normalised covariance, descending
    vectors: np.ndarray  # (D, q) their unit eigenvectors
    total: float  # trace of the N-normalised covariance (sum of all D eigenvalues)
    n: int


def principal(Y, q: int) -> Principal:
    """The q leading principal directions of Y (N, D) under the N-normalised covariance.

    Many more rows than columns (N >= 10 D): the D x D covariance's eigenvectors (no centred copy
    of Y); otherwise the SVD of the centred data."""
    Y = np.asarray(Y, dtype=np.float64)
    n, d = Y.shape
    mean = Y.mean(0)
    q = min(int(q), d)
    if n >= 10 * d:
        C = (Y.T @ Y) / n - np.outer(mean, mean)
        C = 0.5 * (C + C.T)
        w, V = np.linalg.eigh(C)
        order = np.argsort(w)[::-1]
        values, vectors, total = np.maximum(w[order[:q]], 0.0), V[:, order[:q]], float(np.trace(C))
    else:
        Yc = Y - mean
        _, s, Vt = np.linalg.svd(Yc, full_matrices=False)
        ev = s**2 / n
        k = min(q, len(s))
        values = np.zeros(q)
        values[:k] = ev[:k]
        vectors = np.zeros((d, q))
        vectors[:, :k] = Vt[:k].T
        total = float(np.sum(Yc * Yc) / n)
    return Principal(mean, values, vectors, total, n)


#: from this many rows on (and N >= 10 D) :func:`pca_start` takes the scores from the D x D
#: covariance's eigenvectors instead of the SVD (a full SVD holds the data, its centred copy and U:
#: about 4 copies, 1.5 GiB at 10^6 x 50; bench/README.md, "scale")
PCA_COVARIANCE_ROWS = 50_000


def pca_start(Y, q: int, whiten: bool = False, overwrite: bool = False) -> np.ndarray:
    """The PCA start of the GP-LVM family: the scores (N, q) of Y, U_q s_q of the centred data's
    SVD, i.e. (Y - mean) projected on the q leading directions (zero columns past the data's rank);
    ``whiten``: U_q, each column divided by its singular value. ``overwrite``: Y (float64) may be
    centred in place.

    Large tall data (N >= ``PCA_COVARIANCE_ROWS`` and N >= 10 D) take the directions V from the
    D x D matrix Yc^T Yc (one centred copy, no N x D factor), scores Yc V (whitened: / s), each
    column's sign set so that its largest loading is positive; smaller data keep the SVD, whose
    signs are LAPACK's (a start's signs are arbitrary: the models' bounds are invariant to
    reflecting the latent space)."""
    Yc = np.asarray(Y, dtype=np.float64) if overwrite else np.array(Y, dtype=np.float64)
    Yc -= Yc.mean(0)
    n, d = Yc.shape
    if n >= PCA_COVARIANCE_ROWS and n >= 10 * d:
        r = min(q, d)
        evals, V = np.linalg.eigh(Yc.T @ Yc)
        V = V[:, ::-1][:, :r]
        V = V * np.sign(V[np.argmax(np.abs(V), axis=0), np.arange(r)])
        scores = Yc @ V
        if whiten:
            scores /= np.sqrt(np.clip(evals[::-1][:r], 1e-300, None))
    else:
        U, s, _ = np.linalg.svd(Yc, full_matrices=False)
        scores = U[:, :q] if whiten else U[:, :q] * s[:q]
    if scores.shape[1] < q:
        scores = np.pad(scores, ((0, 0), (0, q - scores.shape[1])))
    return scores


def ppca_noise_variance(Y, q: int, p: Principal | None = None) -> float | None:
    """Maximum-likelihood noise variance of q-dimensional PPCA: (total variance - the q leading
    eigenvalues) / (D - q), every eigenvalue of the N-normalised covariance counted (those that are
    zero because N < D too). None if D <= q. ``p``: :func:`principal` of Y already computed."""
    d = np.shape(Y)[1]
    q = int(q)
    if d <= q:
        return None
    p = principal(Y, q) if p is None else p
    return float(max(p.total - float(np.sum(p.values[:q])), 0.0) / (d - q))
