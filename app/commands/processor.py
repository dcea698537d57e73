"""The command path of one partition of one aggregate type: its decisions.

For each batch of commands read from `<type>.commands[p]`, in order: de-duplicate by request
id, refuse what is not due yet, refuse when the partition's backlog is full (BUSY), run the
handler, and then append the events to `<type>.events[p]`, publish the results and commit
the commands' offsets in ONE Kafka transaction. The aggregate states are written locally
only after the transaction committed; they are a fold of the log, restored from it
(`app.commands.states`, `app.commands.restore`). What a transaction builds up is a
`CommandBatch` (`app.commands.batch`); the records beside the events,
`app.commands.records`; the checks of a record before it is decided,
`app.commands.intake`; a command's answer, and a refused one's dead letter,
`app.commands.answers`; another writer's event followed, `app.commands.follow`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from app.commands.answers import CommandAnswers
from app.commands.batch import BatchStats, CommandBatch, Commit, LocalDecided
from app.commands.follow import follow_event
from app.commands.intake import bad_reply, past_window, read_command
from app.commands.records import (
    check_sizes,
    command_record,
    dead_letter_record,
    misrouted,
    state_key,
    targeted,
    unreachable,
    written_in_process,
)
from app.commands.states import PartitionStates
from app.errors import BadRecord, node_fault
from app.kafka import LogReader, OutRecord, Record
from app.kafka.catalog import TopicCatalog
from app.kafka.records import RestoreProgress
from app.model.aggregate import AggregateType
from app.model.decide import CLOCK_SKEW_MS, Decided, cut_message, decide
from app.protocol.dead_letters import Stage
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    IN_PROCESS_HEADER,
    IN_PROCESS_HEADERS,
    SYSTEM_EVENTS,
    CommandEnvelope,
    EventEnvelope,
    ResultCode,
    encode,
    sent_unanswered,
    unknown_system_event,
)
from tables.aggregate_store import AggregateStateStore

__all__ = [
    "BatchStats",
    "CommandBatch",
    "CommandProcessor",
    "Commit",
    "LocalDecided",
    "dead_letter_record",
    "misrouted",
    "state_key",
]

logger = logging.getLogger(__name__)

_FIRED = frozenset({ResultCode.COMMITTED, ResultCode.UNCHANGED, ResultCode.REJECTED})
"""A command decided for good by its aggregate's handler (a duplicate was counted when first
decided; BUSY, not due yet and ERROR are sent again)."""


class CommandProcessor:
    def __init__(
        self,
        agg: AggregateType[Any],
        partition: int,
        *,
        partitions: int,
        states: AggregateStateStore,
        commit: Commit,
        now: Callable[[], int],
        busy_backlog: int = 50_000,
        limits: InputLimits | None = None,
        request_id_window: int = 7 * 24 * 3_600_000,
        targets: TopicCatalog | None = None,
        timer_op: Callable[[EventEnvelope, int], object] | None = None,
        clock_skew_ms: int = CLOCK_SKEW_MS,
    ) -> None:
        self.agg = agg
        # How early a command no sender waits for may come and be decided (`decide`).
        self.clock_skew_ms = clock_skew_ms
        # The cluster's topics: a decision sending to a command topic not there is refused
        # (its send would fail the partition's transaction, again at each retake).
        self.targets = targets
        self._unreachable = None if targets is None else partial(unreachable, targets)
        # What a decision's system event (decided at a time) does to the timers, as the
        # node's subscription will take it, bound to the partition (the node's
        # `app.timers.decided_ops.decided_timer_op`): `BadRecord` for one it would refuse,
        # the decision then answered ERROR, nothing of it written. None: not checked.
        self._timer_op = timer_op
        self.partition = partition
        self.partitions = partitions
        self.topics = AggregateTopics(agg.context, agg.name)
        # Named once: each fired timer writes to both (#20).
        self._events_topic = self.topics.events
        self._commands_topic = self.topics.commands
        self.results_topic = ContextTopics(agg.context).results
        self._commit = commit
        self._now = now
        self.busy_backlog = busy_backlog
        self.limits = limits or InputLimits()
        self._answers = CommandAnswers(self.results_topic, partitions, self.limits)
        self._states = PartitionStates(
            agg,
            partition,
            partitions=partitions,
            store=states,
            limits=self.limits,
            events_topic=self.topics.events,
            request_id_window=request_id_window,
            now=now,
        )

    @property
    def request_id_window(self) -> int:
        """How long an applied request id is kept to de-duplicate a command sent again."""
        return self._states.request_id_window

    async def restore(
        self,
        reader: LogReader,
        progress: RestoreProgress | None = None,
        *,
        misplaced: Callable[[int], None] | None = None,
    ) -> int:
        """Folds the events after the state store's offset into it; how many were read
        (`PartitionStates.restore`; `misplaced` told how many it did not fold for being
        outside their aggregate's partition)."""
        return await self._states.restore(reader, progress, misplaced=misplaced)

    def begin(self) -> CommandBatch:
        """A new batch of decisions, for one transaction of the partition."""
        return CommandBatch(now=self._now())

    def decide_records(
        self,
        batch: CommandBatch,
        records: list[Record],
        backlog: int = 0,
        own: Callable[[Record], bool] | None = None,
    ) -> int:
        """Decides `records` (commands of this partition, in order) into `batch`; how many.
        None is begun past the batch's deadline but the first (slow handlers hold the event
        loop that long and one more at most): the offset committed passes those decided
        alone, the rest are the caller's to decide in a later batch.

        `backlog`: how many commands of the partition wait behind these. A command reached
        while more than `busy_backlog` commands wait (itself, the rest of the records and
        those behind them) is answered BUSY without running its handler: the partition
        sheds its oldest work until it is back within bounds, and the senders retry.

        `own`: whether a record is one this partition wrote itself (a command it decided
        in-process, committed): passed over unread, as it would be read.
        """
        if not records:
            return 0
        now, decided = batch.now, 0
        for i, r in enumerate(records):
            if i and batch.past_deadline():
                break
            decided, waiting = i + 1, len(records) - i + backlog
            if own is not None and own(r):
                continue  # fired in-process: decided in the transaction that wrote it
            try:
                cmd = read_command(r, self.agg.type_name, self.limits, self.partitions)
            except BadRecord as exc:
                self._answers.unreadable(batch, r, exc)
                continue
            if cmd.in_process and written_in_process(r):
                continue  # fired in-process: decided in the transaction that wrote it
            if (wrong := bad_reply(cmd, self.results_topic, self.partitions)) is not None:
                # Never written where it asks: answered where its context's answers go.
                self._answers.refuse(batch, r, cmd, BadRecord(wrong), Stage.READ, own=True)
                continue
            if cmd.in_process and not self._applied(batch, cmd):
                why = (
                    f"in_process is true but the record lacks the {IN_PROCESS_HEADER} header "
                    "a node writes with the commands it decided itself: not decided (send "
                    "a command without in_process)"
                )
                self._answers.refuse(batch, r, cmd, BadRecord(why), Stage.READ)
                continue
            # (Without the header but applied: an earlier version's own record, or a
            # request sent again; decided as any command, it is answered DUPLICATE.)
            if (
                old := past_window(r, cmd, now, self.request_id_window, self.clock_skew_ms)
            ) is not None and (not self._applied(batch, cmd)):
                # Decided again it could be applied twice (one applied and still kept is
                # answered DUPLICATE below, as any).
                self._answers.refuse(batch, r, cmd, BadRecord(old), Stage.DECIDE)
                continue
            if waiting > self.busy_backlog and not sent_unanswered(cmd):
                # (A timer's send no sender waits for is decided all the same: nothing
                # would send it again.)
                message = f"{waiting} commands waiting (bound {self.busy_backlog})"
                batch.out.append(self._answers.result(cmd, ResultCode.BUSY, message, None, now))
                batch.stats.codes[ResultCode.BUSY] += 1
                continue
            try:
                d, version = self._decide(batch, cmd)
            except Exception as exc:
                if node_fault(exc):
                    raise
                # The aggregate this command is decided on cannot be read or folded: the
                # command's fault, answered and kept, and the partition goes on.
                self._answers.refuse(batch, r, cmd, exc, Stage.DECIDE)
                continue
            batch.out.append(
                self._answers.result(cmd, d.code, d.message, version, now, refusal=d.refusal)
            )
            if d.error is not None:
                # Answered ERROR, and kept for an operator: its handler refused to run it.
                self._answers.dead_letter(batch, r, d.error, Stage.DECIDE)
            elif d.code is ResultCode.SCHEDULE_NOT_DUE and sent_unanswered(cmd):
                # Early past the clocks' skew, and no sender waits for its answer (one of
                # another context's): kept for an operator to replay once due, not lost.
                why = f"{d.message}; no sender waits for its answer: replay it once due"
                self._answers.dead_letter(batch, r, BadRecord(why), Stage.DECIDE)
            elif d.code is ResultCode.ERROR and cmd.type not in self.agg.handlers:
                # Answered ERROR, and kept for an operator: no handler will ever take it.
                # (Not a duplicate of a request applied, nor one early: answered as such,
                # with no letter; one early is lettered once it is due, naming what fails.)
                self._answers.dead_letter(batch, r, BadRecord(d.message), Stage.DECIDE)
        batch.stats.commands += decided
        batch.offsets[(self.topics.commands, self.partition)] = records[decided - 1].offset + 1
        return decided

    def _applied(self, batch: CommandBatch, cmd: CommandEnvelope) -> bool:
        """Whether `cmd`'s request id is applied to its aggregate: an in-process command an
        earlier version wrote without the header, read back after an upgrade."""
        return self._states.applied(batch, (state_key(cmd.aggregate), cmd.request_id))

    def decide_local(
        self, batch: CommandBatch, commands: Sequence[CommandEnvelope]
    ) -> list[tuple[CommandEnvelope, ResultCode, str]]:
        """Decides commands of timers of this partition fired in-process into `batch`; what
        each came to, in order (none begun past the batch's deadline but the first, as in
        `decide_records`: the rest are the caller's to fire later).

        The same code as for a command read from the topic (dedup, not-before, handler),
        but no result record: the caller settles the timers before the commit, so that
        each settle is in the same transaction as its events. The command itself is
        written to the command topic in that transaction too, as the record of what was
        sent, with the node's header (`IN_PROCESS_HEADER`): read back, it is passed over.
        One whose record would be refused (`check_sizes`) is answered ERROR, not decided.
        """
        decided: list[tuple[CommandEnvelope, ResultCode, str]] = []
        topic, partition, out = self._commands_topic, self.partition, batch.out
        headers = IN_PROCESS_HEADERS
        for cmd in commands:
            if decided and batch.past_deadline():
                break
            sent: OutRecord | None = None
            try:
                # Before its handler, which may change the body it is given: the record
                # says what was sent.
                record = (topic, partition, cmd.aggregate.id.encode(), encode(cmd), headers)
                # Checked as a decision's records are, and before its handler runs: a timer
                # stored before its topic took less (or the node's bound was lowered)
                # would fail the partition's transaction at every retake. Not written nor
                # decided, it is answered ERROR: the timer retries it, parked in the end.
                check_sizes([record], self.limits, self.targets)
                sent = record
                d, _ = self._decide(batch, cmd)
                code, message = d.code, d.message
            except Exception as exc:
                if node_fault(exc):
                    raise
                # As a target answers a command it cannot decide: the timer retries it.
                code, message = ResultCode.ERROR, cut_message(f"{type(exc).__name__}: {exc}")
                batch.stats.codes[code] += 1
            if sent is not None:
                batch.own[len(out)] = None
                out.append(sent)
            decided.append((cmd, code, message))
        batch.stats.commands += len(decided)
        return decided

    def staged(self, batch: CommandBatch) -> None:
        """The batch waits for the partition's next commit: what it decided counts for the
        batches decided after it."""
        self._states.staged(batch)

    def committed(self, batch: CommandBatch, written: Sequence[int]) -> None:
        """Writes the batch's aggregate states once its transaction committed; `written`:
        the offsets its records were written at."""
        self._states.committed(batch, written)

    async def handle(
        self,
        records: list[Record],
        backlog: int = 0,
        local: Sequence[CommandEnvelope] = (),
        on_local: LocalDecided | None = None,
    ) -> BatchStats:
        """Decides `records`, then the `local` commands, and commits them in one
        transaction of their own (`on_local` hears what the local ones came to first)."""
        batch = self.begin()
        self.decide_records(batch, records, backlog)
        decided = self.decide_local(batch, local)
        if decided and on_local is not None:
            await on_local(decided)
        self.staged(batch)  # as a node's cycle stages it
        self.committed(batch, await self._commit(batch.out, batch.offsets))
        return batch.stats

    def follow(self, batch: CommandBatch, event: EventEnvelope, offset: int) -> bool:
        """Folds another writer's event into its aggregate when ahead of it (`follow_event`)."""
        return follow_event(self.agg, self._states, batch, event, offset)

    def _decide(self, batch: CommandBatch, cmd: CommandEnvelope) -> tuple[Decided, int | None]:
        """Decides one command on the aggregate as the batch left it; its events and
        commands join the batch's records. The decision and the aggregate's version."""
        aid = state_key(cmd.aggregate)
        stored = batch.staged.get(aid) or self._states.stored(aid)
        d = targeted(
            self.targets,
            decide(
                self.agg,
                stored,
                cmd,
                now=batch.now,
                seen=self._states.applied(batch, (aid, cmd.request_id)),
                unreachable=self._unreachable,
                skew_ms=self.clock_skew_ms,
            ),
            f"{self._commands_topic}[{self.partition}]",
        )
        if d.stored is not None:
            # Everything encoded before the batch changes: a decision whose events, commands
            # or aggregate cannot be written raises here and leaves the batch as it was.
            key = cmd.aggregate.id.encode()
            out: list[OutRecord] = [
                (self._events_topic, self.partition, key, encode(e)) for e in d.events
            ]
            out += [command_record(c) for c in d.commands]
            state = self._states.encode(aid, stored, d.stored)  # past its bound: refused
            check_sizes(out, self.limits, self.targets)
            timer_events = self._timer_events(d.events, batch.now)
            batch.staged[aid] = d.stored
            batch.encoded[aid] = state
            batch.following[aid] = None
            batch.applied.add((aid, cmd.request_id))
            base = len(batch.out)
            for i, e in enumerate(d.events):  # first in `out`
                batch.own[base + i] = e.id if e.type in SYSTEM_EVENTS else None
            batch.out += out
            batch.timer_events += timer_events
            batch.stats.committed += 1
            batch.stats.events += len(d.events)
        batch.stats.codes[d.code] += 1
        if cmd.not_before is not None and d.code in _FIRED:
            batch.fired_due.append(cmd.not_before)
        version = d.stored.version if d.stored else (stored.version if stored else None)
        return d, version

    def _timer_events(
        self, events: list[EventEnvelope], now: int
    ) -> list[tuple[EventEnvelope, object]]:
        """A new decision's system events, each with what it does to the timers (None when
        not checked: no `timer_op`); `BadRecord` for a `wow.` event the node's subscription
        would refuse (dead-lettered, no timer changed, its sender told COMMITTED). Decided
        events alone: the log's are the subscription's to take or refuse, as ever."""
        found: list[tuple[EventEnvelope, object]] = []
        for e in events:
            if (why := unknown_system_event(e.type, self.agg.appliers)) is not None:
                raise BadRecord(f"{e.type} {e.id}: {why}")
            if e.type in SYSTEM_EVENTS:
                found.append((e, None if self._timer_op is None else self._timer_op(e, now)))
        return found
