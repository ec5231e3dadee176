"""Generative locally linear embedding (paper 001): stochastic linear reconstruction by EM
(Algorithm 1) or by direct sampling (Algorithm 2), then LLE's linear embedding of each draw.

Conventions and the treatment of the singular conditioning
------------------------------------------------------------
Point i (dimension D) has k neighbours; ``G_i`` (k x D) holds the neighbour differences
y_j - y_i. LLE's weights sum to one, so the weights are written w = w0 + B v with w0 = 1/k and B
(k x k', k' = k - 1) an orthonormal basis of the plane sum(w) = 0; then the paper's model (eqs.
16-20) reads x_i - xbar_i = X~_i v with X~_i = G_i^T B (D x k') and xbar_i the neighbours' mean
(the paper's mu, taken per neighbourhood so that the weights keep LLE's affine invariance), with
prior v ~ N(0, sigma_i I) (the relaxed Omega_i = sigma_i I of eq. 27 on that plane).

The paper conditions on X~ Omega X~^T = sigma X~ X~^T (D x D), which is singular whenever
k' < D and whenever the neighbours are degenerate (coplanar, duplicated); its pseudo-inverse makes
the E-step depend on a rank decision and, in the authors' code, lets sigma_i go negative. Here the
likelihood covariance is sigma_i (X~ X~^T + eps_i I) with eps_i = reg * trace(G_i G_i^T), the same
trace-relative regulariser LLE uses. Then, exactly (push-through identity, everything in k' x k'):

* E-step (eqs. 21-22): E[v] = (X~^T X~ + eps I)^-1 X~^T (x_i - xbar_i), which is LLE's regularised
  weight vector (so the mean weights equal scikit-learn's barycenter weights), and
  Cov[v] = sigma_i eps_i (X~^T X~ + eps I)^-1, positive definite for every k and D.
* M-step (eq. 29 with D + k' in place of d + k): sigma_i = (tr(A_i^-1 S1_i) + tr(S2_i)) / (D + k')
  with A_i = X~ X~^T + eps I, S1_i = r r^T + X~ Cov X~^T (r the residual of the mean) and
  S2_i = Cov + E[v] E[v]^T (the second moment; eq. 22 names the covariance). Both traces are
  non-negative and tr(Cov) > 0, so sigma_i > 0 at every iteration; the update is the affine map
  sigma <- (b_i + c_i sigma) / (D + k') with slope c_i / (D + k') < 1, so EM converges. A floor
  guards the degenerate case b_i = 0 (a point that its neighbours reconstruct exactly with zero
  weights, e.g. all duplicates): ``SIGMA_FLOOR`` times the neighbourhood's mean squared distance
  over the data's mean squared (centred) value, a pure number like sigma_i itself.

Scale: sigma_i, the weights and their covariance are pure numbers (the weights are trace-relative),
so for data c Y the fit is the fit of Y and the bound, a density of Y (eq. 23), is shifted by the
log-Jacobian: elbo(c Y) = elbo(Y) - N D log c. ``data_scale_`` (the data's root mean square
centred value) is recorded and enters only as a ratio to the data's units.

The expected complete-data log-likelihood (eq. 23 with the relaxation) is recorded every
iteration in ``elbo_trace_``; iteration stops when its relative change falls below ``tol``.

Direct sampling (Algorithm 2): LLE first; then w ~ N(w_LLE, a Gamma_i) on the plane sum(w) = 1
with Gamma_i = tau_i^2 (B^T (G_i G_i^T + H_i H_i^T) B + eps_i' I)^-1, H_i the neighbour differences
in the LLE embedding (scaled to unit variance, eq. 37) and eps_i' = reg * trace(G G^T + H H^T).
The ridge makes eq. 35's precision defined when k > D + Q. Eq. 33 adds the data's squared
residual to the embedding's (unit variance per coordinate), which ties the result to the data's
units; here the embedding is put in the data's units first (H multiplied by ``data_scale_``, the
data's root mean square centred value, so both are of one size per coordinate as if the data were
standardised), and the exponent is divided by a per-point noise variance tau_i^2, so a = 1 means
"as uncertain as the reconstruction residuals say". Then data c Y gives the fit of Y, and the
bound, a log-density of the (pure-number) weights, is the same for every c (not shifted). Reading the
ridge as a prior v ~ N(0, (tau^2 / eps') I), tau_i^2 is the evidence-maximising value

    tau_i^2 = (|r_i|^2 + eps' |v_ridge|^2) / (D + Q),   r_i the residual at the ridge weights,

which sets the spread in the k' - (D + Q) directions the neighbours leave free (bench/README.md,
"GLLE direct sampling", has the measurements behind this choice).

Generations (section VI): each draw of all weights gives W, and the embedding of section V (the
bottom eigenvectors of (I - W)^T (I - W) without the constant one). ``cov_scale`` is the paper's
a: the sampling covariance is a Cov[v] (EM) or a Gamma_i (direct). Each generation's coordinates
are permuted and sign-flipped to match the LLE embedding's (``lvmcore.lle.match_axes``), never
rotated; unfolding is measured over all directions of an embedding (``lvmcore.metrics.unfolding``),
as LLE's cost is rotation-invariant.
"""

from __future__ import annotations

from functools import wraps
from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from lvmcore.checks import check_data, check_graph, check_positive, check_positive_int
from lvmcore.graph import knn, knn_query
from lvmcore.lle import (
    BLOCK_POINTS,
    barycenter_weights,
    embed,
    fill_reducing_order,
    map_points,
    match_axes,
    neighbour_differences,
    resolve_solver,
    trace_regulariser,
    weight_matrix,
)
from lvmcore.models._base import REFERENCE_SCORE_CELLS, LatentModel, stalled
from lvmcore.models.components import by_component, neighbour_index_graph
from lvmcore.rows import resolve, source_of

#: sigma_i never falls below this times the neighbourhood's mean squared distance over the data's
#: mean squared centred value (a pure number: the same floor for data at any scale)
SIGMA_FLOOR = 1e-12
_METHODS = ("em", "direct")


def sum_to_one_basis(k: int) -> np.ndarray:
    """Orthonormal basis B (k, k-1) of the plane sum(w) = 0 (columns orthogonal to ones)."""
    Q, _ = np.linalg.qr(np.column_stack([np.ones(k), np.eye(k)[:, : k - 1]]))
    return Q[:, 1:]


def data_scale(Y) -> float:
    """The data's root mean square centred value, sqrt(sum (Y - mean)^2 / (N D)): the unit the fit
    measures the data in (1.0 for constant data, which has none)."""
    s = float(np.sqrt(np.mean((Y - Y.mean(axis=0)) ** 2)))
    return s if s > 0 and np.isfinite(s) else 1.0


# --------------------------------------------------------------------------- per-point statistics
def in_blocks(func):
    """``func(Y, idx, rows, *per_row_arrays, **kwargs)`` run over blocks of ``BLOCK_POINTS`` rows
    and concatenated (positional arrays are sliced with the rows, so everything else is
    keyword-only in the wrapped functions): the (block, k, k) temporaries stay bounded whatever
    the number of rows (a 10^6-point fit without chunks), with the same results to rounding (the
    rows are independent; batched BLAS may round a block of another size differently)."""

    @wraps(func)
    def blocked(Y, idx, rows, *arrays, **kwargs):
        if len(rows) <= BLOCK_POINTS:
            return func(Y, idx, rows, *arrays, **kwargs)
        parts = [
            func(
                Y,
                idx[s : s + BLOCK_POINTS],
                rows[s : s + BLOCK_POINTS],
                *(a[s : s + BLOCK_POINTS] for a in arrays),
                **kwargs,
            )
            for s in range(0, len(rows), BLOCK_POINTS)
        ]
        return tuple(np.concatenate(p, axis=0) for p in zip(*parts))

    return blocked


@in_blocks
def em_point_stats(Y, idx, rows, *, reg):
    """Everything EM needs per point, batched over the given rows (see the module docstring).

    Returns (mean_w (n,k), b (n,), c (n,), logdet_A (n,), eps (n,), L (n,k',k')) where
    L L^T = X~^T X~ + eps I and the sigma update is sigma <- (b + c sigma) / (D + k')."""
    G = neighbour_differences(Y, idx, rows)  # (n, k, D)
    n, k, D = G.shape
    B = sum_to_one_basis(k)
    C = G @ G.transpose(0, 2, 1)
    eps = trace_regulariser(C, reg)
    K = B.T @ C @ B  # X~^T X~  (n, k', k')
    kp = k - 1
    Gm = K + eps[:, None, None] * np.eye(kp)
    L = np.linalg.cholesky(Gm)
    y = -G.mean(axis=1)  # x_i - xbar_i
    Xty = np.einsum("nkd,nd->nk", G, y) @ B  # X~^T y
    m = np.linalg.solve(Gm, Xty[..., None])[..., 0]
    Bm = m @ B.T
    r = y - np.einsum("nk,nkd->nd", Bm, G)
    Xtr = np.einsum("nkd,nd->nk", G, r) @ B
    rAr = (
        np.einsum("nd,nd->n", r, r) - np.einsum("nk,nk->n", Xtr, np.linalg.solve(Gm, Xtr[..., None])[..., 0])
    ) / eps
    s2 = np.clip(np.linalg.eigvalsh(K), 0.0, None)
    c = eps * np.sum(s2 / (s2 + eps[:, None]) ** 2 + 1.0 / (s2 + eps[:, None]), axis=1)
    b = np.maximum(rAr, 0.0) + np.einsum("nk,nk->n", m, m)
    logdet_A = (D - kp) * np.log(eps) + np.sum(np.log(s2 + eps[:, None]), axis=1)
    mean_w = 1.0 / k + Bm
    return mean_w, b, c, logdet_A, eps, L


@in_blocks
def direct_point_stats(Y, idx, rows, *, E, reg):
    """Cholesky factor L (n,k',k') of the precision of eq. (35) on the plane sum(w) = 1, with the
    ridge read as a prior and the evidence-maximising noise variance of the module docstring, and
    log|L L^T| (n,)."""
    G = neighbour_differences(Y, idx, rows)
    H = neighbour_differences(E, idx, rows)
    n, k, D = G.shape
    B = sum_to_one_basis(k)
    C = G @ G.transpose(0, 2, 1) + H @ H.transpose(0, 2, 1)
    eps = trace_regulariser(C, reg)
    Cr = C + eps[:, None, None] * np.eye(k)
    w = np.linalg.solve(Cr, np.ones((n, k, 1)))[..., 0]
    w /= w.sum(axis=1, keepdims=True)
    # evidence-maximising noise variance (module docstring): |r|^2 + eps |v|^2, where |w|^2 = 1/k + |v|^2
    tau2 = (np.einsum("nk,nkl,nl->n", w, Cr, w) - eps / k) / (D + H.shape[2])
    tau2 = np.maximum(tau2, SIGMA_FLOOR * eps / reg / k)
    P = (B.T @ C @ B + eps[:, None, None] * np.eye(k - 1)) / tau2[:, None, None]
    L = np.linalg.cholesky(P)
    return L, 2.0 * np.sum(np.log(np.diagonal(L, axis1=1, axis2=2)), axis=1)


@in_blocks
def sample_point_weights(Y, idx, rows, mean_w, L, scale, z):
    """w = mean_w + B L^-T z sqrt(scale): one draw of N(mean_w, scale (L L^T)^-1) on sum(w) = 1."""
    k = idx.shape[1]
    B = sum_to_one_basis(k)
    v = np.linalg.solve(L.transpose(0, 2, 1), z[..., None])[..., 0]
    return (mean_w + (v * np.sqrt(scale)[:, None]) @ B.T,)


@in_blocks
def oos_point_stats(Y, idx, rows, *, reg):
    """``em_point_stats`` and quad (n,) = (y - ybar)^T A^-1 (y - ybar) = |r|^2 / eps + |m|^2 (the
    minimum of |y - X~ v|^2 / eps + |v|^2, at v = m): what the out-of-sample step of each row needs."""
    mean_w, b, c, logdet_A, eps, L = em_point_stats(Y, idx, rows, reg=reg)
    G = neighbour_differences(Y, idx, rows)
    dw = mean_w - 1.0 / idx.shape[1]  # B m
    r = -G.mean(axis=1) - np.einsum("nk,nkd->nd", dw, G)
    quad = np.einsum("nd,nd->n", r, r) / eps + np.einsum("nk,nk->n", dw, dw)
    return mean_w, b, c, logdet_A, eps, L, quad


def em_iterations(b, c, logdet_A, D, kp, *, max_iter, tol, floor):
    """Run the sigma updates of Algorithm 1. Returns (sigma, trace of the expected complete-data
    log-likelihood per iteration, iterations)."""
    dk = D + kp
    sigma = np.maximum(b / dk, floor)
    const = dk * (np.log(2.0 * np.pi) + 1.0)
    trace = []
    for _ in range(max_iter):
        new = np.maximum((b + c * sigma) / dk, floor)
        # eq. 23 relaxed, at the new sigma with the posterior of the old one; its last term
        # (b + c sigma_old) / sigma_new equals D + k' except where the floor binds
        q = -0.5 * np.sum(const - dk + logdet_A + dk * np.log(new) + (b + c * sigma) / new)
        sigma = new
        trace.append(q)
        if stalled(trace, tol):
            break
    return sigma, np.asarray(trace), len(trace)


# --------------------------------------------------------------------------- estimator
@by_component(neighbour_index_graph)  # a graph in several pieces: one fit per component
class GLLE(LatentModel):
    """Generative LLE (paper 001); on a disconnected graph, per component (``models.components``).

    Parameters
    ----------
    n_components : embedding dimension Q (< D and < n_neighbors)
    n_neighbors : k (the point itself is not counted)
    method : "em" (Algorithm 1) or "direct" (Algorithm 2)
    cov_scale : the paper's a, the default scale of the sampling covariance in ``sample``
    reg : trace-relative regulariser of the weights (scikit-learn's ``reg``)
    max_iter, tol : EM iterations and relative change of the expected log-likelihood to stop at
    chunks : points per Dask chunk for the per-point work (None: in process). Identical results.
    eigen_solver : "auto", "dense" or "pinned_lu" for the embedding eigenproblems
        (``lvmcore.lle.embed``); the sparse one's METIS ordering is computed once per fit and
        shared by the LLE embedding and every generation (one neighbour graph)
    random_state : seed of the generation kept as ``embedding_`` and of the eigensolver start

    Attributes
    ----------
    embedding_ : (N, Q) the generation drawn with ``random_state`` (axes matched to the LLE one)
    embedding_var_ : None (the model has weight variances, not per-point latent variances)
    lle_embedding_ : (N, Q) LLE's embedding (unit variance per coordinate)
    data_scale_ : the data's root mean square centred value (the floor's and, for direct sampling,
        the embedding's unit; see the module docstring, "Scale")
    weights_ : (N, k) mean reconstruction weights (the LLE weights for both methods)
    sigma_ : (N,) EM's relaxed weight variances (method "em")
    elbo_, elbo_trace_ : EM: expected complete-data log-likelihood per iteration (the final one);
        direct: the log-density of the LLE weights under eq. (36), summed over points
    n_iter_ : EM iterations (1 for direct)
    """

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "n_neighbors": [Interval(Integral, 2, None, closed="left")],
        "method": [StrOptions(set(_METHODS))],
        "cov_scale": [Interval(Real, 0, None, closed="neither")],
        "reg": [Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "chunks": [Interval(Integral, 1, None, closed="left"), None],
        "eigen_solver": [StrOptions({"auto", "dense", "pinned_lu"})],
        "random_state": [Interval(Integral, 0, None, closed="left"), None],
    }
    #: the store keeps these; the training rows and the fit's neighbour graph come back as inputs
    persisted = LatentModel.persisted + (
        "elbo_trace_",
        "lle_embedding_",
        "data_scale_",
        "weights_",
        "sigma_",
        "score_reference_",
    )
    needs_inputs = ("data", "graph")

    def __init__(
        self,
        *,
        n_components: int = 2,
        n_neighbors: int = 10,
        method: str = "em",
        cov_scale: float = 1.0,
        reg: float = 1e-3,
        max_iter: int = 100,
        tol: float = 1e-9,
        chunks: int | None = None,
        eigen_solver: str = "auto",
        random_state=None,
    ):
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.method = method
        self.cov_scale = cov_scale
        self.reg = reg
        self.max_iter = max_iter
        self.tol = tol
        self.chunks = chunks
        self.eigen_solver = eigen_solver
        self.random_state = random_state

    def _check_shapes(self, n, D):
        """The data-dependent rules (the others are ``_parameter_constraints``)."""
        q, k = int(self.n_components), int(self.n_neighbors)
        if q >= D:
            raise ValueError(
                f"Expected n_components < n_features, but n_features = {D}, n_components = {q}; "
                "lower n_components"
            )
        if k >= n:
            raise ValueError(
                f"Expected n_neighbors < n_samples, but n_samples = {n}, n_neighbors = {k}; lower n_neighbors"
            )
        if k <= q:
            raise ValueError(
                f"Expected n_neighbors > n_components, but n_neighbors = {k}, n_components = {q}; "
                "raise n_neighbors"
            )
        return q, k

    def fit(self, Y, graph=None, *, client=None, worker: str | None = None):
        """Fit on Y (N, D); ``graph`` (N, >= k) neighbour indices without self, else exact kNN.

        ``client``: a Dask distributed client on which, with ``chunks``, the fit's eigenproblems run
        as tasks (None: in process); ``worker``: the address of the Dask worker this call runs on,
        if it runs in a Dask task: those tasks then go to the other workers (:func:`_other_workers`).
        Neither changes a result."""
        self._validate_params()
        Y = check_data(Y)
        n, D = Y.shape
        q, k = self._check_shapes(n, D)
        if graph is None:
            idx, _ = knn(Y, k)
        else:
            idx = check_graph(graph, n, k)
        self.Y_train_, self.graph_ = Y, idx
        seed = 0 if self.random_state is None else self.random_state
        self.data_scale_ = data_scale(Y)
        if self.method == "em":
            mean_w, b, c, logdet_A, eps, L = map_points(
                em_point_stats, Y, idx, chunks=self.chunks, client=client, reg=self.reg
            )
            floor = SIGMA_FLOOR * eps / self.reg / k / self.data_scale_**2
            sigma, trace, it = em_iterations(
                b, c, logdet_A, D, k - 1, max_iter=self.max_iter, tol=self.tol, floor=floor
            )
            self.sigma_, self._factor, self._scale = sigma, L, sigma * eps
        else:
            mean_w = barycenter_weights(Y, idx, self.reg)
        self.weights_ = mean_w
        W = weight_matrix(mean_w, idx)
        self._order = fill_reducing_order(W) if resolve_solver(self.eigen_solver, n) == "pinned_lu" else None
        (s0,) = _seeds(self.random_state, 1)
        if self.method == "em":  # the kept generation's draw needs no LLE embedding: both solved at once
            draws = [mean_w, self._draw_weights(s0, None, client)]
            self.lle_embedding_, kept = self._embed_all(draws, [seed, s0], client, worker)
        else:  # direct: the sampling covariance needs the LLE embedding, so the kept draw comes after
            (self.lle_embedding_,) = self._embed_all([mean_w], [seed], client, worker)
            L, logdet_P = map_points(
                direct_point_stats,
                Y,
                idx,
                chunks=self.chunks,
                client=client,
                E=self.lle_embedding_ * self.data_scale_,  # in the data's units (module docstring)
                reg=self.reg,
            )
            self._factor, self._scale = L, np.ones(n)
            trace, it = np.array([float(np.sum(0.5 * logdet_P - 0.5 * (k - 1) * np.log(2 * np.pi)))]), 1
            (kept,) = self._embed_all([self._draw_weights(s0, None, client)], [s0], client, worker)
        # the kept draw is generation 0 of sample(G, random_state) at the constructor's a: kept to
        # answer that draw again without a second eigensolve (the sweep asks it twice more)
        self._kept = ((s0, self.cov_scale), kept)
        self.embedding_ = match_axes(self.lle_embedding_, kept)
        self.elbo_trace_, self.n_iter_ = trace, it
        # EM: its rule fired (not the budget); direct: a closed form, nothing to converge
        self.converged_ = stalled(trace, self.tol) if self.method == "em" else True
        self.elbo_ = float(trace[-1])
        self.embedding_var_ = None
        return self

    # --- the model as arrays, and the out-of-sample step ---------------------------------------
    def _restore(self, data, graph) -> None:
        """The training rows and the fit's graph back from the store's inputs; the sampling
        factors (per-point statistics of the fit, recomputed exactly) wait for the first draw."""
        Y = check_data(data)
        if len(Y) != len(self.lle_embedding_):
            raise ValueError(f"data has {len(Y)} rows, the model was fitted on {len(self.lle_embedding_)}")
        self.Y_train_, self.graph_ = Y, check_graph(graph, Y.shape[0], int(self.n_neighbors))
        self._factor = self._scale = self._order = None
        self._kept = ((None, None), None)  # generation 0 is solved again when asked (same seed)

    def _sampling_factors(self, client=None) -> None:
        """The per-point factors and scales of the weight draws, as ``fit`` computed them."""
        Y, idx = self.Y_train_, self.graph_
        if self.method == "em":
            *_, eps, L = map_points(em_point_stats, Y, idx, chunks=self.chunks, client=client, reg=self.reg)
            self._factor, self._scale = L, self.sigma_ * eps
        else:
            E = self.lle_embedding_ * self.data_scale_
            L, _ = map_points(
                direct_point_stats, Y, idx, chunks=self.chunks, client=client, E=E, reg=self.reg
            )
            self._factor, self._scale = L, np.ones(len(Y))
        if resolve_solver(self.eigen_solver, len(Y)) == "pinned_lu":
            self._order = fill_reducing_order(weight_matrix(self.weights_, idx))

    def _map_rows(self, Yc, idx, rows, e_rows=None):
        """The out-of-sample step for rows ``rows`` of ``Yc`` reconstructed from the training
        neighbours ``idx`` (each row its own problem). Returns (mean (n, Q) = sum_j w_j x_j over the
        neighbours' ``embedding_``; var (n, Q) = a X_nbr^T Cov[w] X_nbr per latent dimension, Cov[w]
        the weights' posterior (EM: sigma eps (X~^T X~ + eps I)^-1; direct: Gamma of eq. 35, the
        row's LLE coordinate ``e_rows`` (default: its mean map) in H); log-likelihood (n,) of the
        row's reconstruction, log N(y - ybar; 0, sigma A) with A = X~ X~^T + eps I (module docstring),
        sigma the row's EM variance (``n_iter_`` updates from b / (D + k'), as the fit ran them; for
        direct sampling their fixed point))."""
        k, D = idx.shape[1], Yc.shape[1]
        dk = D + k - 1
        mean_w, b, c, logdet_A, eps, L, quad = oos_point_stats(Yc, idx, rows, reg=self.reg)
        floor = SIGMA_FLOOR * eps / self.reg / k / self.data_scale_**2
        if self.method == "em":
            sigma = np.maximum(b / dk, floor)
            for _ in range(int(self.n_iter_)):
                sigma = np.maximum((b + c * sigma) / dk, floor)
            scale = sigma * eps
        else:
            sigma = np.maximum(b / (dk - c), floor)
            E = self.lle_embedding_ * self.data_scale_
            e_rows = np.einsum("nk,nkq->nq", mean_w, E[idx]) if e_rows is None else e_rows
            Ec = np.zeros((len(Yc), E.shape[1]))
            Ec[: len(E)] = E
            Ec[rows] = e_rows
            L, _ = direct_point_stats(Yc, idx, rows, E=Ec, reg=self.reg)
            scale = np.ones(len(rows))
        Xn = self.embedding_[idx]  # (n, k, Q)
        T = np.linalg.solve(L, np.einsum("kp,nkq->npq", sum_to_one_basis(k), Xn))  # L^-1 B^T X_nbr
        var = float(self.cov_scale) * scale[:, None] * np.sum(T**2, axis=1)
        loglik = -0.5 * (D * np.log(2.0 * np.pi) + D * np.log(sigma) + logdet_A + quad / sigma)
        return np.einsum("nk,nkq->nq", mean_w, Xn), var, loglik

    def _map_new(self, Y_new):
        self._check_fitted()
        Y_new = check_data(Y_new, "Y_new")
        n, D = self.Y_train_.shape
        if Y_new.shape[1] != D:
            raise ValueError(f"Y_new has {Y_new.shape[1]} features, the model was fitted on {D}")
        nbr, _ = knn_query(self.Y_train_, Y_new, int(self.n_neighbors))  # exact, Euclidean as the fit's
        return self._map_rows(np.vstack([self.Y_train_, Y_new]), nbr, n + np.arange(len(Y_new)))

    def transform(self, Y_new, return_var: bool = False):
        """New points (n, D) -> their latent means (n, Q) (and variances (n, Q) with ``return_var``)
        through the reconstruction weights from their k nearest training points (``_map_rows``),
        weights fitted as the fit's (same regulariser), the neighbours' latents ``embedding_``. A
        training row finds itself among its neighbours (distance 0)."""
        mean, var, _ = self._map_new(Y_new)
        return (mean, var) if return_var else mean

    def score_samples(self, Y_new) -> np.ndarray:
        """GLLE's named per-point log density: each new point's reconstruction log-likelihood from
        its k nearest training points under its weight model (``_map_rows``); higher = better
        reconstructed by the reference."""
        return self._map_new(Y_new)[2]

    def map_points(self, Y_new):
        """(latent means, variances, mapping scores) of new points from one pass of ``_map_rows``
        (neighbours and weights found once for ``transform``'s answer and ``score_samples``'); on
        a graph in several pieces, each component's ``transform`` and ``mapping_score``."""
        if self.__dict__.get("components_") is not None:
            return super().map_points(Y_new)
        self.reference_pair(Y_new)
        mean, var, loglik = self._map_new(Y_new)
        return mean, var, self.standardised(loglik, Y_new)

    def reference_score_stats(self, Y_train=None, random_state: int = 0) -> tuple[float, float]:
        """Median and MAD of the training points' scores (at most ``REFERENCE_SCORE_CELLS``, a
        seeded subsample), each scored from its fitted neighbours, itself left out, as a new point
        is (a training row passed to ``score_samples`` would find itself at distance 0)."""
        self._check_fitted()
        n = len(self.Y_train_)
        rows = np.arange(n)
        if n > REFERENCE_SCORE_CELLS:
            rng = np.random.default_rng(random_state)
            rows = np.sort(rng.choice(n, REFERENCE_SCORE_CELLS, replace=False))
        E = self.lle_embedding_ * self.data_scale_
        s = self._map_rows(self.Y_train_, self.graph_[rows], rows, E[rows])[2]
        med = float(np.median(s))
        mad = float(np.median(np.abs(s - med)))
        self.score_reference_ = [med, mad if mad > 0 else 1.0]
        return med, self.score_reference_[1]

    def sample_weights(self, random_state=None, cov_scale=None) -> np.ndarray:
        """One draw of all reconstruction weights (N, k)."""
        self._check_fitted()
        return self._draw_weights(random_state, cov_scale)

    def _draw_weights(self, random_state, cov_scale, client=None):
        a = self.cov_scale if cov_scale is None else check_positive(cov_scale, "cov_scale")
        if self._factor is None:  # a model loaded by from_arrays: its sampling factors, once
            self._sampling_factors(client)
        n, k = self.graph_.shape
        z = np.random.default_rng(random_state).standard_normal((n, k - 1))
        (w,) = map_points(
            sample_point_weights,
            self.Y_train_,
            self.graph_,
            self.weights_,
            self._factor,
            a * self._scale,
            z,
            chunks=self.chunks,
            client=client,
        )
        return w

    def sample(
        self, n_generations: int, random_state=None, cov_scale=None, *, client=None, worker: str | None = None
    ) -> np.ndarray:
        """``n_generations`` embeddings (G, N, Q) from one fit: each draws all weights and solves the
        embedding eigenproblem; each has its axes matched to ``lle_embedding_``. The same ``random_state``
        gives the same generations; ``cov_scale`` overrides the constructor's a.

        ``cov_scale`` may also be a sequence of scales (the covariance-scale study of section VI-C):
        then (S, G, N, Q), the generations of every scale drawn from the same random numbers (the
        draws of one seed differ only by a), each block equal to ``sample(G, random_state, a)``.
        With ``chunks`` and a Dask ``client`` the eigenproblems of one call are solved as tasks at
        once, one per draw, on whichever workers have a thread free (``worker``: as in :meth:`fit`)."""
        self._check_fitted()
        n = check_positive_int(n_generations, "n_generations")
        if cov_scale is None or np.ndim(cov_scale) == 0:
            return self._generations(n, random_state, [cov_scale], client, worker)
        scales = [check_positive(a, "cov_scale") for a in cov_scale]
        out = self._generations(n, random_state, scales, client, worker)
        return out.reshape(len(scales), n, *self.lle_embedding_.shape)

    def _generations(self, n_generations, random_state, scales: list, client, worker):
        """(S * G, N, Q), scale-major: G generations per entry of ``scales`` (None: the constructor's a)."""
        seeds = _seeds(random_state, n_generations)
        draws = [(s, self.cov_scale if a is None else a) for a in scales for s in seeds]
        kept_draw, kept = self._kept
        todo = list(dict.fromkeys(d for d in draws if d != kept_draw))
        solved = {kept_draw: kept}
        if todo:
            W = [self._draw_weights(s, a, client) for s, a in todo]
            solved.update(zip(todo, self._embed_all(W, [s for s, _ in todo], client, worker), strict=True))
        return np.stack([match_axes(self.lle_embedding_, solved[d]) for d in draws])

    def _embed_all(self, weights: list, seeds, client, worker: str | None) -> list:
        """The embedding of each weight draw in the list ``weights`` of (N, k) arrays
        (``lvmcore.lle.embed``, its start seeded by ``seeds``). In process one after the other; with
        ``chunks`` and a Dask ``client``, one task per draw: the draws are dealt over the workers (a
        scattered list goes round the workers) and solved at once, each task holding one
        eigenproblem, so a worker's memory holds one factor as in process. Called from a Dask task
        on ``worker``, the draws go to the other workers (:func:`_other_workers`): the calling worker
        keeps the fit's state and no factor beside it. The list is emptied once scattered.
        Identical results either way."""
        q = self.n_components
        if self.chunks is None or len(weights) <= 1:
            client = None
        if client is None:
            return [
                _embed_draw(self.graph_, self._order, w, q=q, solver=self.eigen_solver, seed=s)
                for w, s in zip(weights, seeds, strict=True)
            ]
        graph = source_of(self.graph_) or client.scatter(self.graph_, broadcast=True, hash=False)
        order = client.scatter(self._order, broadcast=True, hash=False) if self._order is not None else None
        where = _other_workers(client, worker)
        parts = client.scatter(list(weights), hash=False, workers=where)
        weights.clear()  # the workers hold the scattered copies
        futures = [
            client.submit(
                _embed_draw, graph, order, w, q=q, solver=self.eigen_solver, seed=s, workers=where, pure=False
            )
            for w, s in zip(parts, seeds, strict=True)
        ]
        return client.gather(futures)


def _other_workers(client, worker: str | None) -> list | None:
    """The workers an eigenproblem task may run on: called from a Dask task on ``worker`` (a
    sweep's fit), every worker but that one, which holds the fit's state (data, per-point factors,
    weights) for the whole point; an eigenproblem beside that state is the worker's largest peak
    (bench/README.md, "GLLE at scale"). None (any worker) outside a task (``worker`` None) or on a
    one-worker cluster."""
    if worker is None:
        return None
    others = [a for a in client.scheduler_info(n_workers=-1)["workers"] if a != worker]
    return others or None


def _seeds(random_state, n: int) -> np.ndarray:
    """The per-generation seeds of ``random_state`` (generation g of ``sample(G, r)`` uses the
    g-th: the first G of any longer call's)."""
    return np.random.default_rng(random_state).integers(2**63 - 1, size=n)


def _embed_draw(graph, order, w, *, q, solver, seed):
    """One generation's eigenproblem (a Dask task, or a plain call): the embedding of the weights
    ``w`` (N, k) on ``graph`` (an array, or a row source read here)."""
    return embed(weight_matrix(w, resolve(graph)), q, solver=solver, random_state=seed, order=order)[0]
