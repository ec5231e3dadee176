"""Kernels, one module per geometry: ``euclidean`` (RBF-ARD, linear-ARD, with their psi
statistics) and ``hyperbolic`` (hyperboloid exponential). Import from the submodules."""
