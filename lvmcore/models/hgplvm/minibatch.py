"""Minibatch (stochastic variational) training of the Bayesian hyperboloid GP-LVM (paper 002,
eq. 6) and of the sparse one (eq. 5, point latents: below), so one step costs O(B H M^2) whatever N
is; and the sweep's ``hgplvm_bayesian``, which picks it above ``FULL_BATCH_MAX_N`` points (as
``hgplvm_sparse`` does).

Model. As ``lvmcore.models.hgplvm`` (variant "bayesian"): latent points on the Lorentz model L^Q,
q(x_n) = N^w(mu_n, diag S_n) (wrapped normal), prior N^w(mu0, s^2 I), HE kernel
k = sigma exp(-d_L / kappa) with M inducing inputs Z on L^Q. The inducing outputs keep an explicit
whitened q(u) (u = L_m v, K_mm = L_m L_m^T, q(v) = N(m, S_v) shared by the D columns) instead of
being collapsed, so the bound is the uncollapsed one of ``lvmcore.uncollapsed`` (Hensman et
al. 2013) with paper 002's Monte-Carlo psi statistics (eqs. 15-20, ``lvmcore.psi.monte_carlo``):

    F = sum_n E_q(x_n)[E_q(f_n) log p(y_n | f_n)] - KL(q(v) || N(0, I)) - sum_n KL(q(x_n) || p(x_n)).

The first term is linear in (psi0, Psi1^T Y, Psi2) summed over the points, so with H reparameterised
draws per point (``sample_wrapped``) and a batch of B points scaled by N / B it is an unbiased
estimate of F (the collapsed bound, a nonlinear function of the statistics, has no unbiased MC
estimate). At q(v)'s optimum for given statistics the uncollapsed bound equals the collapsed bound of
``hgplvm.bayesian_objective`` with the same statistics (tests/test_hgplvm_svi.py checks both
identities).

Training, three phases:

1. ``max_iter`` minibatch steps (batches of ``batch_size`` drawn without replacement, epoch after
   epoch; H fresh draws per point every step): a natural-gradient step of size ``ng_step`` on q(v)
   toward the batch's optimum (the first of size one), Riemannian Adam (Becigneul & Ganea) on Z and on
   the batch's means (per-point moments and step counts, the exponential map of
   ``lvmcore.manifolds.lorentz``), Adam on log sigma and log beta (log s^2 held at the
   ``prior_scale``'s) and on the batch's log S (held for the first ``fix_variance_iter``
   steps, as the full-batch fit does). ``tol`` stops the phase by the full-batch fit's plateau
   rule (patience 2 windows, after the warm-up) on the bound of one pass over all points after
   every window of whole epochs of at least 50 steps: the statistics at one draw per point, the
   same at every window (common random numbers), q(v) at its optimum for them, i.e. eq. 6 at those
   draws (``window_bounds_``; none where the budget ends before the rule could stop the fit).
2. A per-point pass with the globals and q(v) fixed: every point's q(x_n), in chunks of
   ``chunk_size`` rows, takes ``local_iter`` Riemannian Adam / Adam steps (``local_samples`` fresh
   draws every step),
   vectorised over the chunk. With the globals fixed F separates over points, so this is
   coordinate ascent in the locals and no point is left at its initial value.
3. The final bound. One pass of H draws gives the statistics and q(v) is set to its optimum for them
   (the natural-gradient step of size one with all the data); ``elbo_`` is then F at that q(v) and the
   fitted q(X) and globals, estimated over ALL points with ``eval_samples`` fresh draws per point
   independent of those of the q(v) step: an unbiased Monte-Carlo estimate of a true lower bound of
   the paper's model, with standard error ``elbo_se_`` = sqrt(sum_n var_h(l_nh) / H_eval), l_nh the
   point's expected log-likelihood minus its KL at draw h (a per-point formula, not the psi
   statistics: an independent check of the training's algebra in the tests).

Point latents: the sparse variant (``HyperboloidGPLVM(variant="sparse")``, eq. 5; the sweep's
``hgplvm_sparse``) runs the same three phases with q(x_n) = delta(x_n - mu_n): ``local`` holds the
means alone ({"X"}), the statistics are exact (psi0 = n sigma, Psi1^T Y = K_nm^T Y, Psi2 = K_nm^T K_nm,
``hgplvm.point_statistics``), there are no draws and no KL on X (that variant has no prior on X),
beta stays fixed at the PPCA level its ``noise="auto"`` sets, and the final bound is exact: at
q(v)'s optimum it is the collapsed bound ``hgplvm.sparse_objective`` of the fitted state
(``elbo_se_`` = 0). The training parameters and the choice of training are ``hgplvm._Hyperboloid``'s,
shared by both models.

Memory: q(X) (N x (Q+1) means, N x Q log S), their Adam moments and step counts (about 2.5 times
q(X)) and the centred data; everything else is O(chunk_size H M + M^2), nothing N x M.

:class:`BayesianHyperboloidGPLVM` is the Bayesian hyperboloid GP-LVM's one entry (the sweep's
``hgplvm_bayesian``): ``training="auto"`` fits up to ``FULL_BATCH_MAX_N`` points by the full-batch
loop shared with :class:`~lvmcore.models.hgplvm.HyperboloidGPLVM` (``hgplvm._Hyperboloid``) and above that
on minibatches; ``training_`` says which, and the store's ``minibatch``
output (1 or 0) records it per grid point.
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.utils._param_validation import Interval

from lvmcore import uncollapsed
from lvmcore.kernels.hyperbolic import he_kernel
from lvmcore.linalg import KERNEL_JITTER, NumericalError, cholesky_jax
from lvmcore.manifolds.lorentz import expmap0
from lvmcore.models.hgplvm import (
    FULL_BATCH_MAX_N,
    _Hyperboloid,
    _renorm,
    _rule_windows,
    adam_local,
    kmeans_start,
    mc_statistics,
    new_rows,
    point_statistics,
)
from lvmcore.optim import Lorentz, adam, window_plateau
from lvmcore.precision import jit64, x64
from lvmcore.psi.monte_carlo import log_sinhc, sample_wrapped, wrapped_log_density_origin
from lvmcore.uncollapsed import jitter_tries, kl_qu

__all__ = [
    "BayesianHyperboloidGPLVM",
    "FULL_BATCH_MAX_N",
    "fit_minibatch",
    "transform_minibatch",
    "minibatch_bound",
    "point_terms",
    "kl_qu",
    "optimal_qu",
    "auto_inducing",
]

#: the minibatch fit's default M: the full-batch rule (N / 10 within [64, 256]) would give 256 at
#: every N >= 2,560, and the per-point pass costs H M^2 per point and step
SVI_MAX_INDUCING = 64
_LOG2PI = float(np.log(2.0 * np.pi))


def auto_inducing(n: int) -> int:
    """The minibatch fit's M for ``n_inducing="auto"``: min(N, 64) (``SVI_MAX_INDUCING``)."""
    return int(min(n, SVI_MAX_INDUCING))


# --------------------------------------------------------------------------- the bound
def _kmm(glob, kappa):
    return he_kernel(glob["Z"], glob["Z"], jnp.exp(glob["hyp"][0]), kappa)


def _statistics(local, glob, Y, eps, kappa):
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
    stats, kl = _statistics(local, glob, Y, eps, kappa)
    F = uncollapsed.bound(_kmm(glob, kappa), stats, glob["hyp"][1], qu, N, scale, rel_jitter) - scale * kl
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
    Lm = cholesky_jax(_kmm(glob, kappa), rel_jitter)
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
    return uncollapsed.optimal_qu(_kmm(glob, kappa), stats, glob["hyp"][1], scale, rel_jitter)


@jit64
def _bound_of_statistics(stats, glob, qu, N, kappa, rel_jitter):
    """The uncollapsed bound from the statistics of all N points (point latents: exact, no KL)."""
    return uncollapsed.bound(_kmm(glob, kappa), stats, glob["hyp"][1], qu, N, 1.0, rel_jitter)


# --------------------------------------------------------------------------- steps
@jit64
def _svi_step(local, lmom, glob, gmom, qu, Y, eps, N, scale, kappa, jitter, t, lr, hlr, hmask, upd_S, r_ng):
    """One minibatch step (phase 1): the batch estimate and its gradients, the natural-gradient step
    on q(v) toward the batch's optimum, Riemannian Adam / Adam on the batch's q(x_n) and the globals.
    Returns (local, lmom, glob, gmom, qu, F, finite)."""
    (F, stats), (g_lo, g_gl) = jax.value_and_grad(minibatch_bound, argnums=(0, 1), has_aux=True)(
        local, glob, qu, Y, eps, N, scale, kappa, jitter
    )
    P_t, m_t = uncollapsed.optimal_qu(_kmm(glob, kappa), stats, glob["hyp"][1], scale, jitter)
    qu_new = uncollapsed.natural_step(qu, P_t, m_t, r_ng)
    finite = jnp.isfinite(F) & jnp.all(jnp.isfinite(qu_new["P"])) & jnp.all(jnp.isfinite(qu_new["m"]))
    # the batch's gradient is N / B times the full bound's for its points (Adam: scale-free)
    tl = lmom["t"] + 1.0
    lo, lmo = adam_local(local, {k: g / scale for k, g in g_lo.items()}, lmom, tl, lr, hlr, upd_S)
    lmo["t"] = tl
    Z, mZ, vZ = adam(glob["Z"], g_gl["Z"], gmom["mZ"], gmom["vZ"], t, lr, Lorentz)
    hyp, mh, vh = adam(glob["hyp"], g_gl["hyp"] * hmask, gmom["mh"], gmom["vh"], t, hlr)
    return (
        lo,
        lmo,
        {"Z": Z, "hyp": hyp},
        {"mZ": mZ, "vZ": vZ, "mh": mh, "vh": vh},
        qu_new,
        F,
        finite,
    )


@functools.partial(jit64, static_argnames=("n_steps", "H"))
def _local_pass(local, glob, qu, Y, key, kappa, jitter, lr, hlr, n_steps, H):
    """Phase 2 on one chunk of rows: ``n_steps`` Riemannian Adam (means) / Adam (log S) steps on
    the bound with the globals and q(v) fixed (fresh draws every step, moments from zero; point
    latents, no "log_S" in ``local``: the means alone, no draws)."""
    point = "log_S" not in local
    B, Q = local["X"].shape[0], local["X"].shape[1] - 1

    def grad_local(lo, eps):
        return jax.grad(lambda lo_: minibatch_bound(lo_, glob, qu, Y, eps, 1.0, 1.0, kappa, jitter)[0])(lo)

    def body(i, carry):
        lo, mo = carry
        eps = None if point else jax.random.normal(jax.random.fold_in(key, i), (H, B, Q))
        return adam_local(lo, grad_local(lo, eps), mo, i + 1.0, lr, hlr)

    mom = {"mX": jnp.zeros_like(local["X"]), "vX": jnp.zeros(B)}
    if not point:
        mom.update(mS=jnp.zeros_like(local["log_S"]), vS=jnp.zeros_like(local["log_S"]))
    return jax.lax.fori_loop(0, n_steps, body, (dict(local), mom))[0]


@jit64
def _stats_chunk(local, glob, Y, eps, kappa):
    """(statistics (psi0, Psi1^T Y, Psi2, tr(Y^T Y)), KL of q(X)) of a chunk of rows at draws eps
    (point latents: exact, eps None, KL 0)."""
    return _statistics(local, glob, Y, eps, kappa)


@jit64
def _terms_chunk(local, glob, qu, Y, eps, kappa, jitter):
    """Sum over the chunk's points of mean_h l_nh, and of var_h(l_nh) / H (the MC variance)."""
    lt = point_terms(local, glob, qu, Y, eps, kappa, jitter)
    H = lt.shape[0]
    return jnp.sum(jnp.mean(lt, 0)), jnp.sum(jnp.var(lt, 0, ddof=1) / H)


def _chunks(n, size):
    """Consecutive row slices of at most about ``size`` rows covering n rows."""
    return [slice(r[0], r[-1] + 1) for r in np.array_split(np.arange(n), max(1, -(-n // size)))]


def _rows(X, log_S, sl):
    """q(x) of the rows ``sl``: {"X", "log_S"}, or {"X"} for point latents (log_S None)."""
    return {"X": X[sl]} if log_S is None else {"X": X[sl], "log_S": log_S[sl]}


def _chunk_sums(fn, X, log_S, Y, key, H, size):
    """The sum over chunks of about ``size`` rows (:func:`_chunks`) of fn(q(x) of the rows, their
    data, H standard normal draws per row (the i-th chunk's from fold_in(key, i); None for point
    latents, log_S None))."""
    total = None
    for i, sl in enumerate(_chunks(X.shape[0], size)):
        eps = None
        if log_S is not None:
            eps = jax.random.normal(jax.random.fold_in(key, i), (H, sl.stop - sl.start, log_S.shape[1]))
        s = fn(_rows(X, log_S, sl), Y[sl], eps)
        total = s if total is None else jax.tree_util.tree_map(jnp.add, total, s)
    return total


def _full_bound(X, log_S, glob, Y, key, H, kappa, jitter, size):
    """(the bound, q(v)) of q(X) (means X, log variances log_S; point latents: log_S None) with
    data Y, in one pass over all rows: the statistics and KL(q(X) || p(X)) summed over chunks of
    about ``size`` rows (:func:`_chunk_sums`: H draws per row from ``key``; point latents exact),
    q(v) at its optimum for them, and the uncollapsed bound there less the KL, i.e. the collapsed
    bound of this state (eq. 5; Bayesian: eq. 6 at these draws, ``hgplvm.bayesian_objective``).
    The same ``key`` gives the same draws: with it fixed, the value is a deterministic function
    of the state."""
    fn = lambda lo, y, e: _stats_chunk(lo, glob, y, e, kappa)
    stats, kl = _chunk_sums(fn, X, log_S, Y, key, H, size)
    qu = optimal_qu(stats, glob, kappa, 1.0, jitter)
    F = float(_bound_of_statistics(stats, glob, qu, float(X.shape[0]), kappa, jitter)) - float(kl)
    return F, qu


# --------------------------------------------------------------------------- the minibatch fit
def _minibatch_start(model, Yc, rng):
    """Initial means (the full-batch fit's :func:`~lvmcore.models.hgplvm.tangent_start`) and Z
    (k-means centres of at most 20,000 of them)."""
    n = Yc.shape[0]
    P = model._init_tangent(Yc, rng)
    m = auto_inducing(n) if model.n_inducing == "auto" else int(model.n_inducing)
    sub = P if n <= 20000 else P[rng.choice(n, 20000, replace=False)]
    if m >= sub.shape[0]:
        return P, sub[:m] + 1e-6 * rng.standard_normal(sub[:m].shape)
    return P, kmeans_start(sub, m, rng)


@x64
def fit_minibatch(model, Y):
    """The three phases of the module docstring on Y (N, D), for a hyperboloid GP-LVM ``model``
    (``hgplvm._Hyperboloid``, whose ``fit`` checked its settings): its ``variant`` "bayesian"
    (wrapped-Gaussian q(x_n)) or "sparse" (point latents: exact statistics, no draws, no KL, the
    final bound exact); sets the model's fitted attributes."""
    n, d = Y.shape
    q = int(model.n_components)
    point = model.variant == "sparse"
    H = 1 if point else int(model.n_samples)
    warm = 0 if point else int(model.fix_variance_iter)
    kappa = float(model.kappa)
    rng = np.random.default_rng(model.random_state)
    key = jax.random.PRNGKey(int(rng.integers(2**31)))
    mean = Y.mean(0)
    Yc = Y - mean
    P, C = _minibatch_start(model, Yc, rng)
    hyp0, hmask = model._hyper_start(Yc)
    X = np.array(expmap0(jnp.asarray(P)))
    del P
    log_S = None if point else np.full((n, q), np.log(1e-2 * float(model._setting("init_scale")) ** 2))
    glob = {"Z": expmap0(jnp.asarray(C)), "hyp": hyp0}
    M = int(glob["Z"].shape[0])
    gmom = {"mZ": jnp.zeros_like(glob["Z"]), "vZ": jnp.zeros(M), "mh": jnp.zeros(3), "vh": jnp.zeros(3)}
    lmom = {"mX": np.zeros_like(X), "vX": np.zeros(n), "t": np.zeros(n)}
    if not point:
        lmom.update(mS=np.zeros_like(log_S), vS=np.zeros_like(log_S))
    qu = {"m": jnp.zeros((M, d)), "P": jnp.eye(M)}
    lr, hlr = float(model.learning_rate), float(model.hyper_learning_rate)
    B = int(model.batch_size)
    nb = max(1, n // B)  # batches per epoch, each of B or B + 1 points (at most two compiled shapes)
    jitter, trace, converged = KERNEL_JITTER, [], False
    size = int(model.chunk_size)
    # the plateau rule, on the bound of one pass over all points (:func:`_full_bound`, q(v) at its
    # optimum) after every window of whole epochs of at least 50 steps, with the full-batch fit's
    # patience (sparse 6 windows, Bayesian 2; the Bayesian rule starts after the warm-up). On the
    # batch estimates, their noise (which points, q(v) after each batch's step, fresh draws) hid
    # the progress: 50-step windows stopped the 620-point tree at 651 steps with point latents
    # (Pearson 0.84, where 6,000 steps reach the full-batch fit's 0.93: bench/README.md, "hGP-LVM
    # sparse at scale"), and the Bayesian fit below the full-batch fit's bound ("hGP-LVM
    # minibatch"). Point latents: the exact bound. Bayesian: eq. 6 at one draw per point, the
    # same at every window (``key_rule``; the training's draws are fresh, so the state does not
    # adapt to them), so that successive values differ by the fit's progress, not by fresh
    # Monte-Carlo noise. One pass costs O(N M^2) as the sparse fit's (forward only); with the H
    # draws of a step it cost H times that: at N = 10^5 (B = 1000, H = 5, M = 64) 3.6 CPU s against
    # 8.1 for the window's 100 steps, +37% CPU over a 3,000-step fit; on the depth-5 tree one and
    # five draws stopped the fits as well (bench/README.md, "hGP-LVM minibatch"). No pass with
    # tol = 0, nor where the budget ends before the rule could first stop the fit (start + 2 pat
    # windows: 5,000 steps at 10^6 points and B = 1000)
    window = nb * -(-_rule_windows("bayesian", 0)[0] // nb)
    pat = _rule_windows(model.variant, 0)[1]
    start = -(-warm // window)  # windows before the rule may stop the fit
    rule = model.tol > 0 and (start + 2 * pat) * window <= int(model.max_iter)
    key_rule = jax.random.fold_in(key, 2**30 + 3)
    bounds = []  # the bound after each window
    batches = iter(())
    step = 0
    for step in range(1, int(model.max_iter) + 1):
        rows = next(batches, None)
        if rows is None:
            batches = iter(np.sort(b) for b in np.array_split(rng.permutation(n), nb))
            rows = next(batches)
        eps = None if point else jax.random.normal(jax.random.fold_in(key, step), (H, len(rows), q))
        lb = _rows(X, log_S, rows)
        lm = {k: v[rows] for k, v in lmom.items()}
        r_ng = 1.0 if step == 1 else float(model.ng_step)
        what = f"the minibatch bound or q(u) step is not finite at step {step}"
        for j in jitter_tries(jitter, what, "; lower learning_rate"):
            out = _svi_step(
                lb, lm, glob, gmom, qu, Yc[rows], eps, float(n), n / len(rows), kappa, j, float(step),
                lr, hlr, hmask, step > warm, r_ng,
            )  # fmt: skip
            if bool(out[-1]):
                jitter = j
                break
        lb, lm, glob, gmom, qu, F, _ = out
        X[rows] = np.asarray(lb["X"])
        if not point:
            log_S[rows] = np.asarray(lb["log_S"])
        for k in lmom:
            lmom[k][rows] = np.asarray(lm[k])
        trace.append(float(F))
        if rule and step % window == 0:
            bounds.append(_full_bound(X, log_S, glob, Yc, key_rule, 1, kappa, jitter, size)[0])
            converged = window_plateau(bounds, 1, pat, model.tol, n * d, start)
            if converged:
                break
    del lmom
    # phase 2: every point's q(x_n) with the globals and q(v) fixed, chunk by chunk
    if int(model.local_iter) > 0:
        key_local = jax.random.fold_in(key, 2**30)
        _local_passes(model, X, log_S, glob, qu, Yc, key_local, jitter, int(model.local_iter))
    # phase 3: q(v) at its optimum for one pass of (draws of) the statistics, then the bound
    F, qu = _full_bound(X, log_S, glob, Yc, jax.random.fold_in(key, 2**30 + 1), H, kappa, jitter, size)
    model.qu_, se = qu, 0.0  # point latents: exact statistics, F the collapsed bound (eq. 5)
    if not point:  # the bound with fresh draws (the sum over points of mean_h l_nh, less
        # KL(q(v))) and its standard error
        terms_fn = lambda lo, y, e: _terms_chunk(lo, glob, qu, y, e, kappa, jitter)
        key_eval, H_eval = jax.random.fold_in(key, 2**30 + 2), int(model.eval_samples)
        s, v = _chunk_sums(terms_fn, X, log_S, Yc, key_eval, H_eval, max(1, size // 2))
        F, se = float(s) - float(kl_qu(qu)), float(np.sqrt(float(v)))
    if not np.isfinite(F):
        raise NumericalError(f"the final bound is not finite ({F}); lower learning_rate", name="K_mm")
    model.elbo_se_ = se
    model.n_steps_ = step
    model.window_bounds_ = np.asarray(bounds)
    model.extra_jitter_ = jitter
    model.n_inducing_ = M
    S = None if point else np.exp(log_S)
    model._set_fitted(X, glob["hyp"], S, glob["Z"], hmask, Yc, mean, [*trace, F], converged)
    model.glob_ = {k: np.asarray(v) for k, v in glob.items()}


def _local_passes(model, X, log_S, glob, qu, Y, key, jitter, n_steps):
    """The per-point pass (phase 2) on the rows X, log_S (updated in place; None: point latents)
    with data Y, chunk by chunk, with the globals and q(v) fixed."""
    H = 1 if log_S is None else int(model.local_samples)
    for i, sl in enumerate(_chunks(X.shape[0], int(model.chunk_size))):
        lo = _local_pass(
            _rows(X, log_S, sl), glob, qu, Y[sl], jax.random.fold_in(key, i),
            float(model.kappa), jitter, float(model.learning_rate), float(model.hyper_learning_rate),
            n_steps=n_steps, H=H,
        )  # fmt: skip
        X[sl] = np.asarray(lo["X"])
        if log_S is not None:
            log_S[sl] = np.asarray(lo["log_S"])


@x64
def transform_minibatch(model, Y_new, max_iter=None):
    """Latent positions (n_new, Q+1) on the hyperboloid (means) of new rows after a minibatch fit:
    q(x) of each started at the fitted mean of its nearest training row (in data space) and fitted
    by the per-point pass with everything else fixed (``max_iter`` steps, default ``local_iter`` or
    50)."""
    Yn, idx = new_rows(model, Y_new)
    X = model.lorentz_embedding_[idx].copy()
    log_S = None if model.embedding_var_ is None else np.log(model.embedding_var_[idx])
    steps = int(max_iter) if max_iter is not None else (int(model.local_iter) or 50)
    glob = {k: jnp.asarray(v) for k, v in model.glob_.items()}
    qu = {k: jnp.asarray(v) for k, v in model.qu_.items()}
    key = jax.random.PRNGKey(int(np.random.default_rng(model.random_state).integers(2**31)) + 1)
    _local_passes(model, X, log_S, glob, qu, Yn, key, model.extra_jitter_, steps)
    return np.asarray(_renorm(jnp.asarray(X)))


# --------------------------------------------------------------------------- the model's one entry
@dataclass(kw_only=True, eq=False, repr=False)
class BayesianHyperboloidGPLVM(_Hyperboloid):
    """The Bayesian hyperboloid GP-LVM (paper 002, eq. 6): the one entry of this model (the sweep's
    ``hgplvm_bayesian``) and its one set of defaults, fitted full-batch or on minibatches by N.

    ``training``: "auto" (default) fits N <= ``FULL_BATCH_MAX_N`` points full-batch (the
    collapsed bound, every point every step: the loop it shares with ``HyperboloidGPLVM``
    with the Bayesian bound, run on this object) and larger N on minibatches (the three phases of
    the module docstring); "full" and "minibatch" force one. ``training_`` ("full" / "minibatch")
    and ``minibatch_`` (0.0 / 1.0, stored by the sweep) say which ran. Shared parameters mean the
    same in both: ``max_iter`` optimiser steps (minibatch: of batches), ``tol`` the plateau rule,
    the learning rates (Riemannian Adam on the means and Z, Adam on log sigma, log beta, log s^2
    and log S), H = ``n_samples`` draws per point and step, init, noise, prior.
    ``n_inducing="auto"`` is each training's own rule (full: N / 10 within [64, 256]; minibatch:
    min(N, 64)). The minibatch fit's own: ``batch_size`` B; ``local_iter`` steps of the per-point
    pass; ``ng_step`` the natural-gradient step on q(u); ``local_samples`` draws per point and step
    of that pass (1: the reparameterisation gradient of one draw, as in SVI generally);
    ``eval_samples`` draws per point for ``elbo_``; ``chunk_size`` rows per vectorised chunk of the
    per-point and final passes. ``chunks`` and ``optimizer`` are the full-batch fit's, and refused
    (before any work) when minibatch training is chosen with a non-default value.
    The training parameters and the choice are ``hgplvm._Hyperboloid``'s, shared with the sparse
    variant of ``HyperboloidGPLVM`` (whose minibatch fit is the same three phases with point latents);
    ``local_samples`` and ``eval_samples`` are this model's alone (the sparse one has no draws).

    Attributes after a minibatch fit, beside the full-batch fit's: ``elbo_`` is an unbiased MC
    estimate of the bound at the final state over all points (q(u) at its optimum) and
    ``elbo_se_`` its standard error; ``elbo_trace_`` the batch estimates of the steps, then
    ``elbo_``; ``window_bounds_`` the full-pass bounds the plateau rule read (one per window of
    whole epochs; none with tol = 0 or where the budget ends before the rule could stop the fit);
    ``n_iter_`` (steps + 1), ``n_steps_``, ``qu_``, ``n_inducing_``, ``extra_jitter_``.

    ``max_iter`` = 3000: every full-batch fit behind the recorded tree and myeloid scores
    (bench/README.md, "hGP-LVM quality", Bayesian variant) stopped by the plateau rule, after at
    most 2,400 iterations, so the budget does not bind there; at N = 10^5 the minibatch fit runs
    to it (bench/README.md, "hGP-LVM minibatch")."""

    variant = "bayesian"  # the shared loop runs eq. 6; not a parameter of this model
    mean = "auto"  # the centred data (eq. 6 as written)
    drift_every = "auto"  # no drift line search (a Monte-Carlo bound is too noisy for trial moves)

    max_iter: int = 3000
    init_scale: float = 1.0
    local_samples: int = 1
    eval_samples: int = 10

    _parameter_constraints = {
        **_Hyperboloid._parameter_constraints,
        "local_samples": [Interval(numbers.Integral, 1, None, closed="left")],
        "eval_samples": [Interval(numbers.Integral, 2, None, closed="left")],
    }
