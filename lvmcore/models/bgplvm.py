"""Bayesian GP-LVM with the collapsed variational bound (paper 004, section 3 and appendix A),
written for any number of views sharing one q(X) so that MRD (``lvmcore.models.mrd``) is the same
code with V > 1.

Each view v has centred data Y_v (N x D_v), noise precision beta_v, a kernel
(``lvmcore.kernels.euclidean``: RBF-ARD or linear-ARD) and inducing inputs Z_v (M x Q; shared by
all views by default). The bound is sum_v F_v - KL(q(X) || N(0, I)), F_v the collapsed bound of
``lvmcore.collapsed`` from the view's psi statistics. The statistics and the KL are sums over rows,
computed per row chunk and map-reduced (``lvmcore.chunks.RowChunks``).

Optimisation: L-BFGS over mu, log S, Z, log kernel parameters and log beta. The first
``init_iters`` iterations hold every beta_v at ``snr`` / var(Y_v) (the vargplvm toolbox's fixed
signal-to-noise start), so the fit cannot begin by explaining all variance as noise.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from numbers import Integral, Real

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import solve_triangular
from sklearn.utils._param_validation import Interval, StrOptions

from lvmcore import collapsed, newpoints
from lvmcore.checks import check_data
from lvmcore.chunks import JitStats, RowChunks
from lvmcore.kernels.euclidean import KERNELS, get_kernel
from lvmcore.linalg import (
    KMM_JITTER,
    MAX_JITTER,
    TIME_PRIOR_JITTER,
    TIME_PRIOR_START_RIDGE,
    NumericalError,
    jitter_escalation,
)
from lvmcore.models._base import LatentModel
from lvmcore.optim import lbfgs
from lvmcore.pca import pca_start
from lvmcore.precision import x64
from lvmcore.psi import psi_statistics
from lvmcore.psi.closed_form import kl_diag_gaussian, resolve_impl

KERNEL_NAMES = tuple(KERNELS)


# --------------------------------------------------------------------------- plain functions
@x64
def kmm(kind, Z, kp, jitter=KMM_JITTER):
    """K_mm of view kernel ``kind`` at the inducing inputs plus ``jitter`` on the diagonal: GPy's
    constant ``KMM_JITTER`` by default (the bounds compare with GPy's at unit data scale); a fit
    passes ``KMM_JITTER`` times its view's variance (:func:`kmm_jitters`), so the model does not
    depend on the data's units."""
    return get_kernel(kind).K(Z, Z, kp) + jitter * jnp.eye(Z.shape[0])


def kmm_jitters(views) -> np.ndarray:
    """The K_mm jitter of each (centred) view in its data's units: ``KMM_JITTER`` x its variance."""
    return np.array([KMM_JITTER * (float(np.var(Y)) or 1.0) for Y in views])


@x64
def view_bound(stats, Kmm, log_beta, N, D, rel_jitter=0.0):
    """F_v from the summed statistics (psi0, Psi1^T Y, Psi2, tr(Y^T Y)) (``lvmcore.collapsed``)."""
    psi0, psi1TY, psi2, trYY = stats
    t = collapsed.terms(Kmm, psi1TY, psi2, jnp.exp(log_beta), rel_jitter)
    return collapsed.bound(t, psi0, trYY, log_beta, N, D)


class ViewStats(JitStats):
    """Picklable per-chunk statistics of all views: (local rows, globals, data views) -> partial
    sums ``{"views": [(psi0, Psi1^T Y, Psi2, tr(Y^T Y)) per view], "kl": KL}``. ``impl`` picks the
    RBF psi statistics' implementation (``closed_form.rbf_psi``; None: the default)."""

    def __init__(self, kinds: tuple, shared_inducing: bool, with_kl: bool = True, impl: str | None = None):
        self.kinds = tuple(kinds)
        self.shared = bool(shared_inducing)
        self.with_kl = bool(with_kl)  # False under the temporal prior: its KL is not a row sum
        self.impl = impl

    def key(self):
        return (self.kinds, self.shared, self.with_kl, resolve_impl(self.impl))

    def build(self, primal=True):
        kernels = [get_kernel(k) for k in self.kinds]
        shared, with_kl, impl = self.shared, self.with_kl, self.impl

        def f(local, glob, data):
            mu, S = local["mu"], jnp.exp(local["logS"])
            out = []
            for v, kern in enumerate(kernels):
                Z = glob["Z"][0 if shared else v]
                kp = glob["kern"][v]
                p0, p1, p2 = psi_statistics(kern, mu, S, Z, kp, data[v], primal=primal, impl=impl)
                out.append((p0, p1, p2, jnp.sum(data[v] ** 2)))
            return {"views": out, "kl": kl_diag_gaussian(mu, S) if with_kl else jnp.zeros(())}

        return f

    def build_for_vjp(self):
        return self.build(primal=False)


@functools.lru_cache(maxsize=64)
def bound_objective(kinds: tuple, shared: bool, N: int, dims: tuple):
    """objective(stats, glob, rel_jitter, kmm_jitter) -> the total bound (:func:`total_bound` of
    these views), for ``RowChunks`` (``kmm_jitter``: one per view, :func:`kmm_jitters`; None:
    ``KMM_JITTER``); one object per setting, so that ``RowChunks`` compiles it once."""
    return functools.partial(total_bound, kinds, shared, N, dims)


@x64
def total_bound(kinds, shared, N, dims, stats, glob, rel_jitter=0.0, kmm_jitter=None):
    """sum_v F_v - KL from the summed statistics of all views."""
    F = -stats["kl"]
    for v, kind in enumerate(kinds):
        Z = glob["Z"][0 if shared else v]
        Kmm = kmm(kind, Z, glob["kern"][v], KMM_JITTER if kmm_jitter is None else kmm_jitter[v])
        F = F + view_bound(stats["views"][v], Kmm, glob["log_beta"][v], N, dims[v], rel_jitter)
    return F


def temporal_prior(times, sequences, jitter=TIME_PRIOR_JITTER):
    """Returns k(log_lengthscale) -> K_t (N, N): an RBF covariance over time stamps, block-diagonal
    over independent sequences (paper 004 section 4.3), with unit variance plus jitter."""
    t = np.asarray(times, dtype=np.float64)
    same = np.equal.outer(sequences, sequences).astype(np.float64)
    d2 = np.subtract.outer(t, t) ** 2

    @x64
    def K(log_ls):
        return same * jnp.exp(-0.5 * d2 / jnp.exp(2.0 * log_ls)) + jitter * jnp.eye(len(t))

    return K


@x64
def temporal_posterior(mubar, loglam, Kt):
    """q(x_q) = N(K mubar_q, (K^-1 + diag(lam_q))^-1) per latent dimension q (the reparameterisation
    of Damianou et al., paper 004 section 4.3). Returns (mu (N, Q), log diag S (N, Q),
    KL(q || prod_q N(0, K))); with B = I + Lam^1/2 K Lam^1/2 = L_B L_B^T, S = K - K Lam^1/2 B^-1
    Lam^1/2 K and KL = (tr(B^-1) + mubar^T K mubar - N + log|B|) / 2."""
    N = Kt.shape[0]

    def one(mb, ll):
        r = jnp.exp(0.5 * ll)
        LB = jnp.linalg.cholesky(jnp.eye(N) + r[:, None] * Kt * r[None, :])
        V = solve_triangular(LB, r[:, None] * Kt, lower=True)  # LB^-1 Lam^1/2 K
        diagS = jnp.diag(Kt) - jnp.sum(V * V, axis=0)
        LBinv = solve_triangular(LB, jnp.eye(N), lower=True)  # tr(B^-1) = ||LB^-1||_F^2
        kl = 0.5 * (-N + jnp.sum(LBinv * LBinv) + mb @ Kt @ mb + 2.0 * jnp.sum(jnp.log(jnp.diag(LB))))
        return Kt @ mb, jnp.log(diagS), kl

    mu, logS, kl = jax.vmap(one, in_axes=(1, 1), out_axes=(1, 1, 0))(mubar, loglam)
    return mu, logS, jnp.sum(kl)


# --------------------------------------------------------------------------- estimator core
def _principal_scores(views, r: int) -> np.ndarray:
    """The first r left singular vectors U (N, r) of the centred, per-column standardised and
    concatenated views (:func:`lvmcore.pca.pca_start` whitened): the PCA start of q(X) (paper 004
    initialises with PCA)."""
    Ys = np.hstack([(Y - Y.mean(0)) / np.where(Y.std(0) > 0, Y.std(0), 1.0) for Y in views])
    return pca_start(Ys, r, whiten=True, overwrite=True)


#: the parameter rules of the Bayesian GP-LVM's two fits (L-BFGS: with MRD; minibatch: bgplvm_svi)
RULES = {
    "n_components": [Interval(Integral, 1, None, closed="left")],
    "n_inducing": [Interval(Integral, 1, None, closed="left")],
    "kernel": [StrOptions(set(KERNEL_NAMES))],
    "max_iter": [Interval(Integral, 1, None, closed="left")],
    "snr": [Interval(Real, 0, None, closed="neither")],
    "tol": [Interval(Real, 0, None, closed="left")],
    "random_state": [Interval(Integral, 0, None, closed="left"), None],
}


class BaseCollapsedGPLVM(LatentModel):
    """The collapsed Bayesian GP-LVM of any number of views sharing one q(X): the shared
    implementation of :class:`BayesianGPLVM` (one view), :class:`~lvmcore.models.mrd.MRD` (several)
    and :class:`~lvmcore.models.bgplvm_svi.StochasticBayesianGPLVM` (the same model, fitted on
    minibatches): the checks of the views, the start, the L-BFGS fit, the fitted state, inference
    of new rows and prediction."""

    _parameter_constraints = {
        **RULES,
        "init_iters": [Interval(Integral, 0, None, closed="left")],
        "chunks": [Interval(Integral, 1, None, closed="left"), None],
    }
    #: one set of inducing inputs for all views (MRD's parameter; a single view has one set anyway)
    shared_inducing = True

    # ------------------------------------------------------------------ setup
    def _check_views(self, views):
        if not isinstance(views, (list, tuple)) or len(views) == 0:
            raise ValueError("views must be a non-empty list of (N, D_v) arrays")
        views = [check_data(Y, f"view {v}") for v, Y in enumerate(views)]
        ns = [Y.shape[0] for Y in views]
        if len(set(ns)) != 1:
            raise ValueError(
                f"all views must have the same number of rows (points), got {ns}; align the views"
            )
        q, m = int(self.n_components), int(self.n_inducing)
        kinds = [self.kernel] * len(views) if isinstance(self.kernel, str) else list(self.kernel)
        for k in kinds:
            if k not in KERNEL_NAMES:
                raise ValueError(f"kernel must be one of {KERNEL_NAMES} (or one per view), got {k!r}")
        if len(kinds) != len(views):
            raise ValueError(f"{len(kinds)} kernels given for {len(views)} views; give one per view")
        self.check_size(ns[0])
        return views, tuple(kinds), q, m

    def check_size(self, n_points: int) -> None:
        """Refuse more inducing inputs than points (``LatentModel.check_size``)."""
        self._validate_params()
        if int(self.n_inducing) > n_points:
            raise ValueError(
                f"Expected n_inducing <= n_samples, but n_samples = {n_points}, n_inducing = "
                f"{self.n_inducing}; use n_inducing <= {n_points}"
            )

    def _init_params(self, views, kinds, q, m):
        rng = np.random.default_rng(self.random_state)
        N = views[0].shape[0]
        mu = np.zeros((N, q))
        r = min(q, sum(Y.shape[1] for Y in views))
        mu[:, :r] = _principal_scores(views, r) * np.sqrt(N)
        if r < q:
            mu[:, r:] = 1e-2 * rng.standard_normal((N, q - r))
        mu = mu / mu[:, :r].std(0).max()
        logS = np.log(rng.uniform(0.05, 0.15, size=(N, q)))
        nz = 1 if self.shared_inducing else len(views)
        Z = np.stack([mu[rng.permutation(N)[:m]] + 1e-3 * rng.standard_normal((m, q)) for _ in range(nz)])
        kern = [get_kernel(kind).init(float(np.var(Y)), q) for Y, kind in zip(views, kinds, strict=True)]
        log_beta = np.array([np.log(self.snr / max(float(np.var(Y)), 1e-300)) for Y in views])
        return {"mu": mu, "logS": logS}, {"Z": Z, "kern": kern, "log_beta": log_beta}

    def _start(self, views, kinds, q, m):
        """Centred views (a tuple), their means, each view's K_mm jitter (:func:`kmm_jitters`) and
        the start of q(X) and of the globals (:meth:`_init_params`), from checked views."""
        self.kinds_ = kinds
        self.view_means_ = [Y.mean(0) for Y in views]
        Yc = tuple(Y - mu for Y, mu in zip(views, self.view_means_, strict=True))
        self.kmm_jitter_ = kmm_jitters(Yc)
        return Yc, *self._init_params(Yc, kinds, q, m)

    def _set_fitted(self, local, glob, elbo, trace, converged, jitter, Yc):
        """The fitted state both fits (L-BFGS, minibatch) set: q(X) and the globals as NumPy, the
        bound and its trace, the relative jitter added to K_mm (on top of ``kmm_jitter_``) and the
        centred views."""
        self.local_ = {k: np.asarray(v) for k, v in local.items()}
        self.glob_ = jax.tree_util.tree_map(np.asarray, glob)
        self.elbo_ = elbo
        self.elbo_trace_ = np.asarray(trace, dtype=np.float64)
        self.n_iter_ = len(self.elbo_trace_)
        self.converged_ = converged
        self.extra_jitter_ = jitter
        self.Y_train_ = Yc
        self.embedding_ = self.local_["mu"]
        self.embedding_var_ = np.exp(self.local_["logS"])

    # ------------------------------------------------------------------ fit
    @x64
    def _fit_views(self, views, times=None, sequences=None, client=None):
        views, kinds, q, m = self._check_views(views)
        Yc, local, glob = self._start(views, kinds, q, m)
        N = Yc[0].shape[0]
        dims = tuple(Y.shape[1] for Y in Yc)
        kj = self.kmm_jitter_
        temporal = times is not None
        if temporal:
            times = np.asarray(times, dtype=np.float64).ravel()
            if times.shape[0] != N or not np.all(np.isfinite(times)):
                raise ValueError(
                    f"times must be {N} finite time stamps (one per row), got shape {times.shape}"
                )
            sequences = np.zeros(N, dtype=int) if sequences is None else np.asarray(sequences).ravel()
            if sequences.shape[0] != N:
                raise ValueError(f"sequences must label each of the {N} rows, got shape {sequences.shape}")
            gaps = np.diff(np.sort(times))
            gaps = gaps[gaps > 0]
            Kfun = temporal_prior(times, sequences)
            glob["log_tl"] = np.log(5.0 * (np.median(gaps) if gaps.size else 1.0))
            K0 = np.asarray(Kfun(glob["log_tl"]))
            local = {
                "mubar": np.linalg.solve(K0 + TIME_PRIOR_START_RIDGE * np.eye(N), local["mu"]),
                "loglam": np.full_like(local["mu"], np.log(10.0)),
            }

            def transform(lo, log_tl):
                mu, logS, kl = temporal_posterior(lo["mubar"], lo["loglam"], Kfun(log_tl))
                return {"mu": mu, "logS": logS}, kl

            transform = jax.jit(transform)
            self.times_, self.sequences_ = times, sequences
        stats_fn = ViewStats(kinds, self.shared_inducing, with_kl=not temporal)
        runner = RowChunks(
            stats_fn,
            bound_objective(kinds, bool(self.shared_inducing), N, dims),
            Yc,
            self.chunks,
            origin=list(zip(views, self.view_means_, strict=True)),  # stored views: read on the workers
            client=client,
        )
        x, unravel = ravel_pytree((local, glob))
        x = np.asarray(x)
        state = {"jitter": 0.0, "trace": [], "last": None}

        def evaluate(lo, gl, jitter):
            if not temporal:
                return runner.value_and_grad(lo, gl, jitter, kj)
            (ql, kl), vjp = jax.vjp(transform, lo, gl["log_tl"])
            val, g_ql, g_gl = runner.value_and_grad(ql, gl, jitter, kj)
            g_lo, g_tl = vjp((g_ql, -1.0))
            g_gl = dict(g_gl)
            g_gl["log_tl"] = np.asarray(g_gl.get("log_tl", 0.0)) + np.asarray(g_tl)
            return val - float(kl), jax.tree_util.tree_map(np.asarray, g_lo), g_gl

        def fg(x):
            lo, gl = unravel(x)
            # the jitter on K_mm in use, escalated where the bound is not finite (lvmcore.linalg's schedule)
            for j in jitter_escalation(state["jitter"]):
                val, g_lo, g_gl = evaluate(lo, gl, j)
                if np.isfinite(val):
                    state["jitter"] = j
                    break
            else:
                if state["last"] is None:
                    raise NumericalError(
                        "the bound is not finite at the initial parameters even with jitter "
                        f"{MAX_JITTER:g} x mean diag(K_mm) (K_mm or A not positive definite)",
                        name="K_mm",
                    )
                # a trial point of the line search left the valid region (overflow): reject it
                return np.inf, np.zeros_like(x)
            g, _ = ravel_pytree((g_lo, g_gl))
            state["last"] = val
            return -val, -np.asarray(g)

        def cb(*_):
            state["trace"].append(state["last"])

        # locate log_beta entries robustly: flatten a tree with a marker only in log_beta
        zeros = jax.tree_util.tree_map(np.zeros_like, (local, glob))
        zeros[1]["log_beta"] = np.ones_like(glob["log_beta"])
        beta_mask = np.asarray(ravel_pytree(zeros)[0]) == 1.0
        n_values = N * sum(dims)
        if self.init_iters > 0:  # the noise held at snr: its bounds pin log_beta
            bounds = [(xi, xi) if b else (None, None) for xi, b in zip(x, beta_mask, strict=True)]
            x = lbfgs(fg, x, n_values=n_values, max_iter=int(self.init_iters), tol=0.0, gtol=0.0,
                      bounds=bounds, callback=cb).x  # fmt: skip
        # restarted while iterations remain and a run still gained more than tol per data value:
        # L-BFGS-B's relative-reduction test also fires on one short line-search step after the
        # noise is released, with a stale curvature memory (lvmcore.optim.lbfgs)
        r = lbfgs(fg, x, n_values=n_values, max_iter=int(self.max_iter), tol=self.tol, callback=cb)
        lo, gl = unravel(r.x)
        if temporal:
            self.temporal_params_ = jax.tree_util.tree_map(np.asarray, lo)
            lo = transform(lo, gl["log_tl"])[0]
        elbo = float(-fg(r.x)[0])
        # one trace entry per L-BFGS iteration (both phases); the bound at the returned point is elbo_
        self._set_fitted(lo, gl, elbo, state["trace"], r.converged, state["jitter"], Yc)
        self._train_stats = runner.stats(self.local_, self.glob_)
        self._keep_posterior(self._optimal_qu())
        return self

    def _optimal_qu(self) -> list:
        """Each view's q(u) at the collapsed optimum for the training statistics (whitened: mean,
        covariance; :func:`lvmcore.newpoints.posterior_u`)."""
        return [
            newpoints.posterior_u(
                kmm(kind, self._Z(v), self.glob_["kern"][v], self.kmm_jitter_[v]),
                self._train_stats["views"][v],
                self.glob_["log_beta"][v],
                self.extra_jitter_,
            )  # fmt: skip
            for v, kind in enumerate(self.kinds_)
        ]

    # ------------------------------------------------------------------ learned quantities
    def _view_ard(self):
        return np.stack(
            [get_kernel(k).ard(kp) for k, kp in zip(self.kinds_, self.glob_["kern"], strict=True)]
        )

    @property
    def noise_variance_(self):
        return np.exp(-np.asarray(self.glob_["log_beta"]))

    # ------------------------------------------------------------------ the model as arrays
    persisted = LatentModel.persisted + (
        "elbo_trace_", "ard_weights_", "kinds_", "kmm_jitter_", "extra_jitter_", "score_reference_",
    )  # fmt: skip

    def _keep_posterior(self, qu) -> None:
        """Keep each view's whitened q(u) (``qu``: [(mean (M, D_v), covariance (M, M))], the
        collapsed optimum or the minibatch fit's) and derive what new rows need
        (:meth:`_derive`). The fits' last act; everything out of sample reads only what
        ``to_arrays`` keeps, so a model loaded from them answers exactly as this one."""
        self.qu_mean_ = [np.asarray(m, dtype=np.float64) for m, _ in qu]
        self.qu_cov_ = [np.asarray(c, dtype=np.float64) for _, c in qu]
        self._derive()

    def _derive(self) -> None:
        """Each view's :class:`lvmcore.newpoints.ViewTerms` and its predictive means at the training
        rows' q(x_n) (the start candidates of new rows), from the kept state."""
        self._terms = [
            newpoints.view_terms(
                kmm(kind, self._Z(v), self.glob_["kern"][v], self.kmm_jitter_[v]),
                self._Z(v),
                self.glob_["kern"][v],
                self.glob_["log_beta"][v],
                self.qu_mean_[v],
                self.qu_cov_[v],
                self.extra_jitter_,
            )  # fmt: skip
            for v, kind in enumerate(self.kinds_)
        ]
        self._recon = [
            newpoints.reconstruction(kind, t, self.embedding_, self.embedding_var_)
            for kind, t in zip(self.kinds_, self._terms, strict=True)
        ]

    def to_arrays(self) -> tuple[dict, dict]:
        """``LatentModel.to_arrays`` plus the globals, view means and q(u) per view, flattened:
        ``Z``, ``log_beta``, ``kern<v>_<name>``, ``view_mean<v>``, ``qu_mean<v>``, ``qu_cov<v>``."""
        arrays, params = super().to_arrays()
        arrays["Z"], arrays["log_beta"] = np.asarray(self.glob_["Z"]), np.asarray(self.glob_["log_beta"])
        for v, kp in enumerate(self.glob_["kern"]):
            arrays.update({f"kern{v}_{k}": np.asarray(a) for k, a in kp.items()})
            arrays[f"view_mean{v}"] = np.asarray(self.view_means_[v])
            arrays[f"qu_mean{v}"], arrays[f"qu_cov{v}"] = self.qu_mean_[v], self.qu_cov_[v]
        return arrays, params

    def _restore(self) -> None:
        self.kinds_ = tuple(self.kinds_)
        state = vars(self)
        pop = state.pop
        kern = []
        for v in range(len(self.kinds_)):
            head = f"kern{v}_"
            kern.append({k[len(head) :]: pop(k) for k in sorted(state) if k.startswith(head)})
        self.glob_ = {"Z": pop("Z"), "kern": kern, "log_beta": pop("log_beta")}
        V = range(len(self.kinds_))
        self.view_means_ = [pop(f"view_mean{v}") for v in V]
        self._keep_posterior([(pop(f"qu_mean{v}"), pop(f"qu_cov{v}")) for v in V])

    # ------------------------------------------------------------------ inference and prediction
    def _Z(self, v):
        return np.asarray(self.glob_["Z"][0 if self.shared_inducing else v])

    def _observed(self, observed) -> dict:
        """{view: centred (n, D_v) rows} from {view: raw rows}, checked."""
        self._check_fitted()
        if isinstance(observed, (list, tuple)):
            observed = dict(enumerate(observed))
        if not isinstance(observed, dict) or not observed:
            raise ValueError("observed must name at least one view, e.g. {0: Y0_new}")
        V, obs = len(self.kinds_), {}
        for v, Yn in sorted(observed.items()):
            if not isinstance(v, (int, np.integer)) or not 0 <= v < V:
                raise ValueError(f"view index {v!r} out of range; this model has views 0..{V - 1}")
            Yn = check_data(Yn, f"view {v}")
            D = self.view_means_[v].shape[0]
            if Yn.shape[1] != D:
                raise ValueError(f"view {v} has {Yn.shape[1]} columns, the model was fitted on {D}")
            obs[int(v)] = Yn - self.view_means_[v]
        ns = {Y.shape[0] for Y in obs.values()}
        if len(ns) != 1:
            raise ValueError(f"the observed views have different numbers of rows {sorted(ns)}")
        return obs

    def infer(self, observed, max_iter: int = newpoints.MAX_ITER, return_info: bool = False):
        """q(x*) = N(mu*, diag S*) of new rows observed in a subset of views (paper 004 appendix B),
        each row its own problem: its uncollapsed bound with the fitted q(u) held fixed, maximised
        by per-row damped Newton (``lvmcore.newpoints``). ``observed`` maps view index -> (N*, D_v) array
        (raw units; a list: every view). Returns (mu*, S*), and with ``return_info`` a dict of the
        rows' bounds ``bound``, ``n_iter`` and ``converged``."""
        obs = self._observed(observed)
        vs = list(obs)
        mu, S, F, it, conv = newpoints.infer_rows(
            [self.kinds_[v] for v in vs], [self._terms[v] for v in vs], [obs[v] for v in vs],
            [self._recon[v] for v in vs], self.embedding_, self.embedding_var_, max_iter,
        )  # fmt: skip
        return (mu, S, {"bound": F, "n_iter": it, "converged": conv}) if return_info else (mu, S)

    def new_point_bound(self, observed, mu, S) -> np.ndarray:
        """Each new row's bound F* (n,) at q(x*) = N(mu, diag S) (what :meth:`infer` maximises)."""
        obs = self._observed(observed)
        vs = list(obs)
        terms = [self._terms[v] for v in vs]
        return newpoints.cell_bound([self.kinds_[v] for v in vs], terms, [obs[v] for v in vs], mu, S)

    def predict_view(self, mu, S, view: int = 0):
        """Predictive mean (N*, D_v) and variance (N*, D_v) of view ``view`` at q(x*) = N(mu, diag S)
        (paper 004 appendix C, uncertain inputs; the noise included), in the data's original units,
        from the kept q(u)."""
        self._check_fitted()
        mu, S = np.atleast_2d(np.asarray(mu, float)), np.atleast_2d(np.asarray(S, float))
        mean, var = newpoints.cell_moments(self.kinds_[view], self._terms[view], mu, S)
        return mean + self.view_means_[view], var

    @staticmethod
    def _as_observed(Y_new) -> dict:
        """{view: rows} of new rows given as a dict, a list of every view, or one array (view 0)."""
        observed = Y_new if isinstance(Y_new, (dict, list, tuple)) else {0: Y_new}
        return dict(enumerate(observed)) if isinstance(observed, (list, tuple)) else observed

    def _density_at(self, observed: dict, mu, S) -> np.ndarray:
        """Each row's log predictive density of its observed views at q(x*) = N(mu, diag S)."""
        out = np.zeros(len(mu))
        for v, Y in sorted(observed.items()):
            Y = check_data(Y, f"view {v}")
            mean, var = self.predict_view(mu, S, int(v))
            out += -0.5 * np.sum(np.log(2.0 * np.pi * var) + (Y - mean) ** 2 / var, axis=1)
        return out

    def score_samples(self, Y_new) -> np.ndarray:
        """Each new row's log predictive density of its observed views at its q(x*): sum over the
        views and columns of log N(y; mean, var), the predictive moments of :meth:`predict_view`."""
        observed = self._as_observed(Y_new)
        mu, S = self.infer(observed)
        return self._density_at(observed, mu, S)

    def map_points(self, Y_new):
        """(mu*, S*, mapping score) of new rows from one solve of each row's q(x*) (:meth:`infer`):
        its mean and variance (``transform``'s) and the score of :meth:`score_samples` at it,
        standardised against the reference scores (refused before the solve without them)."""
        observed = self._as_observed(Y_new)
        self.reference_pair(observed)
        mu, S = self.infer(observed)
        return mu, S, self.standardised(self._density_at(observed, mu, S), observed)


@dataclass(kw_only=True, eq=False, repr=False)
class BayesianGPLVM(BaseCollapsedGPLVM):
    """Bayesian GP-LVM (one view). ``fit(Y)``; ``ard_weights_`` (Q,) are the kernel's input
    sensitivities (RBF: variance / lengthscale^2; linear: the ARD variances).

    Parameters: ``n_components`` Q, ``n_inducing`` M, ``kernel`` ("rbf" or "linear"), ``max_iter``
    L-BFGS iterations after the ``init_iters`` with the noise held at ``snr``, ``tol`` (the bound's
    gain per data value at which a fit stops, :func:`lvmcore.optim.lbfgs`), ``chunks`` (rows per
    chunk of the psi statistics; None: in process), ``random_state``."""

    n_components: int = 5
    n_inducing: int = 30
    kernel: str = "rbf"
    max_iter: int = 500
    init_iters: int = 100
    snr: float = 100.0
    tol: float = 1e-9
    chunks: int | None = None
    random_state: int | None = None

    def fit(self, Y, graph=None, *, times=None, sequences=None, client=None):
        """``times`` (N,) switches on the temporal prior (paper 004 section 4.3): X's columns are GP
        functions of time (RBF, learned time scale), independent between ``sequences`` labels.
        ``client``: the Dask client the row chunks (``chunks``) run on (None: in process)."""
        self._validate_params()
        self._refuse_graph(graph)
        self._fit_views([Y], times, sequences, client)
        self.ard_weights_ = self._view_ard()[0]
        return self

    def transform(self, Y_new, return_var: bool = False, max_iter: int = newpoints.MAX_ITER):
        """Means (n, Q) of q(x*) for new rows (and their variances (n, Q) with ``return_var``),
        each row on its own (:meth:`infer`)."""
        mu, S = self.infer({0: Y_new}, max_iter=max_iter)
        return (mu, S) if return_var else mu

    def inverse_transform(self, X, return_var: bool = False):
        """Predictive mean (n, D) in data space at latent points X (and its variance, the noise
        included, with ``return_var``)."""
        self._check_fitted()
        X = np.atleast_2d(np.asarray(X, float))
        mean, var = self.predict_view(X, np.zeros_like(X), 0)
        return (mean, var) if return_var else mean
