__version__ = '0.1.0'


def user_cache_dir(*parts: str) -> str:
    """``$XDG_CACHE_HOME/embed-sweep/<parts>`` (default ``~/.cache/embed-sweep/<parts>``): where
    embed-sweep keeps what it builds once per machine (jax's compilation cache, the native kernel)."""
    import os

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "embed-sweep", *parts)
