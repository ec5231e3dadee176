"""LL-LVM (papers 000, 003): EM timings and solvers, studies of the default model, the
authors' code as oracle."""
