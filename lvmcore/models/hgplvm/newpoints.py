"""New points on a fitted hyperboloid GP-LVM (paper 002): where each lands (``place``), the
predictive of a latent point (``predict_at``), and each new row's predictive log density
(``log_density``), for every variant and either training.

Each new row is its own problem: the model is fixed (the point variant: the exact GP of the
training rows; the sparse and Bayesian ones: the inducing inputs Z, sigma, beta and the whitened
q(v) = N(m, S_v) of the inducing outputs, ``qu_``), and a row's latent (or q(x*)) is optimised
alone. The rows of a call are only stacked for speed: every step's gradient of a row depends on
that row alone (the objectives below are sums of per-row terms), Adam keeps per-row moments, and
the step count is shared, so a row's answer does not depend on which rows come with it. Where a
step draws (the Bayesian variant's wrapped-Gaussian samples), a row's draws come from the fit's key
folded with the row's own seed (:func:`cell_seeds`: a hash of its name, or of its content).

* ``point`` (eq. 4): x* maximises the exact GP predictive density of y*,
  log N(y*; k*^T K^-1 Y, (sigma - k*^T K^-1 k* + 1/beta) I) (the restricted fit's constant mean,
  its GLS estimate, taken off the training rows and y*), started at the fitted point of the
  nearest training row (in data space), ``POINT_STEPS`` Riemannian Adam steps. No variance.
* ``sparse`` (eq. 5) and ``bayesian`` (eq. 6): q(x*) maximises its own term of the uncollapsed
  bound with the globals and q(v) fixed (``objectives.minibatch_bound`` of one row: the per-point
  pass of the minibatch fit, phase 2); point latents for ``sparse``, a wrapped Gaussian N^w(mu*, S*)
  with KL to the prior and fresh draws every step for ``bayesian``. q(v) is the optimum for the
  fit's statistics (after a full-batch fit: one pass at the end of the fit, ``full.fit_full``,
  kept as ``u_posterior_``; after a minibatch fit: phase 3's, ``qu_``). Started at the nearest
  training row's q(x); after a full-batch fit ``POINT_STEPS`` steps (H = ``n_samples`` draws a
  step), after a minibatch fit ``local_iter`` (or 50) with ``local_samples`` draws, as its
  per-point pass. With q(v) at its optimum the collapsed bound's gradient in a training point
  equals this term's (the optimum is stationary), so a training row lands at its fitted latent.

Point latents (point, sparse) end with :func:`_polish`: the HE kernel's kink at d = 0 puts a
cone's apex at every training latent (point) or inducing input (sparse), where a row's maximum
often is; constant-step Adam hovers there and amplifies rounding (a row alone and among others
disagreed by 1e-3 after 200 steps), so each row moves to its nearest kink point where that is at
least as high, or else takes Newton steps to its smooth maximum: the answer is the local maximum
itself (measured: bit-equal alone and in a batch). An explicit ``max_iter`` runs those Adam steps
alone (the optimiser's path; the transform before this polish).

The predictive at a latent x (``predict_at``): the point variant's exact GP; otherwise
a = L_m^-1 k(x, Z), mean a^T m, variance sigma - |a|^2 + a^T S_v a + 1/beta (the noise included).
``log_density``: at the point or sparse variant's x*, log N(y*; mean, var I); for the Bayesian
variant the predictive under q(x*), log mean_k N(y*; mean(x_k), var(x_k) I) over ``SCORE_DRAWS``
draws x_k ~ q(x*) (the row's own seeded draws).
"""

from __future__ import annotations

import functools
import hashlib
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from lvmcore.kernels.hyperbolic import he_kernel
from lvmcore.linalg import KERNEL_JITTER, cholesky_jax
from lvmcore.manifolds.lorentz import from_poincare
from lvmcore.models.hgplvm.objectives import kmm, lift, minibatch_bound, renorm
from lvmcore.models.hgplvm.point import point_kernel
from lvmcore.models.hgplvm.training import adam_local
from lvmcore.precision import jit64, x64
from lvmcore.psi.monte_carlo import sample_wrapped

__all__ = [
    "POINT_STEPS",
    "SCORE_DRAWS",
    "cell_seeds",
    "log_density",
    "place",
    "point_factor",
    "predict_at",
    "to_hyperboloid",
]

#: steps of a new row's optimisation after a full-batch fit (and of the point variant's)
POINT_STEPS = 200
#: Newton steps after the Adam steps of a point or sparse variant's new row (``_polish``), and
#: the nearest kink points (where the HE kernel's distance is 0) it compares first
NEWTON_STEPS = 8
KINK_CANDIDATES = 4
_LOG_2PI = float(np.log(2.0 * np.pi))
#: most rows of new points optimised together (each block padded to a power of two)
BLOCK = 1024
#: draws x_k ~ q(x*) of the Bayesian variant's predictive log density
SCORE_DRAWS = 32
#: what a row's draws fold into the fit's key: its optimisation's, its score's
_PLACE_STREAM, _SCORE_STREAM = 10**6, 10**6 + 1
_LOG2PI = float(np.log(2.0 * np.pi))


def cell_seeds(Y_new, cell_keys=None) -> np.ndarray:
    """One uint32 seed per row, independent of the others in the call: a hash of the row's name
    (``cell_keys``, e.g. obs_names) or, without names, of the row's float64 content."""
    if cell_keys is not None:
        keys = list(cell_keys)
        if len(keys) != len(Y_new):
            raise ValueError(f"cell_keys has {len(keys)} names for {len(Y_new)} rows; pass one per row")
        items = (str(k).encode() for k in keys)
    else:
        rows = np.ascontiguousarray(Y_new, dtype=np.float64)
        items = (r.tobytes() for r in rows)
    return np.array(
        [int.from_bytes(hashlib.blake2b(b, digest_size=4).digest(), "little") for b in items], dtype=np.uint32
    )


def _globals(model):
    """(glob {"Z", "hyp"}, q(v) {"m", "P"}, the K_mm jitter) of a sparse or Bayesian fit."""
    glob = {k: jnp.asarray(v) for k, v in model.glob_.items()}
    qu = getattr(model, "qu_", None) or model.u_posterior_  # minibatch fit / full-batch fit
    qu = {k: jnp.asarray(v) for k, v in qu.items()}
    jitter = getattr(model, "extra_jitter_", None)
    return glob, qu, KERNEL_JITTER if jitter is None else float(jitter)


def _stream_keys(model, seeds, stream):
    """(n, 2) per-row PRNG keys: the fit's key, folded with ``stream``, then with each row's seed."""
    base = jax.random.fold_in(jnp.asarray(np.asarray(model.rng_key_).astype(np.uint32)), stream)
    return jax.vmap(lambda s: jax.random.fold_in(base, s))(jnp.asarray(seeds, dtype=jnp.uint32))


def _draws(keys, i, H, Q):
    """(H, n, Q) standard normals, row b's from fold_in(keys[b], i) (its own, whatever rows come
    with it)."""
    one = lambda k: jax.random.normal(jax.random.fold_in(k, i), (H, Q))
    return jnp.transpose(jax.vmap(one)(keys), (1, 0, 2))


#: derived state of fitted estimators' new points (the point variant's factor),
#: kept beside each estimator, not in it: transform never changes a fitted model's state
_DERIVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def derived(model) -> dict:
    """The derived new-point state of ``model`` (created empty; forgotten by :func:`forget`)."""
    return _DERIVED.setdefault(model, {})


def forget(model) -> None:
    """Drop ``model``'s derived state: its fit changed (a new fit, or its arrays restored)."""
    _DERIVED.pop(model, None)


# --------------------------------------------------------------------------- the point variant
@x64
def point_factor(model):
    """(Cholesky factor L of eq. 4's K, alpha = K^-1 (Y - m), m) of the fitted point variant, m
    the restricted fit's GLS constant mean (zero otherwise): what its predictive needs; kept per
    estimator's :func:`derived` state (rebuilt from the training rows, never stored)."""
    memo = derived(model)
    if "point" not in memo:
        Xtr, Ytr = jnp.asarray(model.lorentz_embedding_), jnp.asarray(model._Y)
        K = point_kernel(Xtr, jnp.log(model.sigma_), jnp.log(model.beta_), float(model.kappa))[0]
        L = jnp.linalg.cholesky(K)
        m_hat = jnp.zeros(Ytr.shape[1])
        if model.restricted_:  # the constant mean's estimate (GLS), taken off both
            k1 = jax.scipy.linalg.cho_solve((L, True), jnp.ones(Ytr.shape[0]))
            m_hat = (k1 @ Ytr) / jnp.sum(k1)
        memo["point"] = (L, jax.scipy.linalg.cho_solve((L, True), Ytr - m_hat), m_hat)
    return memo["point"]


def _point_predict(Xn, Xtr, L, alpha, sigma, beta, kappa):
    """Exact GP predictive mean (n, D) (of the rows less m) and variance (n,) with the noise."""
    ks = he_kernel(Xn, Xtr, sigma, kappa)
    w = jax.scipy.linalg.solve_triangular(L, ks.T, lower=True)
    return ks @ alpha, jnp.maximum(sigma - jnp.sum(w * w, axis=0) + 1.0 / beta, 1e-12)


def _log_normal(Y, mean, var):
    """log N(y; mean, var I) per row (var one per row, broadcast over the last axis)."""
    r = jnp.sum((Y - mean) ** 2, axis=-1)
    return -0.5 * Y.shape[-1] * (_LOG2PI + jnp.log(var)) - 0.5 * r / var


@functools.partial(jit64, static_argnames=("n_steps",))
def _point_pass(X0, Yn, Xtr, L, alpha, sigma, beta, kappa, lr, n_steps):
    """``n_steps`` Riemannian Adam steps of each row's exact predictive log density."""

    def total(X):
        return jnp.sum(_log_normal(Yn, *_point_predict(X, Xtr, L, alpha, sigma, beta, kappa)))

    def body(i, carry):
        lo, mo = carry
        return adam_local(lo, {"X": jax.grad(total)(lo["X"])}, mo, i + 1.0, lr, lr)

    mom = {"mX": jnp.zeros_like(X0), "vX": jnp.zeros(X0.shape[0])}
    return jax.lax.fori_loop(0, n_steps, body, ({"X": X0}, mom))[0]["X"]


# --------------------------------------------------------------------------- sparse and Bayesian
@functools.partial(jit64, static_argnames=("n_steps", "H"))
def _cell_pass(local, glob, qu, Y, keys, kappa, jitter, lr, hlr, n_steps, H):
    """``n_steps`` Riemannian Adam (means) / Adam (log S) steps of each row's term of the
    uncollapsed bound, globals and q(v) fixed; the Bayesian rows' H draws a step their own
    (``keys``, one per row); point latents (no "log_S"): no draws."""
    point = "log_S" not in local
    Q = local["X"].shape[1] - 1

    def grad_local(lo, eps):
        return jax.grad(lambda lo_: minibatch_bound(lo_, glob, qu, Y, eps, 1.0, 1.0, kappa, jitter)[0])(lo)

    def body(i, carry):
        lo, mo = carry
        eps = None if point else _draws(keys, i, H, Q)
        return adam_local(lo, grad_local(lo, eps), mo, i + 1.0, lr, hlr)

    mom = {"mX": jnp.zeros_like(local["X"]), "vX": jnp.zeros(local["X"].shape[0])}
    if not point:
        mom.update(mS=jnp.zeros_like(local["log_S"]), vS=jnp.zeros_like(local["log_S"]))
    return jax.lax.fori_loop(0, n_steps, body, (dict(local), mom))[0]


def _svgp_predict(X, glob, qu, kappa, jitter):
    """Predictive mean (..., D) (centred) and variance (...) with the noise at latents X (..., Q+1)
    under q(v) (module docstring)."""
    Z, sigma, beta, _, Linv, Rinv, _ = _sparse_factors(glob, qu, kappa, jitter)
    a = he_kernel(X, Z, sigma, kappa) @ Linv.T
    b = a @ Rinv.T
    var = sigma - jnp.sum(a * a, -1) + jnp.sum(b * b, -1) + 1.0 / beta
    return a @ qu["m"], jnp.maximum(var, 1e-12)


_svgp_predict_jit = jit64(_svgp_predict)
_point_predict_jit = jit64(_point_predict)


@jit64
def _mixture_log_density(mu, S, Yn, keys, glob, qu, kappa, jitter):
    """log mean_k N(y*; mean(x_k), var(x_k) I) over ``SCORE_DRAWS`` draws x_k ~ N^w(mu, S), each
    row's draws its own (``keys``)."""
    eps = _draws(keys, 0, SCORE_DRAWS, S.shape[1])
    x = sample_wrapped(mu, S, eps)[0]  # (K, n, Q+1)
    lp = _log_normal(Yn[None], *_svgp_predict(x, glob, qu, kappa, jitter))  # (K, n)
    return jax.scipy.special.logsumexp(lp, axis=0) - np.log(SCORE_DRAWS)


# --------------------------------------------------------------------------- the Newton polish
def _row_objective(variant, s, y, args):
    """One row's objective at spatial coordinates s (Q,) (x = lift(s), a global chart of the
    hyperboloid): the point variant's predictive log density; the sparse one's term of the
    uncollapsed bound less KL(q(v)) (a constant here), by the per-row formula with a =
    L_m^-1 k(x, Z): -D/2 log(2 pi / beta) - beta/2 (|y - m^T a|^2 + D (sigma - |a|^2 + a^T S_v a)),
    ``args`` = (Z, sigma, beta, kappa, L_m^-1, R^-1 (S_v = R^-T R^-1), m): O(M^2 + M D) a row
    where the statistics' route (``objectives.minibatch_bound`` of one row) whitens the row's
    M x M Psi2, O(M^3), under the Hessian's every pass."""
    x = jnp.concatenate([jnp.sqrt(1.0 + jnp.sum(s * s))[None], s])[None]
    if variant == "point":
        Xtr, L, alpha, sigma, beta, kappa = args
        return _log_normal(y[None], *_point_predict(x, Xtr, L, alpha, sigma, beta, kappa))[0]
    Z, sigma, beta, kappa, Linv, Rinv, m = args
    a = Linv @ he_kernel(x, Z, sigma, kappa)[0]
    b = Rinv @ a
    r = y - a @ m
    D = y.shape[0]
    return 0.5 * D * (jnp.log(beta) - _LOG_2PI) - 0.5 * beta * (r @ r + D * (sigma - a @ a + b @ b))


def _sparse_factors(glob, qu, kappa, jitter):
    """``_row_objective``'s sparse ``args`` from the globals and q(v), computed once for all rows."""
    sigma, beta = jnp.exp(glob["hyp"][0]), jnp.exp(glob["hyp"][1])
    Lm = cholesky_jax(kmm(glob, kappa), jitter)
    M = Lm.shape[0]
    Linv = jax.scipy.linalg.solve_triangular(Lm, jnp.eye(M), lower=True)
    R = jnp.linalg.cholesky(qu["P"])  # S_v = R^-T R^-1
    Rinv = jax.scipy.linalg.solve_triangular(R, jnp.eye(M), lower=True)
    return glob["Z"], sigma, beta, kappa, Linv, Rinv, qu["m"]


@functools.partial(jit64, static_argnames=("variant", "n_steps"))
def _polish(X, Y, args, kinks, variant, n_steps):
    """The end of a point or sparse variant's new rows (X (n, Q+1) after the Adam steps): each
    row's answer made the local maximum itself, so that it no longer depends on the path.

    The HE kernel exp(-d / kappa) has a kink where d = 0, so a row's objective has a cone's apex at
    every kink point (``kinks``: the training latents of the point variant, the inducing inputs of
    the sparse one), and the maximum is often there. Constant-step Adam hovers around such an apex
    (or a smooth maximum) at a distance of about its step, and the hovering amplifies rounding:
    one row alone and the same row among others then disagree in the fourth digit. So: the row
    moves to the best of its ``KINK_CANDIDATES`` nearest kink points where that is at least as high
    as where Adam ended; otherwise ``n_steps`` safeguarded Newton steps in the chart s = the
    spatial coordinates (x = lift(s)): -H^-1 g where H is negative definite, halved up to three
    times until the objective does not fall, none otherwise (quadratic convergence to a smooth
    maximum)."""
    if variant == "sparse":
        args = _sparse_factors(*args)
    f = lambda s, y: _row_objective(variant, s, y, args)
    val = jax.vmap(f)
    grad = jax.vmap(jax.grad(f))
    hess = jax.vmap(jax.hessian(f))
    S0 = X[:, 1:]
    f0 = val(S0, Y)
    inner = X[:, :1] * kinks[None, :, 0] - X[:, 1:] @ kinks[:, 1:].T  # -<x, z>_L = cosh d
    near = jax.lax.top_k(-inner, min(KINK_CANDIDATES, kinks.shape[0]))[1]  # (n, K) nearest kink points
    cand = kinks[near, 1:]  # (n, K, Q)
    fc = jax.vmap(val, in_axes=(1, None), out_axes=1)(cand, Y)  # (n, K)
    j = jnp.argmax(fc, axis=1)
    snap = jnp.take_along_axis(fc, j[:, None], axis=1)[:, 0] >= f0
    S_kink = jnp.take_along_axis(cand, j[:, None, None], axis=1)[:, 0]

    def body(_, S):
        g, H, fs = grad(S, Y), hess(S, Y), val(S, Y)
        C = jnp.linalg.cholesky(-H)
        ok = jnp.all(jnp.isfinite(C), axis=(1, 2))
        C = jnp.where(ok[:, None, None], C, jnp.eye(S.shape[1]))
        step = jnp.where(
            ok[:, None], jax.vmap(lambda c, gi: jax.scipy.linalg.cho_solve((c, True), gi))(C, g), 0.0
        )
        best, done = S, jnp.zeros(S.shape[0], dtype=bool)
        for a in (1.0, 0.5, 0.25, 0.125):
            trial = S + a * step
            good = ~done & (val(trial, Y) >= fs)
            best = jnp.where(good[:, None], trial, best)
            done = done | good
        return best

    S = jax.lax.fori_loop(0, n_steps, body, S0)
    return lift(jnp.where(snap[:, None], S_kink, S))


# --------------------------------------------------------------------------- the entries
def _blocks(n):
    """Consecutive blocks of at most ``BLOCK`` rows covering n rows, each as (slice, padded
    length: the next power of two, at least 64), so that calls of any size compile a few shapes."""
    out = []
    for a in range(0, n, BLOCK):
        stop = min(a + BLOCK, n)
        out.append((slice(a, stop), max(64, 1 << (stop - a - 1).bit_length())))
    return out


def _pad(a, m):
    """``a`` with its last row repeated to m rows (rows are independent: padding changes nothing
    of the others)."""
    a = jnp.asarray(a)
    return jnp.concatenate([a, jnp.repeat(a[-1:], m - a.shape[0], axis=0)]) if m > a.shape[0] else a


@x64
def place(model, Yn, nearest, seeds=None, max_iter=None):
    """Each new row's latent: (means (n, Q+1) on the hyperboloid, tangent variances S (n, Q) or
    None) for rows Yn (n, D) centred by the training mean, each started at the fitted q(x) of its
    nearest training row ``nearest``; ``seeds`` (:func:`cell_seeds`, Bayesian only) the rows'
    own draws; ``max_iter``: that many Adam steps and nothing else (the optimiser's path after
    them, as ``transform`` gave before the polish; 0: each row at its start); None: the default
    steps, then for point latents :func:`_polish`, which makes the answer the local maximum itself
    (per-row determinism to rounding holds for this default)."""
    minibatch = getattr(model, "training_", "full") == "minibatch"
    bayes = model.variant == "bayesian"
    steps = POINT_STEPS if not minibatch else (int(model.local_iter) or 50)
    steps = steps if max_iter is None else int(max_iter)
    kappa, lr, hlr = float(model.kappa), float(model.learning_rate), float(model.hyper_learning_rate)
    X0 = np.asarray(model.lorentz_embedding_)[nearest]
    out_X = np.empty_like(X0)
    log_S0 = np.log(np.asarray(model.embedding_var_)[nearest]) if bayes else None
    out_S = np.empty_like(log_S0) if bayes else None
    if model.variant == "point":
        L, alpha, m_hat = point_factor(model)
        Xtr = jnp.asarray(model.lorentz_embedding_)
        args = (Xtr, L, alpha, model.sigma_, model.beta_, kappa)
    else:
        glob, qu, jitter = _globals(model)
        H = (int(model.local_samples) if minibatch else int(model.n_samples)) if bayes else 1
        keys = _stream_keys(model, seeds, _PLACE_STREAM) if bayes else None
        args = (glob, qu, kappa, jitter)
    for sl, m in _blocks(len(X0)):
        k = sl.stop - sl.start
        if model.variant == "point":
            Y = _pad(Yn[sl], m) - m_hat
            X = _point_pass(_pad(X0[sl], m), Y, *args[:-1], kappa, lr, n_steps=steps)
            if max_iter is None:
                X = _polish(X, Y, args, Xtr, "point", NEWTON_STEPS)
            out_X[sl] = np.asarray(renorm(X))[:k]
            continue
        local = {"X": _pad(X0[sl], m)}
        if bayes:
            local["log_S"] = _pad(log_S0[sl], m)
        Y = _pad(Yn[sl], m)
        lo = _cell_pass(
            local, glob, qu, Y, None if keys is None else _pad(keys[sl], m), kappa, jitter,
            lr, hlr, n_steps=steps, H=H,
        )  # fmt: skip
        if max_iter is None and not bayes:
            lo["X"] = _polish(lo["X"], Y, args, glob["Z"], "sparse", NEWTON_STEPS)
        out_X[sl] = np.asarray(renorm(lo["X"]))[:k]
        if bayes:
            out_S[sl] = np.exp(np.asarray(lo["log_S"]))[:k]
    return out_X, out_S


@x64
def predict_at(model, X):
    """Predictive mean (n, D) (centred by the training mean) and variance (n,), the noise included,
    at hyperboloid points X (n, Q+1), block by block."""
    kappa = float(model.kappa)
    if model.variant == "point":
        L, alpha, m_hat = point_factor(model)
        Xtr = jnp.asarray(model.lorentz_embedding_)
        fn = lambda x: _point_predict_jit(x, Xtr, L, alpha, model.sigma_, model.beta_, kappa)
    else:
        glob, qu, jitter = _globals(model)
        m_hat = 0.0
        fn = lambda x: _svgp_predict_jit(x, glob, qu, kappa, jitter)
    mean, var = np.empty((len(X), model.mean_.shape[0])), np.empty(len(X))
    for sl, m in _blocks(len(X)):
        mu, v = fn(_pad(X[sl], m))
        k = sl.stop - sl.start
        mean[sl], var[sl] = np.asarray(mu + m_hat)[:k], np.asarray(v)[:k]
    return mean, var


@x64
def log_density(model, Yn, X, S=None, seeds=None):
    """Each row's predictive log density (n,) of Yn (centred by the training mean): at its latent
    X (n, Q+1) (point, sparse), or under q(x*) = N^w(X, S) (Bayesian; ``seeds`` its rows' own
    draws): module docstring."""
    if model.variant != "bayesian":
        mean, var = predict_at(model, X)
        return np.asarray(_log_normal(jnp.asarray(Yn), mean, var))
    glob, qu, jitter = _globals(model)
    keys = _stream_keys(model, seeds, _SCORE_STREAM)
    out = np.empty(len(Yn))
    for sl, m in _blocks(len(Yn)):
        out[sl] = np.asarray(
            _mixture_log_density(
                _pad(X[sl], m), _pad(S[sl], m), _pad(Yn[sl], m), _pad(keys[sl], m), glob, qu,
                float(model.kappa), jitter,
            )
        )[: sl.stop - sl.start]  # fmt: skip
    return out


def to_hyperboloid(X, q: int):
    """Latent points given in the Poincare ball (n, Q) or on the hyperboloid (n, Q+1) as
    hyperboloid points (n, Q+1)."""
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    if X.shape[1] == q + 1:
        return np.asarray(renorm(jnp.asarray(X)))
    if X.shape[1] != q:
        raise ValueError(
            f"latent points need {q} (Poincare ball) or {q + 1} (hyperboloid) columns, got {X.shape[1]}"
        )
    if np.any(np.sum(X * X, axis=1) >= 1.0):
        raise ValueError("Poincare-ball points must have norm < 1")
    return np.asarray(renorm(from_poincare(X)))
