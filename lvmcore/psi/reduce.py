"""Moved to :mod:`lvmcore.chunks` (the row-chunk engine); these names stay importable from here
until ``lvmcore.models.hgplvm`` imports them from there."""

from lvmcore.chunks import ChunkHost, JitStats, RowChunks

__all__ = ["ChunkHost", "JitStats", "RowChunks"]
