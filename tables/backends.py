"""The storage backends by URL: ``memory://`` (the reference) and ``rocksdb:///dir``."""

from __future__ import annotations

from tables.memory_store import MemoryTimerStore
from tables.rocksdb_store import RocksDBTimerStore
from tables.store import ChangelogSink, TimerStore

__all__ = ["open_timer_store"]


def open_timer_store(
    url: str, *, partitions: int, changelog: ChangelogSink | None = None
) -> TimerStore:
    """A store for one aggregate type: ``memory://`` or ``rocksdb:///path/to/dir``.

    A RocksDB store keeps partition p in ``{dir}/p{p}.db`` and serves every partition
    until told otherwise (`assign` / `revoke`).
    """
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"not a store URL: {url!r} (use memory:// or rocksdb:///path)")
    scheme, _, rest = url.partition("://")
    if scheme == "memory":
        if rest:
            raise ValueError(f"memory:// takes no path: {url!r}")
        return MemoryTimerStore(partitions, changelog)
    if scheme == "rocksdb":
        if not rest:
            raise ValueError(f"rocksdb:// needs a directory, e.g. rocksdb:///var/lib/x: {url!r}")
        return RocksDBTimerStore(rest, partitions, changelog)
    raise ValueError(f"unknown store scheme {scheme!r} in {url!r} (use memory:// or rocksdb://)")
