"""Shared test settings: one BLAS thread (the test machine has 2 cores shared by several jobs)."""

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
