"""Hyperboloid GP-LVM (paper 002), by job: the bounds (``objectives``; the exact point variant's
eq. 4 in ``point``), full-batch training (``full``), minibatch training (``minibatch``), what the
two share (``training``) and the estimators (``estimators``).

The model: GP-LVM, sparse and Bayesian GP-LVM with latent points on the
Lorentz model L^Q and the hyperboloid exponential (HE) kernel k(x, x') = sigma exp(-d_L(x, x') / kappa)
(eq. 10, :class:`lvmcore.kernels.hyperbolic.HyperboloidExponential`).

Objectives (section 2.1, eqs. 4-6), maximised:

* ``point``:    exact log marginal likelihood  sum_d log N(y_d | 0, K + beta^-1 I)  (eq. 4, its
                one home :mod:`lvmcore.models.hgplvm.point`: the value, and the hand-written
                gradient the fit's step uses with K^-1 from one LAPACK Cholesky and inverse);
                beta is by default fixed at the Q-dimensional PPCA noise level (``noise``).
* ``sparse``:   collapsed Titsias bound (eq. 5) with M inducing inputs Z on the hyperboloid.
* ``bayesian``: collapsed Bayesian GP-LVM bound (eq. 6) with wrapped Gaussians q(x_i) = N^w(mu_i, S_i),
                prior N^w(mu0, I), Monte-Carlo psi statistics and KL (eqs. 13-20,
                ``lvmcore.psi``), a fresh sample of H draws per point every step, and
                a learned noise. Its estimator (the one entry, with its defaults) is
                :class:`BayesianHyperboloidGPLVM`, whose full-batch fit is the same
                loop as the sparse variant's (``full``).

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

Measurements behind these choices: bench/README.md ("hGP-LVM quality").
"""

from lvmcore.models.hgplvm.estimators import (
    FULL_BATCH_MAX_N,
    BaseHyperboloidGPLVM,
    BayesianHyperboloidGPLVM,
    HyperboloidGPLVM,
)
from lvmcore.models.hgplvm.objectives import (
    bayesian_objective,
    lift,
    minibatch_bound,
    point_statistics,
    sparse_objective,
)
from lvmcore.models.hgplvm.point import point_objective

__all__ = [
    "FULL_BATCH_MAX_N",
    "BaseHyperboloidGPLVM",
    "BayesianHyperboloidGPLVM",
    "HyperboloidGPLVM",
    "bayesian_objective",
    "lift",
    "minibatch_bound",
    "point_objective",
    "point_statistics",
    "sparse_objective",
]
