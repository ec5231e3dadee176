"""Bayesian GP-LVM with the collapsed variational bound (paper 004, section 4.2 and appendix A),
written for any number of views sharing one q(X) so that MRD (``lvmcore.models.mrd``) is the same
code with V > 1.

For view v with N x D_v data Y_v (centred), noise precision beta_v, kernel k_v (RBF-ARD or
linear-ARD) and inducing inputs Z_v (M x Q; shared by all views by default), the bound is

    F_v = -N D/2 log 2 pi + N D/2 log beta - beta/2 tr(Y^T Y) - D/2 log|A|
          + beta^2/2 ||L_A^-1 L_m^-1 Psi1^T Y||^2 - beta D/2 psi0 + beta D/2 tr(L_m^-1 Psi2 L_m^-T)

with L_m = chol(K_mm + JITTER I), A = I + beta L_m^-1 Psi2 L_m^-T, and the total bound is
sum_v F_v - KL(q(X) || N(0, I)). The psi statistics and KL are sums over rows; they are computed per
row chunk and map-reduced (``lvmcore.psi.reduce.RowChunks``), with gradients by ``jax.vjp`` per chunk.

Optimisation: L-BFGS over mu, log S, Z, log kernel parameters and log beta. The first
``init_iters`` iterations hold every beta_v at ``snr`` / var(Y_v) (the vargplvm toolbox's fixed
signal-to-noise start), so the fit cannot begin by explaining all variance as noise.
"""

from __future__ import annotations

import functools

import numpy as np

from lvmcore.checks import check_data, check_positive, check_positive_int
from lvmcore.psi.reduce import JitStats

JITTER = 1e-8  # added to K_mm's diagonal (GPy 1.15 VarDTC const_jitter, so bounds compare exactly)
MAX_JITTER = 1e-1  # escalation (relative to K_mm's mean diagonal) stops here with a NumericalError
_KERNELS = ("rbf", "linear")


def _jax():
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


# --------------------------------------------------------------------------- plain functions
def kernel_params(kind, kp):
    import jax.numpy as jnp

    if kind == "rbf":
        return jnp.exp(kp["log_var"]), jnp.exp(kp["log_ls"])
    return (jnp.exp(kp["log_vars"]),)


def kmm(kind, Z, kp):
    import jax.numpy as jnp

    from lvmcore.psi.closed_form import linear_K, rbf_K

    K = rbf_K(Z, Z, *kernel_params(kind, kp)) if kind == "rbf" else linear_K(Z, Z, *kernel_params(kind, kp))
    return K + JITTER * jnp.eye(Z.shape[0])


#: entries of the largest (rows, M (M + 1) / 2) intermediate of the RBF psi2 per row block: small
#: blocks keep each block's exponentials in cache (they are recomputed, not stored, for the gradient)
PSI_BLOCK_ENTRIES = 327_680


def psi_block(M: int) -> int:
    """Rows per block of the RBF psi statistics (256 at M = 50): a multiple of 16 in [16, 1024]."""
    rows = PSI_BLOCK_ENTRIES // (M * (M + 1) // 2)
    return int(np.clip(rows // 16 * 16, 16, 1024))


def view_psi(kind, mu, S, Z, kp, Y, primal=True):
    from lvmcore.psi.closed_form import linear_psi, rbf_psi

    if kind == "rbf":
        return rbf_psi(mu, S, Z, *kernel_params(kind, kp), Y, block_size=psi_block(Z.shape[0]), primal=primal)
    return linear_psi(mu, S, Z, *kernel_params(kind, kp), Y)


def view_bound(stats, Kmm, log_beta, N, D, extra_jitter=0.0):
    """F_v from the summed statistics (psi0, Psi1^T Y, Psi2, tr(Y^T Y))."""
    import jax.numpy as jnp
    from jax.scipy.linalg import solve_triangular

    psi0, psi1TY, psi2, trYY = stats
    beta = jnp.exp(log_beta)
    M = Kmm.shape[0]
    # escalated jitter is relative to K_mm's mean diagonal (a linear kernel's K_mm has rank Q < M)
    Lm = jnp.linalg.cholesky(Kmm + extra_jitter * jnp.mean(jnp.diag(Kmm)) * jnp.eye(M))
    tmp = solve_triangular(Lm, psi2, lower=True)
    C = solve_triangular(Lm, tmp.T, lower=True)
    A = jnp.eye(M) + beta * C
    LA = jnp.linalg.cholesky(A)
    c = solve_triangular(LA, solve_triangular(Lm, psi1TY, lower=True), lower=True)
    return (
        -0.5 * N * D * jnp.log(2 * jnp.pi)
        + 0.5 * N * D * log_beta
        - 0.5 * beta * trYY
        - D * jnp.sum(jnp.log(jnp.diag(LA)))
        + 0.5 * beta**2 * jnp.sum(c * c)
        - 0.5 * beta * D * psi0
        + 0.5 * beta * D * jnp.trace(C)
    )


class ViewStats(JitStats):
    """Picklable per-chunk statistics of all views: (local rows, globals, data views) -> partial
    sums ``{"views": [(psi0, Psi1^T Y, Psi2, tr(Y^T Y)) per view], "kl": KL}``."""

    def __init__(self, kinds: tuple, shared_inducing: bool, with_kl: bool = True):
        self.kinds = tuple(kinds)
        self.shared = bool(shared_inducing)
        self.with_kl = bool(with_kl)  # False under the temporal prior: its KL is not a row sum

    def key(self):
        return (self.kinds, self.shared, self.with_kl)

    def build(self, primal=True):
        import jax.numpy as jnp

        from lvmcore.psi.closed_form import kl_diag_gaussian

        kinds, shared, with_kl = self.kinds, self.shared, self.with_kl

        def f(local, glob, data):
            mu, S = local["mu"], jnp.exp(local["logS"])
            out = []
            for v, kind in enumerate(kinds):
                Z = glob["Z"][0 if shared else v]
                p0, p1, p2 = view_psi(kind, mu, S, Z, glob["kern"][v], data[v], primal=primal)
                out.append((p0, p1, p2, jnp.sum(data[v] ** 2)))
            return {"views": out, "kl": kl_diag_gaussian(mu, S) if with_kl else jnp.zeros(())}

        return f

    def build_for_vjp(self):
        return self.build(primal=False)


@functools.lru_cache(maxsize=64)
def bound_objective(kinds: tuple, shared: bool, N: int, dims: tuple):
    """objective(stats, glob, extra_jitter) -> the total bound, for ``RowChunks``."""

    def obj(stats, glob, extra_jitter=0.0):
        return total_bound(kinds, shared, N, dims, stats, glob, extra_jitter)

    return obj


def total_bound(kinds, shared, N, dims, stats, glob, extra_jitter=0.0):
    F = -stats["kl"]
    for v, kind in enumerate(kinds):
        Z = glob["Z"][0 if shared else v]
        F = F + view_bound(
            stats["views"][v], kmm(kind, Z, glob["kern"][v]), glob["log_beta"][v], N, dims[v], extra_jitter
        )
    return F


def temporal_prior(times, sequences, jitter=1e-6):
    """Returns k(log_lengthscale) -> K_t (N, N): an RBF covariance over time stamps, block-diagonal
    over independent sequences (paper 004 section 4.3), with unit variance plus jitter."""
    import jax.numpy as jnp

    t = np.asarray(times, dtype=np.float64)
    same = np.equal.outer(sequences, sequences).astype(np.float64)
    d2 = np.subtract.outer(t, t) ** 2

    def K(log_ls):
        return same * jnp.exp(-0.5 * d2 / jnp.exp(2.0 * log_ls)) + jitter * jnp.eye(len(t))

    return K


def temporal_posterior(mubar, loglam, Kt):
    """q(x_q) = N(K mubar_q, (K^-1 + diag(lam_q))^-1) per latent dimension q (the reparameterisation
    of Damianou et al.). Returns (mu (N, Q), log diag S (N, Q), KL(q || prod_q N(0, K)))."""
    import jax
    import jax.numpy as jnp
    from jax.scipy.linalg import solve_triangular

    N = Kt.shape[0]

    def one(mb, ll):
        r = jnp.exp(0.5 * ll)
        B = jnp.eye(N) + r[:, None] * Kt * r[None, :]
        LB = jnp.linalg.cholesky(B)
        V = solve_triangular(LB, r[:, None] * Kt, lower=True)  # LB^-1 Lam^1/2 K
        diagS = jnp.diag(Kt) - jnp.sum(V * V, axis=0)
        LBinv = solve_triangular(LB, jnp.eye(N), lower=True)
        kl = 0.5 * (-N + jnp.sum(LBinv * LBinv) + mb @ Kt @ mb + 2.0 * jnp.sum(jnp.log(jnp.diag(LB))))
        return Kt @ mb, jnp.log(diagS), kl

    mu, logS, kl = jax.vmap(one, in_axes=(1, 1), out_axes=(1, 1, 0))(mubar, loglam)
    return mu, logS, jnp.sum(kl)


# --------------------------------------------------------------------------- estimator core
class _CollapsedGPLVM:
    """Shared implementation of BayesianGPLVM (one view) and MRD (several)."""

    def __init__(
        self,
        n_components: int = 5,
        n_inducing: int = 30,
        kernel: str = "rbf",
        *,
        shared_inducing: bool = True,
        max_iter: int = 500,
        init_iters: int = 100,
        snr: float = 100.0,
        tol: float = 1e-9,
        chunks: int | None = None,
        random_state=None,
    ):
        self.n_components = n_components
        self.n_inducing = n_inducing
        self.kernel = kernel
        self.shared_inducing = shared_inducing
        self.max_iter = max_iter
        self.init_iters = init_iters
        self.snr = snr
        self.tol = tol
        self.chunks = chunks
        self.random_state = random_state

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
        q = check_positive_int(self.n_components, "n_components")
        m = check_positive_int(self.n_inducing, "n_inducing")
        check_positive_int(self.max_iter, "max_iter")
        check_positive(self.snr, "snr")
        kinds = [self.kernel] * len(views) if isinstance(self.kernel, str) else list(self.kernel)
        for k in kinds:
            if k not in _KERNELS:
                raise ValueError(f"kernel must be one of {_KERNELS}, got {k!r}")
        if len(kinds) != len(views):
            raise ValueError(f"{len(kinds)} kernels given for {len(views)} views; give one per view")
        if m > ns[0]:
            raise ValueError(
                f"n_inducing={m} exceeds the number of points ({ns[0]}); use n_inducing <= {ns[0]}"
            )
        return views, tuple(kinds), q, m

    def _init_params(self, views, kinds, q, m):
        rng = np.random.default_rng(self.random_state)
        N = views[0].shape[0]
        Ycat = np.hstack([(Y - Y.mean(0)) / (Y.std(0) + 1e-12) for Y in views])
        U, s, _ = np.linalg.svd(Ycat - Ycat.mean(0), full_matrices=False)
        mu = np.zeros((N, q))
        r = min(q, U.shape[1])
        mu[:, :r] = U[:, :r] * np.sqrt(N)
        if r < q:
            mu[:, r:] = 1e-2 * rng.standard_normal((N, q - r))
        mu = mu / mu[:, :r].std(0).max()
        logS = np.log(rng.uniform(0.05, 0.15, size=(N, q)))
        nz = 1 if self.shared_inducing else len(views)
        Z = np.stack([mu[rng.permutation(N)[:m]] + 1e-3 * rng.standard_normal((m, q)) for _ in range(nz)])
        kern = []
        for Y, kind in zip(views, kinds, strict=True):
            var = float(np.var(Y))
            if kind == "rbf":
                kern.append({"log_var": np.log(var), "log_ls": np.zeros(q)})
            else:
                kern.append({"log_vars": np.full(q, np.log(var / q))})
        log_beta = np.array([np.log(self.snr / max(float(np.var(Y)), 1e-300)) for Y in views])
        return {"mu": mu, "logS": logS}, {"Z": Z, "kern": kern, "log_beta": log_beta}

    # ------------------------------------------------------------------ fit
    def _fit_views(self, views, times=None, sequences=None):
        try:
            self._optimise_views(views, times, sequences)
        finally:
            from lvmcore.psi import native

            native.release_store()  # the pair exponentials kept between forward and backward passes

    def _optimise_views(self, views, times=None, sequences=None):
        from jax.flatten_util import ravel_pytree
        from scipy.optimize import minimize

        from lvmcore.linalg import NumericalError
        from lvmcore.psi.reduce import RowChunks

        views, kinds, q, m = self._check_views(views)
        self.kinds_ = kinds
        self.view_means_ = [Y.mean(0) for Y in views]
        Yc = tuple(Y - mu for Y, mu in zip(views, self.view_means_, strict=True))
        N = Yc[0].shape[0]
        dims = tuple(Y.shape[1] for Y in Yc)
        local, glob = self._init_params(Yc, kinds, q, m)
        temporal = times is not None
        if temporal:
            import jax

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
                "mubar": np.linalg.solve(K0 + 1e-3 * np.eye(N), local["mu"]),
                "loglam": np.full_like(local["mu"], np.log(10.0)),
            }

            def transform(lo, log_tl):
                mu, logS, kl = temporal_posterior(lo["mubar"], lo["loglam"], Kfun(log_tl))
                return {"mu": mu, "logS": logS}, kl

            transform = jax.jit(transform)
            self.times_, self.sequences_ = times, sequences
        stats_fn = ViewStats(kinds, self.shared_inducing, with_kl=not temporal)
        runner = RowChunks(
            stats_fn, bound_objective(kinds, bool(self.shared_inducing), N, dims), Yc, self.chunks
        )
        x0, unravel = ravel_pytree((local, glob))
        x0 = np.asarray(x0)
        state = {"jitter": 0.0, "trace": [], "last": None, "rejected": 0}

        def evaluate(lo, gl, jitter):
            if not temporal:
                return runner.value_and_grad(lo, gl, jitter)
            (ql, kl), vjp = jax.vjp(transform, lo, gl["log_tl"])
            val, g_ql, g_gl = runner.value_and_grad(ql, gl, jitter)
            g_lo, g_tl = vjp((g_ql, -1.0))
            g_gl = dict(g_gl)
            g_gl["log_tl"] = np.asarray(g_gl.get("log_tl", 0.0)) + np.asarray(g_tl)
            return val - float(kl), jax.tree_util.tree_map(np.asarray, g_lo), g_gl

        def fg(x):
            lo, gl = unravel(x)
            val, g_lo, g_gl = evaluate(lo, gl, state["jitter"])
            if not np.isfinite(val):
                # escalate the jitter (relative to K_mm's mean diagonal) while that helps
                j = state["jitter"]
                while not np.isfinite(val) and j < MAX_JITTER:
                    j = max(10 * j, 1e-8)
                    val, g_lo, g_gl = evaluate(lo, gl, j)
                if np.isfinite(val):
                    state["jitter"] = j
                elif state["last"] is None:
                    raise NumericalError(
                        "the bound is not finite at the initial parameters even with jitter "
                        f"{MAX_JITTER:g} x mean diag(K_mm) (K_mm or A not positive definite)",
                        name="K_mm",
                    )
                else:
                    # a trial point of the line search left the valid region (overflow): reject it
                    state["rejected"] += 1
                    return np.inf, np.zeros_like(x)
            g, _ = ravel_pytree((g_lo, g_gl))
            state["last"] = val
            return -val, -np.asarray(g)

        def cb(*_):
            state["trace"].append(state["last"])

        # locate log_beta entries robustly: flatten a tree with a marker only in log_beta
        import jax

        zeros = jax.tree_util.tree_map(np.zeros_like, (local, glob))
        zeros[1]["log_beta"] = np.ones_like(glob["log_beta"])
        marker = ravel_pytree(zeros)[0]
        beta_mask = np.asarray(marker) == 1.0
        x = x0
        if self.init_iters > 0:
            bounds = [(xi, xi) if b else (None, None) for xi, b in zip(x, beta_mask, strict=True)]
            r = minimize(
                fg,
                x,
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                callback=cb,
                options={"maxiter": int(self.init_iters), "ftol": 0.0, "gtol": 0.0},
            )
            x = r.x
        r = minimize(
            fg,
            x,
            jac=True,
            method="L-BFGS-B",
            callback=cb,
            options={"maxiter": int(self.max_iter), "ftol": self.tol, "gtol": 1e-8},
        )
        lo, gl = unravel(r.x)
        if temporal:
            self.temporal_params_ = jax.tree_util.tree_map(np.asarray, lo)
            lo = transform(lo, gl["log_tl"])[0]
        self.local_, self.glob_ = (
            {k: np.asarray(v) for k, v in lo.items()},
            jax.tree_util.tree_map(np.asarray, gl),
        )
        self.elbo_ = float(-fg(r.x)[0])
        self.elbo_trace_ = np.asarray(state["trace"] + [self.elbo_])
        self.n_iter_ = len(state["trace"])
        self.extra_jitter_ = state["jitter"]  # relative to K_mm's mean diagonal, on top of JITTER
        self.Y_train_ = Yc
        self.embedding_ = self.local_["mu"]
        self.embedding_var_ = np.exp(self.local_["logS"])
        self._train_stats = runner.stats(self.local_, self.glob_)
        return self

    # ------------------------------------------------------------------ learned quantities
    def _view_ard(self):
        out = []
        for kind, kp in zip(self.kinds_, self.glob_["kern"], strict=True):
            if kind == "rbf":
                out.append(np.exp(kp["log_var"]) / np.exp(2 * np.asarray(kp["log_ls"])))
            else:
                out.append(np.exp(np.asarray(kp["log_vars"])))
        return np.stack(out)

    @property
    def noise_variance_(self):
        return np.exp(-np.asarray(self.glob_["log_beta"]))

    def _check_fitted(self):
        if not hasattr(self, "glob_"):
            raise ValueError(f"this {type(self).__name__} instance is not fitted yet; call fit first")

    # ------------------------------------------------------------------ inference and prediction
    def _Z(self, v):
        return np.asarray(self.glob_["Z"][0 if self.shared_inducing else v])

    def infer(self, observed: dict, max_iter: int = 300):
        """q(x*) for new rows observed in a subset of views (paper 004 appendix B): maximise the
        bound of training plus new rows over the new rows' mu*, S* with everything else fixed (all
        new rows in one vectorised optimisation). ``observed`` maps view index -> (N*, D_v) array
        (raw units). Returns (mu*, S*)."""
        self._check_fitted()
        jax = _jax()
        import jax.numpy as jnp
        from scipy.optimize import minimize

        from lvmcore.psi.closed_form import kl_diag_gaussian

        if not observed:
            raise ValueError("observed must name at least one view, e.g. {0: Y0_new}")
        V = len(self.kinds_)
        obs = {}
        for v, Yn in observed.items():
            if not isinstance(v, (int, np.integer)) or not 0 <= v < V:
                raise ValueError(f"view index {v!r} out of range; this model has views 0..{V - 1}")
            Yn = check_data(Yn, f"view {v}")
            if Yn.shape[1] != self.Y_train_[v].shape[1]:
                raise ValueError(
                    f"view {v} has {Yn.shape[1]} columns, the model was fitted on {self.Y_train_[v].shape[1]}"
                )
            obs[int(v)] = Yn - self.view_means_[v]
        ns = {Y.shape[0] for Y in obs.values()}
        if len(ns) != 1:
            raise ValueError(f"the observed views have different numbers of rows {sorted(ns)}")
        n_new = ns.pop()
        # start each new row at the latent mean of its nearest training row in the observed views
        Ytr = np.hstack([self.Y_train_[v] for v in sorted(obs)])
        Yn = np.hstack([obs[v] for v in sorted(obs)])
        d2 = (Yn**2).sum(1)[:, None] - 2 * Yn @ Ytr.T + (Ytr**2).sum(1)[None]
        nn = np.argmin(d2, axis=1)
        mu0, logS0 = self.local_["mu"][nn], self.local_["logS"][nn]
        N = self.Y_train_[0].shape[0]
        glob, kinds, train = self.glob_, self.kinds_, self._train_stats
        extra = self.extra_jitter_

        def neg(x):
            mu = x[: n_new * mu0.shape[1]].reshape(mu0.shape)
            S = jnp.exp(x[n_new * mu0.shape[1] :].reshape(mu0.shape))
            F = -kl_diag_gaussian(mu, S)
            for v, Y in obs.items():
                kp = glob["kern"][v]
                p0, p1, p2 = view_psi(kinds[v], mu, S, self._Z(v), kp, Y)
                t = train["views"][v]
                stats = (t[0] + p0, t[1] + p1, t[2] + p2, t[3] + jnp.sum(Y**2))
                F = F + view_bound(
                    stats, kmm(kinds[v], self._Z(v), kp), glob["log_beta"][v], N + n_new, Y.shape[1], extra
                )
            return -F

        vg = jax.jit(jax.value_and_grad(neg))
        x0 = np.concatenate([mu0.ravel(), logS0.ravel()])
        r = minimize(
            lambda x: tuple(np.asarray(a) for a in vg(x)),
            x0,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": int(max_iter)},
        )
        mu = r.x[: mu0.size].reshape(mu0.shape)
        return mu, np.exp(r.x[mu0.size :].reshape(mu0.shape))

    def predict_view(self, mu, S, view: int = 0):
        """Predictive mean (N*, D_v) and variance (N*, D_v) of view ``view`` at q(x*) = N(mu, diag S)
        (paper 004 appendix C, uncertain inputs), in the data's original units."""
        self._check_fitted()
        jax = _jax()
        import jax.numpy as jnp

        mu, S = np.atleast_2d(np.asarray(mu, float)), np.atleast_2d(np.asarray(S, float))
        kind, kp = self.kinds_[view], self.glob_["kern"][view]
        Z = self._Z(view)
        beta = float(np.exp(self.glob_["log_beta"][view]))
        t = self._train_stats["views"][view]
        Kmm = np.asarray(kmm(kind, Z, kp))
        Kmm = Kmm + self.extra_jitter_ * np.mean(np.diag(Kmm)) * np.eye(Z.shape[0])
        B = Kmm + beta * np.asarray(t[2])
        W = beta * np.linalg.solve(B, np.asarray(t[1]))  # (M, D)

        def one(m, s):
            p0, p1, p2 = view_psi(kind, m[None], s[None], Z, kp, jnp.ones((1, 1)))
            return p0, p1[:, 0], p2  # with Y = 1, Psi1^T Y is Psi1 of the row

        p0, p1, p2 = jax.vmap(one)(jnp.asarray(mu), jnp.asarray(S))
        p0, p1, p2 = np.asarray(p0), np.asarray(p1), np.asarray(p2)
        mean = p1 @ W
        KinvmBinv = np.linalg.solve(Kmm, np.eye(len(Kmm))) - np.linalg.solve(B, np.eye(len(B)))
        var = (
            (p0 - np.einsum("ij,nji->n", KinvmBinv, p2) + 1.0 / beta)[:, None]
            + np.einsum("md,nmk,kd->nd", W, p2, W)
            - mean**2
        )
        return mean + self.view_means_[view], var


class BayesianGPLVM(_CollapsedGPLVM):
    """Bayesian GP-LVM (one view). ``fit(Y)``; ``ard_weights_`` (Q,) are the kernel's input
    sensitivities (RBF: variance / lengthscale^2; linear: the ARD variances)."""

    def fit(self, Y, graph=None, times=None, sequences=None):
        """``times`` (N,) switches on the temporal prior (paper 004 section 4.3): X's columns are GP
        functions of time (RBF, learned time scale), independent between ``sequences`` labels."""
        self._fit_views([Y], times, sequences)
        self.ard_weights_ = self._view_ard()[0]
        return self

    def transform(self, Y_new, max_iter: int = 300):
        """Posterior means of q(x*) for new rows."""
        return self.infer({0: Y_new}, max_iter=max_iter)[0]

    def inverse_transform(self, X):
        """Predictive mean in data space at latent points X."""
        X = np.atleast_2d(np.asarray(X, float))
        return self.predict_view(X, np.zeros_like(X), 0)[0]
