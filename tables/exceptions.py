"""The one exception tree of the storage layer."""

from __future__ import annotations

__all__ = ["InvalidRule", "StoreClosed", "StoreError", "TablesError"]


class TablesError(Exception):
    """Root of every error raised by `tables`."""


class InvalidRule(TablesError, ValueError):
    """A schedule rule that cannot fire: bad cron, unknown zone, non-positive interval."""


class StoreError(TablesError):
    """A store operation failed. Nothing of it was written in the partition it failed in;
    a write over several partitions is one RocksDB batch a partition, so the partitions
    written before it may hold theirs (the runner checks each row when it retries).
    `partition`: the partition it failed in, when it is one's (a corrupt row's, a
    partition's write), so that only that one is restored."""

    def __init__(self, *args: object, partition: int | None = None) -> None:
        super().__init__(*args)
        self.partition = partition


class StoreClosed(StoreError):
    """The store (or the partition) was closed."""
