"""How often a worker list read from ``Client.scheduler_info()`` misses the workers, against
``lvmcore.chunks.scheduler_workers`` (asked of the scheduler), on a 2-worker LocalCluster.

``Client.scheduler_info()`` fetches the identity and then returns the client's cached copy, which
the client's periodic refresh (cluster totals only) can overwrite in between; RowChunks read an
empty list as "every worker lost" (bench/README.md, session 4).

    .venv/bin/python bench/dask_worker_list.py --seconds 30
"""

from __future__ import annotations

import argparse
import time


def count(read, seconds: float) -> tuple[int, int]:
    t0, calls, short = time.monotonic(), 0, 0
    while time.monotonic() - t0 < seconds:
        calls += 1
        short += len(read()) != 2
    return calls, short


def main() -> None:
    from distributed import Client, LocalCluster

    from lvmcore.chunks import scheduler_workers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    kw = dict(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    with LocalCluster(**kw) as lc, Client(lc) as client:
        for name, read in (
            ("Client.scheduler_info()['workers']", lambda: client.scheduler_info()["workers"]),
            ("scheduler_workers(client)", lambda: scheduler_workers(client)),
        ):
            calls, short = count(read, args.seconds)
            print(f"{name}: {calls} calls in {args.seconds:.0f} s, {short} with fewer than 2 workers")


if __name__ == "__main__":
    main()
