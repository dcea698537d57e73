"""What one cycle of a partition has for one type (`CycleWork`): the records and offsets it
decided, its command batch and its dead letters, all staged in the partition's one
transaction (`PartitionCycles._stage`); and the handle of the partition's timers it
writes them through (its task's)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from app.commands.processor import CommandBatch, CommandProcessor, dead_letter_record
from app.kafka import OutRecord, Record
from app.node.kept import KeptType
from app.protocol.dead_letters import Stage
from app.protocol.limits import InputLimits
from tables import StoreClosed
from tables.store import TimerWrites

__all__ = ["CycleWork", "records_after"]


@dataclass
class CycleWork:
    """What one cycle of a partition has for one type: written in one transaction."""

    kept: KeptType
    now: int
    limits: InputLimits
    processor: CommandProcessor | None  # None: the partition's commands are not decided here
    # The partition's handle of the type's timer store (its task's take's); None: its
    # task does not hold one (not running it any more).
    store: TimerWrites | None = None
    out: list[OutRecord] = field(default_factory=list)  # beside the command batch's
    letters: Counter[str] = field(default_factory=Counter)  # dead letters in `out`, by topic
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    batch: CommandBatch | None = None
    wrote: bool = False  # timer rows written (buffered in the partition's transaction)
    # The ids of the events whose timer operations its task's cycles carried out at once
    # (`PartitionInput.carried`): read back, they are passed over.
    carried: set[str] = field(default_factory=set)

    def dead_letter(self, record: Record, error: BaseException, stage: Stage) -> None:
        """Skips a bad record: its dead letter commits with the offset that passes it."""
        self.out.append(dead_letter_record(record, error, stage, self.now, self.limits))
        self.letters[record.topic] += 1

    def batch_of(self, p: int) -> CommandBatch | None:
        """The cycle's command batch, begun on first use; None: p's commands are not
        decided here."""
        if self.batch is None and self.processor is not None:
            self.batch = self.processor.begin()
        return self.batch

    @property
    def timers(self) -> TimerWrites:
        """The partition's timers, written through its task's handle (its lock alone);
        `StoreClosed` when its task holds none (the partition is not run here any more)."""
        if self.store is None:
            raise StoreClosed(f"{self.kept.name}: the partition's task holds no timer store")
        return self.store

    @property
    def decider(self) -> CommandProcessor:
        """The processor that began the cycle's batch (asked only once one was begun)."""
        assert self.processor is not None
        return self.processor


def records_after(records: list[Record], done: int) -> list[Record]:
    """The records of a batch after offset `done` (a batch read again after a lost
    membership may hold records done and new ones)."""
    if not records or records[0].offset > done:
        return records
    return [r for r in records if r.offset > done]


CYCLE_RECORDS = 256
"""Records one cycle decides at most: what a partition's queue holds beyond that is
decided in the cycles that follow, the event loop let run between them. A cycle is one
turn of the loop (its store calls do not yield), so a partition catching up on thousands
of records (a poll's batches queued behind a pause) held every other partition's timers
and cycles for hundreds of milliseconds: the tail of the lateness at 5,000 timers/s
(docs/performance.md)."""


def cycle_slices(
    items: list[tuple[str, list[Record]]], budget: int = CYCLE_RECORDS
) -> list[list[tuple[str, list[Record]]]]:
    """`items` (batches of a partition, in order) cut into the cycles that decide them, in
    order, each of at most `budget` records (one batch split where it overflows); one
    empty cycle when there are none (it fires the timers handed over). Concatenated, the
    cycles' batches hold the records of `items` in their order."""
    cycles: list[list[tuple[str, list[Record]]]] = [[]]
    room = max(1, budget)
    for topic, records in items:
        start = 0
        while start < len(records):
            if room == 0:
                cycles.append([])
                room = max(1, budget)
            end = start + min(room, len(records) - start)
            cycles[-1].append((topic, records[start:end]))
            room -= end - start
            start = end
    return cycles


def behind_of(cycles: list[list[tuple[str, list[Record]]]]) -> list[dict[str, int]]:
    """For each of a poll's cycles (`cycle_slices`), how many records of each topic wait in
    the cycles after it: a command's backlog counts them (BUSY), as it did when the whole
    poll was one cycle."""
    after: dict[str, int] = {}
    behind: list[dict[str, int]] = []
    for cycle in reversed(cycles):
        behind.append(dict(after))
        for topic, records in cycle:
            after[topic] = after.get(topic, 0) + len(records)
    behind.reverse()
    return behind
