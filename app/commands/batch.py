"""What one transaction of a partition's command path builds up before it commits: the
records to write, the offsets read, the aggregates as they will be (`CommandBatch`), and
its counts (`BatchStats`); and how it commits (`Commit`)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from app.commands.folds import Mark
from app.kafka import OutRecord
from app.model.decide import StoredAggregate
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode

__all__ = ["BatchStats", "CommandBatch", "Commit", "LocalDecided"]

Commit = Callable[[Sequence[OutRecord], dict[tuple[str, int], int]], Awaitable[list[int]]]
"""Sends records and commits consumer offsets in the partition's one transaction; the
records' offsets (`PartitionTransaction.commit`, bound to the partition)."""

LocalDecided = Callable[[list[tuple[CommandEnvelope, ResultCode, str]]], Awaitable[None]]
"""Told, before the commit, what each command fired in-process came to, so that the
timers' settles join the same transaction (`TimerRunner.record_outcomes`)."""


@dataclass(slots=True)
class BatchStats:
    commands: int = 0
    committed: int = 0
    events: int = 0
    dead_letters: int = 0
    codes: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True, eq=False)
class CommandBatch:
    """What one transaction's decisions have built up so far: its records to write (events,
    results, commands sent, dead letters), the commands' offsets, and the aggregates as
    they will be once it commits."""

    now: int
    staged: dict[str, StoredAggregate] = field(default_factory=dict)
    # The staged aggregates' bytes, encoded when decided: an aggregate that cannot be
    # written is its command's fault then, not a commit's failure later.
    encoded: dict[str, bytes] = field(default_factory=dict)
    applied: set[tuple[str, str]] = field(default_factory=set)
    # Request ids of another writer's events in the log that none could be folded of
    # (dead-lettered): sent again, a duplicate; read again, tried again.
    passed: set[tuple[str, str]] = field(default_factory=set)
    # Per aggregate, the request of another writer's events the follow folded last: its
    # id, that event's offset and the ids of its events folded (the decision's later
    # events share the request id; one folded already is not folded again: `Mark`).
    # None: this node decided for it since (its own events read back are not the writer's).
    following: dict[str, Mark | None] = field(default_factory=dict)
    out: list[OutRecord] = field(default_factory=list)
    # Of `out`, by index, the records on the partition's own input topics (its events, the
    # commands it decided in-process): a timer event's id, else None. Read back once
    # committed, they are passed over undecoded (`app.node.own_records`).
    own: dict[int, str | None] = field(default_factory=dict)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    stats: BatchStats = field(default_factory=lambda: BatchStats())
    # The last offset of the partition's log read in this batch (other writers' events
    # followed or passed over): the state store's offset moves past them with it, so a
    # restore does not fold them a second time.
    log_offset: int | None = None
    # The due times (`not_before`, epoch ms) of the scheduled commands, every timer's, this
    # batch decided for good: their lateness is measured once the batch commits.
    fired_due: list[int] = field(default_factory=list)
    # The timer events (`wow.*`) decided and not yet carried out on the timer table, each
    # with its timer operation as the processor checked it (None: not checked): the
    # partition's cycle carries them out at once, before anything of it fires
    # (`take_timer_events`).
    timer_events: list[tuple[EventEnvelope, object]] = field(default_factory=list)
    # When its cycle's budget for deciding ends (`app.node.cycle_work.DECIDE_BUDGET_S`), on
    # the process's monotonic clock (the node's own is injected, and frozen by tests):
    # past it, no more is begun but the first of a call. None: no end.
    deadline: float | None = None

    def take_timer_events(self) -> list[tuple[EventEnvelope, object]]:
        events, self.timer_events = self.timer_events, []
        return events

    def past_deadline(self) -> bool:
        """Whether its cycle's budget for deciding is spent (`deadline`)."""
        return self.deadline is not None and time.monotonic() > self.deadline

    @property
    def empty(self) -> bool:
        """Nothing decided, followed or read: no need to commit it."""
        return not (self.out or self.staged or self.applied or self.passed or self.offsets)
