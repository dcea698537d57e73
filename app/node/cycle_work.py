"""What one cycle of a partition has for one type (`CycleWork`): the records and offsets it
decided, its command batch and its dead letters, all staged in the partition's one
transaction (`PartitionCycles._stage`); and the handle of the partition's timers it
writes them through (its task's)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from app.commands.processor import CommandBatch, CommandProcessor, dead_letter_record
from app.kafka import OutRecord, Record
from app.node.kept import KeptType
from app.node.own_records import OwnRecords
from app.node.partition_transaction import Counts
from app.protocol.dead_letters import Stage
from app.protocol.limits import InputLimits
from tables import StoreClosed
from tables.store import TimerWrites

__all__ = [
    "DECIDE_BUDGET_S",
    "CycleWork",
    "decide_deadline",
    "let_the_loop_turn",
    "past_deadline",
    "records_after",
    "records_decided",
    "records_to_do",
]


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
    # Its task's own records committed, until read back (`PartitionInput.own`).
    own: OwnRecords = field(default_factory=OwnRecords)
    # When it stops deciding (`decide_deadline`; None: never): its command batch's.
    deadline: float | None = None
    # What it counts, staged with it: counted only once its transaction commits.
    counts: Counts = field(default_factory=Counts)

    def dead_letter(self, record: Record, error: BaseException, stage: Stage) -> None:
        """Skips a bad record: its dead letter commits with the offset that passes it."""
        self.out.append(dead_letter_record(record, error, stage, self.now, self.limits))
        self.letters[record.topic] += 1

    def batch_of(self, p: int) -> CommandBatch | None:
        """The cycle's command batch, begun on first use; None: p's commands are not
        decided here."""
        if self.batch is None and self.processor is not None:
            self.batch = self.processor.begin()
            self.batch.deadline = self.deadline
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


def records_to_do(
    items: list[tuple[str, list[Record]]], done: dict[str, int]
) -> list[tuple[str, list[Record]]]:
    """The records of `items` (batches, in order) still to decide, in their batches and
    order: of each topic, those after its last offset `done` and after those of it earlier
    in `items` (a batch read again after a lost membership, queued behind the first read
    of its records, holds them a second time). No empty batch."""
    last = dict(done)
    to_do: list[tuple[str, list[Record]]] = []
    for topic, records in items:
        if rest := records_after(records, last.get(topic, -1)):
            to_do.append((topic, rest))
            last[topic] = rest[-1].offset
    return to_do


def records_decided(
    items: list[tuple[str, list[Record]]], unreached: int
) -> list[tuple[str, list[Record]]]:
    """The batches of a cycle's `items` it decided, its last `unreached` records left for
    the next cycle (its budget spent): a prefix of `items`' records, in their batches."""
    keep = sum(len(records) for _, records in items) - unreached
    decided: list[tuple[str, list[Record]]] = []
    for topic, records in items:
        if keep <= 0:
            break
        decided.append((topic, records[:keep]))
        keep -= len(records)
    return decided


DECIDE_BUDGET_S = 0.2
"""How long a cycle decides at most, in seconds of the process's monotonic clock (not the
node's injectable one): past it, the cycle decides no more records (at least one, though,
whatever it takes) and no more in-process timers (at least one of those it takes), and
stages and commits what it decided; the rest is decided by the cycles after it. A cycle
is one run of the event loop: a service's handler that is slow but finishes (0.5 s, a
sync HTTP call), 256 of them in one cycle, held the loop for minutes, the node was
expelled from its group mid-cycle (no heartbeat), its commit fenced, and the next owner
did the same cycle again, for ever. With it, the loop turns (heartbeats, other
partitions, /livez) within about the budget and one handler."""


def decide_deadline() -> float:
    """The `time.monotonic()` time past which a cycle starting now decides no more
    (`DECIDE_BUDGET_S`, read at each call so that a test may patch it)."""
    return time.monotonic() + DECIDE_BUDGET_S


def past_deadline(deadline: float) -> bool:
    """Whether a cycle's budget for deciding (`decide_deadline`) is spent."""
    return time.monotonic() > deadline


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


async def let_the_loop_turn() -> None:
    """Between two cycles of a partition: what became ready during the first (I/O, timers
    due: heartbeats, other partitions' cycles and rounds, /livez) runs before the second.
    `asyncio.sleep(0)` put the worker back first in the loop's next run, ahead of the
    timers fallen due meanwhile: they waited for one more cycle (two budgets). A timer of
    its own, the smallest, puts it behind them: the loop's timers run in their order, and
    the I/O before them."""
    await asyncio.sleep(1e-6)
