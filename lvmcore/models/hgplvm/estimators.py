"""Hyperboloid GP-LVM (paper 002): GP-LVM, sparse and Bayesian GP-LVM with latent points on the
Lorentz model L^Q and the hyperboloid exponential (HE) kernel k(x, x') = sigma exp(-d_L(x, x') / kappa)
(eq. 10, :class:`lvmcore.kernels.hyperbolic.HyperboloidExponential`).

Objectives (section 2.1, eqs. 4-6), maximised:

* ``point``:    exact log marginal likelihood  sum_d log N(y_d | 0, K + beta^-1 I)  (eq. 4, its
                one home :mod:`lvmcore.models.hgplvm_point`: the value, and the hand-written
                gradient the fit's step uses with K^-1 from one LAPACK Cholesky and inverse);
                beta is by default fixed at the Q-dimensional PPCA noise level (``noise``).
* ``sparse``:   collapsed Titsias bound (eq. 5) with M inducing inputs Z on the hyperboloid.
* ``bayesian``: collapsed Bayesian GP-LVM bound (eq. 6) with wrapped Gaussians q(x_i) = N^w(mu_i, S_i),
                prior N^w(mu0, I), Monte-Carlo psi statistics and KL (eqs. 13-20,
                :mod:`lvmcore.psi.monte_carlo`), a fresh sample of H draws per point every step, and
                a learned noise. Its estimator (the one entry, with its defaults) is
                :class:`lvmcore.models.hgplvm_svi.BayesianHyperboloidGPLVM`, whose full-batch fit is
                this module's loop.

The data's mean (a departure from eq. 4, whose GP has mean zero). ``mean="integrated"`` (the
point variant's default) integrates a constant mean per column out under a flat prior (the
restricted likelihood): eq. 4 with y^T K^-1 y - (1^T K^-1 y)^2 / (1^T K^-1 1) in the quadratic term
and -D/2 log(1^T K^-1 1 / 2 pi) added; K^-1 is replaced by P = K^-1 - K^-1 1 1^T K^-1 / (1^T K^-1 1)
in the gradients. It is unchanged by a shift of Y and by a constant added to the kernel. Why:
the HE kernel with kappa = 100 is nearly sigma (1 - d / kappa) over the layout, a large constant
part along the ones vector; with centred data and eq. 4 as written (``mean="zero"``) log|K| keeps
rewarding a smaller sigma paid for by spreading the points, and the fit creeps.

Inducing inputs (a departure from the paper, section 3.2, which copies an active set of latent
points re-drawn every few epochs, without gradient): Z starts at the k-means centres of the
initial latent points (tangent space at the origin, mapped by expmap0) and is learned with the
latent points by Riemannian steps; by default M grows with N (``n_inducing="auto"``).

Latent points (or means) are updated by Riemannian Adam (Algorithm 1 with Becigneul and Ganea's
Adam, :func:`lvmcore.optim.adam` on :class:`~lvmcore.optim.Lorentz`): the Euclidean (ambient)
gradient with its time coordinate negated and projected to the tangent space, a step by the
exponential map, first moments carried by parallel transport. kappa is fixed; log sigma, log beta
(and log S) are updated by the same Adam on the trivial manifold (:class:`~lvmcore.optim.Euclidean`).
``optimizer="rsgd"`` steps by the gradient of objective / (N D), so the learning rate does not
depend on the data size.

The drift line search (point variant, ``drift_every``). With kappa = 100, growing every distance
by a factor and shrinking sigma by it leaves eq. 4 almost unchanged: a long ridge along which the
objective still rises slowly and which Adam follows slowly. Every ``drift_every`` iterations the
tangent coordinates at the origin of the points and log sigma are averaged over the stretch; each
point is moved by a = 1, 2, 4, ... times the change of its average since the previous stretch
(parallel-transported to the point), keeping the largest a while the objective rises, nothing if
a = 1 lowers it. The convergence rule's recent windows then span a whole cycle, so a fit stops
only when a search found no uphill move and the steps after it made no progress. Not for the
sparse variant (inducing inputs no point uses would be carried outward without bound) nor the
Bayesian one (a Monte-Carlo bound is too noisy to compare trial moves).

Noise of the point and sparse variants. A learned beta keeps growing on data with within-cluster
jitter (the points spread to interpolate it, and the hierarchy's distances degrade); the authors'
code stops such runs early, an implicit noise level. Here the level is explicit: the
maximum-likelihood noise of Q-dimensional probabilistic PCA (:func:`lvmcore.pca.ppca_noise_variance`),
i.e. of the GP-LVM with a linear kernel (Lawrence 2005), which the point variant extends;
``noise="learn"`` restores the free beta. The Bayesian variant learns its noise (eq. 6 as written:
its posterior variances S take up the jitter).

Measurements behind these choices: bench/README.md ("hGP-LVM quality") and bench/HISTORY.md.
"""

from __future__ import annotations

import functools
import numbers
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from lvmcore import collapsed, linalg
from lvmcore.checks import check_data
from lvmcore.chunks import JitStats, RowChunks
from lvmcore.graph import knn_query
from lvmcore.kernels import HyperboloidExponential
from lvmcore.kernels.hyperbolic import he_kernel
from lvmcore.manifolds.lorentz import egrad2rgrad, expmap, expmap0, logmap, logmap0, proj, to_poincare, transp
from lvmcore.models._base import LatentModel
from lvmcore.models.hgplvm_point import (
    chol_inverse_lower,
    point_grads,
    point_kernel,
    point_objective,
    reml_projection,
    symmetrize_lower,
)
from lvmcore.optim import Lorentz, adam, window_plateau
from lvmcore.pca import pca_start, ppca_noise_variance
from lvmcore.precision import jit64, x64
from lvmcore.psi import psi_statistics

__all__ = [
    "HyperboloidGPLVM",
    "lift",
    "point_objective",
    "sparse_objective",
    "point_statistics",
    "bayesian_objective",
]

#: ``training="auto"`` (sparse and Bayesian variants): the full-batch fit up to this many points,
#: the minibatch fit (``lvmcore.models.hgplvm_svi``) above (bench/README.md, "hGP-LVM Bayesian at
#: scale": the crossover measurement)
FULL_BATCH_MAX_N = 5000
#: settings of the full-batch fit alone, refused (before any work) when minibatch training is chosen
_FULL_ONLY = {"chunks": None, "optimizer": "radam"}
_PATIENCE = 6  # windows without progress before the convergence rule stops a fit (point, sparse)
_PATIENCE_BAYES = 2  # the Bayesian fit's (a longer wait lowered its score, see HyperboloidGPLVM)
_POINT_INIT_SCALE = 0.2  # the point variant's PCA start: max tangent radius (init_scale="auto")
#: the value each "auto" setting takes, per variant
_AUTO = {
    "noise": {"point": "ppca", "sparse": "ppca", "bayesian": "learn"},
    "mean": {"point": "integrated", "sparse": "zero", "bayesian": "zero"},
    "drift_every": {"point": 250, "sparse": 0, "bayesian": 0},
    "init_scale": {"point": _POINT_INIT_SCALE, "sparse": 1.0, "bayesian": 1.0},
}


@x64
def lift(Xs):
    """Spatial coordinates (..., Q) -> hyperboloid points (..., Q+1) with x0 = sqrt(1 + |x~|^2)."""
    Xs = jnp.asarray(Xs, dtype=jnp.float64)
    x0 = jnp.sqrt(1.0 + jnp.sum(Xs * Xs, axis=-1, keepdims=True))
    return jnp.concatenate([x0, Xs], axis=-1)


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
    (eq. 5) and its minibatch form (``hgplvm_svi``) take them from here."""
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


def _renorm(X):
    """Re-snap points onto the manifold (x0 recomputed from the spatial part) against rounding drift."""
    return lift(X[..., 1:])


def _objective(variant, X, hyp, log_S, Z, eps, Y, kappa):
    """The sparse (eq. 5) or Bayesian (eq. 6) bound; the point variant's step and transform have
    their own (eq. 4)."""
    if variant == "sparse":
        return sparse_objective(X, Z, hyp[0], hyp[1], Y, kappa)
    return bayesian_objective(X, log_S, Z, hyp[0], hyp[1], Y, kappa, eps, hyp[2])


def adam_log_S(log_S, g, m, v, t, lr, upd_S=True):
    """One Adam step (:func:`lvmcore.optim.adam`) on the log variances of q(x), clipped to [-20, 5];
    they and their moments are held while ``upd_S`` is False (the warm-up). Returns (log_S, m, v)."""
    new, m_new, v_new = adam(log_S, g, m, v, t, lr)
    keep = functools.partial(jnp.where, upd_S)
    return keep(jnp.clip(new, -20.0, 5.0), log_S), keep(m_new, m), keep(v_new, v)


def adam_local(lo, g, mo, t, lr, lr_S, upd_S=True):
    """The step of rows of q(X) with gradients g: Riemannian Adam (step ``lr``) on the means lo["X"]
    on the hyperboloid and, where q(x) has them (not point latents), :func:`adam_log_S` (step
    ``lr_S``) on lo["log_S"]; moments mo = {"mX", "vX"(, "mS", "vS")}, t the step count (a number,
    or one per row). The minibatch fit's steps, its per-point pass and ``transform`` take it.
    Returns (lo, mo) after the step."""
    X, mX, vX = adam(lo["X"], g["X"], mo["mX"], mo["vX"], t, lr, Lorentz)
    if "log_S" not in lo:
        return {"X": X}, {"mX": mX, "vX": vX}
    t_S = t[:, None] if jnp.ndim(t) else t
    log_S, mS, vS = adam_log_S(lo["log_S"], g["log_S"], mo["mS"], mo["vS"], t_S, lr_S, upd_S)
    return {"X": X, "log_S": log_S}, {"mX": mX, "vX": vX, "mS": mS, "vS": vS}


def _apply_updates(state, grads, t, upd_S, lr, hlr, scale, variant, use_radam):
    """Riemannian steps for the latent points (means) and inducing inputs, Adam for the
    hyperparameters (and log S, once ``upd_S``).  ``state`` and ``grads`` are dicts keyed
    "X", "hyp", "log_S", "Z" (moments under "m*" / "v*")."""
    s = dict(state)
    for k in ("X", "Z") if variant != "point" else ("X",):
        if use_radam:
            s[k], s["m" + k], s["v" + k] = adam(s[k], grads[k], s["m" + k], s["v" + k], t, lr, Lorentz)
        else:
            s[k] = _renorm(expmap(s[k], lr * egrad2rgrad(s[k], grads[k] / scale)))  # RSGD, Algorithm 1
    s["hyp"], s["mh"], s["vh"] = adam(s["hyp"], grads["hyp"], s["mh"], s["vh"], t, hlr)
    if variant == "bayesian":
        s["log_S"], s["mS"], s["vS"] = adam_log_S(s["log_S"], grads["log_S"], s["mS"], s["vS"], t, hlr, upd_S)
    return s


_apply_updates_jit = jax.jit(_apply_updates, static_argnames=("variant", "use_radam"))


@functools.partial(jax.jit, static_argnames=("variant", "use_radam"))
def _fit_step(state, t, eps, upd_S, Y, kappa, lr, hlr, scale, hmask, variant, use_radam):
    """One step of the sparse or Bayesian variant (compiled once per variant/optimizer/shape,
    shared by all instances): objective and gradients by autodiff, then the updates.  ``hmask``
    (3,) zeroes the gradient of a fixed hyperparameter (log sigma, log beta, log prior variance).
    """
    obj = functools.partial(_objective, variant, eps=eps, Y=Y, kappa=kappa)
    args = (state["X"], state["hyp"], state["log_S"], state["Z"])
    f, g = jax.value_and_grad(obj, argnums=(0, 1, 2, 3))(*args)
    grads = {"X": g[0], "hyp": g[1] * hmask, "log_S": g[2], "Z": g[3]}
    return _apply_updates(state, grads, t, upd_S, lr, hlr, scale, variant, use_radam), f


_point_kernel_jit = jax.jit(point_kernel)


@functools.partial(jax.jit, static_argnames=("use_radam",))
def _point_step(state, E, dE, Ki_lower, logdet, t, Y, lr, hlr, scale, hmask, use_radam):
    """The point variant's step after :func:`~lvmcore.models.hgplvm_point.chol_inverse_lower`
    (K^-1's lower triangle): gradients by :func:`point_grads`, then the Riemannian / Adam updates."""
    Ki = symmetrize_lower(Ki_lower)
    f, gX, g_ls, g_lb = point_grads(state["X"], state["hyp"][0], state["hyp"][1], Y, E, dE, Ki, logdet)
    grads = {"X": gX, "hyp": jnp.stack([g_ls, g_lb, jnp.zeros_like(g_ls)]) * hmask}
    return _apply_updates(state, grads, t, False, lr, hlr, scale, "point", use_radam), f


_tangent0 = jax.jit(logmap0)


@jax.jit
def _drift_move(X, A_now, A_prev, a):
    """Each point moved by a times its averaged drift (tangent at the origin: average now minus
    average a stretch earlier, mapped from the average's tangent space to the point's)."""
    P_now, P_prev = expmap0(A_now), expmap0(A_prev)
    v = -logmap(P_now, P_prev)
    v = proj(X, transp(P_now, X, v))
    return _renorm(expmap(X, a * v))


_point_objective_jit = jit64(point_objective, static_argnames=("restricted",))


def _snapshot(state):
    """The observable part of a fit's state, as NumPy copies (for ``fit(callback=...)``)."""
    return {k: None if state.get(k) is None else np.asarray(state[k]) for k in ("X", "hyp", "log_S", "Z")}


def _rule_windows(variant, drift):
    """(window, patience) of the convergence rule: iterations per window mean, and how many recent
    windows must show progress.  With the drift line search every ``drift`` iterations the recent
    windows span a whole cycle (a search and the steps after it), so that the gain of an accepted
    move counts as progress and a stop needs a rejected move as well as a plateau of the steps."""
    if variant == "bayesian":
        return 50, _PATIENCE_BAYES
    return 25, max(_PATIENCE, -(-drift // 25) + 1) if drift else _PATIENCE


def _drift_search(state, avg, prev, Y, kappa, restricted):
    """a = 1, 2, 4, ... times the averaged drift of the points (and of log sigma) from the
    current state while eq. (4) rises; returns (state, a or 0)."""
    lb = state["hyp"][1]
    f0 = float(_point_objective_jit(state["X"], state["hyp"][0], lb, Y, kappa, restricted=restricted))
    best, a = None, 1.0
    while a <= 64:
        X = _drift_move(state["X"], avg["X"], prev["X"], a)
        ls = state["hyp"][0] + a * (avg["ls"] - prev["ls"])
        f = float(_point_objective_jit(X, ls, lb, Y, kappa, restricted=restricted))
        if not f > f0:
            break
        f0, best = f, (X, ls, a)
        a *= 2
    if best is None:
        return state, 0.0
    X, ls, a = best
    s = dict(state)
    s["mX"] = proj(X, transp(state["X"], X, state["mX"]))
    s["X"] = X
    s["hyp"] = state["hyp"].at[0].set(ls)
    return s, a


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


def tangent_start(Y, q, init, scale, rng):
    """Initial latent points (N, q) in the tangent space at the origin (mapped by expmap0): "random"
    U(-1e-3, 1e-3) (the paper's appendix); otherwise the PCA start (:func:`lvmcore.pca.pca_start`)
    scaled to largest norm ``scale``, plus 1e-6 noise to break ties (identical rows)."""
    if init == "random":
        return rng.uniform(-1e-3, 1e-3, size=(Y.shape[0], q))
    P = pca_start(Y, q)
    mx = np.max(np.linalg.norm(P, axis=1))
    if mx > 0:
        P = P * (scale / mx)
    return P + 1e-6 * rng.standard_normal(P.shape)


def noise_variance(Y, q, mode, var_y):
    """The fixed noise variance 1 / beta of a ``noise`` setting, None where beta is learned: "ppca"
    the maximum-likelihood noise of Q-dimensional PPCA (:func:`lvmcore.pca.ppca_noise_variance`;
    None where D <= Q) floored at 1e-6 var(Y) (data of rank <= Q would give 0), a number itself."""
    if mode == "ppca":
        v = ppca_noise_variance(Y, q)
        return None if v is None else max(v, 1e-6 * var_y)
    return None if mode == "learn" else float(mode)


def new_rows(model, Y_new):
    """Rows to transform, checked against a fitted model and centred by its training mean, and the
    index of each row's nearest training row (in data space: where its optimisation starts)."""
    model._check_fitted()
    Y_new = check_data(Y_new, "Y_new")
    if Y_new.shape[1] != model._Y.shape[1]:
        raise ValueError(
            f"Y_new has {Y_new.shape[1]} columns, the model was fitted on {model._Y.shape[1]}; "
            "pass rows with the training data's features"
        )
    Yn = Y_new - model.mean_
    return Yn, knn_query(model._Y, Yn)[0][:, 0]


def kmeans_start(P, m, rng):
    """m inducing inputs (m, Q) in the tangent space at the origin: k-means centres of the initial
    latent points P (N, Q), plus 1e-6 noise to keep them distinct."""
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=m, n_init=1, max_iter=50, random_state=int(rng.integers(2**31)))
    C = km.fit(P).cluster_centers_
    return C + 1e-6 * rng.standard_normal(C.shape)


def _auto_inducing(n):
    """Default M for N points: N / 10 within [64, 256], capped at N (N = 310, 630, 1270 -> 64,
    64, 127; 20,000 -> 256). Fewer inducing inputs than the data's clusters hold the bound back;
    many more make K_mm close to singular (with kappa = 100 the HE kernel is nearly
    sigma (1 - d / kappa) over the latent spread)."""
    return int(min(n, max(64, min(256, round(n / 10)))))


@dataclass(kw_only=True, eq=False, repr=False)
class _Hyperboloid(LatentModel):
    """The parameters and the full-batch fit the hyperboloid GP-LVMs share: :class:`HyperboloidGPLVM`
    (point and sparse variants; its docstring describes the parameters) and
    :class:`~lvmcore.models.hgplvm_svi.BayesianHyperboloidGPLVM`, whose full-batch fit is this loop
    with ``variant`` "bayesian"."""

    n_components: int = 2
    kappa: float = 100.0
    n_inducing: int | str = "auto"
    max_iter: int = 10000
    tol: float = 5e-6
    learning_rate: float = 0.05
    hyper_learning_rate: float = 0.05
    optimizer: str = "radam"
    n_samples: int = 5
    init: str = "pca"
    init_scale: float | str = "auto"
    fix_variance_iter: int = 50
    noise: float | str = "auto"
    prior_scale: float = 1.0
    chunks: int | None = None
    training: str = "auto"
    batch_size: int = 1000
    local_iter: int = 50
    ng_step: float = 0.5
    chunk_size: int = 5000
    random_state: int | np.random.Generator | None = None

    _parameter_constraints = {
        "n_components": [Interval(numbers.Integral, 2, None, closed="left")],
        "kappa": [Interval(numbers.Real, 0, None, closed="neither")],
        "n_inducing": [Interval(numbers.Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "tol": [Interval(numbers.Real, 0, None, closed="left")],
        "learning_rate": [Interval(numbers.Real, 0, None, closed="neither")],
        "hyper_learning_rate": [Interval(numbers.Real, 0, None, closed="neither")],
        "optimizer": [StrOptions({"rsgd", "radam"})],
        "n_samples": [Interval(numbers.Integral, 1, None, closed="left")],
        "init": [StrOptions({"pca", "random"})],
        "init_scale": [StrOptions({"auto"}), Interval(numbers.Real, 0, None, closed="neither")],
        "fix_variance_iter": [Interval(numbers.Integral, 0, None, closed="left")],
        "noise": [StrOptions({"auto", "learn", "ppca"}), Interval(numbers.Real, 0, None, closed="neither")],
        "prior_scale": [Interval(numbers.Real, 0, None, closed="neither")],
        "chunks": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "training": [StrOptions({"auto", "full", "minibatch"})],
        "batch_size": [Interval(numbers.Integral, 1, None, closed="left")],
        "local_iter": [Interval(numbers.Integral, 0, None, closed="left")],
        "ng_step": [Interval(numbers.Real, 0, 1, closed="right")],
        "chunk_size": [Interval(numbers.Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
    }

    def _validate(self):
        self._validate_params()
        if self.variant == "bayesian" and type(self) is HyperboloidGPLVM:
            raise ValueError(
                "variant='bayesian': the Bayesian hyperboloid GP-LVM (eq. 6) has one entry, "
                "lvmcore.models.BayesianHyperboloidGPLVM (full-batch up to 5,000 points, minibatch "
                "above; training='full' forces this fit); use it instead of variant='bayesian'"
            )
        if self.variant == "point" and self.training == "minibatch":
            raise ValueError(
                "training='minibatch' with variant='point': the exact GP-LVM (eq. 4) couples every pair "
                "of points and has no minibatch bound; use variant='sparse' (minibatch above "
                f"{FULL_BATCH_MAX_N:,} points with training='auto') or training='auto'"
            )
        if self.variant != "point" and self.drift_every not in ("auto", 0):
            raise ValueError(
                f"drift_every={self.drift_every!r} with variant={self.variant!r}: the drift line search "
                "is for the point variant (with the sparse one it carried unused inducing inputs "
                "outward without bound, to NaN); use drift_every='auto' or 0"
            )
        if self.variant != "point" and self.mean == "integrated":
            raise ValueError(
                f"mean='integrated' with variant={self.variant!r}: the constant mean integrated out "
                "is the point variant's (eq. 4); use mean='auto' or 'zero'"
            )
        nz = self.noise
        if not isinstance(nz, str) and (isinstance(nz, bool) or not np.isfinite(nz)):
            raise ValueError(f"noise must be 'auto', 'learn', 'ppca' or a finite number > 0, got {nz!r}")

    def _setting(self, name):
        """The parameter ``name`` with "auto" resolved for this variant (``_AUTO``)."""
        value = getattr(self, name)
        return _AUTO[name][self.variant] if value == "auto" else value

    def _hyper_start(self, Y):
        """(log sigma, log beta, log s^2) at the start of a fit to Y (N, D) and the mask (3,) that
        zeroes the gradient of a fixed one: sigma = var(Y), beta the ``noise`` setting's (learned:
        from 100 / var(Y)), s the ``prior_scale`` (fixed)."""
        var_y = float(np.sum(np.var(Y, axis=0)) / Y.shape[1]) or 1.0
        noise_var = noise_variance(Y, int(self.n_components), self._setting("noise"), var_y)
        log_beta0 = np.log(100.0 / var_y) if noise_var is None else -np.log(noise_var)
        hmask = jnp.array([1.0, 0.0 if noise_var is not None else 1.0, 0.0])
        return jnp.array([np.log(var_y), log_beta0, 2.0 * np.log(float(self.prior_scale))]), hmask

    # ------------------------------------------------------------------ helpers
    def _init_tangent(self, Y, rng):
        """Initial latent points in the tangent space at the origin (N, Q): :func:`tangent_start`."""
        return tangent_start(Y, int(self.n_components), self.init, float(self._setting("init_scale")), rng)

    # ------------------------------------------------------------------ training
    def resolve_training(self, n: int) -> str:
        """ "full" or "minibatch" for N = n points: the point variant always "full"; otherwise
        ``training``, where "auto" is "full" up to ``FULL_BATCH_MAX_N`` points and "minibatch" above."""
        if self.variant == "point":
            return "full"
        if self.training != "auto":
            return self.training
        return "full" if n <= FULL_BATCH_MAX_N else "minibatch"

    def check_size(self, n_points: int) -> None:
        """Refusals for N = ``n_points`` before any work (``LatentModel.check_size``): the parameter
        rules (``training`` among them), at least 2 rows, and where the minibatch fit is chosen,
        the settings it cannot honour (:meth:`_check_minibatch`)."""
        self._validate()
        if n_points < 2:
            raise ValueError(f"Y needs at least 2 rows, got {n_points}; pass a data matrix with N >= 2")
        if self.resolve_training(n_points) == "minibatch":
            self._check_minibatch(n_points)

    def _check_minibatch(self, n):
        """Refusals before any minibatch work: the full-batch fit's settings, and the settings that
        cannot work for N = n points."""
        p = self.get_params()
        why = f"N = {n:,} > {FULL_BATCH_MAX_N:,}" if self.training == "auto" else "training='minibatch'"
        for name, default in _FULL_ONLY.items():
            if p[name] != default:
                raise ValueError(
                    f"{name}={p[name]!r} is a setting of the full-batch fit, but the minibatch fit "
                    f"was chosen ({why}); drop {name} (default {default!r}) or set training='full'"
                )
        if self.batch_size > n:
            raise ValueError(
                f"batch_size ({self.batch_size}) exceeds the number of points ({n}); use batch_size <= {n}"
            )
        if self.n_inducing != "auto" and int(self.n_inducing) > n:
            raise ValueError(
                f"n_inducing ({self.n_inducing}) exceeds the number of points ({n}); use n_inducing <= {n} "
                "or 'auto'"
            )

    def fit(self, Y, graph=None, *, callback=None):
        """Fit the model to Y (N, D) by the training :meth:`resolve_training` picks; returns self.
        ``callback(it, state)`` (full-batch fits), if given, is called at the end of every window of
        the convergence rule with the current state (a dict of NumPy arrays: "X" points on the
        hyperboloid, "hyp" log sigma, log beta, log s^2, "log_S", "Z"); it observes the fit and
        does not change it. The minibatch fit takes none."""
        self._refuse_graph(graph)
        Y = check_data(Y)
        self.check_size(Y.shape[0])
        training = self.resolve_training(Y.shape[0])
        if training == "minibatch":
            if callback is not None:
                raise ValueError(
                    "callback observes the full-batch fit, but the minibatch fit was chosen; drop "
                    "callback or set training='full'"
                )
        for k in [k for k in vars(self) if k.endswith("_") and not k.startswith("_")]:
            delattr(self, k)  # an earlier fit's attributes (the two trainings set different ones)
        from lvmcore.models.hgplvm_svi import fit_minibatch

        t_start = time.perf_counter()
        if training == "full":
            self._fit_full(Y, callback)
        else:
            fit_minibatch(self, Y)
        self.fit_time_ = time.perf_counter() - t_start
        self.training_ = training
        self.minibatch_ = float(training == "minibatch")
        return self

    @x64
    def _fit_full(self, Y, callback=None):
        """The full-batch fit (every point every step) of Y (N, D), checked by :meth:`fit`."""
        n, d = Y.shape
        mean = Y.mean(0)
        Yc = jnp.asarray(Y - mean)
        rng = np.random.default_rng(self.random_state)
        key = jax.random.PRNGKey(int(rng.integers(2**31)))
        kappa = float(self.kappa)
        hyp0, hmask = self._hyper_start(Y)
        q = int(self.n_components)
        variant = self.variant
        restricted = self._setting("mean") == "integrated"
        P = self._init_tangent(Y, rng)
        X = expmap0(jnp.asarray(P))
        Z = None
        if variant != "point":  # k-means centres of the initial latent points, or all of them (M = N)
            m = _auto_inducing(n) if self.n_inducing == "auto" else min(int(self.n_inducing), n)
            Z = expmap0(jnp.asarray(P.copy() if m == n else kmeans_start(P, m, rng)))
        state = {
            "X": X,
            "hyp": hyp0,
            "mX": jnp.zeros_like(X),
            "vX": jnp.zeros(n),
            "mh": jnp.zeros(3),
            "vh": jnp.zeros(3),
            "log_S": None,
            "Z": Z,
        }
        if Z is not None:
            state.update(mZ=jnp.zeros_like(Z), vZ=jnp.zeros(Z.shape[0]))
        if variant == "bayesian":
            log_S = jnp.full((n, q), np.log(1e-2 * float(self._setting("init_scale")) ** 2))
            state.update(log_S=log_S, mS=jnp.zeros_like(log_S), vS=jnp.zeros_like(log_S))
        H = int(self.n_samples)
        use_radam = self.optimizer == "radam"
        lr, hlr, scale = float(self.learning_rate), float(self.hyper_learning_rate), float(n * d)
        runner = None
        if variant == "bayesian" and self.chunks is not None:
            runner = RowChunks(
                MCStats(kappa),
                mc_objective(kappa, n, d),
                (np.asarray(Yc),),
                int(self.chunks),
                origin=[(Y, mean)],
            )
        drift = int(self._setting("drift_every"))
        window, patience = _rule_windows(variant, drift)
        warm = int(self.fix_variance_iter) if variant == "bayesian" else 0
        trace, converged, it = [], False, 0
        moves, acc, prev = [], None, None
        for it in range(1, int(self.max_iter) + 1):
            eps = jax.random.normal(jax.random.fold_in(key, it), (H, n, q)) if variant == "bayesian" else None
            upd_S = variant == "bayesian" and it > warm
            if runner is not None:  # Monte-Carlo psi statistics map-reduced over row chunks
                local = {"X": state["X"], "log_S": state["log_S"], "eps": jnp.transpose(eps, (1, 0, 2))}
                f, g_lo, g_gl = runner.value_and_grad(local, {"Z": state["Z"], "hyp": state["hyp"]})
                grads = {k: jnp.asarray(g) for k, g in {**g_lo, **g_gl}.items() if k != "eps"}
                grads["hyp"] = grads["hyp"] * hmask
                state = _apply_updates_jit(
                    state, grads, float(it), upd_S, lr, hlr, scale, variant=variant, use_radam=use_radam
                )
            elif variant == "point":  # K^-1 by LAPACK between two compiled halves (linalg.chol_inverse)
                K, E, dE = _point_kernel_jit(state["X"], state["hyp"][0], state["hyp"][1], kappa)
                Ki_lower, logdet = chol_inverse_lower(K)
                if restricted:
                    Ki_lower, logdet = reml_projection(Ki_lower, logdet)
                state, f = _point_step(
                    state, E, dE, Ki_lower, logdet, float(it), Yc, lr, hlr, scale, hmask, use_radam=use_radam
                )
            else:
                state, f = _fit_step(
                    state, float(it), eps, upd_S, Yc, kappa, lr, hlr, scale, hmask,
                    variant=variant, use_radam=use_radam,
                )  # fmt: skip
            f = float(f)
            if not np.isfinite(f):
                raise FloatingPointError(
                    f"hyperboloid GP-LVM objective became {f} at iteration {it}; lower learning_rate"
                )
            trace.append(f)
            if drift:
                tx, tl = _tangent0(state["X"]), state["hyp"][0]
                acc = (tx, tl) if acc is None else (acc[0] + tx, acc[1] + tl)
                if it % drift == 0:
                    avg = {"X": acc[0] / drift, "ls": acc[1] / drift}
                    acc = None
                    if prev is not None:
                        state, a_drift = _drift_search(state, avg, prev, Yc, kappa, restricted)
                        moves.append((it, a_drift))
                    prev = avg
            if callback is not None and it % window == 0:
                callback(it, _snapshot(state))
            if window_plateau(trace, window, patience, self.tol, n * d, warm):
                converged = True
                break
        S = None if state["log_S"] is None else np.asarray(jnp.exp(state["log_S"]))
        self._set_fitted(state["X"], state["hyp"], S, state["Z"], hmask, Yc, mean, trace, converged)
        self.drift_moves_ = moves
        self.restricted_ = restricted
        self._key = np.asarray(key)

    def _set_fitted(self, X, hyp, S, Z, hmask, Yc, mean, trace, converged):
        """The fitted state both trainings set: the points (means) X on the hyperboloid and in the
        Poincare ball, their variances S (None: point, sparse), the inducing inputs Z (None:
        point), sigma, beta, s (Bayesian) from hyp (log sigma, log beta, log s^2), whether beta was
        fixed (``hmask``), the centred data Yc and the training mean (for ``transform``), the
        objective's trace (its last entry is ``elbo_``, its length ``n_iter_``) and ``converged``."""
        self.lorentz_embedding_ = np.asarray(_renorm(jnp.asarray(X)))
        self.embedding_ = np.asarray(to_poincare(self.lorentz_embedding_))
        self.embedding_var_ = S
        self.inducing_ = None if Z is None else np.asarray(_renorm(Z))
        hyp = np.asarray(hyp)
        self.sigma_, self.beta_ = float(np.exp(hyp[0])), float(np.exp(hyp[1]))
        self.prior_scale_ = float(np.exp(0.5 * hyp[2])) if self.variant == "bayesian" else None
        self.noise_fixed_ = bool(hmask[1] == 0.0)
        self._Y, self.mean_ = np.asarray(Yc), mean
        self.elbo_trace_ = np.asarray(trace, dtype=np.float64)
        self.elbo_, self.n_iter_ = float(trace[-1]), len(trace)
        self.converged_ = converged

    def fit_transform(self, Y, graph=None):
        return self.fit(Y, graph).embedding_

    # ------------------------------------------------------------------ transform
    def transform(self, Y_new, max_iter=None):
        """Latent positions (n_new, Q) in the Poincare ball of new data, model fixed (see
        :meth:`transform_lorentz`)."""
        return np.asarray(to_poincare(self.transform_lorentz(Y_new, max_iter=max_iter)))

    @x64
    def transform_lorentz(self, Y_new, max_iter=None):
        """Latent positions (n_new, Q+1) on the hyperboloid of new data; the fitted state is unchanged.

        Initialised at the fitted position of the nearest training point (in data space), then
        optimised: ``point`` maximises the exact GP predictive density of each new row; ``sparse`` and
        ``bayesian`` maximise the bound of the training + new data with everything but the new latent
        points (and, bayesian, their variances) fixed.
        """
        if getattr(self, "training_", "full") == "minibatch":
            from lvmcore.models.hgplvm_svi import transform_minibatch

            return transform_minibatch(self, Y_new, max_iter=max_iter)
        Yn, nearest = new_rows(self, Y_new)
        Yn, Ytr, Xtr = jnp.asarray(Yn), jnp.asarray(self._Y), jnp.asarray(self.lorentz_embedding_)
        ntr, n_new, q = Xtr.shape[0], Yn.shape[0], int(self.n_components)
        kappa, bayes, H = float(self.kappa), self.variant == "bayesian", int(self.n_samples)
        hyp = jnp.log(jnp.array([self.sigma_, self.beta_, (self.prior_scale_ or 1.0) ** 2]))
        if self.variant == "point":
            sigma, beta = self.sigma_, self.beta_
            K = point_kernel(Xtr, jnp.log(sigma), jnp.log(beta), kappa)[0]  # eq. 4's K
            L = jnp.linalg.cholesky(K)
            if self.restricted_:  # the constant mean's estimate (GLS), taken off both
                k1 = jax.scipy.linalg.cho_solve((L, True), jnp.ones(ntr))
                m_hat = (k1 @ Ytr) / jnp.sum(k1)
                Ytr, Yn = Ytr - m_hat, Yn - m_hat
            alpha = jax.scipy.linalg.cho_solve((L, True), Ytr)

            def obj(Xn, log_S, eps):
                ks = he_kernel(Xn, Xtr, sigma, kappa)  # (n_new, N)
                mean = ks @ alpha
                w = jax.scipy.linalg.solve_triangular(L, ks.T, lower=True)
                var = jnp.maximum(sigma - jnp.sum(w * w, axis=0) + 1.0 / beta, 1e-12)
                r = jnp.sum((Yn - mean) ** 2, axis=1)
                return jnp.sum(-0.5 * Yn.shape[1] * jnp.log(2 * jnp.pi * var) - 0.5 * r / var)

        else:  # the bound of training + new rows (sparse: log S unused)
            Z = jnp.asarray(self.inducing_)
            Yall = jnp.concatenate([Ytr, Yn])
            log_S_tr = jnp.log(jnp.asarray(self.embedding_var_)) if bayes else None

            def obj(Xn, log_S, eps):
                Xall = jnp.concatenate([Xtr, Xn])
                Sall = None if log_S_tr is None else jnp.concatenate([log_S_tr, log_S])
                return _objective(self.variant, Xall, hyp, Sall, Z, eps, Yall, kappa)

        lr = float(self.learning_rate)
        grad_fn = jax.grad(obj, argnums=(0, 1))

        @jax.jit
        def step(lo, mo, t, eps):
            g = dict(zip(("X", "log_S"), grad_fn(lo["X"], lo["log_S"], eps)))
            return adam_local(lo, g, mo, t, lr, lr)

        lo = {"X": Xtr[nearest]}
        lo["log_S"] = jnp.full((n_new, q), np.log(np.median(self.embedding_var_)) if bayes else 0.0)
        mo = {"mX": jnp.zeros_like(lo["X"]), "vX": jnp.zeros(n_new)}
        mo.update(mS=jnp.zeros_like(lo["log_S"]), vS=jnp.zeros_like(lo["log_S"]))
        key = jax.random.fold_in(jnp.asarray(self._key), 10**6)
        n_it = int(max_iter) if max_iter is not None else 200
        for t in range(1, n_it + 1):
            eps = jax.random.normal(jax.random.fold_in(key, t), (H, ntr + n_new, q)) if bayes else None
            lo, mo = step(lo, mo, float(t), eps)
        return np.asarray(_renorm(lo["X"]))


@dataclass(kw_only=True, eq=False, repr=False)
class HyperboloidGPLVM(_Hyperboloid):
    """GP-LVM with latent variables on the Lorentz hyperboloid (paper 002).

    Parameters (keyword-only)
    ----------
    n_components : latent dimension Q (>= 2); points live in R^{Q+1}.
    kappa : HE kernel length scale (fixed; the paper uses 100).
    variant : "point" (exact GP-LVM, eq. 4, :mod:`lvmcore.models.hgplvm_point`) or "sparse"
        (Titsias bound, eq. 5). The Bayesian model (wrapped-Gaussian q(X), MC psi statistics,
        eq. 6) is :class:`~lvmcore.models.hgplvm_svi.BayesianHyperboloidGPLVM`, which runs this
        class's loop with ``variant`` "bayesian" for its full-batch fit; the parameters below that
        name the Bayesian variant are its.
    n_inducing : M inducing inputs (sparse / bayesian), capped at N; "auto" (default) =
        :func:`_auto_inducing` (N / 10 within [64, 256]).  The paper's active sets used M = 50.
    max_iter, tol : iteration budget and the convergence rule: the objective is averaged over
        windows of 25 iterations (50 for the stochastic Bayesian bound); the fit stops when the best
        of the last ``_PATIENCE`` (6; bayesian: 2; with the drift search, the windows of a whole
        cycle and one more: 11) window means exceeds the best earlier one by at most ``tol`` per
        data value (N x D: :func:`lvmcore.optim.plateau`; a plateau, robust to the oscillation of
        Adam steps and to MC noise, at any scale of Y). The budget (10000) is above where the rule
        stops the point and sparse fits on the paper's trees.
    learning_rate : step size of the latent points and inducing inputs (Riemannian Adam, or RSGD on
        the objective / (N D)).
    hyper_learning_rate : Adam step size of log sigma, log beta, log S.
    optimizer : "radam" (default) or "rsgd".
    n_samples : H Monte-Carlo samples per point (bayesian), drawn afresh every iteration.
    init : "pca" (default; PCA scaled to max norm ``init_scale``, mapped by expmap0) or "random"
        (U(-1e-3, 1e-3) as in the paper's appendix).
    init_scale : the PCA start's largest tangent radius; "auto" (default) = 0.2 for the point
        variant, 1 otherwise.  A start near the origin (the paper's init is at 1e-3), where the HE
        kernel's distances are nearly Euclidean, keeps PCA's order and lets the points spread from
        there instead of first re-arranging.
    fix_variance_iter : warm-up (bayesian): S is held at its small initial value for these
        iterations, so the means first settle where the bound's signal is (the paper holds S 100
        epochs).
    noise : "auto" ("ppca" for point and sparse, "learn" for bayesian), "learn" (log beta by Adam
        from beta = 100 / var(Y)), "ppca" (beta
        fixed at 1 / the maximum-likelihood noise variance of Q-dimensional probabilistic PCA,
        :func:`lvmcore.pca.ppca_noise_variance`) or a positive number (fixed noise variance
        1 / beta). The PPCA level keeps the residual that dual PPCA, the GP-LVM's linear-kernel
        case, assigns to noise (a learned beta keeps rising where the data have within-cluster
        jitter), and the sparse bound then approximates the same model as the point variant. The
        Bayesian bound learns its noise (eq. 6; its variances S take up the jitter).
    mean : "auto" (default: "integrated" for point, "zero" for sparse and bayesian), "integrated"
        (a constant mean per column of Y integrated out under a flat prior: the restricted
        likelihood, see the module docstring; point only) or "zero" (eq. 4 / 5 as written, on the
        centred Y).
    drift_every : "auto" (default: 250 for point, 0 for sparse and bayesian) or a number of
        iterations: the period of the drift line search (module docstring); 0 switches it off.
        The sparse and Bayesian variants accept only 0 (module docstring; the Bayesian bound is a
        Monte-Carlo estimate, too noisy to compare trial moves).
    prior_scale : tangent standard deviation s of the prior N^w(mu0, s^2 I) of the Bayesian variant
        (default 1, the paper's prior).
    chunks : rows per chunk for the Bayesian MC statistics map-reduced over Dask workers
        (:class:`lvmcore.chunks.RowChunks`); None computes them in-process.
    training : "auto" (default), "full" or "minibatch" (sparse and Bayesian; the point variant
        is always full-batch and refuses "minibatch"). "auto" fits N <= ``FULL_BATCH_MAX_N``
        (5,000) points full-batch and larger N on minibatches: the three phases of
        :mod:`lvmcore.models.hgplvm_svi` (the uncollapsed bound with a whitened q(u), natural-gradient
        steps on it, Riemannian Adam on Z and the batch's points, a per-point pass, the final bound
        with q(u) at its optimum: for the sparse variant the collapsed eq. 5 of the fitted state).
        ``training_`` and ``minibatch_`` (0.0 / 1.0, stored by the sweep) say which ran. There
        ``max_iter`` counts batches, M = ``n_inducing="auto"`` is min(N, 64), and ``chunks``,
        ``optimizer="rsgd"`` and ``callback`` (full-batch settings) are refused before any work.
    batch_size, local_iter, ng_step, chunk_size : the minibatch fit's B, steps of its per-point
        pass, natural-gradient step on q(u), and rows per vectorised chunk of its per-point and
        final passes.
    random_state : None, int or Generator (k-means start, MC samples, random init).

    Attributes after fit: ``lorentz_embedding_`` (N, Q+1) and ``embedding_`` (N, Q) (Poincare ball)
    of the points (means); ``embedding_var_`` (N, Q) variances S of q(x_i) in the tangent space at
    the mean (bayesian; None otherwise); ``sigma_``, ``beta_``, ``prior_scale_`` (bayesian),
    ``noise_fixed_``, ``elbo_`` (the variant's objective), ``elbo_trace_`` (one value per
    iteration), ``n_iter_``,
    ``converged_``, ``drift_moves_`` ((iteration, a) per drift search; a = 0: no move),
    ``inducing_`` (M, Q+1) or None, ``restricted_`` (the mean integrated out), ``fit_time_``,
    ``training_``, ``minibatch_``; after a minibatch fit (instead of ``drift_moves_``,
    ``restricted_``): ``qu_``, ``glob_``, ``n_steps_``, ``n_inducing_``, ``extra_jitter_``.
    """

    variant: str = "point"
    mean: str = "auto"
    drift_every: int | str = "auto"

    _parameter_constraints = {
        **_Hyperboloid._parameter_constraints,
        "variant": [StrOptions({"point", "sparse", "bayesian"})],
        "mean": [StrOptions({"auto", "zero", "integrated"})],
        "drift_every": [StrOptions({"auto"}), Interval(numbers.Integral, 0, None, closed="left")],
    }
