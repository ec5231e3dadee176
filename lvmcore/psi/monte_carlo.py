"""Monte-Carlo psi statistics and KL term of the Bayesian hyperboloid GP-LVM (paper 002, eqs. 13-20).

The variational posterior is a product of wrapped Gaussians q(x_i) = N^w(x_i | mu_i, diag(S_i))
(Nagano et al., 2019) on the Lorentz model L^Q, the prior p(x_i) = N^w(x_i | mu0, I).  A sample is
drawn by reparameterisation (section 3.2):

    v~ = sqrt(S_i) * eps,  eps ~ N(0, I_Q)           (tangent space at the origin, spatial part)
    u  = PT_{mu0 -> mu_i}((0, v~))                   (parallel transport, eq. 14)
    x  = exp_{mu_i}(u)                               (exponential map, eq. 7)

and the log density of the wrapped Gaussian is (the Jacobian of exp, cf. eq. 13)

    log N^w(x | mu, S) = log N(v~ | 0, S) - (Q - 1) log(sinh(r) / r),   r = ||u||_L = |v~|.

For the HE kernel the expectations (eqs. 15-20) are estimated with H samples per point:

    psi0      = sum_i E[k(x_i, x_i)] = N * sigma                 (exact: d(x, x) = 0)
    Psi1[i,k] = 1/H sum_h k(x_i^(h), z_k)
    Psi2      = sum_i 1/H sum_h k(Z, x_i^(h)) k(x_i^(h), Z)
    KL        = sum_i E_q[log q(x_i) - log p(x_i)]

(the paper writes sums over h; the 1/H normalisation is implied).  In the KL term the Gaussian part
E_q[log N(v~ | 0, S)] = -Q/2 log(2 pi e) - 1/2 sum log S is taken in closed form (lower variance); the
Jacobian term of q and the whole prior term log p(x) = log N(logmap0(x) | 0, I) - (Q-1) log sinhc(d(mu0, x))
are Monte Carlo.

Everything is a sum over data points, so :func:`mc_psi_chunk` works on a chunk of rows and returns the
partial sums ``(psi0_sum, Psi1^T Y_chunk, Psi2_sum, KL_sum)``; the sums over chunks are the full-data
statistics (for a Dask map-reduce).  The kernel is :func:`lvmcore.kernels.hyperbolic.he_kernel`; every
public function runs under a scoped ``jax.enable_x64(True)`` (importing changes no global setting).
"""

from __future__ import annotations

import jax.numpy as jnp

from lvmcore.kernels.hyperbolic import he_kernel
from lvmcore.manifolds.lorentz import expmap, logmap0, origin, transp
from lvmcore.precision import x64

__all__ = ["log_sinhc", "sample_wrapped", "wrapped_log_density_origin", "mc_psi_chunk", "he_statistics"]

_LOG2PI = 1.8378770664093453  # log(2 pi)


@x64
def log_sinhc(r):
    """log(sinh(r) / r) for r >= 0, stable for small r (series) and large r (no overflow)."""
    r = jnp.asarray(r, dtype=jnp.float64)
    sq = r * r
    small = sq < 1e-6
    big = r > 20.0
    rs = jnp.where(small | big, 1.0, r)
    mid = jnp.log(jnp.sinh(rs) / rs)
    rb = jnp.where(big, r, 21.0)
    large = rb - jnp.log(2.0) + jnp.log1p(-jnp.exp(-2.0 * rb)) - jnp.log(rb)
    series = sq / 6.0 - sq * sq / 180.0
    return jnp.where(small, series, jnp.where(big, large, mid))


@x64
def sample_wrapped(mu, S, eps):
    """Reparameterised wrapped-Gaussian samples.

    mu (B, Q+1) points, S (B, Q) positive variances, eps (H, B, Q) standard normals.
    Returns x (H, B, Q+1) and the tangent norms r = |v~| (H, B).
    """
    mu = jnp.asarray(mu, dtype=jnp.float64)
    v = jnp.sqrt(S)[None] * eps  # (H, B, Q)
    v_amb = jnp.concatenate([jnp.zeros(v.shape[:-1] + (1,), dtype=v.dtype), v], axis=-1)
    mu0 = origin(mu.shape[-1] - 1)
    u = transp(mu0, mu[None], v_amb)
    x = expmap(mu[None], u)
    r = jnp.sqrt(jnp.sum(eps * eps * S[None], axis=-1))
    return x, r


@x64
def wrapped_log_density_origin(x, log_var=0.0):
    """log N^w(x | mu0, s^2 I) for points x (..., Q+1), log_var = log s^2 (0: the paper's prior)."""
    q = x.shape[-1] - 1
    w = logmap0(x)
    sq = jnp.sum(w * w, axis=-1)
    r = jnp.sqrt(jnp.where(sq > 0, sq, 1.0))
    r = jnp.where(sq > 0, r, 0.0)
    return -0.5 * q * (_LOG2PI + log_var) - 0.5 * sq * jnp.exp(-log_var) - (q - 1) * log_sinhc(r)


@x64
def mc_psi_chunk(mu, S, eps, Y, Z, variance, kappa, prior_log_var=0.0):
    """Monte-Carlo partial sums over a chunk of rows.

    mu (B, Q+1), S (B, Q), eps (H, B, Q), Y (B, D), Z (M, Q+1), variance and kappa scalars;
    prior_log_var = log s^2 of the prior N^w(mu0, s^2 I) (0 = the paper's unit prior).
    Returns (psi0_sum (), Psi1^T Y (M, D), Psi2_sum (M, M), KL_sum ()) for these rows.
    """
    S = jnp.asarray(S, dtype=jnp.float64)
    Y = jnp.asarray(Y, dtype=jnp.float64)
    h, b, q = eps.shape
    x, r = sample_wrapped(mu, S, eps)  # (H, B, Q+1)
    K = he_kernel(x, Z[None], variance, kappa)  # (H, B, M)
    psi1 = jnp.mean(K, axis=0)  # (B, M)
    psi1ty = psi1.T @ Y
    psi2 = jnp.einsum("hbm,hbn->mn", K, K) / h
    psi0 = b * variance
    # KL: closed-form Gaussian entropy part + MC Jacobian and prior terms
    e_log_q = (
        -0.5 * q * (_LOG2PI + 1.0) * b
        - 0.5 * jnp.sum(jnp.log(S))
        - (q - 1) * jnp.sum(jnp.mean(log_sinhc(r), axis=0))
    )
    e_log_p = jnp.sum(jnp.mean(wrapped_log_density_origin(x, prior_log_var), axis=0))
    return psi0, psi1ty, psi2, e_log_q - e_log_p


@x64
def he_statistics(kernel, mu, S, Z, kp, Y, *, eps, prior_log_var=0.0):
    """The HE kernel's (:class:`~lvmcore.kernels.hyperbolic.HyperboloidExponential`, parameters
    ``{"log_var": log sigma}``, its ``kappa``) chunk sums (psi0, Psi1^T Y, Psi2) and the KL of
    q(X) = prod_n N^w(mu_n, diag S_n) from the prior: :func:`mc_psi_chunk` at the draws ``eps``
    (H, B, Q)."""
    return mc_psi_chunk(mu, S, eps, Y, Z, jnp.exp(kp["log_var"]), kernel.kappa, prior_log_var)
