"""Benchmarks by topic. Each script runs from the repository root as a module,
``.venv/bin/python -m bench.<topic>.<script> ...``; Python imports this package first, so the shared
set-up of :mod:`bench.common` (one thread per BLAS, OpenMP and XLA pool) is in place before any
script imports numpy."""

from bench import common  # noqa: F401  (its import sets the thread limits)
