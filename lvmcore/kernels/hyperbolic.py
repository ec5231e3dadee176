"""Hyperboloid exponential (HE) kernel of the hyperboloid GP-LVM paper, section 3.1, eq. (10).

The geodesic exponential kernel (Feragen et al., 2015) on the Lorentz model L^Q:

    k(x, x') = sigma * exp(-d_L(x, x') / kappa),   d_L(x, x') = arccosh(-<x, x'>_L)   (eqs. 10, 8)

with variance sigma and length scale kappa.  It is positive definite because the hyperbolic
metric is conditionally negative definite (Istas, 2012).  The paper treats kappa as a fixed
hyper-parameter (kappa = 100 in its experiments).

This module is the kernel's one home: the hyperboloid GP-LVM (:mod:`lvmcore.models.hgplvm`) and
its Monte-Carlo psi statistics (:mod:`lvmcore.psi.monte_carlo`) both evaluate it through
:func:`he_kernel` (any points) or :func:`he_kernel_chords` (from squared chord lengths, with the
derivative the hand-written point-variant gradient needs). :class:`HyperboloidExponential` is the
kernel as an object beside ``lvmcore.kernels.euclidean``'s RBF-ARD and linear-ARD; it holds K only,
and its psi statistics under a wrapped-Gaussian q(X) (Monte Carlo, eqs. 13-20) are
``lvmcore.psi``'s, dispatched on the kernel's type.  Everything is float64 under a scoped
``jax.enable_x64(True)`` (:func:`x64`): importing this module changes no global JAX setting.
"""

from __future__ import annotations

import numbers

import jax.numpy as jnp
import numpy as np

from lvmcore.manifolds.lorentz import pairwise_dist
from lvmcore.precision import x64

__all__ = ["he_kernel", "he_kernel_diag", "he_kernel_chords", "HyperboloidExponential"]


def _check_params(variance, kappa) -> None:
    """Validate Python-number hyper-parameters (traced/array values are left alone)."""
    if isinstance(kappa, numbers.Real) and not kappa > 0:
        raise ValueError(
            f"he_kernel: length scale kappa must be > 0, got kappa={kappa!r}; pass a positive "
            "length scale (the paper uses kappa=100; larger kappa spreads the latents further)"
        )
    if isinstance(variance, numbers.Real) and not variance >= 0:
        raise ValueError(
            f"he_kernel: variance sigma must be >= 0, got variance={variance!r}; pass a "
            "non-negative variance (e.g. optimise log-variance and exponentiate it)"
        )


@x64
def he_kernel(X, Z, variance, kappa):
    """HE kernel matrix K[..., i, j] = variance * exp(-d_L(X[..., i], Z[..., j]) / kappa) (eq. 10).

    X: (..., N, Q+1) and Z: (..., M, Q+1) points on the hyperboloid (last axis = ambient
    coordinate, leading axes broadcast); returns (..., N, M) float64.  Differentiable in X, Z,
    variance and kappa; the distance uses the stable form of :func:`lvmcore.manifolds.lorentz.dist`,
    so gradients stay finite where X[i] == Z[j] (the kink of the kernel gets the zero sub-gradient).
    Usable inside traced code.  Raises ValueError if kappa is a Python number <= 0 (or variance a
    Python number < 0).
    """
    _check_params(variance, kappa)
    return variance * jnp.exp(-pairwise_dist(X, Z) / kappa)


@x64
def he_kernel_chords(sq, variance, kappa):
    """HE kernel from squared Lorentz chords sq = <x - x', x - x'>_L = 4 sinh^2(d / 2) >= 0.

    Returns (K, dK/dsq): d = 2 asinh(sqrt(sq) / 2), K = variance exp(-d / kappa) and
    dK/dsq = -K / (kappa sqrt(sq) sqrt(4 + sq)), set to 0 at sq = 0 (the kink's zero sub-gradient).
    """
    _check_params(variance, kappa)
    pos = sq > 1e-24
    h = 0.5 * jnp.sqrt(jnp.where(pos, sq, 1.0))
    s1 = jnp.sqrt(1.0 + h * h)
    d = jnp.where(pos, 2.0 * jnp.log(h + s1), 0.0)
    K = variance * jnp.exp(-d / kappa)
    dK = jnp.where(pos, -K / (kappa * 4.0 * h * s1), 0.0)
    return K, dK


@x64
def he_kernel_diag(X, variance):
    """Diagonal of he_kernel(X, X, variance, kappa): variance at every point (d(x, x) = 0), (N,)."""
    _check_params(variance, 1.0)
    X = jnp.asarray(X, dtype=jnp.float64)
    return variance * jnp.ones(X.shape[:-1], dtype=jnp.float64)


class HyperboloidExponential:
    """The HE kernel (eq. 10) as an object: parameters ``{"log_var": []}`` (log sigma); kappa is
    the paper's fixed hyper-parameter, held by the object. Its psi statistics are
    ``lvmcore.psi.psi_statistics(kernel, ...)`` (Monte Carlo, :mod:`lvmcore.psi.monte_carlo`)."""

    name = "he"

    def __init__(self, kappa: float):
        _check_params(1.0, kappa)
        self.kappa = kappa  # a number, or a traced value inside a compiled step

    @staticmethod
    def init(var: float, q: int) -> dict:
        return {"log_var": np.log(var)}

    @x64
    def K(self, X, Z, kp):
        return he_kernel(X, Z, jnp.exp(kp["log_var"]), self.kappa)
