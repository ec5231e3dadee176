"""Closed-form psi statistics of the Bayesian GP-LVM / MRD (Damianou et al., appendix A, eqs. 38-39).

The variational posterior is q(X) = prod_n N(x_n | mu_n, diag(S_n)) with ``mu`` and ``S`` of shape
(N, Q); the inducing inputs ``Z`` are (M, Q).  For a kernel k the statistics are (eq. 39)

    psi0 = sum_n E_q[k(x_n, x_n)]                       (scalar)
    Psi1 = E_q[K_fu],             Psi1[n, m]     = E_q[k(x_n, z_m)]                (N, M)
    Psi2 = E_q[K_uf K_fu] = sum_n Psi2_n,  Psi2_n[m, m'] = E_q[k(x_n, z_m) k(x_n, z_m')]  (M, M)

All of them are sums over data points, so a chunk of rows of (mu, S, Y) contributes the partial sums
``(psi0_sum, Psi1^T Y, Psi2_sum)`` returned by :func:`rbf_psi` / :func:`linear_psi`; the chunk results
add up to the full-data statistics (the map-reduce in ``lvmcore.chunks``).

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

i.e. a row constant plus one GEMM of the (P, 2Q) matrix [2 zbar, -zbar^2] by the (2Q, B) matrix
[a mu; a] of a block of B rows, where p runs over the P = M (M + 1) / 2 pairs m <= m' (Psi2 is
symmetric, so only the upper triangle is computed and mirrored).  The log of the per-row prefactor
is folded into the row constant; the exponential is fused into the sum over the block's rows.
Psi1 is handled the same way (one (M, 2Q) x (2Q, B) GEMM per block).  Rows are processed in
blocks of ``block_size`` (``jax.lax.scan`` over the full blocks, the N mod block_size remaining rows
as one smaller block): blocks of a few hundred rows keep the (P, B) exponentials in cache, which
matters more here than the exp itself (writing large fresh buffers costs more than computing them).

Gradient (hand-written ``jax.custom_vjp`` of the row sums, no residual but the inputs).  The bound
needs only sum_n Psi2_n and Psi1^T Y, so their cotangents c (per pair) and V (M, D) are shared by
all rows.  With E[p, n] the pair exponentials of row n (recomputed per block in the backward
pass), w1 = 1 / (l2 + S) and W1[m, n] = Psi1[n, m] (V_m . Y_n) / variance:

    d/dmu_nq  = -w1 (mu s1 - h1) - 2 a (mu f - k1)
    d/dS_nq   = -w1 s1 / 2 + w1^2 (mu^2 s1 - 2 mu h1 + h2) / 2 - a f + 2 a^2 (mu^2 f - 2 mu k1 + k2)
    d/dl2_q   = sum_n [d/dS_nq from Psi1 + (d/dS_nq from Psi2) / 2 + (s1 + f) / (2 l2_q)]
    d/dzbar_pq = 2 c_p sum_n E[p, n] a_nq (mu_nq - zbar_pq),  d/dz_mq = sum_n W1 w1 (mu - z_mq)

where s1, h1, h2 = sum_m W1[m, n] (1, z_mq, z_mq^2) and f, k1, k2 = sum_p c_p E[p, n] (1, zbar_pq,
zbar_pq^2): per block, the GEMMs [c, c zbar, c zbar^2]^T E (rows' sums) and E [a mu, a]^T (pairs'
sums), plus one recomputation of E: one exp pass and three (P, 2Q)-sized GEMMs per block, instead
of reverse mode's stored exponentials and elementwise chains. The same rule gives the gradients
of the variance and of the pairs' log factor -(z_m - z_m')^2 / (4 l2) from the row sums; the
dependence of that factor and of zbar on Z and l2 stays with autodiff. For a backward-only use
(``rbf_psi(primal=False)``) the row sums are accumulated in the backward pass instead of a
forward one.

Everything is float64 (scoped, ``lvmcore.precision``), pure and differentiable in
reverse mode (``jax.vjp`` / ``jax.grad``; :func:`rbf_psi` has no forward-mode rule, so no
``jax.jvp`` / ``jax.jacfwd`` / Hessians through it: the per-row Hessians of weighted RBF
statistics are :func:`rbf_row_curvature`'s, in closed form); the public functions are wrapped in
``jax.jit`` (``block_size`` of :func:`rbf_psi` is a static argument).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from lvmcore.kernels.euclidean import linear_K
from lvmcore.precision import jit64, x64
from lvmcore.psi import native

__all__ = [
    "rbf_psi",
    "rbf_psi1",
    "rbf_row_curvature",
    "linear_psi",
    "linear_psi1",
    "kl_diag_gaussian",
    "rbf_statistics",
    "rbf_rows",
    "linear_statistics",
    "linear_rows",
]

DEFAULT_BLOCK = 256
#: entries of the largest (rows, M (M + 1) / 2) intermediate of the RBF psi2 per row block: small
#: blocks keep each block's exponentials in cache (they are recomputed, not stored, for the gradient);
#: 1.25 MiB, so that the backward pass's exponent block and its exponentials fit in a 2 MiB L2 together
PSI_BLOCK_ENTRIES = 163_840


def psi_block(M: int) -> int:
    """Rows per block of the RBF psi statistics (128 at M = 50): a multiple of 16 in [16, 1024]."""
    rows = PSI_BLOCK_ENTRIES // (M * (M + 1) // 2)
    return int(np.clip(rows // 16 * 16, 16, 1024))


#: (rows, M) entries per row block of Psi1 on the native path (1,310 rows at M = 50; bench/README.md)
PSI1_BLOCK_ENTRIES = 1 << 16


def _lengthscale_sq(lengthscale, Q: int):
    """lengthscale (scalar or (Q,)) -> squared lengthscales of shape (Q,)."""
    ls = jnp.broadcast_to(jnp.asarray(lengthscale, dtype=jnp.float64), (Q,))
    return ls * ls


def _as64(*arrays):
    return tuple(jnp.asarray(a, dtype=jnp.float64) for a in arrays)


# ---------------------------------------------------------------------------------------------
# RBF-ARD psi statistics
# ---------------------------------------------------------------------------------------------


def _row_terms(muT, ST, l2c, two):
    """Row-block terms in transposed layout (q along axis 0, rows along axis 1) for psi1 (two = 1)
    or psi2 (two = 2): w = 1 / (l2 + two S) (Q, B), the GEMM's factor [w mu; w] (2Q, B) and the
    row constant -1/2 sum_q log(1 + two S / l2) - (two / 2) sum_q w mu^2 (B,)."""
    w = 1.0 / (l2c + two * ST)
    row = -0.5 * jnp.log1p(two * ST / l2c).sum(0) - (0.5 * two) * (w * muT * muT).sum(0)
    return w, jnp.concatenate([w * muT, w], axis=0), row


def _over_row_blocks(body, carry, xs, block: int):
    """Runs ``carry, ys = body(carry, rows)`` over the rows of the arrays ``xs`` in blocks of
    ``block`` rows: full blocks by ``jax.lax.scan`` (inline when there is one), the remaining
    N mod block rows as one smaller block (no padding, no mask). Returns (carry, ys stacked
    back to N rows) (ys may be None)."""
    N = xs[0].shape[0]
    nb, rem = divmod(N, block)
    parts = []
    if nb == 1:
        carry, ys = body(carry, tuple(x[:block] for x in xs))
        parts.append(ys)
    elif nb > 1:
        xb = tuple(x[: nb * block].reshape((nb, block) + x.shape[1:]) for x in xs)
        carry, ys = jax.lax.scan(body, carry, xb)
        parts.append(jax.tree_util.tree_map(lambda y: y.reshape((nb * block,) + y.shape[2:]), ys))
    if rem:
        carry, ys = body(carry, tuple(x[nb * block :] for x in xs))
        parts.append(ys)
    if parts[0] is None:
        return carry, None
    return carry, jax.tree_util.tree_map(lambda *ys: jnp.concatenate(ys, axis=0), *parts)


def _factors(Z, zbar):
    """Right-hand GEMM factors: [Z, -Z^2/2] (M, 2Q) for psi1, [2 zbar, -zbar^2] (P, 2Q) for psi2."""
    return (
        jnp.concatenate([Z, -0.5 * Z * Z], axis=1),
        jnp.concatenate([2.0 * zbar, -zbar * zbar], axis=1),
    )


def _rbf_sums_impl(mu, S, Y, l2, Z, zbar, block):
    M, D = Z.shape[0], Y.shape[1]
    F1, F2 = _factors(Z, zbar)
    l2c = l2[:, None]

    def body(carry, rows):
        mu_b, S_b, Y_b = rows
        muT, ST = mu_b.T, S_b.T
        _, A1, r1 = _row_terms(muT, ST, l2c, 1.0)
        e1 = jnp.exp(F1 @ A1 + r1)  # (M, B): Psi1^T / variance
        _, A2, r2 = _row_terms(muT, ST, l2c, 2.0)
        e2 = jnp.exp(F2 @ A2 + r2).sum(1)  # (P,): the exp is fused into the reduction over rows
        return (carry[0] + e1 @ Y_b, carry[1] + e2), None

    init = (jnp.zeros((M, D), mu.dtype), jnp.zeros((zbar.shape[0],), mu.dtype))
    return _over_row_blocks(body, init, (mu, S, Y), block)[0]


@partial(jax.custom_vjp, nondiff_argnums=(8, 9))
def _rbf_stats(mu, S, Y, l2, Z, zbar, variance, log_pair, block, primal):
    """(Psi1^T Y (M, D), sum_n Psi2_n per pair m <= m' (P,)), ``log_pair`` the pairs' log factor
    -sum_q (z_m - z_m')^2 / (4 l2).

    Differentiated by the hand-written rule below; its residuals are the inputs and the row sums
    (each row block's exponentials are recomputed in the backward pass, while in cache). With
    ``primal=False`` the outputs are zeros and their row pass is skipped; the backward pass then
    accumulates the row sums itself (the variance and pair-factor gradients need them), so the
    vector-Jacobian product is unchanged. That is for a ``jax.vjp`` whose outputs are discarded:
    XLA does not remove an unused forward loop from a jitted ``jax.vjp``."""
    return _rbf_stats_fwd(mu, S, Y, l2, Z, zbar, variance, log_pair, block, primal)[0]


def _zero_sums(Y, Z, zbar):
    return jnp.zeros((Z.shape[0], Y.shape[1]), Y.dtype), jnp.zeros((zbar.shape[0],), Y.dtype)


def _rbf_stats_fwd(mu, S, Y, l2, Z, zbar, variance, log_pair, block, primal):
    if not primal:
        return _zero_sums(Y, Z, zbar), (mu, S, Y, l2, Z, zbar, variance, log_pair, None)
    sums = _rbf_sums_impl(mu, S, Y, l2, Z, zbar, block)
    out = variance * sums[0], variance * variance * jnp.exp(log_pair) * sums[1]  # Psi1^T Y, Psi2's pairs
    return out, (mu, S, Y, l2, Z, zbar, variance, log_pair, sums)


def _rbf_stats_bwd(block, primal, res, cot):
    """Cotangents G1 (M, D) of Psi1^T Y and G2 (P,) of the pairs; the row pass gets V = variance G1
    and c = variance^2 exp(log_pair) G2 (see the module docstring)."""
    mu, S, Y, l2, Z, zbar, variance, log_pair, sums = res
    G1, G2 = cot
    pf = variance * variance * jnp.exp(log_pair)
    (g_mu, g_S, g_Y, g_l2, g_Z, g_zbar), row_sums = _rbf_sums_bwd(
        block, (mu, S, Y, l2, Z, zbar), (variance * G1, pf * G2), with_sums=sums is None
    )
    e1Y, acc = row_sums if sums is None else sums
    g_var = jnp.sum(G1 * e1Y) + 2.0 * variance * jnp.sum(G2 * jnp.exp(log_pair) * acc)
    return g_mu, g_S, g_Y, g_l2, g_Z, g_zbar, g_var, G2 * pf * acc


def _rbf_sums_bwd(block, res, cot, with_sums=False):
    """The row pass of the backward rule: cotangents V (M, D) of e1Y and c (P,) of the row sums of
    :func:`_rbf_sums_impl`; see the module docstring. With ``with_sums`` it also returns those row
    sums (e1Y, acc), accumulated from the exponentials it recomputes anyway (else None)."""
    mu, S, Y, l2, Z, zbar = res
    V, c = cot
    Q = mu.shape[1]
    F1, F2 = _factors(Z, zbar)
    l2c = l2[:, None]
    ZZt = jnp.concatenate([Z, Z * Z], axis=1).T  # (2Q, M)
    C2t = (c[:, None] * jnp.concatenate([jnp.ones_like(zbar[:, :1]), zbar, zbar * zbar], axis=1)).T

    def body(carry, rows):
        g_l2, g_Z, g_zbar, sums = carry
        mu_b, S_b, Y_b = rows
        muT, ST = mu_b.T, S_b.T
        mu2 = muT * muT
        # psi1: W1[m, n] = e1[m, n] (V_m . Y_n)
        b, A1, r1 = _row_terms(muT, ST, l2c, 1.0)
        e1 = jnp.exp(F1 @ A1 + r1)  # (M, B)
        W1 = e1 * (V @ Y_b.T)
        g_Y = (V.T @ e1).T  # (B, D)
        s1 = W1.sum(0)  # (B,)
        H1 = ZZt @ W1  # (2Q, B): sum_m W1 z_m, sum_m W1 z_m^2
        h1, h2 = H1[:Q], H1[Q:]
        g_mu = -b * (muT * s1 - h1)
        g_S1 = -0.5 * b * s1 + 0.5 * b * b * (mu2 * s1 - 2.0 * muT * h1 + h2)
        g_Z = g_Z + W1 @ A1.T  # (M, 2Q)
        # psi2: weights E2[p, n] c_p
        a, A2, r2 = _row_terms(muT, ST, l2c, 2.0)
        E2 = jnp.exp(F2 @ A2 + r2)  # (P, B)
        H2 = C2t @ E2  # (1 + 2Q, B): sum_p c_p E2 [1, zbar_p, zbar_p^2]
        f, k1, k2 = H2[:1], H2[1 : Q + 1], H2[Q + 1 :]
        g_mu = g_mu - 2.0 * a * (muT * f - k1)
        g_S2 = -a * f + 2.0 * a * a * (mu2 * f - 2.0 * muT * k1 + k2)
        if with_sums:  # the row sum of E2 as one more column of the same GEMM
            EA = E2 @ jnp.concatenate([A2, jnp.ones_like(A2[:1])], axis=0).T  # (P, 2Q + 1)
            g_zbar = g_zbar + EA[:, :-1]
            sums = (sums[0] + e1 @ Y_b, sums[1] + EA[:, -1])
        else:
            g_zbar = g_zbar + E2 @ A2.T  # (P, 2Q)
        g_l2 = g_l2 + (g_S1 + 0.5 * g_S2 + 0.5 * (s1 + f) / l2c).sum(1)
        return (g_l2, g_Z, g_zbar, sums), (g_mu.T, (g_S1 + g_S2).T, g_Y)

    init = (
        jnp.zeros_like(l2),
        jnp.zeros((Z.shape[0], 2 * Q), mu.dtype),
        jnp.zeros((zbar.shape[0], 2 * Q), mu.dtype),
        _zero_sums(Y, Z, zbar) if with_sums else None,
    )
    (g_l2, GZ, Gz, sums), (g_mu, g_S, g_Y) = _over_row_blocks(body, init, (mu, S, Y), block)
    g_Z = GZ[:, :Q] - Z * GZ[:, Q:]
    g_zbar = 2.0 * c[:, None] * (Gz[:, :Q] - zbar * Gz[:, Q:])
    return (g_mu, g_S, g_Y, g_l2, g_Z, g_zbar), sums


_rbf_stats.defvjp(_rbf_stats_fwd, _rbf_stats_bwd)


@jit64
def rbf_psi1(mu, S, Z, variance, lengthscale):
    """Psi1[n, m] = E_q[k_rbf(x_n, z_m)], shape (N, M), row by row (prediction at uncertain inputs),
    via one (N, 2Q) x (2Q, M) GEMM."""
    mu, S, Z = _as64(mu, S, Z)
    l2 = _lengthscale_sq(lengthscale, mu.shape[1])
    b = 1.0 / (l2 + S)  # (N, Q)
    row = -0.5 * jnp.log1p(S / l2).sum(1) - 0.5 * (b * mu * mu).sum(1)  # (N,)
    A = jnp.concatenate([b * mu, b], axis=1)  # (N, 2Q)
    Bm = jnp.concatenate([Z, -0.5 * Z * Z], axis=1).T  # (2Q, M)
    return jnp.asarray(variance, dtype=jnp.float64) * jnp.exp(row[:, None] + A @ Bm)


#: entries of the largest (rows, pairs, 2Q) array of :func:`rbf_row_curvature` per row block
CURVATURE_BLOCK_ENTRIES = 1 << 18


def _weighted_curvature(W, d, S, l2, k):
    """Value (B,), gradient (B, 2Q) and Hessian (B, 2Q, 2Q) in x = (mu, log S) of sum_t W[b, t]
    for terms W = weight exp(log E) with log E = const - 1/2 sum_q log(1 + k S_q / l2_q) -
    (k / 2) sum_q w_q d_tq^2, w = 1 / (l2 + k S), d = mu - z_t (B, T, Q) (Psi1: k = 1, z_m;
    Psi2: k = 2, zbar_mm'). log E is separable in q, so the Hessian of each term is
    E (g g^T + h) with g = (-k w d, (k / 2) S w (k w d^2 - 1)) and h one 2 x 2 block per q:
    (-k w, k^2 S w^2 d, -(k / 2) S l2 w^2 + (k^2 / 2) S w^2 (1 - 2 k S w) d^2)."""
    Q = S.shape[1]
    w, Sw = 1.0 / (l2 + k * S), S / (l2 + k * S)
    G = jnp.concatenate(
        [-k * w[:, None, :] * d, (0.5 * k) * Sw[:, None, :] * (k * w[:, None, :] * d * d - 1.0)], axis=2
    )  # (B, T, 2Q)
    WG = W[:, :, None] * G
    grad = WG.sum(1)
    H = jnp.einsum("bti,btj->bij", WG, G)
    s0 = W.sum(1)[:, None]
    m1 = jnp.einsum("bt,btq->bq", W, d)
    m2 = jnp.einsum("bt,btq->bq", W, d * d)
    h_mm = -k * w * s0
    h_ms = k * k * Sw * w * m1
    h_ss = -(0.5 * k) * Sw * l2 * w * s0 + (0.5 * k * k) * Sw * w * (1.0 - 2.0 * k * Sw) * m2
    eye = jnp.eye(Q, dtype=H.dtype)
    blocks = jnp.concatenate(
        [jnp.concatenate([h_mm[:, :, None] * eye, h_ms[:, :, None] * eye], axis=2),
         jnp.concatenate([h_ms[:, :, None] * eye, h_ss[:, :, None] * eye], axis=2)], axis=1,
    )  # fmt: skip
    return W.sum(1), grad, H + blocks


@jit64
def rbf_row_curvature(mu, S, Z, variance, lengthscale, w1, C):
    """Per row n of q(X) (``mu``, ``S``: (N, Q)): the value (N,), gradient (N, 2Q) and Hessian
    (N, 2Q, 2Q), with respect to x_n = (mu_n, log S_n), of

        T_n = sum_m w1[n, m] Psi1[n, m] + sum_{m, m'} C[m, m'] Psi2_n[m, m']

    (``w1``: (N, M) per-row weights of Psi1; ``C``: (M, M) symmetric weights shared by the rows),
    from the per-row formulas above in closed form (:func:`_weighted_curvature`). This is the
    curvature of the per-row Newton of ``lvmcore.newpoints``: :func:`rbf_psi`'s rule is
    reverse-only, and autodiff's Hessians of these statistics (reverse over reverse, or forward
    over reverse through the plain formulas) build and differentiate the per-row (M, M) arrays
    once per input direction, where here each pair's gradient enters one (2Q x pairs) product
    per row.
    Psi2 runs over the M (M + 1) / 2 pairs m <= m' (off-diagonal weights doubled), rows in blocks
    of a power of two up to CURVATURE_BLOCK_ENTRIES / (pairs 2Q): no (N, pairs, 2Q) array is
    formed."""
    mu, S, Z, w1, C = _as64(mu, S, Z, w1, C)
    variance = jnp.asarray(variance, dtype=jnp.float64)
    N, Q = mu.shape
    M = Z.shape[0]
    l2 = _lengthscale_sq(lengthscale, Q)
    iu, ju = np.triu_indices(M)
    zbar = 0.5 * (Z[iu] + Z[ju])  # (P, Q)
    dzz = Z[iu] - Z[ju]
    log_pf = 2.0 * jnp.log(variance) - (dzz * dzz / (4.0 * l2)).sum(1)  # (P,) pairs' log factor
    Cp = jnp.where(iu == ju, 1.0, 2.0) * C[iu, ju]  # (P,)
    # a power of two: the new-point optimiser's blocks (a power of two) then split into whole row
    # blocks, so every row goes through the same compiled code, whatever its place in the block
    block = 1 << int(max(1, CURVATURE_BLOCK_ENTRIES // (len(iu) * 2 * Q))).bit_length() - 1

    def log_e(d, S_b, k):  # the per-row part of log E (module docstring's formulas), (B, T)
        return -0.5 * jnp.log1p(k * S_b / l2).sum(1)[:, None] - 0.5 * k * (
            d * d / (l2 + k * S_b)[:, None, :]
        ).sum(2)

    def body(carry, rows):
        mu_b, S_b, w_b = rows
        d1 = mu_b[:, None, :] - Z  # (B, M, Q)
        v1, g1, H1 = _weighted_curvature(w_b * variance * jnp.exp(log_e(d1, S_b, 1.0)), d1, S_b, l2, 1.0)
        d2 = mu_b[:, None, :] - zbar  # (B, P, Q)
        v2, g2, H2 = _weighted_curvature(jnp.exp(log_pf + log_e(d2, S_b, 2.0)) * Cp, d2, S_b, l2, 2.0)
        return carry, (v1 + v2, g1 + g2, H1 + H2)

    return _over_row_blocks(body, jnp.zeros(()), (mu, S, w1), block)[1]


@partial(jax.custom_vjp, nondiff_argnums=(6,))
def _native_pairs(mu, S, l2, Z, variance, log_pair, primal):
    """sum_n Psi2_n per pair m <= m' (P,), by the C kernel from q(X); ``primal=False`` as in
    :func:`_rbf_stats` (zeros out, the backward pass computes the row sums it needs)."""
    return _native_pairs_fwd(mu, S, l2, Z, variance, log_pair, primal)[0]


def _native_pairs_fwd(mu, S, l2, Z, variance, log_pair, primal):
    if not primal:
        return jnp.zeros_like(log_pair), (mu, S, l2, Z, variance, log_pair, None)
    # the kernel's inputs made per row tile from q(X) in C: no (N, M) array in between
    acc = native.pairs_qx_fwd(mu, S, l2, Z)
    return variance * variance * jnp.exp(log_pair) * acc, (mu, S, l2, Z, variance, log_pair, acc)


def _native_pairs_bwd(primal, res, g):
    mu, S, l2, Z, variance, log_pair, acc = res
    el = jnp.exp(log_pair)
    pf = variance * variance * el
    # the gradients onto q(X) in C; without the forward's sums (primal=False) the same pass adds them up
    g_mu, g_S, g_l2, g_Z, acc_b = native.pairs_qx_bwd(mu, S, l2, Z, pf * g, with_acc=acc is None)
    acc = acc_b if acc is None else acc
    return g_mu, g_S, g_l2, g_Z, 2.0 * variance * jnp.sum(g * el * acc), g * pf * acc


_native_pairs.defvjp(_native_pairs_fwd, _native_pairs_bwd)

IMPLS = ("native", "xla")


def resolve_impl(impl):
    """'native' (the C pair kernel), 'xla' (pure jax) or None: the native kernel where it builds,
    unless ``EMBED_SWEEP_NATIVE=0`` turns it off, else the XLA path (``lvmcore.psi.native``)."""
    if impl is None:
        return "native" if native.enabled() and native.available() else "xla"
    if impl not in IMPLS:
        raise ValueError(f"unknown psi implementation {impl!r}; use one of {IMPLS} or None (automatic)")
    if impl == "native" and not native.available():
        raise RuntimeError(f"the native psi2 kernel is unavailable: {native.unavailable_reason()}")
    return impl


def rbf_psi(mu, S, Z, variance, lengthscale, Y, *, block_size: int = DEFAULT_BLOCK, primal: bool = True,
            impl: str | None = None):  # fmt: skip
    """Per-chunk partial sums for the RBF-ARD kernel.

    Returns ``(psi0_sum, psi1TY, psi2_sum)``: the scalar N * variance, Psi1^T Y of shape (M, D) and
    sum_n Psi2_n of shape (M, M).  Rows are processed ``block_size`` at a time (static int; XLA
    path).  ``primal=False`` is only for a ``jax.vjp`` whose outputs are discarded (the backward
    task of the chunked map-reduce): Psi1^T Y and Psi2 come back as zeros without their row pass,
    and the vector-Jacobian product is the same.  ``impl``: ``"native"`` (Psi2's pair sums by the
    C kernel of ``lvmcore.psi.native``, Psi1 by jax), ``"xla"`` (all jax, the row blocks above) or
    None, native where it is available (decided when the caller is traced).
    """
    return _rbf_psi(
        mu, S, Z, variance, lengthscale, Y, block_size=max(1, int(block_size)), primal=bool(primal),
        impl=resolve_impl(impl),
    )  # fmt: skip


@jit64(static_argnames=("block_size", "primal", "impl"))
def _rbf_psi(mu, S, Z, variance, lengthscale, Y, *, block_size, primal, impl):
    mu, S, Z, Y = _as64(mu, S, Z, Y)
    variance = jnp.asarray(variance, dtype=jnp.float64)
    N, Q = mu.shape
    M = Z.shape[0]
    l2 = _lengthscale_sq(lengthscale, Q)

    iu, ju = np.triu_indices(M)
    dzz = Z[iu] - Z[ju]
    log_pair = -(dzz * dzz / (4.0 * l2)).sum(1)  # (P,)

    if impl == "native":
        # Psi1 by the row-block pass with no pairs (P = 0: its Psi2 terms are empty arrays), in
        # blocks of PSI1_BLOCK_ENTRIES / M rows: no (N, M) temporaries, which at N = 20,000 cost
        # more in page faults of fresh memory than in arithmetic
        rows1 = max(block_size, PSI1_BLOCK_ENTRIES // M)
        psi1TY, _ = _rbf_stats(mu, S, Y, l2, Z, Z[:0], variance, log_pair[:0], rows1, primal)
        pairs = _native_pairs(mu, S, l2, Z, variance, log_pair, primal)
    else:
        zbar = 0.5 * (Z[iu] + Z[ju])  # (P, Q)
        psi1TY, pairs = _rbf_stats(mu, S, Y, l2, Z, zbar, variance, log_pair, block_size, primal)
    psi2 = jnp.zeros((M, M), jnp.float64).at[iu, ju].set(pairs).at[ju, iu].set(pairs)
    psi0 = N * variance
    return psi0, psi1TY, psi2


def rbf_row_moments(mu, S, Z, variance, lengthscale):
    """One row's psi0 [], psi1 [M] and Psi2 - psi1 psi1^T [M, M] (the covariance of k(x, Z) under
    N(mu, diag S)) for the RBF-ARD kernel, the last without cancellation. Psi2 = psi1 psi1^T * R
    elementwise, and per pair, with c = l_q^2, u = mu_q - (z_mq + z_m'q) / 2, v = (z_mq - z_m'q) / 2,

        log R = sum_q log1p(S_q / c) - log1p(2 S_q / c) / 2 + S_q (u^2 / ((c + S_q)(c + 2 S_q))
                                                                  - v^2 / (c (c + S_q))),

    zero at S = 0; the covariance is psi1 psi1^T expm1(log R). Formed as Psi2 - psi1 psi1^T, it is
    the difference of two terms up to the kernel's variance squared, and a new point's bound, made
    of such terms, rounds at a few 1e-7 of its size on an atlas's fit."""
    mu, S, Z = _as64(mu, S, Z)
    c = _lengthscale_sq(lengthscale, mu.shape[0])
    var = jnp.asarray(variance, dtype=jnp.float64)
    M = Z.shape[0]
    # the sums over q as products with fixed (M or M^2, Q) arrays: (mu - z)^2 = mu^2 - 2 mu z + z^2
    # (its rounding is eps (mu^2 + z^2) / c in an exponent), and no (M, M, Q) array per row, whose
    # reverse pass cost 8x the value's
    w1 = 1.0 / (c + S)
    sq1 = (Z * Z) @ w1 - 2.0 * Z @ (w1 * mu) + (mu * mu) @ w1  # sum_q (mu_q - z_mq)^2 / (c + S)
    p1 = var * jnp.exp(-0.5 * jnp.log1p(S / c).sum() - 0.5 * sq1)
    zbar = (0.5 * (Z[:, None, :] + Z[None, :, :])).reshape(M * M, -1)
    half = (0.5 * (Z[:, None, :] - Z[None, :, :])).reshape(M * M, -1)
    wu = S / ((c + S) * (c + 2.0 * S))
    log_r = (jnp.log1p(S / c) - 0.5 * jnp.log1p(2.0 * S / c)).sum() + (
        (zbar * zbar) @ wu - 2.0 * zbar @ (wu * mu) + (mu * mu) @ wu - (half * half) @ (S / (c * (c + S)))
    ).reshape(M, M)
    return var, p1, (p1[:, None] * p1[None, :]) * jnp.expm1(log_r)


# ---------------------------------------------------------------------------------------------
# linear-ARD psi statistics
# ---------------------------------------------------------------------------------------------


@jit64
def linear_psi1(mu, S, Z, variances):
    """Psi1 = mu diag(variances) Z^T, shape (N, M), row by row (S does not enter)."""
    del S
    return linear_K(mu, Z, variances)


@jit64
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


def linear_row_moments(mu, S, Z, variances):
    """One row's psi0 [], psi1 [M] and Psi2 - psi1 psi1^T = Z diag(v^2 S) Z^T [M, M] for the
    linear-ARD kernel under N(mu, diag S) (as :func:`rbf_row_moments`)."""
    mu, S, Z = _as64(mu, S, Z)
    v = jnp.broadcast_to(jnp.asarray(variances, dtype=jnp.float64), (mu.shape[0],))
    Zv = Z * v
    return (v * (mu * mu + S)).sum(), Zv @ mu, (Zv * S) @ Zv.T


# ---------------------------------------------------------------------------------------------
# the kernels' entries (``lvmcore.psi``'s dispatch table): parameters as the kernel objects hold
# them (log-values, ``lvmcore.kernels.euclidean``)
# ---------------------------------------------------------------------------------------------


@x64
def rbf_statistics(kernel, mu, S, Z, kp, Y, *, primal: bool = True, impl: str | None = None):
    """The RBF-ARD kernel's chunk sums (psi0, Psi1^T Y [M, D], Psi2 [M, M]) of eq. 39 under
    q(X) = prod_n N(mu_n, diag S_n): :func:`rbf_psi` in blocks of :func:`psi_block` rows."""
    var, ls = jnp.exp(kp["log_var"]), jnp.exp(kp["log_ls"])
    return rbf_psi(mu, S, Z, var, ls, Y, block_size=psi_block(Z.shape[0]), primal=primal, impl=impl)


@x64
def rbf_rows(kernel, mu, S, Z, kp):
    """The RBF-ARD kernel's Psi1 [N, M] row by row (prediction at uncertain inputs, appendix C)."""
    return rbf_psi1(mu, S, Z, jnp.exp(kp["log_var"]), jnp.exp(kp["log_ls"]))


@x64
def linear_statistics(kernel, mu, S, Z, kp, Y, *, primal: bool = True, impl: str | None = None):
    """The linear-ARD kernel's chunk sums (psi0, Psi1^T Y, Psi2): :func:`linear_psi` (``primal``
    and ``impl`` are the RBF path's options: nothing to choose here)."""
    return linear_psi(mu, S, Z, jnp.exp(kp["log_vars"]), Y)


@x64
def linear_rows(kernel, mu, S, Z, kp):
    """The linear-ARD kernel's Psi1 [N, M] row by row."""
    return linear_psi1(mu, S, Z, jnp.exp(kp["log_vars"]))


@x64
def rbf_moments(kernel, mu, S, Z, kp):
    """The RBF-ARD kernel's one-row (psi0, psi1, Psi2 - psi1 psi1^T): :func:`rbf_row_moments`."""
    return rbf_row_moments(mu, S, Z, jnp.exp(kp["log_var"]), jnp.exp(kp["log_ls"]))


@x64
def linear_moments(kernel, mu, S, Z, kp):
    """The linear-ARD kernel's one-row (psi0, psi1, Psi2 - psi1 psi1^T): :func:`linear_row_moments`."""
    return linear_row_moments(mu, S, Z, jnp.exp(kp["log_vars"]))


# ---------------------------------------------------------------------------------------------
# KL term
# ---------------------------------------------------------------------------------------------


@jit64
def kl_diag_gaussian(mu, S):
    """KL(q(X) || N(0, I)) summed over the rows of the chunk (and over q)."""
    mu, S = _as64(mu, S)
    return 0.5 * (mu * mu + S - jnp.log(S) - 1.0).sum()
