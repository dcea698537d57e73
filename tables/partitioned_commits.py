"""How a write of either backend reaches the changelog and the local rows
(`PartitionedCommits`, a base of `tables.partitioned.PartitionedStore`): its rows handed
to the changelog sink (a partition's own, attached by its handle while its serving lasts,
else the store's), then written locally with the status counts and live rows kept with
them; and the end of a partition's transaction, its commits landed (`applied_through`)
or rolled back (`_roll_back`)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping

from tables.exceptions import StoreClosed, StoreError
from tables.keys import encode_timer
from tables.partitioned_reads import PartitionedReads
from tables.store import ChangelogRecord, ChangelogSink
from tables.timer import ACTIVE, Timer
from tables.writes import Write

__all__ = ["COUNTED", "PartitionedCommits"]

COUNTED = ACTIVE
"""What `status_counts` counts: the active statuses, each from an index of its own."""


class PartitionedCommits(PartitionedReads):
    """The commit path both backends share: sinks, the local write and what is kept with
    it, and a partition's transaction landing or rolled back."""

    def __init__(
        self, partitions: int, changelog: ChangelogSink | None, owner_type: tuple[str, str] | None
    ) -> None:
        super().__init__(partitions, owner_type)
        self._sink = changelog
        # By partition, the sink its handle attached (`PartitionHandle.attach`) and the
        # serving it holds for: its rows go there, not to `_sink`, while it lasts.
        self._sinks: dict[int, tuple[int, ChangelogSink]] = {}
        # By partition, the serving rolled back (`_roll_back`): it takes no write any more.
        self._rolled_back: dict[int, int] = {}

    # --- what a backend supplies ------------------------------------------------------

    _values_needed = False
    """Whether `_apply` needs the rows' encoded values even without a sink."""

    async def _durable(self, partitions: set[int]) -> None:
        """Before a write to `partitions`, under their write locks: what must be durable first."""

    @abstractmethod
    def _apply(self, writes: list[Write], values: list[bytes | None] | None) -> None:
        """Writes rows and their index entries (deletes a row whose `new` is None): one
        atomic write per partition."""

    async def _commit(self, writes: list[Write]) -> None:
        """Hands the new rows to the sink, then writes them locally."""
        if not writes:
            return
        partitions = {write.partition for write in writes}
        for p in partitions:
            if self._rolled_back.get(p) == self._servings[p]:
                raise StoreClosed(f"partition {p} was rolled back: it takes no write")
        sinks = {p: self._sink_of(p) for p in partitions}
        if len({id(sink) for sink in sinks.values()}) > 1:
            # Partitions of sinks of their own (their transactions): each handed its rows
            # and written apart, so a sink failing leaves no row in another's transaction
            # that was not written here too (a commit would then land a row this copy
            # lacks, past the offset it reads on from). The partitions before it are
            # written; the caller's retry finds them so (`settling.apart`).
            for p in sorted(partitions):
                await self._commit([w for w in writes if w.partition == p])
            return
        await self._durable(partitions)
        sunk = any(sink is not None for sink in sinks.values())
        values: list[bytes | None] | None = None
        if sunk or self._values_needed:
            values = [None if w.new is None else encode_timer(w.new) for w in writes]
        if sunk:
            assert values is not None
            # One call a sink (the usual: one, of one partition or of the store).
            by_sink: dict[int, tuple[ChangelogSink, list[ChangelogRecord]]] = {}
            for write, value in zip(writes, values, strict=True):
                if (sink := sinks[write.partition]) is not None:
                    record = ChangelogRecord(write.partition, write.row, value, write.old)
                    by_sink.setdefault(id(sink), (sink, []))[1].append(record)
            try:
                for sink, records in by_sink.values():
                    await sink(records)
            except Exception as exc:
                # A sink before it holds its part (a write over several partitions, one
                # sink each): nothing is written locally, and the caller writes each
                # partition apart again (`settling.apart`), a conditional write landing once.
                raise StoreError(
                    f"the changelog sink failed, nothing was written locally: {exc!r}"
                ) from exc
        self._write_locally(writes, values)

    def _write_locally(self, writes: list[Write], values: list[bytes | None] | None) -> None:
        """Applies `writes` and keeps the status counts and live rows with them. When it
        fails, some partitions' batches may have landed (RocksDB writes one a partition in
        turn): what is kept of each partition written is forgotten, read again when next
        asked (kept on, it would miss a landed row: an owner's deletion would leave it)."""
        try:
            self._apply(writes, values)
        except BaseException:
            for partition in {w.partition for w in writes}:
                self._forget_counts(partition)
            raise
        # No await since the rows were applied: a count taken in between cannot miss them.
        for write in writes:
            counts = self._counts.get(write.partition)
            if counts is not None:
                if write.old is not None and write.old.status in COUNTED:
                    counts[write.old.status] -= 1
                if write.new is not None and write.new.status in COUNTED:
                    counts[write.new.status] += 1
            if live := self._live.get(write.partition):  # owners read whole lately alone
                live.written(write)

    def _sink_of(self, partition: int) -> ChangelogSink | None:
        """Where `partition`'s rows go: its handle's sink while its serving lasts."""
        attached = self._sinks.get(partition)
        if attached is None:
            return self._sink
        if attached[0] != self._servings[partition]:
            del self._sinks[partition]  # revoked or dropped since: its holder is gone
            return self._sink
        return attached[1]

    def _attach(self, partition: int, serving: int, sink: ChangelogSink) -> None:
        self._check_open()
        self._check_serving(partition, serving)
        self._sinks[partition] = (serving, sink)

    async def applied_through(self, partition: int, offset: int) -> None:
        await self._applied_through(partition, offset, None)

    async def _applied_through(self, partition: int, offset: int, serving: int | None) -> None:
        """`applied_through`; of a serving rolled back since, nothing: the commit's rows
        were written back, and are read on from the changelog."""
        self._check_open()
        self._check_serving(partition, serving)
        async with self._writing([partition]):
            self._check_serving(partition, serving)
            if self._rolled_back.get(partition) == self._servings[partition]:
                return
            held = self._offset(partition)
            if held is None or offset > held:
                self._set_offset(partition, offset)

    async def _roll_back(
        self, partition: int, serving: int, befores: Mapping[bytes, Timer | None]
    ) -> int:
        """Writes back, locally, each row of `befores` as it held before writes whose
        commits did not land (no changelog: none of them committed); from then on this
        serving of the partition takes no write (`StoreClosed`) and records no landing.
        How many rows were written back."""
        self._check_open()
        self._check_serving(partition, serving)
        async with self._writing([partition]):
            self._check_serving(partition, serving)
            if self._rolled_back.get(partition) == serving:
                raise StoreError(f"partition {partition} was rolled back already")
            self._rolled_back[partition] = serving
            await self._durable({partition})
            writes = []
            for row, before in befores.items():
                now = self._load(partition, row)
                if now != before:
                    writes.append(Write(partition, row, now, before))
            values = [None if w.new is None else encode_timer(w.new) for w in writes]
            self._write_locally(writes, values)
            return len(writes)
