"""Whose timers a partition of a type's table holds, for a restore to take no other row.

The live path sets a partition's timers from its type's events keyed to it alone (it
refuses an event of another type, or of an aggregate murmur2 puts elsewhere): every row
it writes is of an owner of the type, in the partition Kafka's default partitioner puts
the owner's id in. A changelog row of any other owner is another writer's, however well
formed (under its own row key, its `partition` field the partition it sits in). Loaded,
it would fire while nothing could stop it: its owner's cancels and deletion are applied
in the owner's own type's table and partition, and `timers show` of the owner reads that
partition alone. So a restore refuses it as it refuses a record that is no row
(`tables.keys.restored_row`, `tables.rowcheck.restored_index_as_is`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tables.partitioner import murmur2
from tables.refs import AggregateRef

__all__ = ["TableOwners", "id_hash"]

_CACHE_SIZE = 4096
_HASHES: dict[str, int] = {}
"""`id_hash` by id, emptied when full: an owner's rows are restored one after another
(they are written together), and pure-Python murmur2 costs 2 to 4 µs an id."""


def id_hash(id: str) -> int:
    """murmur2 of `id` as the partitioner takes it (`tables.partitioner.partition_of` is
    this modulo the partition count), remembered for the most recent ids."""
    hashed = _HASHES.get(id)
    if hashed is None:
        if len(_HASHES) >= _CACHE_SIZE:
            _HASHES.clear()
        # Strict UTF-8 (`partition_of`): a lone surrogate raises UnicodeEncodeError, no
        # valid row holds one.
        hashed = _HASHES[id] = murmur2(id.encode()) & 0x7FFFFFFF
    return hashed


@dataclass(frozen=True, slots=True)
class TableOwners:
    """The owners of the timers of the type `context.aggregate` in a table of `partitions`
    partitions: each owner of the type in the partition its id is keyed to."""

    context: str
    aggregate: str
    partitions: int

    def refusal(self, owner: AggregateRef, partition: int, *, live: bool = True) -> str | None:
        """Why `partition` holds no timer of `owner`; None if it may. `live`: the row is
        not finished (FIRED, CANCELLED): only such a row has its owner's id hashed, as a
        finished row never fires again and its sweep deletes it (murmur2 costs a restore
        3-5 us a row, as much as the rest of its check)."""
        if owner.context != self.context or owner.aggregate != self.aggregate:
            return f"its owner is of type {owner.type_name}, not {self.context}.{self.aggregate}"
        if not live:
            return None
        home = id_hash(owner.id) % self.partitions
        if home != partition:
            return (
                f"its owner {owner.id!r} belongs in partition {home} (murmur2, Kafka's "
                f"default partitioner), not {partition}"
            )
        return None
