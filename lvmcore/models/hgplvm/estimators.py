"""The hyperboloid GP-LVM estimators (paper 002): :class:`HyperboloidGPLVM` (the exact point
GP-LVM, eq. 4, and the sparse one, eq. 5) and :class:`BayesianHyperboloidGPLVM` (eq. 6), thin
estimators over the package's plain functions: the bounds (:mod:`.objectives`, :mod:`.point`), the
full-batch training (:mod:`.full`) and the minibatch training (:mod:`.minibatch`), chosen by N
(``training``). Both share :class:`BaseHyperboloidGPLVM`: the parameters, their rules, the choice
of training, the fitted state and ``transform``.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from lvmcore.checks import check_data
from lvmcore.graph import knn_query
from lvmcore.manifolds.lorentz import to_poincare
from lvmcore.models._base import LatentModel
from lvmcore.models.hgplvm.full import fit_full
from lvmcore.models.hgplvm.minibatch import fit_minibatch
from lvmcore.models.hgplvm.newpoints import (
    cell_seeds,
    forget,
    log_density,
    place,
    predict_at,
    to_hyperboloid,
)
from lvmcore.models.hgplvm.objectives import renorm
from lvmcore.models.hgplvm.training import Trained, tangent_start
from lvmcore.precision import x64

__all__ = [
    "AUTO",
    "FULL_BATCH_MAX_N",
    "POINT_INIT_SCALE",
    "BaseHyperboloidGPLVM",
    "HyperboloidGPLVM",
    "BayesianHyperboloidGPLVM",
]


#: ``training="auto"`` (sparse and Bayesian variants): the full-batch fit up to this many points,
#: the minibatch fit (:mod:`lvmcore.models.hgplvm.minibatch`) above (bench/README.md, "hGP-LVM Bayesian at
#: scale": the crossover measurement)
FULL_BATCH_MAX_N = 5000


#: settings of the full-batch fit alone, refused (before any work) when minibatch training is chosen
_FULL_ONLY = {"chunks": None, "optimizer": "radam"}


POINT_INIT_SCALE = 0.2  # the point variant's PCA start: max tangent radius (init_scale="auto")


#: the value each "auto" setting takes, per variant
AUTO = {
    "noise": {"point": "ppca", "sparse": "ppca", "bayesian": "learn"},
    "mean": {"point": "integrated", "sparse": "zero", "bayesian": "zero"},
    "drift_every": {"point": 250, "sparse": 0, "bayesian": 0},
    "init_scale": {"point": POINT_INIT_SCALE, "sparse": 1.0, "bayesian": 1.0},
}


@dataclass(kw_only=True, eq=False, repr=False)
class BaseHyperboloidGPLVM(LatentModel):
    """The parameters, the choice of training and the fitted state the hyperboloid GP-LVMs share:
    :class:`HyperboloidGPLVM` (point and sparse variants; its docstring describes the parameters)
    and :class:`BayesianHyperboloidGPLVM`, whose full-batch fit is the same loop
    (:func:`~lvmcore.models.hgplvm.full.fit_full`) with ``variant`` "bayesian"."""

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

    #: the store keeps these (and ``glob_`` / ``qu_`` as arrays, :meth:`to_arrays`); the training
    #: rows come back as the input ``data``
    persisted = LatentModel.persisted + (
        "lorentz_embedding_",
        "inducing_",
        "mean_",
        "sigma_",
        "beta_",
        "prior_scale_",
        "noise_fixed_",
        "restricted_",
        "elbo_trace_",
        "elbo_se_",
        "fit_time_",
        "training_",
        "minibatch_",
        "n_steps_",
        "n_inducing_",
        "extra_jitter_",
        "window_bounds_",
        "rng_key_",
        "score_reference_",
    )
    needs_inputs = ("data",)

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

    def setting(self, name):
        """The parameter ``name`` with "auto" resolved for this variant (``AUTO``)."""
        value = getattr(self, name)
        return AUTO[name][self.variant] if value == "auto" else value

    # ------------------------------------------------------------------ helpers
    def init_tangent(self, Y, rng):
        """Initial latent points in the tangent space at the origin (N, Q): :func:`tangent_start`."""
        return tangent_start(Y, int(self.n_components), self.init, float(self.setting("init_scale")), rng)

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

    def fit(self, Y, graph=None, *, callback=None, client=None):
        """Fit the model to Y (N, D) by the training :meth:`resolve_training` picks; returns self.
        ``callback(it, state)`` (full-batch fits), if given, is called at the end of every window of
        the convergence rule with the current state (a dict of NumPy arrays: "X" points on the
        hyperboloid, "hyp" log sigma, log beta, log s^2, "log_S", "Z"); it observes the fit and
        does not change it. The minibatch fit takes none. ``client``: the Dask client the Bayesian
        full-batch fit's row chunks (``chunks``) run on (None: in process)."""
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
        t_start = time.perf_counter()
        if training == "full":
            self._set_fitted(fit_full(self, Y, callback, client))
        else:
            self._set_fitted(fit_minibatch(self, Y))
        self.fit_time_ = time.perf_counter() - t_start
        self.training_ = training
        self.minibatch_ = float(training == "minibatch")
        return self

    @x64  # as inside the trainings: the state's arrays converted in float64
    def _set_fitted(self, t: Trained):
        """The fitted state both trainings set: the points (means) X on the hyperboloid and in the
        Poincare ball, their variances S (None: point, sparse), the inducing inputs Z (None:
        point), sigma, beta, s (Bayesian) from hyp (log sigma, log beta, log s^2), whether beta was
        fixed (``hmask``), the centred data Yc and the training mean (for ``transform``), the
        objective's trace (its last entry is ``elbo_``, its length ``n_iter_``) and ``converged``."""
        X, hyp, S, Z, hmask, Yc, mean, trace, converged = t[:9]
        self.lorentz_embedding_ = np.asarray(renorm(jnp.asarray(X)))
        self.embedding_ = np.asarray(to_poincare(self.lorentz_embedding_))
        self.embedding_var_ = S
        self.inducing_ = None if Z is None else np.asarray(renorm(Z))
        hyp = np.asarray(hyp)
        self.sigma_, self.beta_ = float(np.exp(hyp[0])), float(np.exp(hyp[1]))
        self.prior_scale_ = float(np.exp(0.5 * hyp[2])) if self.variant == "bayesian" else None
        self.noise_fixed_ = bool(hmask[1] == 0.0)
        self._Y, self.mean_ = np.asarray(Yc), mean
        self.elbo_trace_ = np.asarray(trace, dtype=np.float64)
        self.elbo_, self.n_iter_ = float(trace[-1]), len(trace)
        self.converged_ = converged
        for name, value in t.attrs.items():  # the training's own attributes
            setattr(self, name, value)
        self.rng_key_ = np.asarray(t.key, dtype=np.int64)  # the fit's key: new rows' draws fold into it
        forget(self)  # new points' derived state (newpoints.derived) is of the last fit

    def fit_transform(self, Y, graph=None):
        return self.fit(Y, graph).embedding_

    # ------------------------------------------------------------------ new points
    def transform(self, Y_new, return_var: bool = False, *, max_iter=None, cell_keys=None):
        """Latent positions (n_new, Q) in the Poincare ball (the coordinates of ``embedding_``) of new
        rows, the model fixed, each row its own problem (:mod:`~lvmcore.models.hgplvm.newpoints`);
        with ``return_var`` also their variances: the Bayesian model's S* (n_new, Q) of the wrapped
        Gaussian q(x*) in the tangent space at the mean (as ``embedding_var_``), None for the point
        and sparse variants (point latents: no variance). ``cell_keys`` (one name per row, e.g.
        obs_names) seed each row's Monte-Carlo draws (Bayesian); without them a hash of the row's
        content does. ``max_iter``: that many optimiser steps alone (no polish: module
        :mod:`~lvmcore.models.hgplvm.newpoints`); the default is the full map, per-row deterministic."""
        X, S = self._place(Y_new, max_iter, cell_keys)
        P = np.asarray(to_poincare(X))
        return (P, None if S is None else S.copy()) if return_var else P

    def transform_lorentz(self, Y_new, max_iter=None, cell_keys=None):
        """:meth:`transform`'s latent positions on the hyperboloid (n_new, Q+1)."""
        return self._place(Y_new, max_iter, cell_keys)[0].copy()

    def score_samples(self, Y_new, cell_keys=None) -> np.ndarray:
        """Each new row's predictive log density (n_new,) at its place (:meth:`transform`): for the
        point and sparse variants log p(y* | x*) at the optimised x*, for the Bayesian one the
        predictive under q(x*) (a Monte-Carlo mixture over the row's own draws); higher = better
        represented (:func:`~lvmcore.models.hgplvm.newpoints.log_density`)."""
        Yn, _ = self._new_rows(Y_new)
        X, S = self._place(Y_new, None, cell_keys)
        return log_density(self, Yn, X, S, self._seeds(Y_new, cell_keys))

    def map_points(self, Y_new, cell_keys=None):
        """(Poincare-ball positions (n, Q), variances S* or None, mapping scores (n,)) of new rows
        from one placement each (:meth:`transform`'s) and :meth:`score_samples`' density at it,
        standardised against the reference scores (refused before the placement without them)."""
        self.reference_pair(Y_new)
        Yn, nearest = self._new_rows(Y_new)
        seeds = self._seeds(Y_new, cell_keys)
        X, S = place(self, Yn, nearest, seeds, None)
        score = self.standardised(log_density(self, Yn, X, S, seeds), Y_new)
        return np.asarray(to_poincare(X)), None if S is None else S.copy(), score

    def inverse_transform(self, X, return_var: bool = False):
        """The GP's predictive mean (n, D) in data space at latent points X, given in the Poincare
        ball (n, Q, as ``embedding_``) or on the hyperboloid (n, Q+1); with ``return_var`` also the
        predictive variance (n, D), the noise 1 / beta included (the same for every column)."""
        self._check_fitted()
        mean, var = predict_at(self, to_hyperboloid(X, int(self.n_components)))
        mean = mean + self.mean_
        return (mean, np.repeat(var[:, None], mean.shape[1], axis=1)) if return_var else mean

    def _seeds(self, Y_new, cell_keys):
        """Each row's own seed (Bayesian draws; None for point latents, which draw nothing)."""
        return cell_seeds(Y_new, cell_keys) if self.variant == "bayesian" else None

    def _place(self, Y_new, max_iter, cell_keys):
        """(means (n, Q+1), S or None) of new rows (``newpoints.place``); :meth:`map_points` places
        and scores them in one go."""
        Yn, nearest = self._new_rows(Y_new)
        return place(self, Yn, nearest, self._seeds(Y_new, cell_keys), max_iter)

    def _new_rows(self, Y_new):
        """Rows to transform, checked against the fitted model and centred by its training mean,
        and the index of each row's nearest training row (in data space: where its optimisation
        starts)."""
        self._check_fitted()
        Y_new = check_data(Y_new, "Y_new")
        if Y_new.shape[1] != self._Y.shape[1]:
            raise ValueError(
                f"Y_new has {Y_new.shape[1]} columns, the model was fitted on {self._Y.shape[1]}; "
                "pass rows with the training data's features"
            )
        Yn = Y_new - self.mean_
        return Yn, knn_query(self._Y, Yn)[0][:, 0]

    # ------------------------------------------------------------------ the model as arrays
    def to_arrays(self) -> tuple[dict, dict]:
        """The contract's arrays and params, with the globals and q(v) (dicts of arrays: ``glob_``,
        the minibatch fit's ``qu_``, the full-batch fit's ``u_posterior_``) as arrays ``glob_Z``,
        ``glob_hyp``, ``qu_m``, ``qu_P`` / ``u_posterior_m``, ``u_posterior_P``. The training
        rows are not kept: ``from_arrays`` takes them back as ``data``."""
        arrays, params = super().to_arrays()
        for name in ("glob_", "qu_", "u_posterior_"):
            for k, v in (getattr(self, name, None) or {}).items():
                arrays[f"{name}{k}"] = np.asarray(v)
        return arrays, params

    def _restore(self, data) -> None:
        """The centred training rows from the store's ``data`` (every new row starts at its nearest
        one; the point variant's GP conditions on them), the dicts ``glob_`` / ``qu_`` from their
        arrays, the key's dtype; derived factors are rebuilt when first needed."""
        Y = check_data(data)
        if Y.shape[0] != len(self.embedding_):
            raise ValueError(f"data has {Y.shape[0]} rows, the model was fitted on {len(self.embedding_)}")
        self._Y = Y - self.mean_
        for name in ("glob_", "qu_", "u_posterior_"):
            parts = {k[len(name) :]: self.__dict__.pop(k) for k in list(self.__dict__) if k.startswith(name)}
            if parts:
                setattr(self, name, parts)
        self.rng_key_ = np.asarray(self.rng_key_, dtype=np.int64)
        forget(self)


@dataclass(kw_only=True, eq=False, repr=False)
class HyperboloidGPLVM(BaseHyperboloidGPLVM):
    """GP-LVM with latent variables on the Lorentz hyperboloid (paper 002).

    Parameters (keyword-only)
    ----------
    n_components : latent dimension Q (>= 2); points live in R^{Q+1}.
    kappa : HE kernel length scale (fixed; the paper uses 100).
    variant : "point" (exact GP-LVM, eq. 4, :mod:`lvmcore.models.hgplvm.point`) or "sparse"
        (Titsias bound, eq. 5). The Bayesian model (wrapped-Gaussian q(X), MC psi statistics,
        eq. 6) is :class:`BayesianHyperboloidGPLVM`, which runs this
        class's loop with ``variant`` "bayesian" for its full-batch fit; the parameters below that
        name the Bayesian variant are its.
    n_inducing : M inducing inputs (sparse / bayesian), capped at N; "auto" (default) =
        :func:`lvmcore.models.hgplvm.full.auto_inducing` (N / 10 within [64, 256]).  The paper's
        active sets used M = 50.
    max_iter, tol : iteration budget and the convergence rule: the objective is averaged over
        windows of 25 iterations (50 for the stochastic Bayesian bound); the fit stops when the best
        of the last ``PATIENCE`` (6; bayesian: 2; with the drift search, the windows of a whole
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
        :mod:`lvmcore.models.hgplvm.minibatch` (the uncollapsed bound with a whitened q(u), natural-gradient
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
        **BaseHyperboloidGPLVM._parameter_constraints,
        "variant": [StrOptions({"point", "sparse", "bayesian"})],
        "mean": [StrOptions({"auto", "zero", "integrated"})],
        "drift_every": [StrOptions({"auto"}), Interval(numbers.Integral, 0, None, closed="left")],
    }


# --------------------------------------------------------------------------- the model's one entry
@dataclass(kw_only=True, eq=False, repr=False)
class BayesianHyperboloidGPLVM(BaseHyperboloidGPLVM):
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
    The training parameters and the choice are :class:`BaseHyperboloidGPLVM`'s, shared with the sparse
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
        **BaseHyperboloidGPLVM._parameter_constraints,
        "local_samples": [Interval(numbers.Integral, 1, None, closed="left")],
        "eval_samples": [Interval(numbers.Integral, 2, None, closed="left")],
    }
