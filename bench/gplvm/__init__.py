"""Bayesian GP-LVM and MRD (paper 004): the bound and its psi statistics, minibatch
training, MRD, the engine A/B."""
