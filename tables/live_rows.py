"""The live rows of the owners a partition's store read whole lately (`LiveRows`), so that
an owner deleted again reads those alone, not every row it keeps.

An owner's deletion (`cancel_all`) cancels its PENDING, FIRING, PARKED and PAUSED rows
(`tables.timer.ACTIVE`), but the rows it finds are all those its owner keeps: its
CANCELLED and FIRED ones stay for the retention, and nothing bounds how many (another
writer's events set them). Read and decoded at every deletion of the owner, ten deletions
of an owner of 20,000 rows held the event loop for 11 s.

What is kept is derived from the local rows alone, never written anywhere: an owner's
entry is made from a read of all its rows in the partition with no write of it between
(`know`): in one call, or a chunk at a time under the partition's write lock, the event
loop let run between chunks (`PartitionedReads._know_live`, before a deletion); and every
local write after it keeps it (`wrote`); a restore, which writes rows
no write of the store's own did, and a partition opened, closed or dropped forget the
partition's entries. Bounded: the least recently known owners are forgotten first, and an
owner with more live rows than the bound is not kept (it is read whole, as before).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from typing import Final

from tables.keys import owner_prefix
from tables.timer import ACTIVE
from tables.writes import Write

__all__ = ["OWNERS_LIMIT", "ROWS_LIMIT", "LiveRows"]

OWNERS_LIMIT: Final = 4096
"""Owners kept a partition, at most (an entry is ~200 bytes without its rows)."""

ROWS_LIMIT: Final = 16_384
"""Live row keys kept a partition, all owners together, at most (~100 bytes each)."""


class LiveRows:
    """Of one partition, for the owners read whole lately: the row keys of their live rows,
    by owner prefix (`tables.keys.owner_prefix`)."""

    def __init__(self, owners: int | None = None, rows: int | None = None) -> None:
        self._owners_limit = OWNERS_LIMIT if owners is None else owners
        self._rows_limit = ROWS_LIMIT if rows is None else rows
        self._rows = 0
        self._by_owner: OrderedDict[bytes, set[bytes]] = OrderedDict()

    def __bool__(self) -> bool:
        return bool(self._by_owner)

    def rows_of(self, prefix: bytes) -> set[bytes] | None:
        """The row keys of the live rows of the owner of `prefix`; None: not known."""
        rows = self._by_owner.get(prefix)
        if rows is not None:
            self._by_owner.move_to_end(prefix)
        return rows

    def keeps(self, rows: int) -> bool:
        """Whether an owner of that many live rows would be kept (`know`)."""
        return rows <= self._rows_limit

    def know(self, prefix: bytes, rows: Collection[bytes]) -> None:
        """The live rows of the owner of `prefix` are `rows`: all its rows read just now, no
        write of the partition since the read began."""
        self._forget(prefix)
        if not self.keeps(len(rows)):
            return
        self._by_owner[prefix] = set(rows)
        self._rows += len(rows)
        self._bound()

    def written(self, write: Write) -> None:
        """`wrote` of a local write."""
        row = write.new or write.old
        if row is not None:
            active = write.new is not None and write.new.status in ACTIVE
            self.wrote(owner_prefix(row.owner), write.row, active=active)

    def wrote(self, prefix: bytes, row: bytes, *, active: bool) -> None:
        """A local write of `row` of the owner of `prefix` left it live (`active`) or not
        (finished, or deleted)."""
        rows = self._by_owner.get(prefix)
        if rows is None:
            return
        if active:
            if row not in rows:
                rows.add(row)
                self._rows += 1
                if len(rows) > self._rows_limit:
                    self._forget(prefix)
                else:
                    self._by_owner.move_to_end(prefix)  # not the one the bound drops
                    self._bound()
        elif row in rows:
            rows.discard(row)
            self._rows -= 1

    def _forget(self, prefix: bytes) -> None:
        rows = self._by_owner.pop(prefix, None)
        if rows is not None:
            self._rows -= len(rows)

    def _bound(self) -> None:
        """Forgets the least recently known owners while past either bound."""
        while len(self._by_owner) > self._owners_limit or self._rows > self._rows_limit:
            _, rows = self._by_owner.popitem(last=False)
            self._rows -= len(rows)
