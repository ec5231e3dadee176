"""The LL-LVM estimator and its variational EM driver (paper 000 appendix C; paper 003).

Each EM iteration: q(x) (``qx``), q(C) (``qc``), then gamma, beta, alpha (``mstep``), then the bound
(``bound``); every step maximises the bound in its argument (exactly, or by a partial step that still
raises it: the factorised solver's gamma), so it never decreases.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import eigsh
from sklearn.utils._param_validation import Interval, StrOptions

from lvmcore import graph as lg
from lvmcore.checks import check_data

from .._base import REFERENCE_SCORE_CELLS, LatentModel, stalled
from ..components import by_component
from .bound import elbo
from .likelihood import lik_stats
from .mstep import update_alpha, update_beta, update_gamma
from .oos import conditional_loglik, reconstruct, transform_points
from .operators import EPSILON_FORMS, LIKELIHOODS, QC, QX, Theta, prepare_graph
from .qc import update_qc
from .qx import update_qx

#: quadratic variant: problems with N <= this many points use the dense solver under solver="auto"
AUTO_DENSE_MAX_N = 200
#: largest N the exact dense solver of the paper's model (eps I) takes under solver="auto". The
#: factorised solver is faster per iteration from about N = 300 (bench/lllvm/fit.py --solvers dense
#: factorised), but it fits a smaller variational family (q(x), q(C) factorised per point): a lower
#: bound and a visibly different embedding at N = 400 (bench/README.md, LL-LVM). Fidelity first: the
#: exact model stays the default while its O((N Q)^3) iterations are affordable (about 2 CPU s per
#: iteration at N = 1,000, 14 s at 2,000); the cost model (tasks/costs.py) prices either solver
GAUSSIAN_DENSE_MAX_N = 1000
#: the authors' eps 1 1^T form has the dense solver only: solver="auto" takes it up to this N (its
#: O((N Q)^2) memory and O((N Q)^3) time per iteration) and refuses it above
ONES_DENSE_MAX_N = 2000
_SOLVERS = ("auto", "dense", "sparse", "factorised")
_INITS = ("random_c", "random_x", "spectral")


def spectral_init(W, Q: int, rng) -> np.ndarray:
    """Laplacian eigenmaps start: the Q eigenvectors of L after the constant one, each scaled to unit
    variance, plus 1e-3 N(0, 1) noise from ``rng`` (so seeds give different starts)."""
    W = sp.csr_matrix(W)
    n = W.shape[0]
    L = sp.diags(np.asarray(W.sum(1)).ravel()) - W
    if n <= 2000:
        _, V = np.linalg.eigh(L.toarray())
    else:
        v0 = np.random.default_rng(0).standard_normal(n)
        _, V = eigsh(sp.csc_matrix(L), k=Q + 1, sigma=-1e-6, which="LM", v0=v0)
    V = V[:, 1 : Q + 1]
    V = V / V.std(axis=0)
    return V + 1e-3 * rng.standard_normal(V.shape)


def lllvm_fit(
    Y,
    W,
    *,
    n_components: int = 2,
    solver: str = "dense",
    max_iter: int = 50,
    tol: float = 0.0,
    eps_c: float = 1e-3,
    eps_y: float = 1e-3,
    alpha0: float = 1e-3,
    beta0: float = 1.0,
    gamma0: float = 1.0,
    init: str = "random_c",
    learn_alpha: bool = True,
    learn_beta: bool = True,
    chunks: int | None = None,
    random_state=None,
    callback=None,
    likelihood: str = "gaussian",
    epsilon_form: str = "identity",
    qc0: tuple[np.ndarray, np.ndarray] | None = None,
    client=None,
    memory_bytes: int | None = None,
):
    """Variational EM on (already preprocessed) Y (N, D) with the symmetric 0/1 adjacency W.

    ``init="random_c"`` starts from q(C) with N(0, 1) means and identity covariance (the authors'
    start); ``"random_x"`` from N(0, 1) latent means; ``"spectral"`` from Laplacian eigenmaps.
    ``qc0 = (mean (N, D, Q), row covariance (N Q, N Q))`` gives the starting q(C) explicitly (dense
    solver; used by the oracle comparison with the authors' code). Returns (qx, qc, theta, graph,
    trace), ``trace`` the bound after every iteration; stops when the relative change of the bound
    falls below ``tol``.
    """
    Y = np.asarray(Y, dtype=np.float64)
    n, D = Y.shape
    Q = int(n_components)
    g = prepare_graph(W, solver, chunks, likelihood, epsilon_form, client=client, memory_bytes=memory_bytes)
    th = Theta(alpha=float(alpha0), beta=float(beta0), gamma=float(gamma0), eps_c=eps_c, eps_y=eps_y)
    rng = np.random.default_rng(random_state)
    E = len(g.ei)
    dense = solver == "dense"
    idx = np.arange(n)
    if qc0 is not None:
        mean0, full0 = (np.asarray(a, dtype=np.float64) for a in qc0)
        if mean0.shape != (n, D, Q) or full0.shape != (n * Q, n * Q) or not dense:
            raise ValueError(
                f"qc0 must be (mean ({n}, {D}, {Q}), covariance ({n * Q}, {n * Q})) with solver='dense'"
            )
        F4 = full0.reshape(n, Q, n, Q)
        qc = QC(
            mean=mean0, cov=F4[idx, :, idx, :], cov_edge=F4[g.ei, :, g.ej, :], logdet_prec=0.0, full=full0
        )
    elif init == "random_c":
        qc = QC(
            mean=rng.standard_normal((n, D, Q)),
            cov=np.broadcast_to(np.eye(Q), (n, Q, Q)).copy(),
            cov_edge=np.zeros((E, Q, Q)),
            logdet_prec=0.0,
            full=np.eye(n * Q) if dense else None,
        )
    elif init in ("random_x", "spectral"):
        mean0 = rng.standard_normal((n, Q)) if init == "random_x" else spectral_init(W, Q, rng)
        qx = QX(
            mean=mean0,
            cov=np.zeros((n, Q, Q)),
            cov_edge=np.zeros((E, Q, Q)),
            logdet_prec=0.0,
            full=np.zeros((n * Q, n * Q)) if dense else None,
        )
        qc = update_qc(Y, g, qx, th, "initialisation")
    else:
        raise ValueError(f"init must be one of {_INITS}, got {init!r}")
    x0 = qx.mean if qc0 is None and init in ("random_x", "spectral") else None  # warm starts of CG
    trace = []
    for it in range(int(max_iter)):
        ctx = f"EM iteration {it}"
        qx = update_qx(Y, g, qc, th, ctx, x0=x0)
        x0 = qx.mean
        qc = update_qc(Y, g, qx, th, ctx, c0=qc.mean)
        st = lik_stats(Y, g, qx, qc) if likelihood == "gaussian" else None
        th.gamma = update_gamma(Y, g, qx, qc, th, stats=st)
        if learn_beta:
            th.beta = update_beta(g, qc, th)
        if learn_alpha:
            th.alpha = update_alpha(g, qx, th.alpha)
        F = elbo(Y, g, qx, qc, th, stats=st)
        trace.append(F)
        if callback is not None:
            callback(it, qx, qc, th, F)
        if tol > 0 and stalled(trace, tol):
            break
    return qx, qc, th, g, np.asarray(trace)


def centroid_relative_cov(qx: QX, solver: str) -> np.ndarray:
    """Per-point posterior covariances of x_i - mean_j(x_j) (N, Q, Q): the layout's uncertainty.

    With a full-covariance q(x) (solvers "dense" and "sparse") the common translation 1 (x) e_q is
    an exact eigenvector of the x precision with eigenvalue alpha (the likelihood and the graph
    prior see differences x_i - x_j only), so Sigma_x = Sigma_perp + (alpha N)^-1 1 1^T (x) I_Q with
    Sigma_perp's block rows summing to zero, and Cov(x_i - mean x) = Sigma_x^(ii) - I_Q / (alpha N)
    exactly. The removed part is set by the prior alone and dwarfs the rest at the authors' fixed
    alpha = 1e-3 (1 / (alpha N) = 2.5 at N = 400, against a layout variance of order 1), so the
    marginal blocks would report the same wide ellipse for every point. The factorised solver's q(x)
    is a product over points with no joint translation: its blocks are returned as they are."""
    if solver == "factorised":
        return qx.cov
    n, Q = qx.mean.shape
    return qx.cov - np.eye(Q) / (qx.alpha * n)


def adjacency_graph(est, Y, graph):
    """LL-LVM's graph for :func:`lvmcore.models.components.by_component`: (what its fit gets:
    ``graph``, else the kNN indices of Y; the union-symmetrised adjacency; the graph of a
    component's rows in its own numbering)."""
    if graph is None:
        graph = lg.knn(Y, int(est.n_neighbors))[0]
    W = est._graph(Y, graph)
    if sp.issparse(graph):
        return graph, W, lambda rows, inv: W[rows][:, rows]
    idx = np.asarray(graph)[:, : int(est.n_neighbors)]
    return graph, W, lambda rows, inv: inv[idx[rows]]


@by_component(adjacency_graph)  # a graph in several pieces: one fit per component
class LLLVM(LatentModel):
    """Locally linear latent variable model: variational EM over q(x), q(C) with gamma learned
    (paper 000 appendix C; paper 003). On a disconnected graph, per component
    (``lvmcore.models.components``).

    Parameters (keyword-only)
    ----------
    n_components : latent dimension Q (< D)
    n_neighbors : k of the kNN graph (union-symmetrised; the point itself is not counted: the
        authors' k is ours + 1)
    likelihood : "gaussian" (default, the paper's model: the normalised N(y | Sigma_y e, Sigma_y) of
        paper 000 eqs. 29-31 / paper 003 eq. 5, which the authors' code optimises; dense precisions)
        or "quadratic" (NOT the paper's model: the f-term form of eq. 28, a density that integrates to
        exp(-(f - e' Sigma_y e) / 2) < 1, a graph-dependent deficit, so its bound must not be used to
        compare graphs; kept because its precisions are graph-sparse and scale with solver="sparse")
    solver : "dense" (exact reference: full-covariance q(x), q(C)), "factorised" (the paper's model with
        eps I, q(x) and q(C) factorised per point: a smaller variational family, so a lower but true
        bound; sparse factorisation of eps_y I + 2 gamma L, selected inversion on distance-2 pairs, CG
        for the means; see ``local.py`` and bench/README.md for its measured cost), "sparse"
        (quadratic variant only: level-block Cholesky with selected inversion) or "auto" (gaussian:
        dense up to GAUSSIAN_DENSE_MAX_N points, factorised above, where it is the faster; the
        dense-only epsilon_form="ones" up to ONES_DENSE_MAX_N, refused above; quadratic: dense up to
        AUTO_DENSE_MAX_N points, else sparse)
    max_iter, tol : EM iterations and relative bound change to stop at (0: run max_iter)
    epsilon_c, epsilon_y : the small fixed precisions of the C prior and of the y likelihood
    epsilon_form : "identity" (eps I, the paper) or "ones" (eps 1 1^T, the authors' code: it only
        penalises the mean; dense solver)
    standardize : centre Y and divide it by its largest absolute entry (the authors' preprocessing;
        the priors' unit graph weights make the fit scale-dependent); ``elbo_`` stays the bound of the
        data as given (the scaled data's bound minus N D log scale), ``Y_train_`` is the scaled data
    chunks : points per chunk of the quadratic variant's edge sums, run as Dask tasks; None in process
    init : "random_c" (q(C) means N(0, 1), covariance I: the authors' start), "random_x" or "spectral"
    random_state : seed of the random start
    alpha : None (learned by the M-step) or a fixed precision of the x prior (the authors fix 1e-3)
    beta : None (learned) or a fixed scale of the C prior (the authors' code has none: beta = 1)
    """

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "n_neighbors": [Interval(Integral, 1, None, closed="left")],
        "solver": [StrOptions(set(_SOLVERS))],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "epsilon_c": [Interval(Real, 0, None, closed="neither")],
        "epsilon_y": [Interval(Real, 0, None, closed="neither")],
        "epsilon_form": [StrOptions(set(EPSILON_FORMS))],
        "standardize": ["boolean"],
        "chunks": [None, Interval(Integral, 1, None, closed="left")],
        "init": [StrOptions(set(_INITS))],
        "random_state": [None, Interval(Integral, 0, None, closed="left"), np.random.Generator],
        "likelihood": [StrOptions(set(LIKELIHOODS))],
        "alpha": [None, Interval(Real, 0, None, closed="neither")],
        "beta": [None, Interval(Real, 0, None, closed="neither")],
    }
    #: the store keeps these and q(x), q(C) (``to_arrays``); the training rows and the neighbour
    #: graph come back as inputs
    persisted = LatentModel.persisted + (
        "elbo_trace_",
        "embedding_cov_",
        "center_",
        "scale_",
        "solver_",
        "alpha_",
        "beta_",
        "gamma_",
        "C_",
        "score_reference_",
    )
    needs_inputs = ("data", "graph")

    def __init__(
        self,
        *,
        n_components: int = 2,
        n_neighbors: int = 10,
        likelihood: str = "gaussian",
        solver: str = "auto",
        max_iter: int = 50,
        tol: float = 1e-6,
        epsilon_c: float = 1e-3,
        epsilon_y: float = 1e-3,
        epsilon_form: str = "identity",
        standardize: bool = True,
        chunks: int | None = None,
        init: str = "random_c",
        random_state=None,
        alpha: float | None = 1e-3,
        beta: float | None = 1.0,
    ):
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.likelihood = likelihood
        self.solver = solver
        self.max_iter = max_iter
        self.tol = tol
        self.epsilon_c = epsilon_c
        self.epsilon_y = epsilon_y
        self.epsilon_form = epsilon_form
        self.standardize = standardize
        self.chunks = chunks
        self.init = init
        self.random_state = random_state
        self.alpha = alpha
        self.beta = beta

    # ------------------------------------------------------------------ checks
    def _resolve_solver(self, n: int) -> str:
        """The solver a fit on n points uses; refuses combinations that are not the model asked for."""
        paper = self.likelihood == "gaussian" or self.epsilon_form == "ones"
        if paper and self.solver == "sparse":
            raise ValueError(
                f"solver='sparse' solves the graph-sparse precisions of likelihood='quadratic' only; "
                f"likelihood={self.likelihood!r}, epsilon_form={self.epsilon_form!r} has dense precisions: "
                "use solver='dense' (exact), 'factorised' (per-point factorised q, scales) or 'auto'"
            )
        if self.solver == "factorised" and (self.likelihood != "gaussian" or self.epsilon_form != "identity"):
            raise ValueError(
                f"solver='factorised' fits the paper's model (likelihood='gaussian', "
                f"epsilon_form='identity') "
                f"only, got likelihood={self.likelihood!r}, epsilon_form={self.epsilon_form!r}; use "
                "solver='dense' for epsilon_form='ones', solver='sparse' or 'auto' for 'quadratic'"
            )
        if self.solver != "auto":
            return self.solver
        if not paper:
            return "dense" if n <= AUTO_DENSE_MAX_N else "sparse"
        if n <= (ONES_DENSE_MAX_N if self.epsilon_form == "ones" else GAUSSIAN_DENSE_MAX_N):
            return "dense"
        if self.epsilon_form == "ones":
            raise ValueError(
                f"LL-LVM with epsilon_form='ones' (the authors' eps 1 1^T) has only the exact dense solver, "
                f"O((N Q)^3) time and O((N Q)^2) memory per iteration; solver='auto' takes it up to N = "
                f"{ONES_DENSE_MAX_N}, got N = {n}. Use epsilon_form='identity' (the paper's eps I; "
                "solver='auto' then fits it with the factorised solver), fit a subsample, or pass "
                "solver='dense' to run it anyway"
            )
        return "factorised"

    def _check_shapes(self, n, D):
        if self.n_components >= D:
            raise ValueError(
                f"Expected n_components < n_features, but n_components = {self.n_components}, "
                f"n_features = {D}; choose a smaller n_components"
            )
        if self.n_neighbors >= n:
            raise ValueError(
                f"Expected n_neighbors < n_samples, but n_samples = {n}, n_neighbors = {self.n_neighbors}; "
                "use a smaller n_neighbors"
            )
        if self.likelihood == "quadratic" and self.epsilon_form != "identity":
            raise ValueError("likelihood='quadratic' is defined with epsilon_form='identity' only")

    def _graph(self, Y, graph) -> sp.csr_matrix:
        n = Y.shape[0]
        k = int(self.n_neighbors)
        if graph is None:
            idx, _ = lg.knn(Y, k)
            W = lg.adjacency(idx, mode="union")
        elif sp.issparse(graph):
            W = sp.csr_matrix(graph, dtype=np.float64)
            if W.shape != (n, n):
                raise ValueError(f"graph adjacency must be ({n}, {n}) for {n} points, got {W.shape}")
            if abs(W - W.T).max() > 0:
                raise ValueError("graph adjacency must be symmetric; symmetrise it with W.maximum(W.T)")
            W.setdiag(0)
            W.eliminate_zeros()
            W.data[:] = 1.0
        else:
            idx = np.asarray(graph)
            if idx.ndim != 2 or idx.shape[0] != n or not np.issubdtype(idx.dtype, np.integer):
                raise ValueError(
                    f"graph must be None, a sparse adjacency or an int array (N, k) of neighbour "
                    f"indices with N = {n}; got {type(graph).__name__} of shape {getattr(idx, 'shape', None)}"
                )
            if idx.shape[1] < k:
                raise ValueError(
                    f"graph has {idx.shape[1]} neighbours per point but n_neighbors = {k}; "
                    "compute the kNN graph with at least n_neighbors columns"
                )
            if idx.min() < 0 or idx.max() >= n:
                raise ValueError(f"graph indices must lie in [0, {n - 1}]")
            W = lg.adjacency(idx[:, :k], mode="union")
        return W  # a disconnected graph is fitted per component (``models.components``)

    # ------------------------------------------------------------------ fit
    def fit(self, Y, graph=None, *, client=None, memory_bytes=None):
        """Fit on Y (N, D); ``graph``: None (kNN of Y), an (N, >= k) int array of neighbour indices or a
        symmetric sparse adjacency; ``client``: the Dask client the ``chunks`` of the quadratic
        variant run on (None: local threads); ``memory_bytes``: what the fit may use (default the
        memory available), against which the sparse and factorised solvers refuse, before any
        work, a graph whose breadth-first levels are too wide (``operators.check_level_memory``).
        Returns self."""
        self._validate_params()
        Y = check_data(Y)
        n, D = Y.shape
        self._check_shapes(n, D)
        solver = self._resolve_solver(n)
        W = self._graph(Y, graph)
        if self.standardize:  # the authors' preprocessing: centre, divide by the largest |entry|
            center = Y.mean(axis=0)
            scale = float(np.abs(Y - center).max()) or 1.0
        else:
            center, scale = np.zeros(D), 1.0
        Ys = (Y - center) / scale
        qx, qc, th, g, trace = lllvm_fit(
            Ys,
            W,
            n_components=int(self.n_components),
            solver=solver,
            max_iter=int(self.max_iter),
            tol=float(self.tol),
            eps_c=float(self.epsilon_c),
            eps_y=float(self.epsilon_y),
            chunks=self.chunks,
            client=client,
            memory_bytes=memory_bytes,
            init=self.init,
            random_state=self.random_state,
            likelihood=self.likelihood,
            epsilon_form=self.epsilon_form,
            alpha0=1e-3 if self.alpha is None else float(self.alpha),
            learn_alpha=self.alpha is None,
            beta0=1.0 if self.beta is None else float(self.beta),
            learn_beta=self.beta is None,
        )
        self.center_, self.scale_ = center, scale
        self.Y_train_ = Ys
        self.adjacency_ = W
        g.client = None  # the fitted model holds no cluster connection (it may be pickled or stored)
        self.graph_ = g
        self.solver_ = solver
        self.qx_, self.qc_, self.theta_ = qx, qc, th
        self.embedding_ = qx.mean
        self.embedding_cov_ = centroid_relative_cov(qx, solver)
        self.embedding_var_ = np.diagonal(self.embedding_cov_, axis1=1, axis2=2).copy()
        self.C_ = qc.mean
        self.alpha_, self.beta_, self.gamma_ = th.alpha, th.beta, th.gamma
        # the bound of Y as given: the fit's bound is a density of Ys = (Y - center) / scale, so
        # log p(Y) = log p(Ys) - N D log(scale) (the recorded centre and scale held fixed); a fit of
        # c Y then has the same embedding and the bound shifted by -N D log c
        self.elbo_trace_ = trace - n * D * np.log(scale)
        self.elbo_ = float(self.elbo_trace_[-1])
        self.n_iter_ = len(trace)
        self.converged_ = self.tol > 0 and stalled(trace, self.tol)
        return self

    # ------------------------------------------------------------------ the model as arrays
    def to_arrays(self) -> tuple[dict, dict]:
        """The contract's arrays and params, with q(x) and q(C) beside them (their means are
        ``embedding_`` and ``C_``): covariance blocks, and the full covariances of the dense solver."""
        arrays, params = super().to_arrays()
        for name, q in (("qx", self.qx_), ("qc", self.qc_)):
            for part in ("cov", "cov_edge", "full"):
                if getattr(q, part) is not None:
                    arrays[f"{name}_{part}"] = getattr(q, part)
            params["fitted"][f"{name}_logdet_prec"] = float(q.logdet_prec)
        params["fitted"]["qx_alpha"] = None if self.qx_.alpha is None else float(self.qx_.alpha)
        return arrays, params

    def _restore(self, data, graph) -> None:
        """q(x), q(C), theta from the kept arrays; the scaled training rows, the adjacency and the
        solver's graph quantities from the store's data and neighbour graph, as ``fit`` made them."""
        Y = check_data(data)
        if Y.shape != (len(self.embedding_), self.C_.shape[1]):
            raise ValueError(f"data has shape {Y.shape}, the model was fitted on {self.C_.shape[:2]}")
        self.Y_train_ = (Y - self.center_) / self.scale_
        self.adjacency_ = self._graph(Y, graph)
        self.graph_ = prepare_graph(
            self.adjacency_, self.solver_, self.chunks, self.likelihood, self.epsilon_form
        )
        q = {
            name: self.__dict__.pop(name, None) for name in list(self.__dict__) if name[:3] in ("qx_", "qc_")
        }
        self.qx_ = QX(
            mean=self.embedding_,
            cov=q["qx_cov"],
            cov_edge=q["qx_cov_edge"],
            logdet_prec=q["qx_logdet_prec"],
            full=q.get("qx_full"),
            alpha=q["qx_alpha"],
        )
        self.qc_ = QC(
            mean=self.C_,
            cov=q["qc_cov"],
            cov_edge=q["qc_cov_edge"],
            logdet_prec=q["qc_logdet_prec"],
            full=q.get("qc_full"),
        )
        self.theta_ = Theta(
            alpha=self.alpha_,
            beta=self.beta_,
            gamma=self.gamma_,
            eps_c=float(self.epsilon_c),
            eps_y=float(self.epsilon_y),
        )

    # ------------------------------------------------------------------ new points
    def _out_of_sample(self, Y_new):
        """(scaled rows, neighbours, q(x*) mean and cov, q(C*) mean and cov) of new points."""
        self._check_fitted()
        Ytr = self.Y_train_
        Y_new = check_data(Y_new, "Y_new")
        if Y_new.shape[1] != Ytr.shape[1]:
            raise ValueError(f"Y_new has {Y_new.shape[1]} features, the model was fitted on {Ytr.shape[1]}")
        Y_new = (Y_new - self.center_) / self.scale_
        nbr, _ = lg.knn_query(Ytr, Y_new, int(self.n_neighbors))
        return (Y_new, nbr, *transform_points(Ytr, self.graph_, self.qx_, self.qc_, self.theta_, Y_new, nbr))

    def transform(self, Y_new, return_var: bool = False, return_cov: bool = False):
        """Posterior mean (M, Q) of x* for new points, with ``return_var`` also the marginal variances
        (M, Q), with ``return_cov`` the covariances (M, Q, Q): each new point joins the training graph
        alone with edges to its n_neighbors nearest training points; E-step for (x*, C*) with the
        training posterior and theta frozen (``oos.transform_points``, on the fit's solver), so a
        point's answer does not depend on the others transformed with it. Does not change the fit."""
        _, _, mx, Sx, _, _ = self._out_of_sample(Y_new)
        if return_cov:
            return mx, Sx
        return (mx, np.diagonal(Sx, axis1=1, axis2=2).copy()) if return_var else mx

    def score_samples(self, Y_new) -> np.ndarray:
        """LL-LVM's per-point likelihood term: log p(y* | the training rows) under the likelihood
        (``oos.conditional_loglik``) with x*, C* at their out-of-sample posterior means, the training
        ones at theirs; a density of Y as given (the standardisation's - D log scale). Higher =
        better represented."""
        Ys, nbr, mx, _, Cs, _ = self._out_of_sample(Y_new)
        return self._loglik_at(Ys, nbr, mx, Cs)

    def map_points(self, Y_new):
        """(latent means, marginal variances, mapping scores) of new points from one out-of-sample
        E-step (``transform``'s) and the likelihood term of ``score_samples`` at its posterior
        means; on a graph in several pieces, each component's ``transform`` and ``mapping_score``."""
        if self.__dict__.get("components_") is not None:
            return super().map_points(Y_new)
        self.reference_pair(Y_new)
        Ys, nbr, mx, Sx, Cs, _ = self._out_of_sample(Y_new)
        var = np.diagonal(Sx, axis1=1, axis2=2).copy()
        return mx, var, self.standardised(self._loglik_at(Ys, nbr, mx, Cs), Y_new)

    def _loglik_at(self, Ys, nbr, mx, Cs) -> np.ndarray:
        """``score_samples``' likelihood term of scaled new rows ``Ys`` with neighbours ``nbr`` at
        their out-of-sample posterior means of x* (``mx``) and C* (``Cs``)."""
        Ytr, x, C = self.Y_train_, self.embedding_, self.C_
        et = np.einsum("mkdq,mkq->md", Cs[:, None] + C[nbr], mx[:, None, :] - x[nbr])
        others = np.broadcast_to(Ytr.sum(axis=0), Ys.shape) if self.epsilon_form == "ones" else None
        ll = conditional_loglik(
            Ys, np.full(len(Ys), nbr.shape[1]), et, Ytr[nbr].sum(axis=1), self.theta_, others
        )
        return ll - Ys.shape[1] * np.log(self.scale_)

    def reference_score_stats(self, Y_train=None, random_state: int = 0) -> tuple[float, float]:
        """Median and MAD of the training points' scores (at most ``REFERENCE_SCORE_CELLS``, a
        seeded subsample), each scored as ``score_samples`` scores a new point (the out-of-sample
        E-step and the likelihood term at its means), its neighbours its ``n_neighbors`` nearest
        other training rows: itself left out. A training row's conditional in the fitted graph
        instead scores it by the x and C fitted to it, so a new cell of a kind the reference holds
        would sit well below a typical reference cell."""
        self._check_fitted()
        Ytr = self.Y_train_
        n, k = len(Ytr), int(self.n_neighbors)
        rows = np.arange(n)
        if n > REFERENCE_SCORE_CELLS:
            rows = np.sort(
                np.random.default_rng(random_state).choice(n, REFERENCE_SCORE_CELLS, replace=False)
            )
        nbr = lg.knn_query(Ytr, Ytr[rows], k + 1)[0]
        # the row itself, or where duplicates tie with it the farthest of the k + 1
        self_at = np.where((nbr == rows[:, None]).any(axis=1), (nbr == rows[:, None]).argmax(axis=1), k)
        keep = np.arange(k + 1)[None, :] != self_at[:, None]
        nbr = nbr[keep].reshape(len(rows), k)
        mx, _, Cs, _ = transform_points(Ytr, self.graph_, self.qx_, self.qc_, self.theta_, Ytr[rows], nbr)
        s = self._loglik_at(Ytr[rows], nbr, mx, Cs)
        med = float(np.median(s))
        mad = float(np.median(np.abs(s - med)))
        self.score_reference_ = [med, mad if mad > 0 else 1.0]
        return med, self.score_reference_[1]

    def inverse_transform(self, X):
        """Reconstruction of section 4.2 from the n_neighbors nearest training latents (both likelihoods:
        it uses the posterior means of x and C only)."""
        self._check_fitted()
        X = check_data(X, "X")
        if X.shape[1] != self.embedding_.shape[1]:
            raise ValueError(
                f"X has {X.shape[1]} columns, the latent dimension is {self.embedding_.shape[1]}"
            )
        Yhat = reconstruct(self.Y_train_, self.qx_, self.qc_, X, int(self.n_neighbors))
        return Yhat * self.scale_ + self.center_

    def score(self, Y, graph=None) -> float:
        """The final lower bound of a fit with this estimator's settings on (Y, graph): compare
        hypothesised graphs (or k) by it (paper section 4.1). Does not change this estimator."""
        return LLLVM(**self.get_params()).fit(Y, graph).elbo_
