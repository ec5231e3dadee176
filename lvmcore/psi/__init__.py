"""Psi statistics: ``closed_form`` (RBF-ARD, linear-ARD under diagonal Gaussian q(X); the kernels
in ``lvmcore.kernels.euclidean`` dispatch to it), ``native`` (a C kernel for the RBF Psi2's pair
sums, the default path wherever it builds) and ``monte_carlo`` (hyperboloid exponential kernel
under wrapped Gaussians). The chunked map-reduce over rows is ``lvmcore.chunks``."""
