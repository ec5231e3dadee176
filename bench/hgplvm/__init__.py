"""Hyperboloid GP-LVM (paper 002): the authors' code as anchor, quality, convergence,
minibatch and sparse fits at scale."""
