"""The reference TimerStore: plain dicts and sorted lists, the same semantics as RocksDB.

Rows are keyed by the same row-key bytes as on disk and the indexes are sorted lists of
`(due_at, id, row key)`, which sort as the RocksDB index keys do, so both backends
return the same timers in the same order.
"""

from __future__ import annotations

import heapq
import logging
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import islice

from tables.keys import finished_at, owner_prefix, ref_bytes, restored_row
from tables.partitioned import PartitionedStore
from tables.refs import AggregateRef
from tables.store import ChangelogSink, DuePosition, DueRow, UnreadableRow
from tables.store import unreadable_reason as _reason
from tables.timer import Timer, TimerStatus
from tables.writes import Write

__all__ = ["MemoryTimerStore"]

logger = logging.getLogger(__name__)

_Entry = tuple[int, str, bytes]
"""An index entry: `(due_at, id, row key)`."""

_DUE = frozenset({TimerStatus.PENDING, TimerStatus.FIRING})


def _remove(entries: list[_Entry], entry: _Entry) -> None:
    at = bisect_left(entries, entry)
    if at < len(entries) and entries[at] == entry:
        del entries[at]


@dataclass
class _Partition:
    rows: dict[bytes, Timer] = field(default_factory=dict)
    owners: dict[bytes, set[bytes]] = field(default_factory=dict)
    due: list[_Entry] = field(default_factory=list)
    parked: dict[bytes, list[_Entry]] = field(default_factory=dict)
    finished: list[_Entry] = field(default_factory=list)
    """`(finished_at, id, row key)` of the FIRED and CANCELLED rows."""
    held: set[bytes] = field(default_factory=set)
    """The row keys of the PAUSED rows."""
    offset: int | None = None

    def put(self, row: bytes, timer: Timer) -> None:
        self.delete(row)
        self.rows[row] = timer
        self.owners.setdefault(owner_prefix(timer.owner), set()).add(row)
        entry = (timer.due_at, timer.id, row)
        if timer.status in _DUE:
            insort(self.due, entry)
        elif timer.status is TimerStatus.PARKED:
            insort(self.parked.setdefault(ref_bytes(timer.target), []), entry)
        elif timer.status is TimerStatus.PAUSED:
            self.held.add(row)  # in no index the firing loop reads (`tables.keys.HELD`)
        else:
            insort(self.finished, _finished(timer, row))

    def delete(self, row: bytes) -> None:
        old = self.rows.pop(row, None)
        if old is None:
            return
        prefix = owner_prefix(old.owner)
        rows = self.owners[prefix]
        rows.discard(row)
        if not rows:
            del self.owners[prefix]
        entry = (old.due_at, old.id, row)
        if old.status in _DUE:
            _remove(self.due, entry)
        elif old.status is TimerStatus.PARKED:
            target = ref_bytes(old.target)
            _remove(self.parked[target], entry)
            if not self.parked[target]:
                del self.parked[target]
        elif old.status is TimerStatus.PAUSED:
            self.held.discard(row)
        else:
            _remove(self.finished, _finished(old, row))


def _finished(timer: Timer, row: bytes) -> _Entry:
    return (finished_at(timer.due_at, timer.slot_due_at), timer.id, row)


class MemoryTimerStore(PartitionedStore):
    """Everything in dicts: for tests and as the reference the RocksDB store must match."""

    def __init__(
        self,
        partitions: int,
        changelog: ChangelogSink | None = None,
        *,
        owner_type: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(partitions, changelog, owner_type)
        self._data = [_Partition() for _ in range(partitions)]

    def _load(self, partition: int, row: bytes) -> Timer | None:
        return self._data[partition].rows.get(row)

    def _owner_rows(self, partition: int, prefix: bytes) -> Iterator[tuple[bytes, Timer]]:
        data = self._data[partition]
        for row in sorted(data.owners.get(prefix, ())):
            yield row, data.rows[row]

    def _owner_chunk(
        self, partition: int, prefix: bytes, after: bytes | None, count: int
    ) -> list[tuple[bytes, Timer]]:
        data = self._data[partition]
        rows = data.owners.get(prefix, ())
        picked = heapq.nsmallest(count, (r for r in rows if after is None or r > after))
        return [(row, data.rows[row]) for row in picked]

    def _apply(self, writes: list[Write], values: list[bytes | None] | None) -> None:
        for write in writes:
            if write.new is None:
                self._data[write.partition].delete(write.row)
            else:
                self._data[write.partition].put(write.row, write.new)

    def _expired(self, partition: int, until: int, limit: int) -> list[tuple[bytes, Timer]]:
        data = self._data[partition]
        entries = islice(data.finished, bisect_left(data.finished, (until + 1,)))
        return [(row, data.rows[row]) for _, _, row in islice(entries, limit)]

    def _due(
        self, partitions: list[int], until: int, limit: int, after: DuePosition | None = None
    ) -> list[Timer]:
        picked = self._picked(partitions, until, limit, after)
        return [self._data[partition].rows[entry[2]] for entry, partition in picked]

    def _due_rows(self, partitions: list[int], until: int, limit: int) -> list[DueRow]:
        return [
            DueRow(due_at, id, partition, timer=self._data[partition].rows[row])
            for (due_at, id, row), partition in self._picked(partitions, until, limit)
        ]

    def _picked(
        self, partitions: list[int], until: int, limit: int, after: DuePosition | None = None
    ) -> list[tuple[_Entry, int]]:
        runs = []
        for partition in partitions:
            entries = self._data[partition].due
            start = 0 if after is None else bisect_right(entries, after)
            end = bisect_left(entries, (until + 1,))
            runs.append([(entry, partition) for entry in entries[start : min(end, start + limit)]])
        return list(islice(heapq.merge(*runs), limit))

    def _firing(self, partition: int, count: int) -> list[Timer]:
        data = self._data[partition]
        rows = (data.rows[row] for _, _, row in data.due)
        return list(islice((t for t in rows if t.status is TimerStatus.FIRING), count))

    def _parked(self, partitions: list[int], target: AggregateRef) -> list[Timer]:
        key = ref_bytes(target)
        runs = [
            [(entry, partition) for entry in self._data[partition].parked.get(key, ())]
            for partition in partitions
        ]
        return [self._data[partition].rows[entry[2]] for entry, partition in heapq.merge(*runs)]

    def _due_entries(self, partition: int, start: int) -> Iterator[tuple[int, str]]:
        data = self._data[partition]
        for due_at, _, row in islice(data.due, bisect_left(data.due, (start,)), None):
            yield due_at, data.rows[row].status.value

    def _parked_entries(self, partition: int) -> Iterator[Callable[[], Timer]]:
        data = self._data[partition]
        for target in sorted(data.parked):  # target bytes, as the RocksDB index sorts them
            for _, _, row in data.parked[target]:
                yield partial(data.rows.__getitem__, row)

    def _held_count(self, partition: int) -> int:
        return len(self._data[partition].held)

    def _restore(
        self, partition: int, records: Iterable[tuple[int, bytes, bytes | None]]
    ) -> list[UnreadableRow]:
        decoded: list[tuple[bytes, Timer | None]] = []
        unreadable: list[UnreadableRow] = []
        last = None
        for offset, key, value in records:
            last = offset
            if value is None:
                decoded.append((key, None))
                continue
            try:
                decoded.append((key, restored_row(partition, key, value, self._owners)))
            except ValueError as exc:
                # No row: the key keeps what it held before (another writer's garbage
                # under a live timer's key never deletes it), as the row written again
                # after its letter says (`app.timers.restore.unreadable_letters`).
                unreadable.append(UnreadableRow(offset, key, value, _reason(exc)))
        if last is None:
            return unreadable
        data = self._data[partition]
        for key, timer in decoded:
            if timer is None:
                data.delete(key)
            else:
                data.put(key, timer)
        data.offset = last
        return unreadable

    async def _end_restore(self, partition: int) -> None:
        pass  # nothing kept for restores alone

    def _offset(self, partition: int) -> int | None:
        return self._data[partition].offset

    def _set_offset(self, partition: int, offset: int) -> None:
        self._data[partition].offset = offset

    def _open_partition(self, partition: int) -> None:
        pass

    def _close_partition(self, partition: int) -> None:
        pass

    def _drop_partition(self, partition: int, served: bool) -> None:
        self._data[partition] = _Partition()

    def _close(self) -> None:
        self._data = []
