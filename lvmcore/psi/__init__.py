"""The psi statistics of a kernel under q(X), one entry dispatched by the kernel's type (GPflow's
``expectations``): :func:`psi_statistics` (a chunk's sums (psi0, Psi1^T Y, Psi2), and for the
hyperboloid kernel the KL of q(X) as a fourth entry) and :func:`psi1` (Psi1 row by row, for
prediction at uncertain inputs). Every model's bound goes through them; a new kernel registers
its statistics in :data:`STATISTICS` (:func:`register`) and the bound code does not change.

The implementations, by kernel: ``closed_form`` (RBF-ARD, linear-ARD under diagonal Gaussian
q(X)), with ``native`` (a C kernel for the RBF Psi2's pair sums, the default path wherever it
builds), and ``monte_carlo`` (the hyperboloid exponential kernel under wrapped Gaussians). The
chunked map-reduce over rows is ``lvmcore.chunks``."""

from __future__ import annotations

from lvmcore.kernels import RBF, HyperboloidExponential, Linear
from lvmcore.psi import closed_form, monte_carlo

__all__ = ["STATISTICS", "MOMENTS", "psi_statistics", "psi1", "row_moments", "register"]

#: kernel class -> (chunk sums, Psi1 rows or None): ``f(kernel, mu, S, Z, kp, Y, **options)`` and
#: ``g(kernel, mu, S, Z, kp)``, kp the kernel's parameters as the kernel object holds them
STATISTICS: dict = {
    RBF: (closed_form.rbf_statistics, closed_form.rbf_rows),
    Linear: (closed_form.linear_statistics, closed_form.linear_rows),
    HyperboloidExponential: (monte_carlo.he_statistics, None),
}


#: kernel class -> ``f(kernel, mu, S, Z, kp)``: one row's (psi0, psi1 [M], Psi2 - psi1 psi1^T
#: [M, M]) under N(mu, diag S) (mu, S: [Q]), the covariance without cancellation (new points)
MOMENTS: dict = {RBF: closed_form.rbf_moments, Linear: closed_form.linear_moments}


def register(kernel_class: type, statistics, rows=None, moments=None) -> None:
    """Register the psi statistics of a new kernel class (the entries of :data:`STATISTICS` and,
    where it has them, :data:`MOMENTS`)."""
    STATISTICS[kernel_class] = (statistics, rows)
    if moments is not None:
        MOMENTS[kernel_class] = moments


def _entry(kernel, which: int):
    # the Euclidean kernels are classes with static methods, the hyperboloid kernel an instance
    cls = kernel if isinstance(kernel, type) else type(kernel)
    fns = (*STATISTICS.get(cls, (None, None)), MOMENTS.get(cls))
    if fns[which] is None:
        what = ("psi statistics", "Psi1 rows", "row moments")[which]
        raise TypeError(
            f"no {what} for a kernel of type {cls.__name__}; register them with lvmcore.psi.register"
        )
    return fns[which]


def psi_statistics(kernel, mu, S, Z, kp, Y, **options):
    """The psi statistics of ``kernel`` (parameters ``kp``) under q(X) (means ``mu`` [B, .],
    variances ``S`` [B, Q]) at the inducing inputs ``Z`` [M, .], summed over the rows of this chunk
    with data ``Y`` [B, D]: (psi0 [], Psi1^T Y [M, D], Psi2 [M, M]), and for the hyperboloid kernel
    the KL of q(X) [] as a fourth entry. ``options``: the implementation's (RBF: ``primal``,
    ``impl``; hyperboloid: the draws ``eps`` [H, B, Q] and ``prior_log_var``)."""
    return _entry(kernel, 0)(kernel, mu, S, Z, kp, Y, **options)


def row_moments(kernel, mu, S, Z, kp):
    """One row's (psi0, psi1 [M], Psi2 - psi1 psi1^T [M, M]) of ``kernel`` under N(mu, diag S):
    the terms of a new point's bound (``lvmcore.newpoints``), its covariance free of cancellation."""
    return _entry(kernel, 2)(kernel, mu, S, Z, kp)


def psi1(kernel, mu, S, Z, kp):
    """Psi1 [N, M] = E_q[k(x_n, z_m)] of ``kernel`` row by row (prediction at uncertain inputs)."""
    return _entry(kernel, 1)(kernel, mu, S, Z, kp)
