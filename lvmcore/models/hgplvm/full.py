"""Full-batch training of the hyperboloid GP-LVM (paper 002): every point every step, for the
exact point variant (eq. 4, :mod:`.point`), the sparse one (eq. 5) and the Bayesian one (eq. 6,
:mod:`.objectives`); at its end, for the sparse and Bayesian variants, q(v) at its optimum for the
fit's statistics (``u_posterior_``: what new rows are placed against, :mod:`.newpoints`; the
minibatch fit's is ``qu_``).

Latent points (or means) and inducing inputs are updated by Riemannian Adam (:mod:`.training`);
kappa is fixed; log sigma, log beta (and log S) are updated by the same Adam on the trivial
manifold. ``optimizer="rsgd"`` steps by the gradient of objective / (N D), so the learning rate
does not depend on the data size. The Bayesian variant's Monte-Carlo statistics can be
map-reduced over row chunks (``chunks``, :class:`lvmcore.chunks.RowChunks`) on a Dask client the
caller passes in.

The drift line search (point variant, ``drift_every``). With kappa = 100, growing every distance
by a factor and shrinking sigma by it leaves eq. 4 almost unchanged: a long ridge along which the
objective still rises slowly and which Adam follows slowly. Every ``drift_every`` iterations the
tangent coordinates at the origin of the points and log sigma are averaged over the stretch; each
point is moved by a = 1, 2, 4, ... times the change of its average since the previous stretch
(parallel-transported to the point), keeping the largest a while the objective rises, nothing if
a = 1 lowers it (:func:`drift_search`). The convergence rule's recent windows then span a whole
cycle (:func:`~lvmcore.models.hgplvm.training.rule_windows`), so a fit stops only when a search
found no uphill move and the steps after it made no progress.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lvmcore.chunks import RowChunks
from lvmcore.linalg import KERNEL_JITTER
from lvmcore.manifolds.lorentz import egrad2rgrad, expmap, expmap0, logmap, logmap0, proj, transp
from lvmcore.models.hgplvm.minibatch import posterior_u
from lvmcore.models.hgplvm.objectives import MCStats, mc_objective, objective, renorm
from lvmcore.models.hgplvm.point import (
    chol_inverse_lower,
    point_grads,
    point_kernel,
    point_objective,
    reml_projection,
    symmetrize_lower,
)
from lvmcore.models.hgplvm.training import (
    Trained,
    adam_log_S,
    hyper_start,
    kmeans_start,
    rule_windows,
)
from lvmcore.optim import Lorentz, adam, window_plateau
from lvmcore.precision import jit64, x64

__all__ = ["auto_inducing", "drift_search", "fit_full"]


def auto_inducing(n):
    """Default M for N points: N / 10 within [64, 256], capped at N (N = 310, 630, 1270 -> 64,
    64, 127; 20,000 -> 256). Fewer inducing inputs than the data's clusters hold the bound back;
    many more make K_mm close to singular (with kappa = 100 the HE kernel is nearly
    sigma (1 - d / kappa) over the latent spread)."""
    return int(min(n, max(64, min(256, round(n / 10)))))


def _apply_updates(state, grads, t, upd_S, lr, hlr, scale, variant, use_radam):
    """Riemannian steps for the latent points (means) and inducing inputs, Adam for the
    hyperparameters (and log S, once ``upd_S``).  ``state`` and ``grads`` are dicts keyed
    "X", "hyp", "log_S", "Z" (moments under "m*" / "v*")."""
    s = dict(state)
    for k in ("X", "Z") if variant != "point" else ("X",):
        if use_radam:
            s[k], s["m" + k], s["v" + k] = adam(s[k], grads[k], s["m" + k], s["v" + k], t, lr, Lorentz)
        else:
            s[k] = renorm(expmap(s[k], lr * egrad2rgrad(s[k], grads[k] / scale)))  # RSGD, Algorithm 1
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
    obj = functools.partial(objective, variant, eps=eps, Y=Y, kappa=kappa)
    args = (state["X"], state["hyp"], state["log_S"], state["Z"])
    f, g = jax.value_and_grad(obj, argnums=(0, 1, 2, 3))(*args)
    grads = {"X": g[0], "hyp": g[1] * hmask, "log_S": g[2], "Z": g[3]}
    return _apply_updates(state, grads, t, upd_S, lr, hlr, scale, variant, use_radam), f


_point_kernel_jit = jax.jit(point_kernel)


@functools.partial(jax.jit, static_argnames=("use_radam",))
def _point_step(state, E, dE, Ki_lower, logdet, t, Y, lr, hlr, scale, hmask, use_radam):
    """The point variant's step after :func:`~lvmcore.models.hgplvm.point.chol_inverse_lower`
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
    return renorm(expmap(X, a * v))


_point_objective_jit = jit64(point_objective, static_argnames=("restricted",))


def _snapshot(state):
    """The observable part of a fit's state, as NumPy copies (for ``fit(callback=...)``)."""
    return {k: None if state.get(k) is None else np.asarray(state[k]) for k in ("X", "hyp", "log_S", "Z")}


def drift_search(state, avg, prev, Y, kappa, restricted):
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


@x64
def fit_full(model, Y, callback=None, client=None):
    """The full-batch fit (every point every step) of Y (N, D) for a hyperboloid GP-LVM ``model``
    (its parameters; :class:`~lvmcore.models.hgplvm.estimators.BaseHyperboloidGPLVM`, whose
    ``fit`` checked them) and its ``variant``; returns the fitted state (:class:`Trained`).
    ``callback(it, state)`` observes the fit at the end of every window of the convergence rule;
    ``client``: the Dask client the Bayesian variant's row chunks (``chunks``) run on (None: in
    process)."""
    n, d = Y.shape
    mean = Y.mean(0)
    Yc = jnp.asarray(Y - mean)
    rng = np.random.default_rng(model.random_state)
    key = jax.random.PRNGKey(int(rng.integers(2**31)))
    kappa = float(model.kappa)
    hyp0, hmask = hyper_start(Y, int(model.n_components), model.setting("noise"), model.prior_scale)
    q = int(model.n_components)
    variant = model.variant
    restricted = model.setting("mean") == "integrated"
    P = model.init_tangent(Y, rng)
    X = expmap0(jnp.asarray(P))
    Z = None
    if variant != "point":  # k-means centres of the initial latent points, or all of them (M = N)
        m = auto_inducing(n) if model.n_inducing == "auto" else min(int(model.n_inducing), n)
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
        log_S = jnp.full((n, q), np.log(1e-2 * float(model.setting("init_scale")) ** 2))
        state.update(log_S=log_S, mS=jnp.zeros_like(log_S), vS=jnp.zeros_like(log_S))
    H = int(model.n_samples)
    use_radam = model.optimizer == "radam"
    lr, hlr, scale = float(model.learning_rate), float(model.hyper_learning_rate), float(n * d)
    runner = None
    if variant == "bayesian" and model.chunks is not None:
        runner = RowChunks(
            MCStats(kappa),
            mc_objective(kappa, n, d),
            (np.asarray(Yc),),
            int(model.chunks),
            origin=[(Y, mean)],
            client=client,
        )
    drift = int(model.setting("drift_every"))
    window, patience = rule_windows(variant, drift)
    warm = int(model.fix_variance_iter) if variant == "bayesian" else 0
    trace, converged, it = [], False, 0
    moves, acc, prev = [], None, None
    for it in range(1, int(model.max_iter) + 1):
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
                    state, a_drift = drift_search(state, avg, prev, Yc, kappa, restricted)
                    moves.append((it, a_drift))
                prev = avg
        if callback is not None and it % window == 0:
            callback(it, _snapshot(state))
        if window_plateau(trace, window, patience, model.tol, n * d, warm):
            converged = True
            break
    S = None if state["log_S"] is None else np.asarray(jnp.exp(state["log_S"]))
    attrs = {"drift_moves_": moves, "restricted_": restricted}
    X, hyp, Z = state["X"], state["hyp"], state["Z"]
    if Z is not None:  # q(v) at its optimum for the fit's statistics: what new points are placed by
        attrs["glob_"] = {"Z": np.asarray(Z), "hyp": np.asarray(hyp)}
        qu_key = jax.random.fold_in(key, 2**30 + 1)
        size = int(model.chunk_size)
        qu = posterior_u(X, state["log_S"], attrs["glob_"], Yc, qu_key, H, kappa, KERNEL_JITTER, size)
        attrs["u_posterior_"] = {k: np.asarray(v) for k, v in qu.items()}
    return Trained(X, hyp, S, Z, hmask, Yc, mean, trace, converged, attrs, np.asarray(key))
