"""LL-LVM: the locally linear latent variable model (paper 000 appendices B and C; paper 003),
fitted by variational EM. One module per group of appendix-C equations:

- ``operators``: the graph Laplacian, the prior / likelihood precisions built from it, the
  e-operators F, G and the state containers;
- ``estep_x``: q(x) (eqs. 50-57); ``estep_c``: q(C) (eqs. 64-71);
- ``mstep``: gamma, beta, alpha (eqs. 72-80); ``bound``: the variational lower bound;
- ``oos``: out-of-sample E-step and reconstruction (section 4.2);
- ``factorised``: the same model with q(x), q(C) factorised per point (``solver="factorised"``): the
  E-steps, bound, gamma step and out-of-sample E-step that need Lt only on distance-2 pairs;
- ``estimator``: the EM driver ``lllvm_fit`` and the ``LLLVM`` estimator.

The default likelihood is the paper's normalised N(y | Sigma_y e, Sigma_y) (eqs. 29-31); the f-term
form of eq. 28 stays as ``likelihood="quadratic"``, which is not the paper's model.
"""

from .bound import LikStats, elbo, expected_S, gauss_loglik, lik_stats
from .estep_c import update_qc
from .estep_x import update_qx
from .estimator import (
    AUTO_DENSE_MAX_N,
    GAUSSIAN_DENSE_MAX_N,
    LLLVM,
    ONES_DENSE_MAX_N,
    lllvm_fit,
    spectral_init,
)
from .mstep import update_alpha, update_beta, update_gamma
from .oos import reconstruct, transform_points, transform_points_gaussian
from .operators import (
    QC,
    QX,
    LLGraph,
    Theta,
    c_quad,
    e_moment,
    eps_lap_inverse,
    lap_logdet_trace,
    prepare_graph,
    x_quad,
)

__all__ = [
    "LLLVM",
    "LLGraph",
    "QX",
    "QC",
    "Theta",
    "LikStats",
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
    "transform_points_gaussian",
    "reconstruct",
    "x_quad",
    "c_quad",
    "e_moment",
    "eps_lap_inverse",
    "lap_logdet_trace",
    "AUTO_DENSE_MAX_N",
    "GAUSSIAN_DENSE_MAX_N",
    "ONES_DENSE_MAX_N",
]
