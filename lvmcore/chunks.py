"""The row-chunk engine: work over row chunks of the data, in process or on the Dask cluster the
caller runs in (``distributed.get_client``; inside a sweep's worker task under ``worker_client``,
the sweep's own cluster). Every chunked model goes through it (``chunks`` = rows per chunk; None:
in process, one piece); chunked and unchunked results agree up to summation order.

* :func:`row_spans` cuts N rows into chunks; :func:`map_chunks` runs a stateless function on each
  chunk and returns the results in chunk order: GLLE's per-point statistics (``lvmcore.lle``) and
  LL-LVM's per-edge sums.
* :class:`RowChunks` is the iterative map-reduce of an objective that depends on the data through
  per-row sums (the collapsed GP-LVM bound, paper 004 section 4.2): each evaluation (1) maps
  ``stats_fn(local_c, glob, data_c)`` over the chunks, (2) sums the statistics and evaluates the
  objective and its gradient with respect to them and the globals on the driver, (3) sends the
  cotangents back and each chunk returns the ``jax.vjp`` of its statistics (its rows' gradient and
  its share of the globals'). On a cluster each worker holds a contiguous run of the chunks for
  the whole fit in one actor (:class:`ChunkHost`): two calls per worker per evaluation, no tasks,
  and a lost worker's chunks are dealt again over the running workers. With one chunk the three
  steps are one jitted ``value_and_grad``.

Data that lives in a zarr store (a sweep's ingested inputs) is not shipped: the caller declares
it with :func:`stored_rows` (an array, and the :class:`StoredRows` that reads the same values),
and on a cluster each worker reads its own rows, or the whole array once, from the store; only
the store's path and the row spans travel. Arrays not declared (a library user's ``fit(Y)``) are
scattered from the caller as before.

``stats_fn`` must be picklable and expose ``raw(local, glob, data)`` (a pure jax function), and
``forward`` / ``backward`` (its jitted evaluation and vector-Jacobian product, compiled once per
process), as :class:`JitStats` provides; ``build_for_vjp()`` may skip outputs nobody reads
(``rbf_psi(primal=False)``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading

import jax
import numpy as np

from lvmcore.precision import x64


def row_spans(n: int, chunks: int | None) -> list[tuple[int, int]]:
    """[(start, end)] of consecutive chunks of ``chunks`` rows covering 0..n (one span if None)."""
    if chunks is None or chunks >= n:
        return [(0, n)]
    return [(s, min(s + int(chunks), n)) for s in range(0, n, int(chunks))]


class StoredRows:
    """Rows of a variable of a zarr store (an ingested data store, a kNN graph store), read where
    they are used. Small and picklable: what travels to a worker instead of the rows.

    ``columns``: only the first columns (a graph at the sweep's largest k fitted at a smaller k);
    ``shift``: subtracted from every row (a model's centred data, Y - mean: the same values as
    slicing the centred array); ``expect``: store attributes that must hold when read (the data's
    fingerprint), so a store rewritten during a fit is refused, never read as if it were the same."""

    def __init__(self, path, name, *, dtype=np.float64, columns=None, shift=None, expect=None):
        self.path, self.name = str(path), str(name)
        self.dtype = np.dtype(dtype)
        self.columns = None if columns is None else int(columns)
        self.shift = None if shift is None else np.asarray(shift, dtype=self.dtype)
        self.expect = dict(expect or {})

    def shifted(self, shift) -> StoredRows:
        """The same rows less ``shift``."""
        out = StoredRows(self.path, self.name, dtype=self.dtype, columns=self.columns, expect=self.expect)
        out.shift = np.asarray(shift, dtype=self.dtype) + (0 if self.shift is None else self.shift)
        return out

    def _array(self):
        import zarr

        group = zarr.open_group(self.path, mode="r")
        for k, v in self.expect.items():
            if group.attrs.get(k) != v:
                raise RuntimeError(
                    f"the store {self.path} changed while a fit read it ({k} is {group.attrs.get(k)!r}, "
                    f"the fit started with {v!r}); run the fit again"
                )
        return group[self.name]

    def read(self, a: int, b: int) -> np.ndarray:
        """Rows a:b (a C-contiguous array of ``dtype``)."""
        arr = self._array()
        x = arr[a:b] if self.columns is None else arr[a:b, : self.columns]
        x = np.ascontiguousarray(x, dtype=self.dtype)
        return x if self.shift is None else x - self.shift

    def whole(self) -> np.ndarray:
        """Every row, read once per process (cached while the store records the same attributes)."""
        return _whole(self)

    def _key(self):
        shift = None if self.shift is None else self.shift.tobytes()
        return (self.path, self.name, self.dtype.str, self.columns, shift, tuple(sorted(self.expect.items())))

    def __eq__(self, other):
        return isinstance(other, StoredRows) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f"StoredRows({self.path!r}, {self.name!r}, columns={self.columns})"


@functools.lru_cache(maxsize=2)
def _whole_cached(src: StoredRows) -> np.ndarray:
    arr = src._array()
    x = src.read(0, arr.shape[0])
    x.flags.writeable = False  # shared by every task of this process that reads it
    return x


def _whole(src: StoredRows) -> np.ndarray:
    src._array()  # the store's attributes checked on every use, not only on the first read
    return _whole_cached(src)


class _Rows:
    """Rows a:b of a :class:`StoredRows`, read on the worker that receives it."""

    def __init__(self, src: StoredRows, a: int, b: int):
        self.src, self.a, self.b = src, int(a), int(b)

    def __eq__(self, other):
        return isinstance(other, _Rows) and (self.src, self.a, self.b) == (other.src, other.a, other.b)

    def __hash__(self):
        return hash((self.src, self.a, self.b))


_STORED: list = []  # (array, StoredRows) declared by stored_rows, newest last
_STORED_LOCK = threading.Lock()


@contextlib.contextmanager
def stored_rows(*pairs):
    """Declare, for the block's duration, that each array of ``pairs`` ((array, StoredRows)) holds
    the values its StoredRows reads: chunked work on a cluster then sends the store's path and row
    spans, not the rows (:func:`map_chunks`, :class:`RowChunks`). A sweep's fit task declares the
    data and graph it read from the ingested stores."""
    pairs = [(np.asarray(x), src) for x, src in pairs]
    with _STORED_LOCK:
        _STORED.extend(pairs)
    try:
        yield
    finally:
        with _STORED_LOCK:
            for p in pairs:
                for i in range(len(_STORED) - 1, -1, -1):
                    if _STORED[i] is p:
                        del _STORED[i]
                        break


def _equal(x: np.ndarray, y: np.ndarray, rows: int = 65536) -> bool:
    """Exactly equal arrays, compared in row blocks (no N x D temporary)."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x is y:
        return True
    return all(np.array_equal(x[a : a + rows], y[a : a + rows]) for a in range(0, x.shape[0], rows))


def source_of(x, shift=None) -> StoredRows | None:
    """The :class:`StoredRows` that reads ``x`` (``x + shift``'s rows less ``shift``, given
    ``shift``), if an array of equal values was declared by :func:`stored_rows`; else None. The
    declared array is compared value by value: models take copies of what they are given
    (``check_data``), so the array reaching the chunk engine is an equal copy, not the same object."""
    if not isinstance(x, np.ndarray) or x.ndim == 0:
        return None
    with _STORED_LOCK:
        declared = list(_STORED)
    for arr, src in reversed(declared):
        if _equal(x, arr):
            return src if shift is None else src.shifted(shift)
    return None


def _resolve(x):
    """A worker's view of what it was sent: rows and stored arrays read from their store."""
    if isinstance(x, _Rows):
        return x.src.read(x.a, x.b)
    if isinstance(x, StoredRows):
        return x.whole()
    return x


def dask_client():
    """The distributed client this code runs under, or None (no cluster: Dask's local scheduler)."""
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return None


def _call(fn, shared, blocks, a, b, kwargs):
    return fn(*shared, *blocks, slice(a, b), **kwargs)


def _call_stored(fn, shared, blocks, a, b, kwargs):
    """:func:`_call` on a worker, stored arrays and rows read there first."""
    shared = [_resolve(x) for x in shared]
    blocks = [_resolve(x) for x in blocks]
    return fn(*shared, *blocks, slice(a, b), **{k: _resolve(v) for k, v in kwargs.items()})


def map_chunks(fn, spans, *, shared=(), sliced=(), **kwargs) -> list:
    """``[fn(*shared, *(x[a:b] for x in sliced), slice(a, b), **kwargs) for (a, b) in spans]``.

    One span: a plain call in process. Several: one task per span. On a distributed cluster the
    ``shared`` arrays and array keyword arguments go to every worker once and each span's slices
    to one worker, so nothing large travels inside the task graph; an array declared by
    :func:`stored_rows` is not sent at all: each task reads its span's rows (sliced) or the whole
    array (shared; once per worker process) from the store. Without a cluster, ``dask.delayed``
    tasks on the local scheduler. ``fn`` must be picklable (a module-level function or a partial
    of one)."""
    if len(spans) == 1:
        ((a, b),) = spans
        return [_call(fn, shared, [x[a:b] for x in sliced], a, b, kwargs)]
    client = dask_client()
    if client is None:
        import dask

        sh = [dask.delayed(x, pure=True) for x in shared]
        parts = [
            dask.delayed(_call, pure=True)(fn, sh, [x[a:b] for x in sliced], a, b, kwargs) for a, b in spans
        ]
        return list(dask.compute(*parts))

    def send_whole(x):
        if not isinstance(x, np.ndarray):
            return x
        return source_of(x) or client.scatter(x, broadcast=True, hash=False)

    sh = [send_whole(x) for x in shared]
    kw = {k: send_whole(v) for k, v in kwargs.items()}
    stored = [source_of(x) for x in sliced]
    futures = []
    for a, b in spans:
        blocks = [
            _Rows(src, a, b) if src is not None else client.scatter(x[a:b], hash=False)
            for x, src in zip(sliced, stored, strict=True)
        ]
        futures.append(client.submit(_call_stored, fn, sh, blocks, a, b, kw, pure=False))
    return client.gather(futures)


def _tree_add(a, b):
    return jax.tree_util.tree_map(lambda x, y: x + y, a, b)


def _tree_concat(trees):
    """Like pytrees of row blocks, concatenated along the rows."""
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=0), *trees)


def _tree_rows(tree, spans):
    """Row slices ``[a:b]`` of every leaf of ``tree``, one pytree per (a, b) in ``spans`` (views)."""
    return [jax.tree_util.tree_map(lambda x, a=a, b=b: x[a:b], tree) for a, b in spans]


def _tree_sum(trees):
    """Sum of a non-empty sequence of like pytrees, in sequence order."""
    total = trees[0]
    for t in trees[1:]:
        total = _tree_add(total, t)
    return total


def _to_np(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


class JitStats:
    """Base for picklable statistics functions: subclasses define ``key()`` (hashable) and
    ``build()`` returning the pure function (local, glob, data) -> pytree of partial sums."""

    _cache: dict = {}

    def key(self):
        raise NotImplementedError

    def build(self):
        raise NotImplementedError

    def build_for_vjp(self):
        """The function whose ``jax.vjp`` the backward task runs: same gradient as ``build()``'s,
        outputs unused (a subclass may skip computing them; see ``rbf_psi(primal=False)``)."""
        return self.build()

    def _compiled(self):
        k = (type(self).__name__, self.key())
        if k not in JitStats._cache:
            f = self.build()
            fb = self.build_for_vjp()

            def back(local, glob, data, cot):
                _, vjp = jax.vjp(lambda lo, gl: fb(lo, gl, data), local, glob)
                return vjp(cot)

            JitStats._cache[k] = (f, jax.jit(f), jax.jit(back))
        return JitStats._cache[k]

    @x64
    def raw(self, local, glob, data):
        return self._compiled()[0](local, glob, data)

    @x64
    def forward(self, local, glob, data):
        return _to_np(self._compiled()[1](local, glob, data))

    @x64
    def backward(self, local, glob, data, cot):
        return _to_np(self._compiled()[2](local, glob, data, cot))


class ChunkHost:
    """The row chunks of one Dask worker, as a Dask actor living there.

    It holds its chunks of the data for the whole fit. ``forward`` receives the worker's rows of
    the variational parameters (one contiguous block), computes each chunk's statistics and
    returns their sum; it keeps the rows for the ``backward`` call that follows, which returns the
    block's row gradient and the summed gradient for the globals. So an evaluation is two calls
    per worker and no tasks: the task route it replaces (scatter the rows, submit a forward and a
    backward task per chunk, gather) spent about 0.15 s per evaluation in Dask's own latencies and
    messages at 200,000 rows in 8 chunks (bench/README.md).

    Workers with more than one thread run their chunks on that many threads (XLA releases the GIL).
    The calls run on the worker's actor thread, outside its task slots: the scheduler does not
    count this work, and a one-thread worker may run one queued task beside it (a sweep's fit
    secedes from its slot while it waits on the actors).
    """

    #: threads the chunks run on (the worker's thread count, at most the number of chunks); class
    #: attributes too, so that an actor handle can read them
    threads = 1
    last_threads: tuple = ()

    def __init__(self, stats_fn, offsets, *parts):
        self.stats_fn = stats_fn
        self.offsets = list(offsets)  # chunk c holds block rows offsets[c]:offsets[c + 1]
        # a chunk sent as stored rows is read here, from the store (RowChunks with ``sources``)
        self.parts = tuple(tuple(_resolve(x) for x in part) for part in parts)
        self.rows = None
        try:
            from distributed import get_worker

            threads = get_worker().state.nthreads
        except (ImportError, ValueError):
            threads = 1
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
        rows = _tree_rows(block, zip(self.offsets[:-1], self.offsets[1:]))
        self.rows = rows if keep else None

        def one(lo, d):
            return threading.current_thread().name, self.stats_fn.forward(lo, glob, d)

        ran = self._map(one, rows, self.parts)
        self.last_threads = tuple(sorted({t for t, _ in ran}))
        return _tree_sum([o for _, o in ran])

    def backward(self, glob, cot):
        if self.rows is None:
            raise RuntimeError("ChunkHost.backward without a forward(keep=True) call before it")
        rows, self.rows = self.rows, None
        backs = self._map(lambda lo, d: self.stats_fn.backward(lo, glob, d, cot), rows, self.parts)
        return _tree_concat([b[0] for b in backs]), _tree_sum([b[1] for b in backs])


class _HostLost(RuntimeError):
    """A worker holding row chunks left the cluster while an evaluation waited on it."""


def scheduler_workers(client) -> dict:
    """{address: info} of the scheduler's workers, asked of the scheduler now (a synchronous
    client). Not ``Client.scheduler_info()["workers"]``: that returns the client's cached identity,
    which the client's periodic refresh (cluster totals only, no workers) can overwrite between the
    fresh fetch and the return (measured: 3 of 37,463 calls in 30 s saw no worker on a 2-worker
    cluster); one such empty answer, read as "every worker lost", failed a chunked fit under load."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


class RowChunks:
    """Row-chunked evaluation of ``objective(sum_c stats_fn(local_c, glob, data_c), glob, *extra)``.

    ``data`` is a tuple of arrays with N rows (the views); ``local`` a pytree of arrays with N rows;
    ``extra`` dynamic scalars of the objective (e.g. extra jitter). ``chunks=None`` (or >= N) means
    one piece in process. ``origin``: for each of ``data``, ``(array, shift)`` with
    ``data[i] == array - shift`` (a model's centred views; ``shift`` None: the array itself); if
    every array was declared by :func:`stored_rows`, each worker reads its chunks' rows from the
    store (less the shift) instead of receiving them from the caller.

    With several chunks and a Dask client (``distributed.get_client``), the chunks are dealt to the
    workers in contiguous runs, one :class:`ChunkHost` actor per worker. The driver talks to the
    actors straight, not through the scheduler, when it runs in a Dask worker (as a sweep's fit
    does, under ``worker_client``) or its client was made with ``direct_to_workers=True``; otherwise
    each call is relayed by the scheduler. If a worker holding chunks is lost, the evaluation deals
    all the chunks again over the running workers (new actors) and repeats itself once.
    """

    #: jitted objective and fused functions per (statistics, objective): the objective must be a
    #: long-lived function (e.g. from the cached ``bound_objective``) for this to hit
    _compiled: dict = {}

    def __init__(self, stats_fn, objective, data: tuple, chunks: int | None = None, origin=None):
        self.stats_fn, self.objective = stats_fn, objective
        self.n = data[0].shape[0]
        self.bounds = row_spans(self.n, chunks)
        self.client = dask_client() if len(self.bounds) > 1 else None
        self.parts = [tuple(np.asarray(d[a:b]) for d in data) for a, b in self.bounds]
        #: where each worker reads its rows (one StoredRows per data array), or None: rows are sent
        self.sources = None
        if self.client is not None:
            pairs = list(origin) if origin is not None else [(d, None) for d in data]
            if len(pairs) != len(data):
                raise ValueError(f"origin has {len(pairs)} entries for {len(data)} data arrays")
            found = [source_of(np.asarray(x), shift) for x, shift in pairs]
            self.sources = found if all(f is not None for f in found) else None
        self.hosts: list = []  # (first row, end row, host): a ChunkHost, or an Actor to one
        self._host_futures: list = []
        if len(self.bounds) > 1:
            try:
                self._place()
            except _HostLost:  # a worker went while the actors were being placed: deal again
                self._place()
        key = (type(stats_fn).__name__, stats_fn.key(), objective)
        if key not in RowChunks._compiled:
            raw = stats_fn.raw
            RowChunks._compiled[key] = (
                jax.jit(jax.value_and_grad(objective, argnums=(0, 1))),
                jax.jit(
                    jax.value_and_grad(
                        lambda lo, gl, d, *ex: objective(raw(lo, gl, d), gl, *ex), argnums=(0, 1)
                    )
                ),
            )
        self._obj_vg, self._fused = RowChunks._compiled[key]

    @property
    def placement(self) -> list:
        """The worker address of each chunk (``None`` in process)."""
        return [
            getattr(host, "_address", None)
            for a, _ in self.bounds
            for first, end, host in self.hosts
            if first <= a < end
        ]

    #: while waiting on the actors, how often to check that their workers are still there (s)
    POLL = 5.0
    _rotation = itertools.count()

    def _await_actor(self, fut, worker):
        """The actor of ``fut``, once its worker has a free thread to start it. A worker busy with
        another long task (a 10^6 x 50 kNN search takes minutes) delays it, which is not a
        failure: wait as long as the worker is alive (a fixed timeout here failed the 10^6 x 50
        sweep's Bayesian GP-LVM after 300 s behind that search), and give up only if it is lost."""
        return self._wait(
            fut,
            lambda: worker not in self._running_workers(),
            f"worker {worker} was lost while placing its row chunks",
        )

    def _wait(self, fut, lost, message):
        """``fut``'s result, checking every ``POLL`` seconds whether ``lost()``: a worker that
        stopped answering (frozen, swapping) keeps its connection open until the scheduler drops
        it after its time-to-live, so the wait stops then (``_HostLost(message)``), not before."""
        while True:
            try:
                return fut.result(timeout=self.POLL)
            except TimeoutError:
                if lost():
                    raise _HostLost(message) from None

    def _running_workers(self) -> list:
        info = scheduler_workers(self.client)
        return sorted(a for a, w in info.items() if w.get("status", "running") == "running")

    def _place(self):
        """Deal the chunks to the workers (contiguous runs, as even as the counts allow) and start
        one actor per worker holding its chunks; in process, one host holds them all. The hosts
        are replaced only once every actor is up, so a failure here leaves no partial placement.
        With fewer chunks than workers, successive runners start at different workers."""
        if self.client is None:
            runs = [list(range(len(self.bounds)))]
            workers = [None]
        else:
            workers = self._running_workers()
            if not workers:
                raise RuntimeError(
                    "RowChunks: the Dask cluster has no running worker to hold the row chunks; "
                    "start workers (or leave chunks=None to evaluate in process)"
                )
            if len(workers) > len(self.bounds):
                start = next(RowChunks._rotation) % len(workers)
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
                        sent = [tuple(_Rows(src, *self.bounds[c]) for src in self.sources) for c in idx]
                    else:
                        sent = self.client.scatter(parts, hash=False, workers=[w], direct=True)
                    fut = self.client.submit(
                        ChunkHost,
                        self.stats_fn,
                        offsets,
                        *sent,
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

    def _blocks(self, local):
        return _tree_rows(local, [(a, b) for a, b, _ in self.hosts])

    @x64
    def stats(self, local, glob):
        """Summed statistics over all chunks."""
        glob, local = _to_np(glob), _to_np(local)

        def evaluate():
            return _tree_sum(self._on_hosts("forward", [(blk, glob, False) for blk in self._blocks(local)]))

        if len(self.bounds) == 1:
            return self.stats_fn.forward(local, glob, self.parts[0])
        return self._with_hosts(evaluate)

    @x64
    def value_and_grad(self, local, glob, *extra):
        """Returns (value, grad_local, grad_glob) as numpy."""
        glob, local = _to_np(glob), _to_np(local)
        if len(self.bounds) == 1:
            v, (gl, gg) = self._fused(local, glob, self.parts[0], *extra)
            return float(v), _to_np(gl), _to_np(gg)

        def evaluate():
            stats = _tree_sum(self._on_hosts("forward", [(blk, glob) for blk in self._blocks(local)]))
            value, (g_stats, g_glob) = self._obj_vg(stats, glob, *extra)
            backs = self._on_hosts("backward", [(glob, _to_np(g_stats))] * len(self.hosts))
            g_local = _tree_concat([b[0] for b in backs])
            return float(value), g_local, _tree_sum([_to_np(g_glob)] + [b[1] for b in backs])

        return self._with_hosts(evaluate)
