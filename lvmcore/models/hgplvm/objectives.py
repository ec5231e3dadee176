"""The hyperboloid GP-LVM's bounds (paper 002): what the trainings maximise, as plain functions.

* ``sparse``: the collapsed Titsias bound (eq. 5) with M inducing inputs Z on the hyperboloid,
  from the exact statistics of point latents (:func:`point_statistics`): :func:`sparse_objective`.
* ``bayesian``: the collapsed Bayesian GP-LVM bound (eq. 6) with wrapped Gaussians
  q(x_i) = N^w(mu_i, S_i), prior N^w(mu0, s^2 I), Monte-Carlo psi statistics and KL (eqs. 13-20,
  ``lvmcore.psi``): :func:`bayesian_objective`; per row chunk for ``lvmcore.chunks``
  (:class:`MCStats`, :func:`mc_objective`).
* The minibatch form of both (:func:`minibatch_bound`): the inducing outputs keep an explicit
  whitened q(u) (u = L_m v, K_mm = L_m L_m^T, q(v) = N(m, S_v) shared by the D columns), so the
  bound is the uncollapsed one of ``lvmcore.uncollapsed`` (Hensman et al. 2013), linear in the
  statistics summed over the points; at q(v)'s optimum (:func:`optimal_qu`) it equals the
  collapsed bound of the same statistics. :func:`point_terms` is the same bound per point and draw
  by the per-point formula (an independent check of the statistics' algebra).

The exact point variant's objective (eq. 4) is :mod:`lvmcore.models.hgplvm.point`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lvmcore import collapsed, linalg, uncollapsed
from lvmcore.chunks import JitStats
from lvmcore.kernels.hyperbolic import HyperboloidExponential, he_kernel
from lvmcore.linalg import KERNEL_JITTER, cholesky_jax
from lvmcore.precision import jit64, x64
from lvmcore.psi import psi_statistics
from lvmcore.psi.monte_carlo import log_sinhc, sample_wrapped, wrapped_log_density_origin

__all__ = [
    "lift",
    "renorm",
    "point_statistics",
    "sparse_objective",
    "mc_statistics",
    "bayesian_objective",
    "objective",
    "MCStats",
    "mc_objective",
    "kmm",
    "row_statistics",
    "minibatch_bound",
    "point_terms",
    "optimal_qu",
    "bound_of_statistics",
]


@x64
def lift(Xs):
    """Spatial coordinates (..., Q) -> hyperboloid points (..., Q+1) with x0 = sqrt(1 + |x~|^2)."""
    Xs = jnp.asarray(Xs, dtype=jnp.float64)
    x0 = jnp.sqrt(1.0 + jnp.sum(Xs * Xs, axis=-1, keepdims=True))
    return jnp.concatenate([x0, Xs], axis=-1)


def renorm(X):
    """Re-snap points onto the manifold (x0 recomputed from the spatial part) against rounding drift."""
    return lift(X[..., 1:])


@x64
def _bound(psi0, psi1ty, psi2, Z, log_sigma, log_beta, trYY, n, d, kappa):
    """The collapsed bound (eqs. 5, 6 without the KL) from the psi statistics, through
    :mod:`lvmcore.collapsed` (the one collapsed bound of lvmcore: :class:`~lvmcore.collapsed.Terms`,
    then :func:`~lvmcore.collapsed.bound`).  K_mm gets the relative jitter ``linalg.KERNEL_JITTER`` (x sigma,
    its diagonal)."""
    Kmm = he_kernel(Z, Z, jnp.exp(log_sigma), kappa)
    t = collapsed.terms(Kmm, psi1ty, psi2, jnp.exp(log_beta), linalg.KERNEL_JITTER)
    return collapsed.bound(t, psi0, trYY, log_beta, n, d)


def point_statistics(X, Z, log_sigma, Y, kappa):
    """The statistics of rows Y (n, D) at point latents X (n, Q+1), i.e. q(x_i) = delta(x_i - X_i):
    the psi statistics are then exact, (psi0, Psi1^T Y, Psi2, tr(Y^T Y)) = (n sigma, K_nm^T Y,
    K_nm^T K_nm, tr(Y^T Y)) with K_nm the HE kernel (eq. 10) between X and Z. The sparse bound
    (eq. 5) and its minibatch form (:func:`minibatch_bound`) take them from here."""
    Knm = he_kernel(X, Z, jnp.exp(log_sigma), kappa)
    return Y.shape[0] * jnp.exp(log_sigma), Knm.T @ Y, Knm.T @ Knm, jnp.sum(Y * Y)


@x64
def sparse_objective(X, Z, log_sigma, log_beta, Y, kappa):
    """Titsias collapsed bound (eq. 5) with inducing inputs Z (M, Q+1) (differentiable in Z)."""
    n, d = Y.shape
    psi0, p1y, p2, tryy = point_statistics(X, Z, log_sigma, Y, kappa)
    return _bound(psi0, p1y, p2, Z, log_sigma, log_beta, tryy, n, d, kappa)


def mc_statistics(X, log_S, Z, hyp, Y, eps, kappa):
    """The statistics of rows Y (n, D) under q(x_i) = N^w(X_i, diag exp(log_S_i)) at the draws eps
    (H, n, Q), (psi0, Psi1^T Y, Psi2, tr(Y^T Y)), and the sum of their KL(q(x_i) || p(x_i))
    (eqs. 15-20: the HE kernel's expectations), with hyp = (log sigma, log beta, log s^2). The
    full-batch bound, its row chunks and the minibatch bound all take them from here."""
    kp = {"log_var": hyp[0]}
    *psi, kl = psi_statistics(
        HyperboloidExponential(kappa), X, jnp.exp(log_S), Z, kp, Y, eps=eps, prior_log_var=hyp[2]
    )
    return (*psi, jnp.sum(Y * Y)), kl


@x64
def bayesian_objective(mu, log_S, Z, log_sigma, log_beta, Y, kappa, eps, prior_log_var=0.0):
    """Bayesian GP-LVM bound (eq. 6) with MC psi statistics; eps (H, N, Q) fixes the samples;
    prior N^w(mu0, s^2 I) with log s^2 = prior_log_var (0: the paper's)."""
    hyp = (log_sigma, log_beta, prior_log_var)
    (psi0, psi1ty, psi2, tryy), kl = mc_statistics(mu, log_S, Z, hyp, Y, eps, kappa)
    return _bound(psi0, psi1ty, psi2, Z, log_sigma, log_beta, tryy, *Y.shape, kappa) - kl


def objective(variant, X, hyp, log_S, Z, eps, Y, kappa):
    """The sparse (eq. 5) or Bayesian (eq. 6) bound; the point variant's step and transform have
    their own (eq. 4)."""
    if variant == "sparse":
        return sparse_objective(X, Z, hyp[0], hyp[1], Y, kappa)
    return bayesian_objective(X, log_S, Z, hyp[0], hyp[1], Y, kappa, eps, hyp[2])


class MCStats(JitStats):
    """Per-chunk Monte-Carlo psi statistics of the Bayesian variant for ``lvmcore.chunks``:
    local = {"X": means (n, Q+1), "log_S": (n, Q), "eps": samples (n, H, Q)}, glob = {"Z", "hyp"},
    data = (Y_chunk,)."""

    def __init__(self, kappa: float):
        self.kappa = float(kappa)

    def key(self):
        return (self.kappa,)

    def build(self):
        def f(local, glob, data):
            eps = jnp.transpose(local["eps"], (1, 0, 2))
            stats, kl = mc_statistics(
                local["X"], local["log_S"], glob["Z"], glob["hyp"], data[0], eps, self.kappa
            )
            return {"psi": stats[:3], "kl": kl, "trYY": stats[3]}

        return f


@functools.lru_cache(maxsize=32)
def mc_objective(kappa: float, n: int, d: int):
    """The Bayesian bound (eq. 6) from summed ``MCStats`` statistics."""

    def obj(stats, glob):
        hyp = glob["hyp"]
        return _bound(*stats["psi"], glob["Z"], hyp[0], hyp[1], stats["trYY"], n, d, kappa) - stats["kl"]

    return obj

# --------------------------------------------------------------------------- the minibatch bound
_LOG2PI = float(np.log(2.0 * np.pi))


# --------------------------------------------------------------------------- the bound
def kmm(glob, kappa):
    return he_kernel(glob["Z"], glob["Z"], jnp.exp(glob["hyp"][0]), kappa)


def row_statistics(local, glob, Y, eps, kappa):
    """(statistics, KL of q(X)) of the rows ``local``: Monte-Carlo at the draws eps (Bayesian:
    "log_S" in local, ``hgplvm.mc_statistics``), or exact for point latents (sparse: no "log_S",
    eps unused, ``hgplvm.point_statistics``, and no KL: the sparse variant has no prior on X)."""
    if "log_S" not in local:
        return point_statistics(local["X"], glob["Z"], glob["hyp"][0], Y, kappa), 0.0
    return mc_statistics(local["X"], local["log_S"], glob["Z"], glob["hyp"], Y, eps, kappa)


@x64
def minibatch_bound(local, glob, qu, Y, eps, N, scale, kappa, rel_jitter=KERNEL_JITTER):
    """The batch estimate of F (module docstring) and the batch's statistics (psi0, Psi1^T Y, Psi2,
    tr(Y^T Y)): rows ``local`` = {"X": (B, Q+1) means, "log_S": (B, Q)} (point latents, the sparse
    variant: {"X"} alone, eps None), data Y (B, D), draws eps (H, B, Q), globals {"Z": (M, Q+1),
    "hyp": [log sigma, log beta, log s^2]}, q(v) = {"m": (M, D), "P": (M, M) precision};
    ``scale`` = N / B (1 with all N points: the full uncollapsed bound)."""
    stats, kl = row_statistics(local, glob, Y, eps, kappa)
    F = uncollapsed.bound(kmm(glob, kappa), stats, glob["hyp"][1], qu, N, scale, rel_jitter) - scale * kl
    return F, stats


@x64
def point_terms(local, glob, qu, Y, eps, kappa, rel_jitter=KERNEL_JITTER):
    """Per point and draw, l_nh = log-likelihood term minus KL(q(x_n) || p(x_n)) at draw h, (H, B),
    by the per-point formula (not the psi statistics): with a = L_m^-1 k(x_nh, Z),
    E_q(f)[log p(y_n | f)] = -D/2 log(2 pi / beta) - beta/2 (|y_n - m^T a|^2 + D (sigma - |a|^2 +
    a^T S_v a)); the KL's Gaussian entropy part in closed form, its Jacobian and prior parts at the
    draw (as ``mc_psi_chunk``). sum_n mean_h l_nh - KL(q(v)) is the full bound's MC estimate."""
    X, log_S = local["X"], local["log_S"]
    hyp = glob["hyp"]
    sigma, beta = jnp.exp(hyp[0]), jnp.exp(hyp[1])
    D, Q = Y.shape[1], log_S.shape[1]
    x, r = sample_wrapped(X, jnp.exp(log_S), eps)  # (H, B, Q+1), (H, B)
    Lm = cholesky_jax(kmm(glob, kappa), rel_jitter)
    M = Lm.shape[0]
    Linv = jax.scipy.linalg.solve_triangular(Lm, jnp.eye(M), lower=True)
    R = jnp.linalg.cholesky(qu["P"])  # S_v = R^-T R^-1
    Rinv = jax.scipy.linalg.solve_triangular(R, jnp.eye(M), lower=True)
    a = he_kernel(x, glob["Z"][None], sigma, kappa) @ Linv.T  # (H, B, M)
    b = a @ Rinv.T  # a^T S_v a = |R^-1 a|^2
    resid = Y[None] - a @ qu["m"]
    ll = 0.5 * D * (hyp[1] - _LOG2PI) - 0.5 * beta * (
        jnp.sum(resid * resid, -1) + D * (sigma - jnp.sum(a * a, -1) + jnp.sum(b * b, -1))
    )
    log_q = -0.5 * Q * (_LOG2PI + 1.0) - 0.5 * jnp.sum(log_S, -1)[None] - (Q - 1) * log_sinhc(r)
    return ll - (log_q - wrapped_log_density_origin(x, hyp[2]))


def optimal_qu(stats, glob, kappa, scale=1.0, rel_jitter=KERNEL_JITTER):
    """q(v) maximising the bound for these statistics (scaled by ``scale``): {"m", "P"} (numpy)."""
    P, m = _optimal_qu_jit(stats, glob, kappa, scale, rel_jitter)
    return {"m": np.asarray(m), "P": np.asarray(P)}


@jit64
def _optimal_qu_jit(stats, glob, kappa, scale, rel_jitter):
    return uncollapsed.optimal_qu(kmm(glob, kappa), stats, glob["hyp"][1], scale, rel_jitter)


@jit64
def bound_of_statistics(stats, glob, qu, N, kappa, rel_jitter):
    """The uncollapsed bound from the statistics of all N points (point latents: exact, no KL)."""
    return uncollapsed.bound(kmm(glob, kappa), stats, glob["hyp"][1], qu, N, 1.0, rel_jitter)
