"""The sweep's cluster settings, on a real 2-process Dask LocalCluster started by the sweep's own
``start_cluster``."""

from __future__ import annotations

import os

from distributed import Client

from flows.cluster import compile_cache_env, normalise_cluster, start_cluster


def test_compile_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache_env() == {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "embed-sweep" / "jax")}
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = str(tmp_path / "home" / ".cache" / "embed-sweep" / "jax")
    assert compile_cache_env() == {"JAX_COMPILATION_CACHE_DIR": expected}
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "")  # the user's way to switch it off
    assert compile_cache_env() == {"JAX_COMPILATION_CACHE_DIR": ""}


def test_a_second_worker_loads_what_the_first_compiled(monkeypatch, tmp_path):
    """The sweep's cluster gives its workers the default cache folder; worker 0 compiles a jitted
    function and writes it there; worker 1 then gets the same function from there (jax's cache-hit
    event) instead of compiling it."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "embed-sweep" / "jax"
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # cache even this small one

    def compile_once():
        import jax
        import jax.numpy as jnp
        from jax import monitoring

        events = []
        monitoring.register_event_listener(lambda name, **kw: events.append(name))
        f = jax.jit(lambda x: jnp.sin(x) @ jnp.cos(x).T + 3.0)
        value = float(f(jnp.arange(64.0).reshape(8, 8)).sum())
        return {
            "dir": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
            "hits": events.count("/jax/compilation_cache/cache_hits"),
            "misses": events.count("/jax/compilation_cache/cache_misses"),
            "value": value,
        }

    with (
        start_cluster(normalise_cluster({"type": "local", "n_workers": 2})) as (address, _, _),
        Client(address) as client,
    ):
        w0, w1 = sorted(client.scheduler_info()["workers"])
        first = client.submit(compile_once, workers=[w0], pure=False).result()
        entries = sorted(p.name for p in cache.glob("*-cache"))
        second = client.submit(compile_once, workers=[w1], pure=False).result()
    assert first["dir"] == second["dir"] == str(cache)
    assert first["hits"] == 0 and first["misses"] >= 1, first
    assert entries, f"nothing written to {cache}"
    assert second["hits"] >= 1, second
    assert second["value"] == first["value"]
