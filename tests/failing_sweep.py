"""The sweep whose every grid point fails (issue 36, W6), shared by the in-process test
(test_reliability) and the deployment test (test_deploy): its data, and what it must leave in
Prefect, read back through the client."""

from __future__ import annotations

import numpy as np

#: what the sweep's two ppca points at latent_dim 2 end as
FAILED_MESSAGE = "2 of 2 grid points failed (2 in this run)"


def write_plane_csv(path) -> str:
    """60 points on a plane in 3-D, as CSV: PPCA at latent_dim 2 has a singular covariance there, a
    real failure of every point (no mock)."""
    Y = np.random.default_rng(0).normal(size=(60, 2))
    np.savetxt(path, np.hstack([Y, np.zeros((60, 1))]), delimiter=",")
    return str(path)


def flow_run_logs(client, flow_run_id) -> str:
    """The log messages of one flow run, one per line."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(entry.message for entry in logs)


def assert_failed_in_prefect(client, flow_run_id, store: str) -> None:
    """The failing sweep's flow run and its one subflow ended Failed; the subflow's logs carry the
    counts and the reason; the store's summary artifact names the failed points."""
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
    )

    from flows.artifacts import artifact_key

    assert client.read_flow_run(flow_run_id).state.is_failed()
    subs = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]))
    )
    assert len(subs) == 1 and subs[0].state.is_failed(), subs
    text = flow_run_logs(client, subs[0].id)  # the sweep's subflow: the counts and the distinct reasons
    assert "2 of the 2 grid points run failed" in text and "ppca: 2 point(s):" in text, text
    assert "singular" in text, text
    art = client.read_artifacts(
        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key(str(store), "summary")]))
    )
    assert art and any("failed: ppca: 2 point(s)" in (a.description or "") for a in art), art
