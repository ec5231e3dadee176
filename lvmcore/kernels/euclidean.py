"""Euclidean ARD kernels of the Bayesian GP-LVM and MRD (paper 004, section 3 and appendix A),
one object each; they hold K only (their psi statistics are ``lvmcore.psi``'s, by kernel type).

* RBF:    k(x, z) = variance * exp(-1/2 sum_q (x_q - z_q)^2 / lengthscale_q^2)
* linear: k(x, z) = sum_q variances_q x_q z_q

A kernel object carries no state: its parameters are a dict of log-values (the optimiser's
unconstrained coordinates) passed to every method. Each kernel gives

* ``init(var, Q)``: the parameters at the start of a fit (signal variance ``var`` of the data);
* ``K(X, Z, kp)``: the kernel matrix [N, M];
* ``ard(kp)``: the input sensitivities [Q] that ARD switches off (RBF: variance / lengthscale^2).

A new kernel brings these three, and registers its psi statistics under q(X) with
``lvmcore.psi`` (the closed forms of these two: ``lvmcore.psi.closed_form``); the collapsed bound
(``lvmcore.collapsed``) does not change.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lvmcore.precision import jit64, x64

__all__ = ["rbf_K", "linear_K", "RBF", "Linear", "KERNELS", "get_kernel"]


@jit64
def rbf_K(X, Z, variance, lengthscale):
    """RBF-ARD kernel matrix k(X, Z) [N, M]; ``lengthscale`` a scalar or [Q]."""
    X, Z = jnp.asarray(X, jnp.float64), jnp.asarray(Z, jnp.float64)
    ls = jnp.broadcast_to(jnp.asarray(lengthscale, jnp.float64), (X.shape[1],))
    Xs, Zs = X / ls, Z / ls
    d2 = (Xs * Xs).sum(1)[:, None] + (Zs * Zs).sum(1)[None, :] - 2.0 * (Xs @ Zs.T)
    return variance * jnp.exp(-0.5 * jnp.maximum(d2, 0.0))


@jit64
def linear_K(X, Z, variances):
    """Linear-ARD kernel matrix k(X, Z) = X diag(variances) Z^T [N, M]."""
    X, Z = jnp.asarray(X, jnp.float64), jnp.asarray(Z, jnp.float64)
    v = jnp.broadcast_to(jnp.asarray(variances, jnp.float64), (X.shape[1],))
    return (X * v) @ Z.T


class RBF:
    """RBF-ARD: parameters ``{"log_var": [], "log_ls": [Q]}``."""

    name = "rbf"

    @staticmethod
    def init(var: float, q: int) -> dict:
        return {"log_var": np.log(var), "log_ls": np.zeros(q)}

    @staticmethod
    @x64
    def K(X, Z, kp):
        return rbf_K(X, Z, jnp.exp(kp["log_var"]), jnp.exp(kp["log_ls"]))

    @staticmethod
    def ard(kp) -> np.ndarray:
        return np.exp(np.asarray(kp["log_var"])) / np.exp(2.0 * np.asarray(kp["log_ls"]))


class Linear:
    """Linear-ARD: parameters ``{"log_vars": [Q]}``."""

    name = "linear"

    @staticmethod
    def init(var: float, q: int) -> dict:
        return {"log_vars": np.full(q, np.log(var / q))}

    @staticmethod
    @x64
    def K(X, Z, kp):
        return linear_K(X, Z, jnp.exp(kp["log_vars"]))

    @staticmethod
    def ard(kp) -> np.ndarray:
        return np.exp(np.asarray(kp["log_vars"]))


KERNELS = {k.name: k for k in (RBF, Linear)}


def get_kernel(name: str):
    """The kernel object named ``name`` ("rbf", "linear")."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; use one of {sorted(KERNELS)}") from None
