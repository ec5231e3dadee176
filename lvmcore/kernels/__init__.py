"""Kernels, one module per geometry: ``euclidean`` (RBF-ARD, linear-ARD, with their closed-form
psi statistics, paper 004 appendix A) and ``hyperbolic`` (the hyperboloid exponential kernel,
paper 002 eq. 10, with its Monte-Carlo psi statistics, eqs. 13-20).

:func:`expectations` is the one entry to the psi statistics of a kernel under q(X), dispatched
on the kernel's type (as GPflow's ``expectations``): a new kernel registers its own, and the
bound code (``lvmcore.collapsed``) does not change."""

from __future__ import annotations

import functools

from lvmcore.kernels.euclidean import RBF, Linear
from lvmcore.kernels.hyperbolic import HyperboloidExponential

__all__ = ["expectations", "RBF", "Linear", "HyperboloidExponential"]


@functools.singledispatch
def expectations(kernel, mu, S, Z, kp, Y, **kw):
    """psi statistics of ``kernel`` under q(X) (means ``mu``, variances ``S``) at the inducing
    inputs Z, summed over the rows of this chunk: (psi0, Psi1^T Y, Psi2), and for the hyperboloid
    kernel the KL of q(X) as a fourth entry."""
    raise TypeError(f"no psi statistics for a kernel of type {type(kernel).__name__}")


@expectations.register(type)
def _(kernel, mu, S, Z, kp, Y, **kw):  # the Euclidean kernels are classes with static methods
    if kernel in (RBF, Linear):
        return kernel.psi(mu, S, Z, kp, Y, **kw)
    raise TypeError(f"no psi statistics for {kernel!r}")


@expectations.register(HyperboloidExponential)
def _(kernel, mu, S, Z, kp, Y, *, eps, prior_log_var=0.0):
    return kernel.psi(mu, S, Z, kp, Y, eps=eps, prior_log_var=prior_log_var)
