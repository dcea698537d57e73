"""The storage backends by URL: ``memory://`` (the reference) and ``rocksdb:///dir``."""

from __future__ import annotations

from tables.memory_store import MemoryTimerStore
from tables.rocksdb_store import RocksDBTimerStore
from tables.store import ChangelogSink, TimerStore

__all__ = ["open_timer_store"]


def open_timer_store(
    url: str,
    *,
    partitions: int,
    changelog: ChangelogSink | None = None,
    owner_type: tuple[str, str] | None = None,
) -> TimerStore:
    """A store for one aggregate type: ``memory://`` or ``rocksdb:///path/to/dir``.

    A RocksDB store keeps partition p in ``{dir}/p{p}.db`` and serves every partition
    until told otherwise (`assign` / `revoke`). `owner_type`, the type's `(context,
    aggregate)`: a restore takes only rows of owners of the type keyed to their partition
    (`tables.owners`); without it, any owner's (a store of made-up rows: tests, benches).
    """
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"not a store URL: {url!r} (use memory:// or rocksdb:///path)")
    scheme, _, rest = url.partition("://")
    if scheme == "memory":
        if rest:
            raise ValueError(f"memory:// takes no path: {url!r}")
        return MemoryTimerStore(partitions, changelog, owner_type=owner_type)
    if scheme == "rocksdb":
        if not rest:
            raise ValueError(f"rocksdb:// needs a directory, e.g. rocksdb:///var/lib/x: {url!r}")
        return RocksDBTimerStore(rest, partitions, changelog, owner_type=owner_type)
    raise ValueError(f"unknown store scheme {scheme!r} in {url!r} (use memory:// or rocksdb://)")
