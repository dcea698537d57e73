"""The base both backends share: the TimerStore's writes, planned by `tables.writes`, and
the status counts (how a write reaches the changelog sink and the local rows:
`tables.partitioned_commits`; the reads: `tables.partitioned_reads`; the partitions
served, assigned, revoked and closed: `tables.served`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from tables.keys import key_suffix, owner_prefix, row_key
from tables.partition_handle import PartitionHandle
from tables.partitioned_commits import COUNTED, PartitionedCommits
from tables.refs import AggregateRef
from tables.retention import expiry_cutoff, plan_expiry
from tables.served import Found
from tables.timer import Timer, TimerChange, TimerStatus
from tables.tombstones import (
    DELETED_KEY,
    CancelMark,
    deleted_through,
    deletion_mark,
    tombstone,
)
from tables.writes import (
    Write,
    check_change,
    pause_row,
    plan_cancel,
    plan_settle,
    put_row,
    resume_row,
)

__all__ = ["PartitionedStore"]

logger = logging.getLogger(__name__)

_DELETED = key_suffix(DELETED_KEY)
"""An owner's deletion mark's row key after its owner's prefix."""


class PartitionedStore(PartitionedCommits):
    """What both backends share: the TimerStore's writes, the status counts (the commit
    path: `tables.partitioned_commits`; the reads: `tables.partitioned_reads`; serving and
    the checks: `tables.served`)."""

    def partition(self, partition: int) -> PartitionHandle:
        """Partition `partition` alone, for the task that took it (`PartitionHandle`):
        bound to this serving of it, refused once it is revoked or dropped."""
        self._check_open()
        self._check_served(partition)
        return PartitionHandle(self, partition, self._servings[partition])

    # --- the TimerStore ---------------------------------------------------------------

    async def put(self, timer: Timer) -> bool:
        return await self._put(timer, None)

    async def _put(self, timer: Timer, serving: int | None) -> bool:
        self._check_open()
        self._check_serving(timer.partition, serving)
        async with self._writing([timer.partition]):
            self._check_serving(timer.partition, serving)
            prefix = owner_prefix(timer.owner)
            row = prefix + key_suffix(timer.key)
            held = self._load(timer.partition, row)
            mark = self._load(timer.partition, prefix + _DELETED)  # `tables.tombstones`
            new = put_row(held, timer, deleted_through(mark))
            if new is None:
                return False
            await self._commit([Write(timer.partition, row, held, new)])
            return True

    async def put_many(self, timers: Sequence[Timer]) -> list[Timer]:
        return await self._put_many(timers, None)

    async def _put_many(self, timers: Sequence[Timer], serving: int | None) -> list[Timer]:
        self._check_open()
        partitions = {timer.partition for timer in timers}  # each checked once, not per row
        for partition in partitions:
            self._check_serving(partition, serving)
        if not timers:
            return []
        async with self._writing(partitions):
            for partition in partitions:  # again: one may have been revoked meanwhile
                self._check_serving(partition, serving)
            by_partition: dict[int, list[bytes]] = {}
            ats: list[tuple[int, bytes, bytes]] = []
            for timer in timers:
                prefix = owner_prefix(timer.owner)
                row = prefix + key_suffix(timer.key)
                # Its owner's deletion mark (`tables.tombstones`), read with the rows.
                mark = prefix + _DELETED
                ats.append((timer.partition, row, mark))
                by_partition.setdefault(timer.partition, []).extend((row, mark))
            # The rows held, each partition's read at once (a read per row cost as much).
            latest: dict[tuple[int, bytes], Timer | None] = {}
            for partition, rows in by_partition.items():
                rows = list(dict.fromkeys(rows))
                loaded = self._load_many(partition, rows)
                latest.update(zip([(partition, r) for r in rows], loaded, strict=True))
            # Each put sees the ones before it in the batch (the same key twice in a log).
            writes: list[Write] = []
            for timer, (partition, row, mark) in zip(timers, ats, strict=True):
                at = (partition, row)
                held = latest[at]
                new = put_row(held, timer, deleted_through(latest[(partition, mark)]))
                if new is not None:
                    writes.append(Write(at[0], at[1], held, new))
                    latest[at] = new
            await self._commit(writes)
            return [write.new for write in writes if write.new is not None]

    async def cancel(
        self, owner: AggregateRef, key: str, version: int, mark: CancelMark | None = None
    ) -> bool:
        return await self._cancel(owner, key, version, None, mark)

    async def _cancel(
        self,
        owner: AggregateRef,
        key: str,
        version: int,
        only: tuple[int, int] | None,
        mark: CancelMark | None = None,
    ) -> bool:
        row, also = row_key(owner, key), self._marked(mark, only)
        async with self._writing_found(lambda: self._found_row(row, only), only, also) as held:
            read = (None, None) if mark is None else (mark.at, mark.id)
            writes = plan_cancel(held, version, *read)
            if not writes and mark is not None:  # what it leaves: `tables.tombstones`
                at, _, old = held[0] if held else (mark.partition, row, None)
                if (new := tombstone(old, owner, key, version, mark)) is not None:
                    writes = [Write(at, row, old, new)]
            await self._commit(writes)
            return bool(writes)

    async def pause(self, owner: AggregateRef, key: str, version: int) -> bool:
        return await self._pause(owner, key, version, None)

    async def _pause(
        self, owner: AggregateRef, key: str, version: int, only: tuple[int, int] | None
    ) -> bool:
        paused = await self._rewrite(owner, key, lambda held: pause_row(held, version), only)
        return paused is not None

    async def resume(self, owner: AggregateRef, key: str, version: int, now: int) -> Timer | None:
        return await self._resume(owner, key, version, now, None)

    async def _resume(
        self, owner: AggregateRef, key: str, version: int, now: int, only: tuple[int, int] | None
    ) -> Timer | None:
        return await self._rewrite(owner, key, lambda held: resume_row(held, version, now), only)

    async def _rewrite(
        self,
        owner: AggregateRef,
        key: str,
        decide: Callable[[Timer], Timer | None],
        only: tuple[int, int] | None,
    ) -> Timer | None:
        """Writes what `decide` makes of `owner`'s row under `key`: the row written, or None
        (no such row, or `decide` wrote nothing)."""
        row = row_key(owner, key)
        async with self._writing_found(lambda: self._found_row(row, only), only) as found:
            if not found or (new := decide(found[0][2])) is None:
                return None
            partition, _, held = found[0]
            await self._commit([Write(partition, row, held, new)])
            return new

    async def cancel_all(
        self, owner: AggregateRef, version: int, mark: CancelMark | None = None
    ) -> int:
        return await self._cancel_all(owner, version, None, mark)

    async def _cancel_all(
        self,
        owner: AggregateRef,
        version: int,
        only: tuple[int, int] | None,
        mark: CancelMark | None = None,
    ) -> int:
        prefix = owner_prefix(owner)

        def rows() -> list[Found]:
            # Its live rows alone: its finished ones, kept for the retention and not
            # bounded in number, were read and decoded at every deletion (hunt F1).
            return [found for p in self._searched(only) for found in self._live_rows(p, prefix)]

        also = self._marked(mark, only)
        await self._know_live(prefix, only)  # read a chunk a turn, where not known
        async with self._writing_found(rows, only, also) as held:
            writes = plan_cancel(held, version, None if mark is None else mark.at)
            cancelled = len(writes)
            if mark is not None:
                # The owner's deletion mark (`tables.tombstones`), a finished row: read.
                at = prefix + _DELETED
                old = self._load(mark.partition, at)
                if (new := deletion_mark(old, owner, version, mark)) is not None:
                    writes.append(Write(mark.partition, at, old, new))
            await self._commit(writes)
            self._live_left(prefix, held, writes[:cancelled])
            return cancelled

    def _found_row(self, row: bytes, only: tuple[int, int] | None) -> list[Found]:
        """`_find`'s row, as a list (none or one)."""
        found = self._find(row, only)
        return [] if found is None else [found]

    async def settle(self, changes: list[TimerChange]) -> int:
        return await self._settle(changes, None)

    async def _settle(self, changes: list[TimerChange], serving: int | None) -> int:
        self._check_open()
        for change in changes:
            check_change(change)
            self._check_serving(change.loaded.partition, serving)
        if not changes:
            return 0
        async with self._writing({change.loaded.partition for change in changes}):
            for change in changes:
                self._check_serving(change.loaded.partition, serving)
            rows = [row_key(change.loaded.owner, change.loaded.key) for change in changes]
            written, writes = plan_settle(changes, rows, self._load_as_loaded)
            await self._commit(writes)
            return written

    async def expire(self, partition: int, now: int, retention: int, limit: int) -> int:
        return await self._expire(partition, now, retention, limit, None)

    async def _expire(
        self, partition: int, now: int, retention: int, limit: int, serving: int | None
    ) -> int:
        self._check_open()
        for name, value, least in (
            ("now", now, 0),
            ("retention", retention, 0),
            ("limit", limit, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int of at least {least}, not {value!r}")
        self._check_serving(partition, serving)
        async with self._writing([partition]):
            self._check_serving(partition, serving)
            rows = self._expired(partition, expiry_cutoff(now, retention), limit)
            writes = plan_expiry(partition, rows, now, retention, limit)
            await self._commit(writes)
            return len(writes)

    async def _drop(self, partition: int, row: bytes, serving: int | None) -> Timer | None:
        """Deletes `row` of `partition` whatever it holds: the row deleted, or None."""
        self._check_serving(partition, serving)
        async with self._writing([partition]):
            self._check_serving(partition, serving)
            if (held := self._load(partition, row)) is not None:
                await self._commit([Write(partition, row, held, None)])
            return held

    def status_counts(self, partition: int) -> dict[TimerStatus, int]:
        self._check_open()
        self._check_served(partition)
        counts = self._counts.get(partition)
        if counts is None:
            # Synchronous: no write can land between the scan and keeping its result.
            counts = dict.fromkeys(sorted(COUNTED), 0)
            for _, status in self._due_entries(partition, 0):
                counts[TimerStatus(status)] += 1
            counts[TimerStatus.PARKED] = sum(1 for _ in self._parked_entries(partition))
            counts[TimerStatus.PAUSED] = self._held_count(partition)
            self._counts[partition] = counts
        return dict(counts)
