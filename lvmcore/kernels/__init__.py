"""Kernels, one module per geometry: ``euclidean`` (RBF-ARD, linear-ARD) and ``hyperbolic``
(hyperboloid exponential). Import from the submodules."""
