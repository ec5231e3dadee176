"""The optimisers of the GP-LVM family and their stopping rules.

* :func:`stalled` - the stopping rule: a fit has converged when its objective gained at most
  ``tol`` per data value (N x D) over the last stretch. The tolerance is per data value, not
  relative to |objective|: a bound that is a density of Y moves by -N D log c when Y is scaled by
  c, an additive shift that must not move where a fit stops. The Bayesian GP-LVM and MRD (through
  :func:`lbfgs`) stop by it.
* :func:`plateau` - the window rule of the hyperboloid GP-LVM (full-batch and minibatch) and of
  the minibatch Bayesian GP-LVM (windows of epochs): the objective
  averaged over windows of steps (robust to Adam's oscillation and to Monte-Carlo noise), its gain
  the best recent window mean over the best earlier one, judged by :func:`stalled`;
  :func:`window_plateau` is the check both hGP-LVM loops run after every step.
* :func:`lbfgs` - scipy's L-BFGS-B on the objective per data value, shifted to 0 at the start
  (so its own relative-reduction test is the same at any data scale), restarted while iterations
  remain and a run stopped by that test still gained more than ``tol`` per value.
* :func:`adam` - the one Adam, Riemannian (Becigneul and Ganea 2019; geoopt's ``RiemannianAdam``)
  over a manifold: :class:`Euclidean` parameters are the trivial case (the step of Kingma and Ba),
  :class:`Lorentz` points step by the exponential map with first moments carried by parallel
  transport and one second moment per point (the squared Lorentz norm of its gradient).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import minimize

from lvmcore.manifolds.lorentz import egrad2rgrad, expmap, inner, proj, project_to_manifold, transp

__all__ = ["stalled", "plateau", "window_plateau", "lbfgs", "LbfgsResult", "adam", "Euclidean", "Lorentz"]


def stalled(gain: float, tol: float, n_values: float) -> bool:
    """The stopping rule: ``gain`` (the objective's rise over the last stretch) is at most ``tol``
    per data value. A non-finite gain is not a stall."""
    return bool(np.isfinite(gain) and gain <= float(tol) * float(n_values))


def plateau(means, patience: int, tol: float, n_values: float) -> bool:
    """The window rule: :func:`stalled` on the gain of the best of the last ``patience`` window
    means over the best earlier one (the caller checks it once enough windows exist)."""
    return stalled(max(means[-patience:]) - max(means[:-patience]), tol, n_values)


def window_plateau(trace, window: int, patience: int, tol: float, n_values: float, start: int = 0) -> bool:
    """The window rule after step len(trace) of a fit (one objective value per step): at the end of
    a window, once ``start`` steps and 2 ``patience`` windows more have run and ``tol`` > 0,
    :func:`plateau` on the means of the trace's windows of ``window`` steps."""
    it = len(trace)
    if tol <= 0 or it % window or it < start + 2 * patience * window:
        return False
    return plateau(np.mean(np.reshape(trace, (-1, window)), axis=1), patience, tol, n_values)


class LbfgsResult(NamedTuple):
    x: np.ndarray
    converged: bool  # stopped by the rule or by L-BFGS-B's own gradient test, not the budget
    nit: int


def lbfgs(fg, x, *, n_values, max_iter, tol, gtol=1e-8, bounds=None, callback=None) -> LbfgsResult:
    """Minimise ``fg(x) -> (f, grad)`` (f: minus a bound, in its own units) by L-BFGS-B.

    The optimiser sees (f - f(x0)) / n_values: its ftol (``tol``) and the restart rule
    (:func:`stalled`) are per data value; ``gtol`` is on the gradient of f itself (its inf-norm
    per data value is compared, the same test at any size). ``tol = 0`` and ``gtol = 0`` run the
    whole budget. ``fg`` may return ``inf`` for a rejected trial point."""
    nv = float(n_values)
    f0 = float(fg(x)[0])
    if not np.isfinite(f0):
        f0 = 0.0

    def scaled(z):
        f, g = fg(z)
        return (f - f0) / nv, np.asarray(g) / nv

    left, converged, nit = int(max_iter), False, 0
    opts = {"ftol": float(tol), "gtol": float(gtol) / nv}
    while left > 0:
        start = scaled(x)[0]
        r = minimize(scaled, x, jac=True, method="L-BFGS-B", bounds=bounds, callback=callback,
                     options={"maxiter": left, **opts})  # fmt: skip
        left -= max(int(r.nit), 1)
        nit += int(r.nit)
        x = r.x
        if tol <= 0:
            converged = False
            break
        if r.nit >= 1 and stalled(start - r.fun, tol, 1.0):
            converged = True
            break
        if r.nit < 1 or r.status != 0 or "REDUCTION OF F" not in str(r.message):
            # status 0: L-BFGS-B's own test fired (the projected gradient); 1: the budget;
            # 2: an abnormal stop (a failed line search), not a certified optimum, except as the
            # first step of a restart after L-BFGS-B's ftol stop: then not even a steepest-descent
            # step lowers f, so x is stationary to f's round-off (data scaled by 1e-12 or 1e6 put
            # f's constant N D log c, and its round-off, far above the last steps' gains)
            converged = r.status == 0 or (r.nit < 1 and nit > 0)
            break
    return LbfgsResult(np.asarray(x), converged, nit)


def _sqrt(x):
    """sqrt in the array's own library (NumPy arrays stay NumPy; JAX arrays and tracers JAX)."""
    return jnp.sqrt(x) if isinstance(x, jax.Array) else np.sqrt(x)


class Euclidean:
    """The trivial manifold: the Riemannian gradient is the gradient, the second moment is kept per
    component (Kingma and Ba's Adam), a step is a translation and the moments need no transport.
    Library-neutral: NumPy arrays stay NumPy.

    The hooks :func:`adam` calls: ``rgrad(x, g)`` the Riemannian gradient; ``sqnorm(x, u, w)`` w times
    the squared norm of u in the second moment's resolution (w first, so each manifold keeps the
    rounding of its own written-out step); ``per_point(a)`` a per-point quantity shaped to broadcast
    against p; ``step(x, u, m)`` the retraction along u and m transported to the new point."""

    @staticmethod
    def rgrad(x, g):
        return g

    @staticmethod
    def sqnorm(x, u, w):
        return w * u * u

    @staticmethod
    def per_point(a):
        return a

    @staticmethod
    def step(x, u, m):
        return x + u, m


class Lorentz:
    """Points (..., Q+1) on the Lorentz model (:mod:`lvmcore.manifolds.lorentz`): the ambient gradient
    with its time coordinate negated and projected to the tangent space (Algorithm 1 of paper 002),
    one second moment per point (the squared Lorentz norm of its gradient: geoopt's
    ``component_inner``), the step by the exponential map and the first moments parallel-transported
    to the new points. JAX only."""

    @staticmethod
    def rgrad(x, g):
        return egrad2rgrad(x, g)

    @staticmethod
    def sqnorm(x, u, w):
        return w * jnp.maximum(inner(u, u), 0.0)

    @staticmethod
    def per_point(a):
        return jnp.asarray(a)[..., None]

    @staticmethod
    def step(x, u, m):
        xn = project_to_manifold(expmap(x, u))
        return xn, proj(xn, transp(x, xn, m))


def adam(p, g, m, v, t, lr, manifold=Euclidean, *, b1=0.9, b2=0.999, eps=1e-8):
    """One (Riemannian) Adam ascent step (Kingma and Ba; Becigneul and Ganea 2019, geoopt's
    ``RiemannianAdam``) on ``p`` with gradient ``g``: first moments m (p's shape, tangent vectors),
    second moments v (per component on :class:`Euclidean`, per point on :class:`Lorentz`) and the
    step count t >= 1 (a number, or an array of counts: one per row on :class:`Euclidean`, where it
    broadcasts against p, one per point on :class:`Lorentz`). Returns (p, m, v) after the step."""
    g = manifold.rgrad(p, g)
    m = b1 * m + (1.0 - b1) * g
    v = b2 * v + manifold.sqnorm(p, g, 1.0 - b2)
    bias1, bias2 = manifold.per_point(1.0 - b1**t), 1.0 - b2**t
    p, m = manifold.step(p, lr * (m / bias1) / (manifold.per_point(_sqrt(v / bias2)) + eps), m)
    return p, m, v
