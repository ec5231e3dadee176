"""Lorentz (hyperboloid) model of hyperbolic space with curvature -1.

    H^Q = {x in R^{Q+1} : <x, x>_L = -1, x_0 > 0},   <x, y>_L = -x_0 y_0 + sum_{i>=1} x_i y_i

References are to the hyperboloid GP-LVM paper (section 2.2 and 3.2): exponential map eq. (7),
geodesic distance eq. (8), map to the Poincare ball eq. (9), tangent projection eq. (12) and
parallel transport eq. (14).

Conventions
-----------
* All functions are written with ``jax.numpy`` and run in float64 (``lvmcore.precision``), accept numpy or
  jax arrays and are differentiable; only :func:`check_point` is plain numpy.
* Points and ambient tangent vectors carry the ambient coordinate on the LAST axis (length Q+1);
  all leading axes are batch axes and broadcast.  Scalar-valued results (``inner``, ``dist``,
  ``norm``) drop the last axis.
* ``expmap0`` / ``logmap0`` work with the SPATIAL part of tangent vectors at the origin
  ``mu0 = (1, 0, ..., 0)`` (shape ``(..., Q)``): the tangent space at ``mu0`` is ``{(0, v~)}``, so
  the time component is always 0 and is omitted.
* Functions of points only give meaningful results for points on the manifold; after an
  unconstrained update use :func:`project_to_manifold`.
* The array functions are wrapped in ``jax.jit`` (compiled once per input shape/dtype).
* Where a function has a kink (``dist`` at ``x == y``, ``norm`` at ``v == 0``) the returned
  gradient is the zero sub-gradient, never NaN.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lvmcore.precision import jit64, x64

__all__ = [
    "egrad2rgrad",
    "EPS_NORM",
    "MAX_NORM",
    "SERIES_SQ",
    "DIST_SWITCH",
    "origin",
    "inner",
    "norm",
    "dist",
    "pairwise_dist",
    "proj",
    "expmap",
    "expmap0",
    "logmap",
    "logmap0",
    "transp",
    "to_poincare",
    "from_poincare",
    "project_to_manifold",
    "check_point",
]

#: Lorentz norms (of tangent vectors or of point differences) below this are treated as exactly 0:
#: the sqrt is not differentiated there, which keeps gradients finite (zero sub-gradient).
EPS_NORM = 1e-15
#: Tangent-vector norms are clipped to this before cosh/sinh in :func:`expmap` /
#: :func:`expmap0` (cosh(50) ~ 2.6e21; beyond that the hyperboloid coordinates lose all precision
#: and overflow follows at ~710).  A longer vector moves MAX_NORM along its geodesic.
MAX_NORM = 50.0
#: Below this squared norm (norm 1e-4) sinh(r)/r, cosh(r), r/sinh(r), asinh(r)/r are evaluated by
#: their Taylor series (truncation error < 1e-19 relative), which is smooth in r**2.
SERIES_SQ = 1e-8
#: ``dist`` uses arccosh(-<x, y>_L) when -<x, y>_L > DIST_SWITCH (well conditioned there) and
#: 2 asinh(||x - y||_L / 2) below it (no cancellation for nearby points).
DIST_SWITCH = 2.0


def _time(x):
    return x[..., 0]


def _space(x):
    return x[..., 1:]


@x64
def origin(q: int):
    """The origin mu0 = (1, 0, ..., 0) of H^q, shape (q + 1,)."""
    return jnp.zeros(q + 1, dtype=jnp.float64).at[0].set(1.0)


@jit64
def inner(x, y):
    """Lorentzian inner product <x, y>_L = -x0 y0 + sum_i xi yi over the last axis (batched)."""
    x = jnp.asarray(x, dtype=jnp.float64)
    y = jnp.asarray(y, dtype=jnp.float64)
    return jnp.sum(_space(x) * _space(y), axis=-1) - _time(x) * _time(y)


def _safe_sqrt(sq):
    """sqrt(max(sq, 0)) that is 0 with zero gradient for sq <= EPS_NORM**2 (no inf * 0 = NaN)."""
    pos = sq > EPS_NORM**2
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)


@jit64
def norm(v):
    """Lorentz norm sqrt(<v, v>_L) of (space-like) tangent vectors; negative squares clip to 0."""
    return _safe_sqrt(inner(v, v))


@jit64
def dist(x, y):
    """Geodesic distance d(x, y) = arccosh(-<x, y>_L) (eq. 8), evaluated stably.

    With w = x - y one has <w, w>_L = 2(cosh d - 1) = 4 sinh(d/2)**2 on H^Q, so for nearby points
    ``d = 2 asinh(||x - y||_L / 2)`` is used (accurate to full relative precision, finite zero
    gradient at x == y); for -<x, y>_L > DIST_SWITCH the direct arccosh form is used.  Both forms
    agree on the manifold, so Riemannian gradients (ambient gradient followed by :func:`proj`)
    are the same whichever branch is taken.
    """
    x = jnp.asarray(x, dtype=jnp.float64)
    y = jnp.asarray(y, dtype=jnp.float64)
    z = -inner(x, y)
    far = z > DIST_SWITCH
    d_far = jnp.arccosh(jnp.where(far, z, DIST_SWITCH + 1.0))
    d_near = 2.0 * jnp.arcsinh(0.5 * norm(x - y))
    return jnp.where(far, d_far, d_near)


@jit64
def pairwise_dist(X, Y):
    """Matrix of geodesic distances: X (..., N, Q+1), Y (..., M, Q+1) -> (..., N, M)."""
    X = jnp.asarray(X, dtype=jnp.float64)
    Y = jnp.asarray(Y, dtype=jnp.float64)
    return dist(X[..., :, None, :], Y[..., None, :, :])


@jit64
def proj(x, v):
    """Project an ambient vector v onto the tangent space at x: v + <x, v>_L x (eq. 12).

    Note: a Euclidean (ambient) gradient g must first be multiplied by the metric
    diag(-1, 1, ..., 1) (flip the sign of g0) before projecting, to get the Riemannian gradient.
    """
    x = jnp.asarray(x, dtype=jnp.float64)
    v = jnp.asarray(v, dtype=jnp.float64)
    return v + inner(x, v)[..., None] * x


def _cosh_sinhc(sq):
    """(cosh r, sinh(r_c)/r) for r = sqrt(sq) with r_c = min(r, MAX_NORM); smooth in sq at 0."""
    small = sq < SERIES_SQ
    r = jnp.sqrt(jnp.where(small, 1.0, sq))
    rc = jnp.minimum(r, MAX_NORM)
    cosh_big = jnp.cosh(rc)
    sinhc_big = jnp.sinh(rc) / r
    cosh_small = 1.0 + sq / 2.0 + sq * sq / 24.0
    sinhc_small = 1.0 + sq / 6.0 + sq * sq / 120.0
    return jnp.where(small, cosh_small, cosh_big), jnp.where(small, sinhc_small, sinhc_big)


@jit64
def expmap(x, v):
    """Exponential map at x (eq. 7): cosh(||v||_L) x + sinh(||v||_L) v / ||v||_L.

    x: (..., Q+1) points, v: (..., Q+1) tangent vectors at x.  Norms above MAX_NORM are clipped
    (the step is shortened to MAX_NORM along the same geodesic).  Smooth (finite gradients) at v=0.
    """
    x = jnp.asarray(x, dtype=jnp.float64)
    v = jnp.asarray(v, dtype=jnp.float64)
    sq = jnp.maximum(inner(v, v), 0.0)
    c, s = _cosh_sinhc(sq)
    return c[..., None] * x + s[..., None] * v


@jit64
def expmap0(v):
    """Exponential map at the origin mu0 = (1, 0, ..., 0).

    v: (..., Q) SPATIAL part of a tangent vector at mu0 (the full tangent vector is (0, v)).
    Returns points (..., Q+1) = (cosh r, sinh(r)/r * v) with r = |v| (clipped at MAX_NORM).
    """
    v = jnp.asarray(v, dtype=jnp.float64)
    sq = jnp.sum(v * v, axis=-1)
    c, s = _cosh_sinhc(sq)
    return jnp.concatenate([c[..., None], s[..., None] * v], axis=-1)


@jit64
def logmap(x, y):
    """Logarithmic map at x: the tangent vector u at x with expmap(x, u) = y, ||u||_L = d(x, y).

    u = d / sinh(d) * proj_x(y).  proj_x(y) = y + <x, y>_L x is evaluated for nearby points as
    w - (<w, w>_L / 2) x with w = y - x (identical on H^Q, no cancellation), and d/sinh(d) by its
    series for small d, so the map and its gradients are finite at x == y (where u = 0).
    """
    x = jnp.asarray(x, dtype=jnp.float64)
    y = jnp.asarray(y, dtype=jnp.float64)
    z = -inner(x, y)
    far = (z > DIST_SWITCH)[..., None]
    w = y - x
    u_near = w - (0.5 * inner(w, w))[..., None] * x
    u_far = y - z[..., None] * x
    u = jnp.where(far, u_far, u_near)
    d = dist(x, y)
    dsq = d * d
    small = dsq < SERIES_SQ
    d_safe = jnp.where(small, 1.0, d)
    coef = jnp.where(small, 1.0 - dsq / 6.0 + 7.0 * dsq * dsq / 360.0, d_safe / jnp.sinh(d_safe))
    return coef[..., None] * u


@jit64
def logmap0(y):
    """Logarithmic map at the origin mu0; returns the SPATIAL part (..., Q) of the tangent vector.

    With y = (cosh d, sinh d * e): logmap0(y) = asinh(|y~|) / |y~| * y~ (y~ = y[..., 1:]), which is
    stable for all distances (inverse of :func:`expmap0`).
    """
    y = jnp.asarray(y, dtype=jnp.float64)
    ys = _space(y)
    sq = jnp.sum(ys * ys, axis=-1)
    small = sq < SERIES_SQ
    n = jnp.sqrt(jnp.where(small, 1.0, sq))
    coef = jnp.where(small, 1.0 - sq / 6.0 + 3.0 * sq * sq / 40.0, jnp.arcsinh(n) / n)
    return coef[..., None] * ys


@jit64
def transp(x, y, v):
    """Parallel transport of v in T_x H^Q to T_y H^Q along the geodesic (eq. 14).

        PT_{x->y}(v) = v + <y - alpha x, v>_L / (alpha + 1) * (x + y),   alpha = -<x, y>_L >= 1.

    Eq. (14) of the paper writes gamma = <mu, nu>_L; with that sign the denominator gamma + 1
    would be <= 0.  The correct convention (Nagano et al., 2019, which the paper follows) is
    alpha = -<x, y>_L, used here; it is the one for which the result is tangent at y.
    """
    x = jnp.asarray(x, dtype=jnp.float64)
    y = jnp.asarray(y, dtype=jnp.float64)
    v = jnp.asarray(v, dtype=jnp.float64)
    alpha = -inner(x, y)
    coef = inner(y - alpha[..., None] * x, v) / (alpha + 1.0)
    return v + coef[..., None] * (x + y)


@jit64
def to_poincare(x):
    """Map hyperboloid points (..., Q+1) to the Poincare ball (..., Q): x~ / (1 + x0) (eq. 9)."""
    x = jnp.asarray(x, dtype=jnp.float64)
    return _space(x) / (1.0 + _time(x))[..., None]


@jit64
def from_poincare(p):
    """Inverse of :func:`to_poincare`: p (..., Q) with |p| < 1 -> ((1+|p|^2), 2p) / (1 - |p|^2)."""
    p = jnp.asarray(p, dtype=jnp.float64)
    sq = jnp.sum(p * p, axis=-1)
    den = 1.0 - sq
    return jnp.concatenate([((1.0 + sq) / den)[..., None], 2.0 * p / den[..., None]], axis=-1)


@jit64
def egrad2rgrad(x, g):
    """Riemannian gradient at x from the ambient Euclidean gradient g (Algorithm 1 of paper 002,
    lines 3-4): multiply by the metric diag(-1, 1, ..., 1) (negate g0), then project (eq. 12)."""
    g = jnp.asarray(g, dtype=jnp.float64)
    return proj(x, g.at[..., 0].multiply(-1.0))


@jit64
def project_to_manifold(x):
    """Snap ambient points onto H^Q by recomputing x0 = sqrt(1 + |x~|^2) (keeps the spatial part)."""
    x = jnp.asarray(x, dtype=jnp.float64)
    xs = _space(x)
    x0 = jnp.sqrt(1.0 + jnp.sum(xs * xs, axis=-1))
    return jnp.concatenate([x0[..., None], xs], axis=-1)


def check_point(x, atol: float = 1e-8, rtol: float = 1e-10) -> None:
    """Raise ValueError if any point in x (..., Q+1) is not on H^Q, else return None.

    A point passes if it is finite, x0 > 0 and |<x, x>_L + 1| <= atol + rtol * x0**2 (the
    relative term accounts for rounding in the squares of large coordinates).  Plain numpy.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0 or x.shape[-1] < 2:
        raise ValueError(
            f"hyperboloid points need an ambient last axis of length Q+1 >= 2, got shape {x.shape}"
        )
    pts = x.reshape(-1, x.shape[-1])
    bad = ~np.all(np.isfinite(pts), axis=-1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{int(bad.sum())} point(s) contain NaN/inf (first at flat index {i}: {pts[i]}); "
            "the optimisation probably diverged"
        )
    x0 = pts[:, 0]
    bad = x0 <= 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{int(bad.sum())} point(s) have x0 <= 0 (first at flat index {i}: x0 = {x0[i]!r}); "
            "points must lie on the upper sheet x0 > 0 (use project_to_manifold)"
        )
    val = np.sum(pts[:, 1:] ** 2, axis=-1) - x0**2
    err = np.abs(val + 1.0)
    bad = err > atol + rtol * x0**2
    if bad.any():
        i = int(np.argmax(np.where(bad, err, -np.inf)))
        raise ValueError(
            f"{int(bad.sum())} point(s) are off the hyperboloid: <x, x>_L = {val[i]!r} != -1 "
            f"at flat index {i} (|error| {err[i]:.3e} > tolerance {atol + rtol * x0[i] ** 2:.3e}); "
            "use project_to_manifold"
        )
    return None
