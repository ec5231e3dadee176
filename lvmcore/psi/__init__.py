"""Psi statistics: ``closed_form`` (RBF-ARD, linear-ARD under diagonal Gaussian q(X)),
``monte_carlo`` (hyperboloid exponential kernel under wrapped Gaussians) and ``reduce``
(the chunked Dask map-reduce of per-chunk partial sums and their vector-Jacobian products)."""
