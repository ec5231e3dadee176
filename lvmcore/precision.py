"""float64 for lvmcore's jax code, scoped: importing lvmcore leaves the process-wide
``jax_enable_x64`` flag as the user set it.

Every public jax entry point of lvmcore runs under JAX's scoped ``jax.enable_x64(True)`` (a
thread-local setting), through :func:`x64` or :func:`jit64`. Tracing happens inside that scope, so
the compiled functions are float64 throughout; jax keys its compilation cache on the setting, so a
caller's float32 work is unaffected. Code running on other threads (the chunk threads of
``lvmcore.chunks``) enters the scope itself. A caller who traces lvmcore functions inside its own
``jax.jit`` / ``jax.grad`` does that under ``jax.enable_x64(True)`` too, so that the outer
transformation's values are float64 as well.
"""

from __future__ import annotations

import functools

import jax

__all__ = ["x64", "jit64"]


def x64(fn):
    """``fn`` run under ``jax.enable_x64(True)``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with jax.enable_x64(True):
            return fn(*args, **kwargs)

    return wrapper


def jit64(fn=None, **jit_kwargs):
    """``jax.jit(fn, **jit_kwargs)`` traced and run under ``jax.enable_x64(True)``; usable as
    ``@jit64`` or ``@jit64(static_argnames=...)``."""
    if fn is None:
        return functools.partial(jit64, **jit_kwargs)
    return x64(jax.jit(fn, **jit_kwargs))
