"""Hyperboloid exponential (HE) kernel of the hyperboloid GP-LVM paper, section 3.1, eq. (10).

The geodesic exponential kernel (Feragen et al., 2015) on the Lorentz model L^Q:

    k(x, x') = sigma * exp(-d_L(x, x') / kappa),   d_L(x, x') = arccosh(-<x, x'>_L)   (eqs. 10, 8)

with variance sigma and length scale kappa.  It is positive definite because the hyperbolic
metric is conditionally negative definite (Istas, 2012).  The paper treats kappa as a fixed
hyper-parameter (kappa = 100 in its experiments).
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

from lvmcore.manifolds.lorentz import pairwise_dist

__all__ = ["he_kernel", "he_kernel_diag"]


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


def he_kernel(X, Z, variance, kappa):
    """HE kernel matrix K[i, j] = variance * exp(-d_L(X[i], Z[j]) / kappa) (eq. 10).

    X: (N, Q+1) and Z: (M, Q+1) points on the hyperboloid (last axis = ambient coordinate);
    returns (N, M) float64.  Differentiable in X, Z, variance and kappa; the distance uses the
    stable form of :func:`lvmcore.manifolds.lorentz.dist`, so gradients stay finite where
    X[i] == Z[j] (the kernel has a kink there; the zero sub-gradient of d is used).

    Raises ValueError if kappa is a Python number <= 0 (or variance a Python number < 0).
    """
    _check_params(variance, kappa)
    return _he_kernel(X, Z, variance, kappa)


@jax.jit
def _he_kernel(X, Z, variance, kappa):
    # variance and kappa are traced (not static): no recompilation when they change
    return variance * jnp.exp(-pairwise_dist(X, Z) / kappa)


def he_kernel_diag(X, variance):
    """Diagonal of he_kernel(X, X, variance, kappa): variance at every point (d(x, x) = 0), (N,)."""
    _check_params(variance, 1.0)
    X = jnp.asarray(X, dtype=jnp.float64)
    return variance * jnp.ones(X.shape[:-1], dtype=jnp.float64)
