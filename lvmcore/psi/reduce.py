"""Chunked map-reduce of the collapsed GP-LVM bound over rows (paper 004, section 4.2).

The bound depends on the data only through per-row sums (psi0, Psi1^T Y, Psi2, tr(Y^T Y), KL), so:

1. *map*: each row chunk c computes its partial sums ``stats_c = stats_fn(local_c, glob, data_c)``
   (local = the chunk's rows of the variational parameters; glob = inducing inputs and kernel
   parameters);
2. *reduce*: the sums are added (only M x M and M x D pieces travel) and the driver evaluates the
   objective and its gradient with respect to the summed statistics and the globals;
3. *back*: each chunk runs ``jax.vjp`` of its own statistics with those cotangents, returning the
   gradient for its rows and its contribution to the globals' gradient.

One chunk and many chunks give the same bound and gradient up to summation order. With a single
chunk the three steps are fused into one jitted ``value_and_grad``. On a Dask cluster the data
chunks are scattered once and stay on the workers; each evaluation sends only the chunk's rows of
the variational parameters and the small globals. Inside a Dask worker under ``worker_client`` it
runs on the sweep's own cluster (``distributed.get_client`` finds that client).

``stats_fn`` must be picklable and expose ``raw(local, glob, data)`` (a pure jax function), and
``forward`` / ``backward`` (its jitted evaluation and vector-Jacobian product, compiled once per
process), as :class:`JitStats` provides. The backward task differentiates ``build_for_vjp()``, which
may skip computing outputs nobody reads (the RBF psi statistics skip their forward row pass there:
the backward task cost a forward plus a backward pass before, 164 ms vs 54 ms forward at 25,000
rows, M = 50, Q = 5).
"""

from __future__ import annotations

import jax
import numpy as np

from lvmcore.heap import keep_heap

jax.config.update("jax_enable_x64", True)


def _tree_add(a, b):
    return jax.tree_util.tree_map(lambda x, y: x + y, a, b)


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

    def raw(self, local, glob, data):
        return self._compiled()[0](local, glob, data)

    def forward(self, local, glob, data):
        return _to_np(self._compiled()[1](local, glob, data))

    def backward(self, local, glob, data, cot):
        return _to_np(self._compiled()[2](local, glob, data, cot))


def _forward(stats_fn, local, glob, data):
    keep_heap()
    return stats_fn.forward(local, glob, data)


def _backward(stats_fn, local, glob, data, cot):
    keep_heap()
    return stats_fn.backward(local, glob, data, cot)


class RowChunks:
    """Row-chunked evaluation of ``objective(sum_c stats_fn(local_c, glob, data_c), glob, *extra)``.

    ``data`` is a tuple of arrays with N rows (the views); ``local`` a pytree of arrays with N rows;
    ``extra`` dynamic scalars of the objective (e.g. extra jitter). ``chunks=None`` (or >= N) means
    one piece in process.
    """

    #: jitted objective and fused functions per (statistics, objective): the objective must be a
    #: long-lived function (e.g. from the cached ``bound_objective``) for this to hit
    _compiled: dict = {}

    def __init__(self, stats_fn, objective, data: tuple, chunks: int | None = None):
        self.stats_fn, self.objective = stats_fn, objective
        n = data[0].shape[0]
        self.n = n
        if chunks is None or chunks >= n:
            self.bounds = [(0, n)]
        else:
            self.bounds = [(s, min(s + int(chunks), n)) for s in range(0, n, int(chunks))]
        self.client = None
        if len(self.bounds) > 1:
            try:
                from distributed import get_client

                self.client = get_client()
            except (ImportError, ValueError):
                self.client = None
        parts = [tuple(np.asarray(d[a:b]) for d in data) for a, b in self.bounds]
        if self.client is not None:
            # place the chunks round-robin over the workers (a plain scatter of one small tuple per
            # call can put every chunk on the same worker, and the tasks follow their data there)
            workers = sorted(self.client.scheduler_info()["workers"])
            self.placement = [workers[c % len(workers)] for c in range(len(parts))]
            self._chunks_of_worker: dict = {}
            for c, w in enumerate(self.placement):
                self._chunks_of_worker.setdefault(w, []).append(c)
            self.data = [
                self.client.scatter(p, hash=False, workers=[w])
                for p, w in zip(parts, self.placement, strict=True)
            ]
        else:
            self.data = parts
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

    def _split(self, local):
        return [jax.tree_util.tree_map(lambda x, a=a, b=b: x[a:b], local) for a, b in self.bounds]

    def _run(self, fn, per_chunk):
        if self.client is None:
            return [fn(self.stats_fn, *args) for args in per_chunk]
        futs = [self.client.submit(fn, self.stats_fn, *args, pure=False) for args in per_chunk]
        return self.client.gather(futs)

    def stats(self, local, glob):
        """Summed statistics over all chunks."""
        glob = _to_np(glob)
        outs = self._run(
            _forward, [(lo, glob, d) for lo, d in zip(self._split(_to_np(local)), self.data, strict=True)]
        )
        total = outs[0]
        for o in outs[1:]:
            total = _tree_add(total, o)
        return total

    def value_and_grad(self, local, glob, *extra):
        """Returns (value, grad_local, grad_glob) as numpy."""
        glob = _to_np(glob)
        if len(self.bounds) == 1:
            v, (gl, gg) = self._fused(_to_np(local), glob, self.data[0], *extra)
            return float(v), _to_np(gl), _to_np(gg)
        locs = self._split(_to_np(local))
        if self.client is not None:
            # send each chunk's rows once, straight to the worker holding its data; the forward and
            # the backward task both use them there
            # (one scatter call per worker, with all of its chunks: each call is a round trip)
            futs = [None] * len(locs)
            for w, idx in self._chunks_of_worker.items():
                sent = self.client.scatter([locs[i] for i in idx], hash=False, workers=[w], direct=True)
                for i, f in zip(idx, sent, strict=True):
                    futs[i] = f
            locs = futs
        stats = None
        for o in self._run(_forward, [(lo, glob, d) for lo, d in zip(locs, self.data, strict=True)]):
            stats = o if stats is None else _tree_add(stats, o)
        value, (g_stats, g_glob) = self._obj_vg(stats, glob, *extra)
        g_stats = _to_np(g_stats)
        backs = self._run(_backward, [(lo, glob, d, g_stats) for lo, d in zip(locs, self.data, strict=True)])
        g_local = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=0), *[b[0] for b in backs])
        g_total = _to_np(g_glob)
        for b in backs:
            g_total = _tree_add(g_total, b[1])
        return float(value), g_local, g_total
