"""What the hyperboloid GP-LVM's two trainings (full-batch :mod:`.full`, minibatch
:mod:`.minibatch`) share: the start (latent points, inducing inputs, hyperparameters), the
Riemannian Adam step of rows of q(X), the convergence rule's windows, and :class:`Trained`, the
fitted state a training returns to its estimator (:mod:`.estimators`).

Latent points (or means) are updated by Riemannian Adam (Algorithm 1 with Becigneul and Ganea's
Adam, :func:`lvmcore.optim.adam` on :class:`~lvmcore.optim.Lorentz`); log sigma, log beta (and
log S) by the same Adam on the trivial manifold.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from lvmcore.optim import Lorentz, adam
from lvmcore.pca import pca_start, ppca_noise_variance

__all__ = [
    "PATIENCE",
    "PATIENCE_BAYES",
    "Trained",
    "rule_windows",
    "tangent_start",
    "noise_variance",
    "hyper_start",
    "kmeans_start",
    "adam_log_S",
    "adam_local",
]


class Trained(NamedTuple):
    """A training's result, which its estimator stores: the points (means) X [N, Q+1] on the
    hyperboloid, hyp [3] (log sigma, log beta, log s^2), the variances S [N, Q] of q(x_i) (None:
    point latents), the inducing inputs Z [M, Q+1] (None: point variant), ``hmask`` [3] (0 where a
    hyperparameter was fixed), the centred data Yc [N, D] and its mean [D], the objective's trace
    (its last entry the fit's bound), ``converged``, ``attrs`` (the training's own fitted
    attributes, by name) and ``key`` (the random key of the fit's draws, for ``transform``)."""

    X: object
    hyp: object
    S: object
    Z: object
    hmask: object
    Yc: object
    mean: object
    trace: list
    converged: bool
    attrs: dict
    key: object = None


PATIENCE = 6  # windows without progress before the convergence rule stops a fit (point, sparse)
PATIENCE_BAYES = 2  # the Bayesian fit's (a longer wait lowered its score, see HyperboloidGPLVM)


def rule_windows(variant, drift):
    """(window, patience) of the convergence rule: iterations per window mean, and how many recent
    windows must show progress.  With the drift line search every ``drift`` iterations the recent
    windows span a whole cycle (a search and the steps after it), so that the gain of an accepted
    move counts as progress and a stop needs a rejected move as well as a plateau of the steps."""
    if variant == "bayesian":
        return 50, PATIENCE_BAYES
    return 25, max(PATIENCE, -(-drift // 25) + 1) if drift else PATIENCE


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



def hyper_start(Y, n_components: int, noise, prior_scale: float):
    """(log sigma, log beta, log s^2) at the start of a fit to Y (N, D) and the mask (3,) that
    zeroes the gradient of a fixed one: sigma = var(Y), beta the ``noise`` setting's (its "auto"
    resolved; learned: from 100 / var(Y)), s the ``prior_scale`` (fixed)."""
    var_y = float(np.sum(np.var(Y, axis=0)) / Y.shape[1]) or 1.0
    noise_var = noise_variance(Y, int(n_components), noise, var_y)
    log_beta0 = np.log(100.0 / var_y) if noise_var is None else -np.log(noise_var)
    hmask = jnp.array([1.0, 0.0 if noise_var is not None else 1.0, 0.0])
    return jnp.array([np.log(var_y), log_beta0, 2.0 * np.log(float(prior_scale))]), hmask


def kmeans_start(P, m, rng):
    """m inducing inputs (m, Q) in the tangent space at the origin: k-means centres of the initial
    latent points P (N, Q), plus 1e-6 noise to keep them distinct."""
    from sklearn.cluster import KMeans  # here: 0.4 s to import, and only fits with Z need it

    km = KMeans(n_clusters=m, n_init=1, max_iter=50, random_state=int(rng.integers(2**31)))
    C = km.fit(P).cluster_centers_
    return C + 1e-6 * rng.standard_normal(C.shape)


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
