"""Closed-form psi statistics of the Bayesian GP-LVM / MRD (Damianou et al., appendix A, eqs. 38-39).

The variational posterior is q(X) = prod_n N(x_n | mu_n, diag(S_n)) with ``mu`` and ``S`` of shape
(N, Q); the inducing inputs ``Z`` are (M, Q).  For a kernel k the statistics are (eq. 39)

    psi0 = sum_n E_q[k(x_n, x_n)]                       (scalar)
    Psi1 = E_q[K_fu],             Psi1[n, m]     = E_q[k(x_n, z_m)]                (N, M)
    Psi2 = E_q[K_uf K_fu] = sum_n Psi2_n,  Psi2_n[m, m'] = E_q[k(x_n, z_m) k(x_n, z_m')]  (M, M)

All of them are sums over data points, so a chunk of rows of (mu, S, Y) contributes the partial sums
``(psi0_sum, Psi1^T Y, Psi2_sum)`` returned by :func:`rbf_psi` / :func:`linear_psi`; the chunk results
add up to the full-data statistics (the map-reduce in ``lvmcore.psi.reduce``).

Kernels (ARD):

* RBF:    k(x, z) = variance * exp(-0.5 * sum_q (x_q - z_q)^2 / lengthscale_q^2)
* linear: k(x, z) = sum_q variances_q x_q z_q

RBF formulas (Titsias & Lawrence, 2010), with l2 = lengthscale^2:

    Psi1[n, m]    = variance * prod_q (1 + S_nq / l2_q)^(-1/2)
                    * exp(-0.5 * sum_q (mu_nq - z_mq)^2 / (l2_q + S_nq))
    Psi2_n[m, m'] = variance^2 * prod_q (1 + 2 S_nq / l2_q)^(-1/2)
                    * exp(-sum_q (z_mq - z_m'q)^2 / (4 l2_q))
                    * exp(-sum_q (mu_nq - zbar_mm'q)^2 / (l2_q + 2 S_nq)),   zbar = (z_m + z_m') / 2

Speed formulation: no (N, M, M, Q) array is ever formed.  With a_nq = 1 / (l2_q + 2 S_nq) the
last exponent is expanded as

    -sum_q a_nq mu_nq^2 + sum_q (a_nq mu_nq) (2 zbar_pq) + sum_q a_nq (-zbar_pq^2)

i.e. a row constant plus one GEMM of the (B, 2Q) matrix [a*mu, a] by the (2Q, P) matrix
[2 zbar; -zbar^2]^T, where p runs over the P = M (M + 1) / 2 pairs m <= m' (Psi2 is symmetric, so
only the upper triangle is computed and mirrored).  The log of the per-row prefactor is folded into
the row constant, the result is exponentiated and summed over rows (a GEMV with the row mask).
Rows are processed in blocks of ``block_size`` with ``jax.lax.scan`` (the last block zero-padded and
masked), so the forward pass's largest intermediate is (block_size, P). Reverse mode keeps every
block's exponentials (rows x P in all: the callers bound rows by chunking); ``remat=True`` wraps the
block in ``jax.checkpoint`` to recompute them instead (measured 1.6x slower at N = 5,000, M = 50).
Psi1 is handled the same way (one (B, 2Q) x (2Q, M) GEMM per block).

Everything is float64 (``jax_enable_x64`` is switched on at import), pure and differentiable
(``jax.vjp`` / ``jax.grad``); the public functions are wrapped in ``jax.jit`` (``block_size`` of
:func:`rbf_psi` is a static argument).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

__all__ = [
    "rbf_K",
    "linear_K",
    "rbf_psi",
    "rbf_psi1",
    "linear_psi",
    "linear_psi1",
    "kl_diag_gaussian",
]

DEFAULT_BLOCK = 512


def _lengthscale_sq(lengthscale, Q: int):
    """lengthscale (scalar or (Q,)) -> squared lengthscales of shape (Q,)."""
    ls = jnp.broadcast_to(jnp.asarray(lengthscale, dtype=jnp.float64), (Q,))
    return ls * ls


def _as64(*arrays):
    return tuple(jnp.asarray(a, dtype=jnp.float64) for a in arrays)


# ---------------------------------------------------------------------------------------------
# kernel matrices
# ---------------------------------------------------------------------------------------------


@jax.jit
def rbf_K(X, Z, variance, lengthscale):
    """RBF-ARD kernel matrix k(X, Z), shape (N, M)."""
    X, Z = _as64(X, Z)
    ls = jnp.sqrt(_lengthscale_sq(lengthscale, X.shape[1]))
    Xs, Zs = X / ls, Z / ls
    d2 = (Xs * Xs).sum(1)[:, None] + (Zs * Zs).sum(1)[None, :] - 2.0 * (Xs @ Zs.T)
    return variance * jnp.exp(-0.5 * jnp.maximum(d2, 0.0))


@jax.jit
def linear_K(X, Z, variances):
    """Linear-ARD kernel matrix k(X, Z) = X diag(variances) Z^T, shape (N, M)."""
    X, Z = _as64(X, Z)
    v = jnp.broadcast_to(jnp.asarray(variances, dtype=jnp.float64), (X.shape[1],))
    return (X * v) @ Z.T


# ---------------------------------------------------------------------------------------------
# RBF-ARD psi statistics
# ---------------------------------------------------------------------------------------------


def _rbf_psi1_block(mu, S, Z, variance, l2):
    """Psi1 for a block of rows, (B, M), via one (B, 2Q) x (2Q, M) GEMM."""
    b = 1.0 / (l2 + S)  # (B, Q)
    row = -0.5 * jnp.log1p(S / l2).sum(1) - 0.5 * (b * mu * mu).sum(1)  # (B,)
    A = jnp.concatenate([b * mu, b], axis=1)  # (B, 2Q)
    Bm = jnp.concatenate([Z, -0.5 * Z * Z], axis=1).T  # (2Q, M)
    return variance * jnp.exp(row[:, None] + A @ Bm)


def _rbf_psi2_block(mu, S, mask, l2, Bpair):
    """sum_n mask_n * prod_q(1+2S/l2)^(-1/2) exp(-sum_q (mu - zbar_p)^2 a), shape (P,)."""
    a = 1.0 / (l2 + 2.0 * S)  # (B, Q)
    row = -0.5 * jnp.log1p(2.0 * S / l2).sum(1) - (a * mu * mu).sum(1)  # (B,)
    A = jnp.concatenate([a * mu, a], axis=1)  # (B, 2Q)
    return mask @ jnp.exp(row[:, None] + A @ Bpair)  # GEMM, exp, GEMV


def _rbf_block_stats(mu, S, Y, mask, Z, variance, l2, Bpair):
    psi1 = _rbf_psi1_block(mu, S, Z, variance, l2) * mask[:, None]
    return psi1.T @ Y, _rbf_psi2_block(mu, S, mask, l2, Bpair)


def _pad_blocks(x, nb: int, block: int):
    """(N, ...) -> (nb, block, ...) with zero padding at the end."""
    pad = nb * block - x.shape[0]
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    return x.reshape((nb, block) + x.shape[1:])


@jax.jit
def rbf_psi1(mu, S, Z, variance, lengthscale):
    """Psi1[n, m] = E_q[k_rbf(x_n, z_m)], shape (N, M) (used for prediction)."""
    mu, S, Z = _as64(mu, S, Z)
    l2 = _lengthscale_sq(lengthscale, mu.shape[1])
    return _rbf_psi1_block(mu, S, Z, jnp.asarray(variance, dtype=jnp.float64), l2)


@partial(jax.jit, static_argnames=("block_size", "remat"))
def rbf_psi(mu, S, Z, variance, lengthscale, Y, *, block_size: int = DEFAULT_BLOCK, remat: bool = False):
    """Per-chunk partial sums for the RBF-ARD kernel.

    Returns ``(psi0_sum, psi1TY, psi2_sum)``: the scalar N * variance, Psi1^T Y of shape (M, D) and
    sum_n Psi2_n of shape (M, M).  Rows are processed ``block_size`` at a time (static int).
    """
    mu, S, Z, Y = _as64(mu, S, Z, Y)
    variance = jnp.asarray(variance, dtype=jnp.float64)
    N, Q = mu.shape
    M = Z.shape[0]
    D = Y.shape[1]
    l2 = _lengthscale_sq(lengthscale, Q)

    iu, ju = np.triu_indices(M)
    zbar = 0.5 * (Z[iu] + Z[ju])  # (P, Q)
    dzz = Z[iu] - Z[ju]
    log_pair = -(dzz * dzz / (4.0 * l2)).sum(1)  # (P,)
    Bpair = jnp.concatenate([2.0 * zbar, -zbar * zbar], axis=1).T  # (2Q, P)

    block = max(1, int(block_size))
    if N <= block:
        psi1TY, acc = _rbf_block_stats(mu, S, Y, jnp.ones((N,), jnp.float64), Z, variance, l2, Bpair)
    else:
        nb = -(-N // block)
        xs = (
            _pad_blocks(mu, nb, block),
            _pad_blocks(S, nb, block),
            _pad_blocks(Y, nb, block),
            _pad_blocks(jnp.ones((N,), jnp.float64), nb, block),
        )
        stats = jax.checkpoint(_rbf_block_stats) if remat else _rbf_block_stats

        def body(carry, x):
            mu_b, S_b, Y_b, m_b = x
            t1, t2 = stats(mu_b, S_b, Y_b, m_b, Z, variance, l2, Bpair)
            return (carry[0] + t1, carry[1] + t2), None

        init = (jnp.zeros((M, D), jnp.float64), jnp.zeros((iu.size,), jnp.float64))
        (psi1TY, acc), _ = jax.lax.scan(body, init, xs)

    pairs = variance * variance * jnp.exp(log_pair) * acc
    psi2 = jnp.zeros((M, M), jnp.float64).at[iu, ju].set(pairs).at[ju, iu].set(pairs)
    psi0 = N * variance
    return psi0, psi1TY, psi2


# ---------------------------------------------------------------------------------------------
# linear-ARD psi statistics
# ---------------------------------------------------------------------------------------------


@jax.jit
def linear_psi1(mu, S, Z, variances):
    """Psi1 = mu diag(variances) Z^T, shape (N, M) (S does not enter)."""
    del S
    return linear_K(mu, Z, variances)


@jax.jit
def linear_psi(mu, S, Z, variances, Y):
    """Per-chunk partial sums for the linear-ARD kernel, ``(psi0_sum, psi1TY, psi2_sum)``.

    psi0_sum = sum_n sum_q v_q (mu_nq^2 + S_nq); Psi1^T Y = Z diag(v) (mu^T Y);
    psi2_sum = Z diag(v) (mu^T mu + diag(sum_n S_n)) diag(v) Z^T.  Pure GEMMs.
    """
    mu, S, Z, Y = _as64(mu, S, Z, Y)
    v = jnp.broadcast_to(jnp.asarray(variances, dtype=jnp.float64), (mu.shape[1],))
    psi0 = ((mu * mu + S).sum(0) * v).sum()
    Zv = Z * v  # (M, Q)
    psi1TY = Zv @ (mu.T @ Y)
    C = mu.T @ mu + jnp.diag(S.sum(0))
    psi2 = Zv @ C @ Zv.T
    return psi0, psi1TY, psi2


# ---------------------------------------------------------------------------------------------
# KL term
# ---------------------------------------------------------------------------------------------


@jax.jit
def kl_diag_gaussian(mu, S):
    """KL(q(X) || N(0, I)) summed over the rows of the chunk (and over q)."""
    mu, S = _as64(mu, S)
    return 0.5 * (mu * mu + S - jnp.log(S) - 1.0).sum()
