"""Kernels, one module per geometry: ``euclidean`` (RBF-ARD, linear-ARD, paper 004 appendix A)
and ``hyperbolic`` (the hyperboloid exponential kernel, paper 002 eq. 10). A kernel holds K only;
its psi statistics under q(X) are :mod:`lvmcore.psi`'s, dispatched on the kernel's type (as
GPflow's ``kernels`` and ``expectations``), so this package never imports ``lvmcore.psi``."""

from __future__ import annotations

from lvmcore.kernels.euclidean import RBF, Linear
from lvmcore.kernels.hyperbolic import HyperboloidExponential

__all__ = ["RBF", "Linear", "HyperboloidExponential"]
