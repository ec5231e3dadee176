"""Stochastic variational Bayesian GP-LVM: the uncollapsed bound of paper 004's model trained on
minibatches of points (the GPflow #1749 request), so one step costs O(B M^2 Q) whatever N is.

Model and bound. As ``lvmcore.models.bgplvm`` (paper 004 section 3): q(X) = prod_n N(mu_n, diag S_n)
and an RBF-ARD or linear-ARD kernel with M inducing inputs Z, but the inducing outputs keep an
explicit whitened q(v) (u = L_m v) instead of being collapsed:

    F = sum_n E_q(x_n)[E_q(f_n) log p(y_n | f_n)] - KL(q(v) || N(0, I)) - sum_n KL(q(x_n) || N(0, I)),

the uncollapsed bound of ``lvmcore.uncollapsed`` (its formula, from the psi statistics summed over
the points). A batch of B points scaled by N / B gives an unbiased estimate of F. At the optimal
q(v), S_v = (I + beta C)^-1 and m = beta S_v c, F equals the collapsed bound (``lvmcore.collapsed``)
exactly: :func:`optimal_qu` and the tests check that identity.

Training (Hensman, Fusi and Lawrence 2013's SVI for GPs, applied to the GP-LVM): per batch,
(1) the statistics and the gradient of the batch estimate at the current parameters; (2) a
natural-gradient step of size ``ng_step`` on q(v) in its natural parameters (S_v^-1, S_v^-1 m):
the bound is conjugate in q(v), so that step moves them toward the batch's optimum
(I + beta C_B, beta c_B) (the first step is of size one); (3) Adam steps on the kernel
parameters, Z and log beta (``learning_rate``) and on the batch's own mu_n and log S_n
(``local_learning_rate``; per-point Adam moments, so a point's step count is its own). The first
``init_epochs`` hold beta at ``snr`` / var(Y) as the collapsed model's first phase does. Memory:
q(X), its Adam moments (four more N x Q arrays) and the centred data; everything else is
O(B M^2 + M D). The last act of ``fit`` is one pass over all points for the exact statistics:
``elbo_uncollapsed_`` is F with q(v) as trained, then q(v) is set to its optimum for those
statistics (a natural-gradient step of size one with the full data) and ``elbo_`` is F there,
which equals the collapsed bound at the fitted q(X) and hyperparameters.

Estimator, not a BayesianGPLVM option: the optimiser's parameters (batch size, steps, epochs) and
its loop have nothing in common with the collapsed L-BFGS fit; the fitted state is the same
(``local_``, ``glob_``, the training statistics), so prediction and ``transform`` are
BayesianGPLVM's own (``BaseCollapsedGPLVM``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from numbers import Integral, Real

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from sklearn.utils._param_validation import Interval

from lvmcore import newpoints, uncollapsed
from lvmcore.kernels.euclidean import get_kernel
from lvmcore.linalg import KMM_JITTER
from lvmcore.models.bgplvm import RULES, BaseCollapsedGPLVM, BayesianGPLVM, kmm
from lvmcore.optim import adam, window_plateau
from lvmcore.precision import jit64, x64
from lvmcore.psi import psi_statistics
from lvmcore.psi.closed_form import kl_diag_gaussian
from lvmcore.uncollapsed import jitter_tries

__all__ = [
    "StochasticBayesianGPLVM",
    "uncollapsed_bound",
    "optimal_qu",
    "batch_statistics",
]


#: the stopping rule (:func:`lvmcore.optim.window_plateau`, as the hGP-LVM fits'): the epoch
#: estimates averaged over windows of RULE_WINDOW epochs; the fit stops when the best of the last
#: RULE_PATIENCE window means beats the best earlier one by at most ``tol`` per data value. Not the
#: difference of two successive epoch estimates: that stopped fits on the estimate's noise and on
#: the dip after the noise is released (50-D roll, tol 1e-3: at 10^5 after 6 epochs at -1.12 per
#: value, where 300 epochs reach 0.46; at 10^4 after 74: bench/README.md, "Minibatch Bayesian GP-LVM")
RULE_WINDOW, RULE_PATIENCE = 5, 2


# --------------------------------------------------------------------------- plain functions
@x64
def uncollapsed_bound(kind, stats, glob, qu, N, scale=1.0, rel_jitter=0.0, kmm_jitter=KMM_JITTER):
    """sum_n E[log p(y_n | f_n)] - KL(q(v)) of the module docstring, from statistics
    (psi0, Psi1^T Y, Psi2, tr(Y^T Y)) of a set of points scaled by ``scale`` (N / B for a batch of B
    of the N points; 1 for all of them). ``qu`` = {"m": (M, D), "P": (M, M)}: q(v)'s mean and
    precision S_v^-1. The KL of q(X) is the caller's. ``kmm_jitter``: K_mm's jitter in the data's
    units (a fit passes :func:`~lvmcore.models.bgplvm.kmm_jitters` of its data)."""
    Kmm = kmm(kind, glob["Z"][0], glob["kern"][0], kmm_jitter)
    return uncollapsed.bound(Kmm, stats, glob["log_beta"][0], qu, N, scale, rel_jitter)


def optimal_qu(kind, stats, glob, scale=1.0, rel_jitter=0.0, kmm_jitter=KMM_JITTER):
    """The q(v) that maximises :func:`uncollapsed_bound` for these statistics: precision
    I + beta C and mean beta (I + beta C)^-1 c, C and c from the statistics scaled by ``scale``
    (the natural-gradient step of size one). Returns {"m", "P"} as numpy arrays."""
    P, m = _optimal_qu_jit(kind, stats, glob, scale, rel_jitter, kmm_jitter)
    return {"m": np.asarray(m), "P": np.asarray(P)}


@jit64(static_argnames=("kind",))
def _optimal_qu_jit(kind, stats, glob, scale, rel_jitter, kmm_jitter):
    """:func:`optimal_qu`'s algebra, compiled once per kernel (it runs once per minibatch)."""
    Kmm = kmm(kind, glob["Z"][0], glob["kern"][0], kmm_jitter)
    return uncollapsed.optimal_qu(Kmm, stats, glob["log_beta"][0], scale, rel_jitter)


@x64
def batch_statistics(kind, mu, S, Y, glob):
    """(psi0, Psi1^T Y, Psi2, tr(Y^T Y)) summed over the given points (the kernel's psi statistics)."""
    p0, p1y, p2 = psi_statistics(get_kernel(kind), mu, S, glob["Z"][0], glob["kern"][0], Y)
    return (p0, p1y, p2, jnp.sum(jnp.asarray(Y) ** 2))


@functools.lru_cache(maxsize=16)
def _batch_step(kind: str):
    """Jitted (local_B, glob, qu, Y_B, N, scale, rel_jitter) -> ((batch estimate of F, statistics
    of the batch), (d/d local_B, d/d glob)); q(v) is held fixed."""

    def objective(local, glob, qu, Y, N, scale, rel_jitter, kmm_jitter=KMM_JITTER):
        mu, S = local["mu"], jnp.exp(local["logS"])
        stats = batch_statistics(kind, mu, S, Y, glob)
        F = uncollapsed_bound(kind, stats, glob, qu, N, scale, rel_jitter, kmm_jitter)
        F = F - scale * kl_diag_gaussian(mu, S)
        return F, stats

    return jit64(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))


# --------------------------------------------------------------------------- estimator
@dataclass(kw_only=True, eq=False, repr=False)
class StochasticBayesianGPLVM(BaseCollapsedGPLVM):
    """Bayesian GP-LVM (one view) trained by stochastic variational inference on minibatches of
    points (module docstring). ``embedding_`` / ``embedding_var_`` are q(X)'s means and variances;
    ``elbo_`` the full bound at the fitted state with q(u) at its optimum (= the collapsed bound);
    ``elbo_uncollapsed_`` the full bound with q(u) as trained; ``elbo_trace_`` one entry per
    epoch (the mean of that epoch's minibatch estimates of the bound: an estimate, not the bound
    at one point), then the exact bound of the final full pass (= ``elbo_``).

    Parameters: ``n_components`` Q, ``n_inducing`` M, ``kernel`` ("rbf" or "linear"),
    ``batch_size`` B (points per step, at most N: a data set of fewer points is one batch per
    epoch, as a minibatch loader yields it), ``max_iter`` epochs (passes over the points; 600:
    on the 50-D roll the rule below stopped the fit at 205-305 epochs at 10^4 and 10^5 points and
    at 446 at 10^6, none within 100),
    ``init_epochs`` epochs with the noise held at ``snr``, ``learning_rate`` (Adam, globals),
    ``local_learning_rate`` (Adam, the batch's q(x_n); 0.2, not 0.1: on the 50-D roll a higher
    bound after 100 epochs at the same cost, equal on the 3-D roll: bench/README.md, "Minibatch
    Bayesian GP-LVM"), ``ng_step`` (natural-gradient step on q(u)), ``tol`` (per data value: stop
    when the best of the last ``RULE_PATIENCE`` means of ``RULE_WINDOW`` epoch estimates beats the
    best earlier one by at most ``tol``, checked after ``init_epochs`` and 2 ``RULE_PATIENCE``
    windows more; 0: run all epochs; 1e-3: about 0.01 per value over a further 100 epochs at that
    rate, below the bound's spread over fit seeds), ``random_state``."""

    _parameter_constraints = {
        **RULES,
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "init_epochs": [Interval(Integral, 0, None, closed="left")],
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "local_learning_rate": [Interval(Real, 0, None, closed="neither")],
        "ng_step": [Interval(Real, 0, 1, closed="right")],
    }

    n_components: int = 5
    n_inducing: int = 30
    kernel: str = "rbf"
    batch_size: int = 1000
    max_iter: int = 600
    init_epochs: int = 2
    learning_rate: float = 0.05
    local_learning_rate: float = 0.2
    ng_step: float = 0.5
    snr: float = 100.0
    tol: float = 1e-3
    random_state: int | None = None

    # ------------------------------------------------------------------ fit
    def fit(self, Y, graph=None):
        self._validate_params()
        self._refuse_graph(graph)
        (Y,), _, q, m = self._check_views([Y])  # BayesianGPLVM's refusals (data, n_inducing <= N)
        self._fit(Y, q, m)
        self.ard_weights_ = self._view_ard()[0]
        return self

    @x64
    def _fit(self, Y, q, m):
        kind = self.kernel
        (Yc,), local, glob = self._start([Y], (kind,), q, m)  # the collapsed model's start
        N = Yc.shape[0]
        step = _batch_step(kind)
        rng = np.random.default_rng(self.random_state)
        # Adam state: the globals as one vector (hold_beta zeroes log beta's gradient), and per row
        # of q(X), each row with its own step count
        xg, unravel = ravel_pytree(glob)
        xg, tg, tl = np.asarray(xg), 0, np.zeros(N)
        mg, vg = np.zeros_like(xg), np.zeros_like(xg)
        ml, vl = ({k: np.zeros_like(v) for k, v in local.items()} for _ in range(2))
        hold = jax.tree_util.tree_map(np.ones_like, glob)
        hold["log_beta"] = np.zeros_like(glob["log_beta"])
        hold_beta = np.asarray(ravel_pytree(hold)[0])
        nb = max(1, int(round(N / min(self.batch_size, N))))
        kj = float(self.kmm_jitter_[0])  # K_mm's jitter in the data's units: the fit is scale-free
        qu, jitter, trace, converged = None, 0.0, [], False
        for epoch in range(int(self.max_iter)):
            est = 0.0
            for rows in np.array_split(rng.permutation(N), nb):
                rows = np.sort(rows)
                lb = {"mu": local["mu"][rows], "logS": local["logS"][rows]}
                scale = N / len(rows)
                for j in jitter_tries(jitter, f"the minibatch bound is not finite (epoch {epoch})"):
                    if qu is None:  # start q(u) at the first batch's optimum
                        S = np.exp(lb["logS"])
                        stats = batch_statistics(kind, lb["mu"], S, Yc[rows], glob)
                        qu = optimal_qu(kind, stats, glob, scale, j, kj)
                        if not np.all(np.isfinite(qu["P"])):
                            qu = None
                            continue
                    (F, stats), (g_lo, g_gl) = step(lb, glob, qu, Yc[rows], float(N), scale, j, kj)
                    if np.isfinite(float(F)):
                        jitter = j
                        break
                est += float(F) / nb
                # natural-gradient step on q(u) toward the batch's optimum
                # (its precision I + beta (N / B) C_B can lose definiteness to K_mm's conditioning
                # when N / B is large: escalate the jitter as for the bound)
                what = f"the optimal q(u) of a minibatch is not finite (epoch {epoch})"
                for j in jitter_tries(jitter, what):
                    target = optimal_qu(kind, stats, glob, scale, j, kj)
                    if np.all(np.isfinite(target["m"])) and np.all(np.isfinite(target["P"])):
                        jitter = j
                        break
                qu = uncollapsed.natural_step(qu, target["P"], target["m"], self.ng_step)
                # Adam on the globals (beta held during the first epochs) and the batch's q(x_n):
                # d F / d local_B is the full bound's gradient for those points times N / B
                tg += 1
                gg = np.asarray(ravel_pytree(g_gl)[0]) * (hold_beta if epoch < self.init_epochs else 1.0)
                xg, mg, vg = adam(xg, gg, mg, vg, tg, self.learning_rate)
                glob = unravel(xg)
                tl[rows] += 1
                for k, p in local.items():
                    g = np.asarray(g_lo[k]) / scale  # the full bound's gradient for these rows
                    p[rows], ml[k][rows], vl[k][rows] = adam(
                        p[rows], g, ml[k][rows], vl[k][rows], tl[rows][:, None], self.local_learning_rate
                    )
            trace.append(est)
            if window_plateau(trace, RULE_WINDOW, RULE_PATIENCE, self.tol, N * Yc.shape[1], self.init_epochs):
                converged = True
                break
        # the exact statistics of all points, in batches: the bound with q(u) as trained, then
        # q(u) at its optimum for them (a natural-gradient step of size one on the full data)
        S_all = np.exp(local["logS"])
        stats = None
        for rows in np.array_split(np.arange(N), nb):
            s = batch_statistics(kind, local["mu"][rows], S_all[rows], Yc[rows], glob)
            stats = s if stats is None else tuple(a + b for a, b in zip(stats, s, strict=True))
        stats = tuple(np.asarray(s) for s in stats)
        kl_x = float(kl_diag_gaussian(local["mu"], S_all))
        self.elbo_uncollapsed_ = float(uncollapsed_bound(kind, stats, glob, qu, N, 1.0, jitter, kj)) - kl_x
        qu = optimal_qu(kind, stats, glob, 1.0, jitter, kj)
        elbo = float(uncollapsed_bound(kind, stats, glob, qu, N, 1.0, jitter, kj)) - kl_x
        self.qu_ = qu
        # the final full pass counts as an iteration: the trace ends at the exact bound, as every
        # estimator's does (the sweep stores elbo_ and its trace side by side)
        self._set_fitted(local, glob, elbo, [*trace, elbo], converged, jitter, (Yc,))
        self._train_stats = {"views": [stats], "kl": kl_x}
        self._keep_posterior([(qu["m"], newpoints.covariance_of_precision(qu["P"]))])  # the svi's q(u)

    persisted = BaseCollapsedGPLVM.persisted + ("elbo_uncollapsed_",)

    # one view, the same fitted state as BayesianGPLVM's: its out-of-sample methods serve as they are
    transform = BayesianGPLVM.transform
    inverse_transform = BayesianGPLVM.inverse_transform
