"""The benchmarks' local Dask cluster: worker processes with one thread each, pinned to a core. The
client talks to the workers directly (``direct_to_workers``), as a sweep's fit does from inside a
worker: the row-chunk actors' calls then skip the scheduler's relay."""

import contextlib


@contextlib.contextmanager
def local_client(n_workers: int):
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            preload=["flows.pin_cores", "flows.worker_heap"],
        ) as lc,
        Client(lc, direct_to_workers=True) as client,
    ):
        yield client
