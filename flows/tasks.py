"""The sweep's Prefect tasks: thin typed wrappers, each calling one plain function of the pipeline
library (tasks/), with retries only where the work is I/O that a second try can fix."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.ingest import ingest_dataset
from tasks.knn import build_graph
from tasks.point import add_extras, refit_points, run_points
from tasks.report import make_report
from tasks.store import Layout


def retry_unless_refused(task, task_run, state) -> bool:
    """Retry a failure a second try can fix (I/O), never a refusal of the user's input (a
    ValueError naming the value and the fix): it would only say the same thing three times."""
    try:
        state.result()
    except ValueError:
        return False
    except Exception:  # the failure's own exception, re-raised by result(): any other kind retries
        return True
    return True


@task(name="ingest", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_refused)
def ingest_task(
    dataset: str | dict, data_path: str, expect: str | None = None, keep_preprocessing: bool = False
) -> str:
    """The data set written to the sweep's data store (tasks.ingest.ingest_dataset)."""
    return ingest_dataset(dataset, data_path, expect, keep_preprocessing)


@task(name="knn", retries=1, retry_condition_fn=retry_unless_refused)
def knn_task(data_path: str, k_max: int, graph_path: str, method: str = "auto") -> str:
    """The kNN graph at the largest k (tasks.knn.build_graph); "" when no model needs one."""
    if k_max < 1:
        return ""
    return build_graph(data_path, int(k_max), graph_path, method)


@task(name="grid-points", cache_policy=NO_CACHE, task_run_name="{key}-{n}-points")
def grid_points_task(
    key: str,
    options: dict,
    data_path: str,
    graph_path: str | None,
    items: list,
    store: str,
    layout: Layout,
    n: int = 0,
    retry_failed: bool = False,
    extras: bool = True,
) -> list[str]:
    """A batch of ``n`` grid points of one model (tasks.point.run_points); ``n`` names the task run;
    ``extras``: GLLE's diagnostics computed with each fit (else left to the chosen setting)."""
    return run_points(key, options, data_path, graph_path, items, store, layout, retry_failed, extras)


@task(name="refit-models", cache_policy=NO_CACHE, task_run_name="{key}-refit-{n}-points")
def refit_points_task(
    key: str,
    options: dict,
    data_path: str,
    graph_path: str | None,
    items: list,
    store: str,
    layout: Layout,
    n: int = 0,
) -> list[str]:
    """``--refit-models``: finished grid points fitted again for their models, the stored numbers
    kept (tasks.point.refit_points); ``n`` names the task run."""
    return refit_points(key, options, data_path, graph_path, items, store, layout)


@task(name="extras", cache_policy=NO_CACHE, task_run_name="{key}-extras-{n}-points")
def extras_task(
    key: str,
    options: dict,
    data_path: str,
    graph_path: str | None,
    items: list,
    store: str,
    layout: Layout,
    n: int = 0,
) -> list[str]:
    """GLLE's diagnostics (generations, covariance-scale study) for finished grid points that lack
    them, the chosen settings after the selection (tasks.point.add_extras); ``n`` names the task run."""
    return add_extras(key, options, data_path, graph_path, items, store, layout)


@task(name="report", retries=1)
def report_task(store: str) -> str:
    """The HTML report of the store (tasks.report.make_report); returns its path."""
    return make_report(store)
