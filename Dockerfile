# The image that the `embed-sweep/k8s` deployment names (deploy/prefect.yaml, cluster.image): this
# project with its pinned dependencies and dask-kubernetes. The same image serves the pod running
# `prefect worker start --pool k8s-pool` and the Dask scheduler and worker pods that
# dask-kubernetes starts (they run `dask scheduler` / `dask worker` from it).
#
#   docker build -t ghcr.io/<your-org>/embed-sweep:<tag> .
#   docker push ghcr.io/<your-org>/embed-sweep:<tag>
FROM python:3.12-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    EMBED_SWEEP_HOME=/opt/embed-sweep \
    OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1 \
    MKL_NUM_THREADS=1 \
    EMBED_SWEEP_NATIVE=0

WORKDIR /opt/embed-sweep
COPY pyproject.toml requirements.lock README.md ./
COPY lvmcore lvmcore
COPY tasks tasks
COPY flows flows
COPY deploy deploy
# the pinned working set of requirements.lock plus dask-kubernetes (resolved against it:
# 2026.3.0 with kr8s 0.20 and kopf 1.45); no C compiler, so the psi statistics take the XLA path
# (EMBED_SWEEP_NATIVE=0 above: no build attempted, no warning per worker)
RUN pip install -c requirements.lock ".[k8s]" "dask-kubernetes==2026.3.0" \
    && python -c "import lvmcore, tasks, flows.sweep, dask_kubernetes.operator" \
    && useradd --create-home --uid 1000 sweep \
    && mkdir -p /data && chown sweep /data
USER sweep
