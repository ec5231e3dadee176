"""LL-LVM: the locally linear latent variable model (paper 000 appendices B and C; paper 003),
fitted by variational EM. One module per group of appendix-C equations:

- ``operators``: the graph Laplacian, the prior / likelihood precisions built from it (Lt on the
  distance-2 pattern for the factorised solver), the e-operators F, G, e~ and the state containers;
- ``qx``: q(x) (eqs. 50-57); ``qc``: q(C) (eqs. 64-71);
- ``likelihood``: the likelihood statistics and <log p(y | x, C)>; ``bound``: the variational lower bound;
- ``mstep``: gamma, beta, alpha (eqs. 72-80);
- ``oos``: out-of-sample E-step and reconstruction (section 4.2);
- ``estimator``: the EM driver ``lllvm_fit`` and the ``LLLVM`` estimator.

Each equation has one entry for every solver, which it reads from the graph (``g.solver``): "dense"
(full-covariance q(x), q(C)), "sparse" (the quadratic variant's graph-sparse precisions) or
"factorised" (q(x), q(C) factorised per point: the paper's model at scale, needing Lt only on
distance-2 pairs). The factorised solver's graph structures are in ``local``, its CG and
preconditioners in ``cg``.

The default likelihood is the paper's normalised N(y | Sigma_y e, Sigma_y) (eqs. 29-31); the f-term
form of eq. 28 stays as ``likelihood="quadratic"``, which is not the paper's model.
"""

from .bound import elbo
from .estimator import (
    AUTO_DENSE_MAX_N,
    GAUSSIAN_DENSE_MAX_N,
    LLLVM,
    ONES_DENSE_MAX_N,
    lllvm_fit,
    spectral_init,
)
from .likelihood import FactStats, LikStats, expected_S, gauss_loglik, lik_stats
from .mstep import update_alpha, update_beta, update_gamma
from .oos import conditional_loglik, reconstruct, transform_points
from .operators import (
    QC,
    QX,
    LLGraph,
    Theta,
    c_quad,
    e_moment,
    eps_lap_inverse,
    lap_logdet_trace,
    lt_at,
    prepare_graph,
    x_quad,
)
from .qc import update_qc
from .qx import update_qx

__all__ = [
    "LLLVM",
    "LLGraph",
    "QX",
    "QC",
    "Theta",
    "LikStats",
    "FactStats",
    "prepare_graph",
    "update_qx",
    "update_qc",
    "expected_S",
    "update_alpha",
    "update_beta",
    "update_gamma",
    "elbo",
    "gauss_loglik",
    "lik_stats",
    "lllvm_fit",
    "spectral_init",
    "transform_points",
    "conditional_loglik",
    "reconstruct",
    "x_quad",
    "c_quad",
    "e_moment",
    "eps_lap_inverse",
    "lap_logdet_trace",
    "lt_at",
    "AUTO_DENSE_MAX_N",
    "GAUSSIAN_DENSE_MAX_N",
    "ONES_DENSE_MAX_N",
]
