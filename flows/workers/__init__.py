"""The plumbing of the sweep's worker processes, each module loaded by name where a worker starts:
``pin_cores`` (one core each), ``heap`` (the allocator's heap kept), ``logs`` (a lost scheduler as
one log line) are Dask ``--preload`` modules; ``pdeath`` runs a command that ends with its parent
(``python -m flows.workers.pdeath``)."""
