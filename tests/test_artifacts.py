"""What a sweep leaves in the Prefect UI (read back from a real Prefect server through the client)
and what it shows on a terminal."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from flows.artifacts import artifact_key
from flows.progress import Progress
from flows.sweep import embed_sweep
from tests.prefect_server import pointed_at

TINY = {"name": "swiss_roll", "n": 120, "seed": 2}


@pytest.fixture(scope="module")
def server(prefect_api):
    with pointed_at(prefect_api) as env:
        yield env


def _artifacts(key: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC
        )


@pytest.mark.slow  # two real sweeps on a local cluster and a Prefect server
def test_a_sweep_leaves_progress_summary_and_links_in_the_prefect_ui_versioned_per_run(
    server, sweep_cluster, tmp_path
):
    store = tmp_path / "roll.zarr"
    args = dict(
        dataset=TINY,
        models=["ppca", "glle_em"],
        grid={"k": [6, 9], "latent_dim": [1, 2], "seed": [0]},
        store=str(store),
        n_generations=0,
        cluster=sweep_cluster,
    )
    res = embed_sweep(**args)
    assert res["done"] == 6 and res["report"]
    keys = {kind: artifact_key(store, kind) for kind in ("progress", "summary", "links")}
    progress, summary, links = (_artifacts(keys[k]) for k in ("progress", "summary", "links"))
    assert len(progress) == len(summary) == len(links) == 1
    assert progress[0].type == "progress" and float(progress[0].data) == 100.0
    # all three belong to the flow run that fitted the grid
    assert progress[0].flow_run_id is not None
    assert progress[0].flow_run_id == summary[0].flow_run_id == links[0].flow_run_id
    rows = summary[0].data if isinstance(summary[0].data, list) else json.loads(summary[0].data)
    by_model = {r["model"]: r for r in rows}
    assert set(by_model) == {"ppca", "glle_em"}
    assert by_model["ppca"]["done"] == 2 and by_model["glle_em"]["done"] == 4
    assert by_model["glle_em"]["chosen by"].startswith("geodesic_agreement across k, latent_dim")
    assert 0 < by_model["glle_em"]["trustworthiness"] <= 1
    md = links[0].data
    assert store.resolve().as_uri() in md and Path(res["report"]).resolve().as_uri() in md
    assert "embed-sweep export" in md

    # a rerun (nothing left to do) adds a new version under the same keys
    again = embed_sweep(**args)
    assert again["ran"] == 0
    for kind in ("progress", "summary", "links"):
        versions = _artifacts(keys[kind])
        assert len(versions) == 2, kind
        assert versions[0].flow_run_id != versions[1].flow_run_id
    assert float(_artifacts(keys["progress"])[0].data) == 100.0
    # another store never shares the keys
    assert artifact_key(tmp_path / "other" / "roll.zarr", "summary") != keys["summary"]


def test_progress_bar_on_a_terminal_and_plain_lines_otherwise(capsys):
    seen = []
    out = io.StringIO()
    bar = Progress(4, stream=out, tty=True, on_update=seen.append)
    bar.point("glle_em", {"k": 6}, "done")
    bar.point("glle_em", {"k": 9}, "failed")
    bar.batch_done()
    assert bar.eta() is not None and bar.eta() >= 0
    text = out.getvalue()
    assert "\r\x1b[K" in text and "2/4 (1 done, 1 failed)" in text and "left" in text
    assert "failed: glle_em {'k': 9} failed\n" in text  # a failure keeps its own line
    bar.point("ppca", {"latent_dim": 1}, "skipped")  # done by an earlier attempt: not this run's work
    bar.point("ppca", {"latent_dim": 2}, "done")
    bar.batch_done()
    bar.close()
    assert out.getvalue().endswith("3/3 (2 done, 1 failed) 0:00 elapsed\n")
    assert seen == [0.5, 1.0]
    assert capsys.readouterr().out == ""  # nothing went around the bar

    plain = Progress(2, stream=io.StringIO(), tty=False)
    plain.point("ppca", {"latent_dim": 1}, "done")
    plain.close()
    assert capsys.readouterr().out.startswith("[1/2] ppca {'latent_dim': 1} done (")


@pytest.mark.slow  # a whole `embed-sweep run` (a subprocess on the module's server and cluster) on a terminal
def test_cli_on_a_terminal_draws_the_bar_instead_of_lines(server, sweep_cluster, tmp_path):
    """`embed-sweep run` attached to a pseudo-terminal: the bar is redrawn in place with counts
    and the final line says every point is done; no plain per-point lines."""
    import pty
    import subprocess
    import sys

    main, child = pty.openpty()
    env = dict(os.environ)  # the test run's Prefect server: PREFECT_API_URL (server fixture)
    cmd = [
        str(Path(sys.executable).with_name("embed-sweep")),
        "run",
        "--dataset",
        json.dumps(TINY),
        "--models",
        "ppca",
        "--grid",
        '{"latent_dim": [1, 2], "seed": [0, 1, 2]}',
        "--out",
        str(tmp_path / "out"),
        "--no-report",
        "--cluster",
        sweep_cluster,
    ]
    proc = subprocess.Popen(cmd, stdin=child, stdout=child, stderr=child, env=env, close_fds=True)
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(main)
    text = b"".join(chunks).decode(errors="replace")
    assert "\r\x1b[K" in text, text[-2000:]
    assert "6/6 (6 done, 0 failed)" in text
    assert "[1/6] ppca" not in text  # the plain lines are for pipes and logs, not terminals
