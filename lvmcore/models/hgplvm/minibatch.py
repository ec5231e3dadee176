"""Minibatch (stochastic variational) training of the Bayesian hyperboloid GP-LVM (paper 002,
eq. 6) and of the sparse one (eq. 5, point latents: below), so one step costs O(B H M^2) whatever N
is; the estimators (:mod:`.estimators`) pick it above ``FULL_BATCH_MAX_N`` points.

Model. As the full-batch fit's (:mod:`.full`, variant "bayesian"): latent points on the Lorentz
model L^Q, q(x_n) = N^w(mu_n, diag S_n) (wrapped normal), prior N^w(mu0, s^2 I), HE kernel
k = sigma exp(-d_L / kappa) with M inducing inputs Z on L^Q. The inducing outputs keep an explicit
whitened q(u) (u = L_m v, K_mm = L_m L_m^T, q(v) = N(m, S_v) shared by the D columns) instead of
being collapsed, so the bound is the uncollapsed one of ``lvmcore.uncollapsed`` (Hensman et
al. 2013) with paper 002's Monte-Carlo psi statistics (eqs. 15-20, ``lvmcore.psi``;
:func:`~lvmcore.models.hgplvm.objectives.minibatch_bound`):

    F = sum_n E_q(x_n)[E_q(f_n) log p(y_n | f_n)] - KL(q(v) || N(0, I)) - sum_n KL(q(x_n) || p(x_n)).

The first term is linear in (psi0, Psi1^T Y, Psi2) summed over the points, so with H reparameterised
draws per point (``sample_wrapped``) and a batch of B points scaled by N / B it is an unbiased
estimate of F (the collapsed bound, a nonlinear function of the statistics, has no unbiased MC
estimate). At q(v)'s optimum for given statistics the uncollapsed bound equals the collapsed bound of
``objectives.bayesian_objective`` with the same statistics (tests/test_hgplvm_svi.py checks both
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
``objectives.point_statistics``), there are no draws and no KL on X (that variant has no prior on X),
beta stays fixed at the PPCA level its ``noise="auto"`` sets, and the final bound is exact: at
q(v)'s optimum it is the collapsed bound ``objectives.sparse_objective`` of the fitted state
(``elbo_se_`` = 0). The training parameters and the choice of training are the estimators'
(:mod:`.estimators`), shared by both models.

Memory: q(X) (N x (Q+1) means, N x Q log S), their Adam moments and step counts (about 2.5 times
q(X)) and the centred data; everything else is O(chunk_size H M + M^2), nothing N x M.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lvmcore import uncollapsed
from lvmcore.linalg import KERNEL_JITTER, NumericalError
from lvmcore.manifolds.lorentz import expmap0
from lvmcore.models.hgplvm.objectives import (
    bound_of_statistics,
    kmm,
    minibatch_bound,
    optimal_qu,
    point_terms,
    row_statistics,
)
from lvmcore.models.hgplvm.training import (
    Trained,
    adam_local,
    hyper_start,
    kmeans_start,
    rule_windows,
)
from lvmcore.optim import Lorentz, adam, window_plateau
from lvmcore.precision import jit64, x64
from lvmcore.uncollapsed import jitter_tries, kl_qu

__all__ = ["SVI_MAX_INDUCING", "auto_inducing", "fit_minibatch", "posterior_u"]


#: the minibatch fit's default M: the full-batch rule (N / 10 within [64, 256]) would give 256 at
#: every N >= 2,560, and the per-point pass costs H M^2 per point and step
SVI_MAX_INDUCING = 64


def auto_inducing(n: int) -> int:
    """The minibatch fit's M for ``n_inducing="auto"``: min(N, 64) (``SVI_MAX_INDUCING``)."""
    return int(min(n, SVI_MAX_INDUCING))


# --------------------------------------------------------------------------- steps
@jit64
def _svi_step(local, lmom, glob, gmom, qu, Y, eps, N, scale, kappa, jitter, t, lr, hlr, hmask, upd_S, r_ng):
    """One minibatch step (phase 1): the batch estimate and its gradients, the natural-gradient step
    on q(v) toward the batch's optimum, Riemannian Adam / Adam on the batch's q(x_n) and the globals.
    Returns (local, lmom, glob, gmom, qu, F, finite)."""
    (F, stats), (g_lo, g_gl) = jax.value_and_grad(minibatch_bound, argnums=(0, 1), has_aux=True)(
        local, glob, qu, Y, eps, N, scale, kappa, jitter
    )
    P_t, m_t = uncollapsed.optimal_qu(kmm(glob, kappa), stats, glob["hyp"][1], scale, jitter)
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
    return row_statistics(local, glob, Y, eps, kappa)


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
    bound of this state (eq. 5; Bayesian: eq. 6 at these draws, ``objectives.bayesian_objective``).
    The same ``key`` gives the same draws: with it fixed, the value is a deterministic function
    of the state."""
    fn = lambda lo, y, e: _stats_chunk(lo, glob, y, e, kappa)
    stats, kl = _chunk_sums(fn, X, log_S, Y, key, H, size)
    qu = optimal_qu(stats, glob, kappa, 1.0, jitter)
    F = float(bound_of_statistics(stats, glob, qu, float(X.shape[0]), kappa, jitter)) - float(kl)
    return F, qu


def posterior_u(X, log_S, glob, Y, key, H, kappa, jitter, size):
    """q(v) (whitened, {"m", "P"}) at its optimum for the statistics of q(X) (means X, log
    variances log_S; point latents: None) with data Y, in one pass over all rows (H draws per row
    from ``key``): what new points are placed and scored against (:mod:`.newpoints`) after a
    full-batch fit, as phase 3 sets it after a minibatch one."""
    return _full_bound(X, log_S, glob, Y, key, H, kappa, jitter, size)[1]


# --------------------------------------------------------------------------- the minibatch fit
def _minibatch_start(model, Yc, rng):
    """Initial means (the model's start, :func:`~lvmcore.models.hgplvm.training.tangent_start`) and Z
    (k-means centres of at most 20,000 of them)."""
    n = Yc.shape[0]
    P = model.init_tangent(Yc, rng)
    m = auto_inducing(n) if model.n_inducing == "auto" else int(model.n_inducing)
    sub = P if n <= 20000 else P[rng.choice(n, 20000, replace=False)]
    if m >= sub.shape[0]:
        return P, sub[:m] + 1e-6 * rng.standard_normal(sub[:m].shape)
    return P, kmeans_start(sub, m, rng)


@x64
def fit_minibatch(model, Y):
    """The three phases of the module docstring on Y (N, D), for a hyperboloid GP-LVM ``model``
    (:class:`~lvmcore.models.hgplvm.estimators.BaseHyperboloidGPLVM`, whose ``fit`` checked its
    settings): its ``variant`` "bayesian" (wrapped-Gaussian q(x_n)) or "sparse" (point latents:
    exact statistics, no draws, no KL, the final bound exact). Returns the fitted state
    (:class:`~lvmcore.models.hgplvm.training.Trained`)."""
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
    hyp0, hmask = hyper_start(Yc, int(model.n_components), model.setting("noise"), model.prior_scale)
    X = np.array(expmap0(jnp.asarray(P)))
    del P
    log_S = None if point else np.full((n, q), np.log(1e-2 * float(model.setting("init_scale")) ** 2))
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
    window = nb * -(-rule_windows("bayesian", 0)[0] // nb)
    pat = rule_windows(model.variant, 0)[1]
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
    se = 0.0  # point latents: exact statistics, F the collapsed bound (eq. 5)
    if not point:  # the bound with fresh draws (the sum over points of mean_h l_nh, less
        # KL(q(v))) and its standard error
        terms_fn = lambda lo, y, e: _terms_chunk(lo, glob, qu, y, e, kappa, jitter)
        key_eval, H_eval = jax.random.fold_in(key, 2**30 + 2), int(model.eval_samples)
        s, v = _chunk_sums(terms_fn, X, log_S, Yc, key_eval, H_eval, max(1, size // 2))
        F, se = float(s) - float(kl_qu(qu)), float(np.sqrt(float(v)))
    if not np.isfinite(F):
        raise NumericalError(f"the final bound is not finite ({F}); lower learning_rate", name="K_mm")
    S = None if point else np.exp(log_S)
    attrs = {
        "qu_": qu,
        "elbo_se_": se,
        "n_steps_": step,
        "window_bounds_": np.asarray(bounds),
        "extra_jitter_": jitter,
        "n_inducing_": M,
        "glob_": {k: np.asarray(v) for k, v in glob.items()},
    }
    trace = [*trace, F]
    return Trained(X, glob["hyp"], S, glob["Z"], hmask, Yc, mean, trace, converged, attrs, np.asarray(key))


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
