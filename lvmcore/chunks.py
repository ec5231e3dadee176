"""The row-chunk engine: work over row chunks of the data, in process or on a Dask cluster whose
client the caller passes in (``client=``; a sweep's fit task passes its worker's client, the sweep's
own cluster: ``tasks/fit.py``). This module knows no ambient cluster: without a client the chunks
run in this process. Every chunked model goes through it (``chunks`` = rows per chunk; None: in
process, one piece); chunked and unchunked results agree up to summation order.

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

Data whose rows can be read again is not shipped: an array that carries its row source
(:mod:`lvmcore.rows`: a fit given a :class:`~lvmcore.data.rowsource.ZarrRows`, or values with
``attach``) sends only the source and the row spans, and each worker reads its own rows, or the
whole array once, there. Plain arrays (a library user's ``fit(Y)``) are scattered from the caller.
Actor placement lives in :mod:`lvmcore.actors`.

``stats_fn`` must be picklable and expose ``raw(local, glob, data)`` (a pure jax function), and
``forward`` / ``backward`` (its jitted evaluation and vector-Jacobian product, compiled once per
process), as :class:`JitStats` provides; ``build_for_vjp()`` may skip outputs nobody reads
(``rbf_psi(primal=False)``).
"""

from __future__ import annotations

import dask
import jax
import numpy as np

from lvmcore.actors import (
    ActorPlacement,
    ChunkHost,
    HostLost,
    scheduler_workers,
    tree_concat,
    tree_rows,
    tree_sum,
)
from lvmcore.precision import x64
from lvmcore.rows import RowBlock, resolve, source_of

__all__ = ["ChunkHost", "JitStats", "RowChunks", "map_chunks", "row_spans", "scheduler_workers"]


def row_spans(n: int, chunks: int | None) -> list[tuple[int, int]]:
    """[(start, end)] of consecutive chunks of ``chunks`` rows covering 0..n (one span if None)."""
    if chunks is None or chunks >= n:
        return [(0, n)]
    return [(s, min(s + int(chunks), n)) for s in range(0, n, int(chunks))]


def _call(fn, shared, blocks, a, b, kwargs):
    return fn(*shared, *blocks, slice(a, b), **kwargs)


def _call_stored(fn, shared, blocks, a, b, kwargs):
    """:func:`_call` on a worker, row sources and row blocks read there first."""
    shared = [resolve(x) for x in shared]
    blocks = [resolve(x) for x in blocks]
    return fn(*shared, *blocks, slice(a, b), **{k: resolve(v) for k, v in kwargs.items()})


def map_chunks(fn, spans, *, client=None, shared=(), sliced=(), **kwargs) -> list:
    """``[fn(*shared, *(x[a:b] for x in sliced), slice(a, b), **kwargs) for (a, b) in spans]``.

    One span: a plain call in process. Several: one task per span. On the distributed cluster of
    ``client`` (a ``distributed.Client``, passed by the caller) the ``shared`` arrays and array
    keyword arguments go to every worker once and each span's slices to one worker, so nothing
    large travels inside the task graph; an array carrying its row source
    (:func:`lvmcore.rows.source_of`) is not sent at all: each task reads its span's rows (sliced)
    or the whole array (shared; once per worker process) from the source. Without a client,
    ``dask.delayed`` tasks on the local scheduler. ``fn`` must be picklable (a
    module-level function or a partial of one)."""
    if len(spans) == 1:
        ((a, b),) = spans
        return [_call(fn, shared, [x[a:b] for x in sliced], a, b, kwargs)]
    if client is None:
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
            RowBlock(src, a, b) if src is not None else client.scatter(x[a:b], hash=False)
            for x, src in zip(sliced, stored, strict=True)
        ]
        futures.append(client.submit(_call_stored, fn, sh, blocks, a, b, kw, pure=False))
    return client.gather(futures)


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


class RowChunks(ActorPlacement):
    """Row-chunked evaluation of ``objective(sum_c stats_fn(local_c, glob, data_c), glob, *extra)``.

    ``data`` is a tuple of arrays with N rows (the views); ``local`` a pytree of arrays with N rows;
    ``extra`` dynamic scalars of the objective (e.g. extra jitter). ``chunks=None`` (or >= N) means
    one piece in process. ``origin``: for each of ``data``, ``(array, shift)`` with
    ``data[i] == array - shift`` (a model's centred views; ``shift`` None: the array itself); if
    every array carries its row source (:mod:`lvmcore.rows`), each worker reads its chunks' rows
    from the source (less the shift) instead of receiving them from the caller.

    With several chunks and a Dask ``client`` (passed by the caller), the chunks are dealt to the
    workers in contiguous runs, one :class:`ChunkHost` actor per worker. The driver talks to the
    actors straight, not through the scheduler, when it runs in a Dask worker (as a sweep's fit
    does, under ``worker_client``) or its client was made with ``direct_to_workers=True``; otherwise
    each call is relayed by the scheduler. If a worker holding chunks is lost, the evaluation deals
    all the chunks again over the running workers (new actors) and repeats itself once.
    """

    #: jitted objective and fused functions per (statistics, objective): the objective must be a
    #: long-lived function (e.g. from the cached ``bound_objective``) for this to hit
    _compiled: dict = {}

    def __init__(self, stats_fn, objective, data: tuple, chunks: int | None = None, origin=None, client=None):
        self.stats_fn, self.objective = stats_fn, objective
        self.n = data[0].shape[0]
        self.bounds = row_spans(self.n, chunks)
        self.client = client if len(self.bounds) > 1 else None
        self.parts = [tuple(np.asarray(d[a:b]) for d in data) for a, b in self.bounds]
        #: where each worker reads its rows (one RowSource per data array), or None: rows are sent
        self.sources = None
        if self.client is not None:
            pairs = list(origin) if origin is not None else [(d, None) for d in data]
            if len(pairs) != len(data):
                raise ValueError(f"origin has {len(pairs)} entries for {len(data)} data arrays")
            found = [source_of(x, shift) for x, shift in pairs]
            self.sources = found if all(f is not None for f in found) else None
        self.hosts: list = []  # (first row, end row, host): a ChunkHost, or an Actor to one
        self._host_futures: list = []
        if len(self.bounds) > 1:
            try:
                self._place()
            except HostLost:  # a worker went while the actors were being placed: deal again
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

    def _blocks(self, local):
        return tree_rows(local, [(a, b) for a, b, _ in self.hosts])

    @x64
    def stats(self, local, glob):
        """Summed statistics over all chunks."""
        glob, local = _to_np(glob), _to_np(local)

        def evaluate():
            return tree_sum(self._on_hosts("forward", [(blk, glob, False) for blk in self._blocks(local)]))

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
            stats = tree_sum(self._on_hosts("forward", [(blk, glob) for blk in self._blocks(local)]))
            value, (g_stats, g_glob) = self._obj_vg(stats, glob, *extra)
            backs = self._on_hosts("backward", [(glob, _to_np(g_stats))] * len(self.hosts))
            g_local = tree_concat([b[0] for b in backs])
            return float(value), g_local, tree_sum([_to_np(g_glob)] + [b[1] for b in backs])

        return self._with_hosts(evaluate)
