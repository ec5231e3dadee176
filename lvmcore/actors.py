"""Dask actor placement for the row-chunk engine (:class:`lvmcore.chunks.RowChunks`): each worker
holds a contiguous run of the chunks for the whole fit in one actor (:class:`ChunkHost`), and a
lost worker's chunks are dealt again over the running workers (:class:`ActorPlacement`)."""

from __future__ import annotations

import itertools
import threading

import jax
import numpy as np

from lvmcore.rows import RowBlock, resolve


def _tree_add(a, b):
    return jax.tree_util.tree_map(lambda x, y: x + y, a, b)


def tree_sum(trees):
    """Sum of a non-empty sequence of like pytrees, in sequence order."""
    total = trees[0]
    for t in trees[1:]:
        total = _tree_add(total, t)
    return total


def tree_concat(trees):
    """Like pytrees of row blocks, concatenated along the rows."""
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=0), *trees)


def tree_rows(tree, spans):
    """Row slices ``[a:b]`` of every leaf of ``tree``, one pytree per (a, b) in ``spans`` (views)."""
    return [jax.tree_util.tree_map(lambda x, a=a, b=b: x[a:b], tree) for a, b in spans]


class ChunkHost:
    """The row chunks of one Dask worker, as a Dask actor living there.

    It holds its chunks of the data for the whole fit. ``forward`` receives the worker's rows of
    the variational parameters (one contiguous block), computes each chunk's statistics and
    returns their sum; it keeps the rows for the ``backward`` call that follows, which returns the
    block's row gradient and the summed gradient for the globals. So an evaluation is two calls
    per worker and no tasks: the task route it replaces (scatter the rows, submit a forward and a
    backward task per chunk, gather) spent about 0.15 s per evaluation in Dask's own latencies and
    messages at 200,000 rows in 8 chunks (bench/README.md).

    A host on a worker with more than one thread runs its chunks on that many threads (XLA releases
    the GIL): ``threads``, the worker's thread count, given by the placement (read from the
    scheduler; this class asks its worker nothing).
    The calls run on the worker's actor thread, outside its task slots: the scheduler does not
    count this work, and a one-thread worker may run one queued task beside it (a sweep's fit
    secedes from its slot while it waits on the actors).
    """

    #: threads the chunks run on (the worker's thread count, at most the number of chunks); class
    #: attributes too, so that an actor handle can read them
    threads = 1
    last_threads: tuple = ()

    def __init__(self, stats_fn, offsets, *parts, threads: int = 1):
        self.stats_fn = stats_fn
        self.offsets = list(offsets)  # chunk c holds block rows offsets[c]:offsets[c + 1]
        # a chunk sent as a row block is read here, from its source (RowChunks with ``sources``)
        self.parts = tuple(tuple(resolve(x) for x in part) for part in parts)
        self.rows = None
        self.threads = max(1, min(int(threads), len(parts)))
        #: the names of the threads the last forward call's chunks ran on
        self.last_threads = ()

    def _map(self, fn, *iterables):
        """``fn`` over the chunks, results in chunk order (so the sums do not depend on timing).
        With ``threads`` > 1, thread k runs chunks k, k + threads, ...: one named thread each,
        started per call (a pool may hand every chunk to whichever thread wakes first)."""
        items = list(zip(*iterables, strict=True))
        if self.threads == 1:
            return [fn(*it) for it in items]
        out, errors = [None] * len(items), []

        def work(k):
            try:
                for i in range(k, len(items), self.threads):
                    out[i] = fn(*items[i])
            except BaseException as e:  # re-raised in the calling thread
                errors.append(e)

        threads = [
            threading.Thread(target=work, args=(k,), name=f"embed-sweep-chunks-{k}")
            for k in range(self.threads)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out

    def forward(self, block, glob, keep=True):
        rows = tree_rows(block, zip(self.offsets[:-1], self.offsets[1:]))
        self.rows = rows if keep else None

        def one(lo, d):
            return threading.current_thread().name, self.stats_fn.forward(lo, glob, d)

        ran = self._map(one, rows, self.parts)
        self.last_threads = tuple(sorted({t for t, _ in ran}))
        return tree_sum([o for _, o in ran])

    def backward(self, glob, cot):
        if self.rows is None:
            raise RuntimeError("ChunkHost.backward without a forward(keep=True) call before it")
        rows, self.rows = self.rows, None
        backs = self._map(lambda lo, d: self.stats_fn.backward(lo, glob, d, cot), rows, self.parts)
        return tree_concat([b[0] for b in backs]), tree_sum([b[1] for b in backs])


class HostLost(RuntimeError):
    """A worker holding row chunks left the cluster while an evaluation waited on it."""


def scheduler_workers(client) -> dict:
    """{address: info} of the scheduler's workers, asked of the scheduler now (a synchronous
    client). Not ``Client.scheduler_info()["workers"]``: that returns the client's cached identity,
    which the client's periodic refresh (cluster totals only, no workers) can overwrite between the
    fresh fetch and the return (measured: 3 of 37,463 calls in 30 s saw no worker on a 2-worker
    cluster); one such empty answer, read as "every worker lost", failed a chunked fit under load."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def thread_use(dask_worker) -> tuple[int, int]:
    """(tasks executing, threads) of a Dask worker, read on the worker itself (``Client.run``). A
    task that seceded (a sweep's fit waiting on its actors) is long-running, not executing."""
    return dask_worker.state.executing_count, dask_worker.state.nthreads


class ActorPlacement:
    """The actors of a row-chunked evaluation: ``bounds`` (row spans), ``parts`` (each chunk's data
    arrays), ``sources`` (one :class:`~lvmcore.rows.RowSource` per data array, or None: the rows
    are scattered from the caller), ``stats_fn`` and ``client`` (None: one in-process host)
    are set by the subclass before :meth:`_place`."""

    #: while waiting on the actors, how often to check that their workers are still there (s)
    POLL = 5.0
    _rotation = itertools.count()

    @property
    def placement(self) -> list:
        """The worker address of each chunk (``None`` in process)."""
        return [
            getattr(host, "_address", None)
            for a, _ in self.bounds
            for first, end, host in self.hosts
            if first <= a < end
        ]

    def _await_actor(self, fut, worker):
        """The actor of ``fut``, once its worker has a free thread to start it. Placement prefers
        free workers; when every worker is busy with another long task (a 10^6 x 50 kNN search
        takes minutes) the wait is not a failure: wait as long as the worker is alive (a fixed
        timeout here failed the 10^6 x 50 sweep's Bayesian GP-LVM after 300 s behind that
        search), and give up only if it is lost."""
        return self._wait(
            fut,
            lambda: worker not in self._running_workers(),
            f"worker {worker} was lost while placing its row chunks",
        )

    def _wait(self, fut, lost, message):
        """``fut``'s result, checking every ``POLL`` seconds whether ``lost()``: a worker that
        stopped answering (frozen, swapping) keeps its connection open until the scheduler drops
        it after its time-to-live, so the wait stops then (``HostLost(message)``), not before."""
        while True:
            try:
                return fut.result(timeout=self.POLL)
            except TimeoutError:
                if lost():
                    raise HostLost(message) from None

    def _running_workers(self) -> dict:
        """{address: thread count} of the scheduler's running workers, in address order."""
        info = scheduler_workers(self.client)
        running = sorted(a for a, w in info.items() if w.get("status", "running") == "running")
        return {a: int(info[a].get("nthreads", 1)) for a in running}

    def _free_workers(self, workers: list) -> list:
        """Those of ``workers`` with a thread free now. An actor starts as a task, so on a worker
        whose threads all run other tasks (another model's GLLE fit at 10^6 points: half an hour)
        it would start only when one ends; the chunks go to the free workers instead. Asked of
        the workers themselves (the scheduler's heartbeat counts lag); a worker that does not
        answer counts as busy."""
        use = self.client.run(thread_use, workers=workers, on_error="return")
        return [w for w in workers if isinstance(use.get(w), tuple) and use[w][0] < use[w][1]]

    def _place(self):
        """Deal the chunks to the workers (contiguous runs, as even as the counts allow) and start
        one actor per worker holding its chunks; in process, one host holds them all. The hosts
        are replaced only once every actor is up, so a failure here leaves no partial placement.
        With fewer chunks than workers, successive runners start at different workers."""
        if self.client is None:
            runs = [list(range(len(self.bounds)))]
            workers = [None]
        else:
            running = self._running_workers()
            workers = list(running)
            if not workers:
                raise RuntimeError(
                    "row chunks: the Dask cluster has no running worker to hold the row chunks; "
                    "start workers (or leave chunks=None to evaluate in process)"
                )
            # the workers with a free thread; when every one is busy, all of them (and wait)
            workers = self._free_workers(workers) or workers
            if len(workers) > len(self.bounds):
                start = next(ActorPlacement._rotation) % len(workers)
                workers = (workers[start:] + workers[:start])[: len(self.bounds)]
            runs = [list(r) for r in np.array_split(np.arange(len(self.bounds)), len(workers))]
        hosts, futures = [], []
        try:
            for w, idx in zip(workers, runs, strict=True):
                first, end = self.bounds[idx[0]][0], self.bounds[idx[-1]][1]
                offsets = [self.bounds[c][0] - first for c in idx] + [end - first]
                parts = [self.parts[c] for c in idx]
                if w is None:
                    host = ChunkHost(self.stats_fn, offsets, *parts)
                else:
                    if self.sources is not None:  # the worker reads its rows from the store
                        sent = [tuple(RowBlock(src, *self.bounds[c]) for src in self.sources) for c in idx]
                    else:
                        sent = self.client.scatter(parts, hash=False, workers=[w], direct=True)
                    fut = self.client.submit(
                        ChunkHost,
                        self.stats_fn,
                        offsets,
                        *sent,
                        threads=running[w],
                        actor=True,
                        workers=[w],
                        allow_other_workers=False,
                        pure=False,
                    )
                    futures.append(fut)
                    host = self._await_actor(fut, w)
                    del sent  # the actor holds the arrays; the scattered copies can go
                hosts.append((first, end, host))
        except BaseException:
            for f in futures:
                f.release()
            raise
        assert hosts[0][0] == 0 and hosts[-1][1] == self.n
        assert all(h[1] == g[0] for h, g in zip(hosts, hosts[1:]))
        old = self._host_futures
        self.hosts, self._host_futures = hosts, futures
        for f in old:
            f.release()

    def _on_hosts(self, method, args_per_host):
        # actor calls return futures at once: every worker starts before the first result is awaited
        calls = [getattr(h, method)(*args) for (_, _, h), args in zip(self.hosts, args_per_host, strict=True)]
        if self.client is None:
            return calls
        lost = "a worker holding row chunks was lost mid-call"
        return [self._wait(c, self._hosts_lost, lost) for c in calls]

    def _hosts_lost(self) -> bool:
        if self.client is None:
            return False
        alive = set(scheduler_workers(self.client))
        return any(
            f.status != "finished" or h._address not in alive
            for f, (_, _, h) in zip(self._host_futures, self.hosts, strict=True)
        )

    def _with_hosts(self, evaluate):
        """Run ``evaluate()``; if it failed because a worker holding chunks was lost, deal all the
        chunks again over the running workers (new actors) and run it once more."""
        try:
            return evaluate()
        except Exception:
            if not self._hosts_lost():
                raise
        self._place()
        return evaluate()
