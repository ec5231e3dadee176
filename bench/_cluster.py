"""The benchmarks' local Dask cluster: worker processes with one thread each, pinned to a core."""

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
            preload=["flows.pin_cores"],
        ) as lc,
        Client(lc) as client,
    ):
        yield client
