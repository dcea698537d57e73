"""The command path of one partition of one aggregate type.

For each batch of commands read from `<type>.commands[p]`, in order: de-duplicate by request
id, refuse what is not due yet, refuse when the partition's backlog is full (BUSY), run the
handler, and then append the events to `<type>.events[p]`, publish the results and commit
the commands' offsets in ONE Kafka transaction. The aggregate states are written locally
only after the transaction committed; they are a fold of the log, restored from it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from app.errors import BadRecord, MissingTopic, node_fault
from app.kafka import LogReader, OutRecord, Record
from app.kafka.catalog import TopicCatalog, no_target_message
from app.kafka.records import RestoreProgress
from app.model.aggregate import AggregateType
from app.model.decide import Decided, StoredAggregate, decide, fold
from app.protocol.dead_letters import Stage, dead_letter
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    SYSTEM_EVENTS,
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    ResultCode,
    decode,
    encode,
)
from tables import AggregateRef, StoreError
from tables.aggregate_store import AggregateStateStore
from tables.partitioner import partition_of

__all__ = [
    "BatchStats",
    "CommandBatch",
    "CommandProcessor",
    "Commit",
    "LocalDecided",
    "dead_letter_record",
]

Commit = Callable[[Sequence[OutRecord], dict[tuple[str, int], int]], Awaitable[list[int]]]
"""Sends records and commits consumer offsets in the partition's one transaction; the
records' offsets (`PartitionTransaction.commit`, bound to the partition)."""

LocalDecided = Callable[[list[tuple[CommandEnvelope, ResultCode, str]]], Awaitable[None]]
"""Told, before the commit, what each command fired in-process came to, so that the
timers' settles join the same transaction (`TimerRunner.record_outcomes`)."""

logger = logging.getLogger(__name__)

_FIRED = frozenset({ResultCode.COMMITTED, ResultCode.UNCHANGED, ResultCode.REJECTED})
"""A command decided for good by its aggregate's handler (a duplicate was counted when first
decided; BUSY, not due yet and ERROR are sent again)."""


@dataclass(slots=True)
class BatchStats:
    commands: int = 0
    committed: int = 0
    events: int = 0
    dead_letters: int = 0
    codes: Counter[str] = field(default_factory=Counter)


def dead_letter_record(
    record: Record,
    error: BaseException | str,
    stage: Stage,
    now: int,
    limits: InputLimits,
) -> OutRecord:
    """The dead letter of `record` on its context's dead-letter topic: its bytes whole, why
    in its headers (`app.protocol.dead_letters`)."""
    logger.error(
        "dead-lettering %s[%d]@%d (%s): %s",
        record.topic,
        record.partition,
        record.offset,
        stage.value,
        str(error)[:500],
    )
    return dead_letter(record, error, stage, now, limit=limits.dead_letter_bytes)


def misrouted(record: Record, aggregate: AggregateRef, partitions: int) -> str | None:
    """Why `record` of `aggregate` is not where Kafka's default partitioner puts it, or
    None. An aggregate's records are keyed by its id, in murmur2(id)'s partition: one
    written elsewhere would split its log (or its commands) across two owners."""
    if record.key is None:
        return f"no key: records of {aggregate.id!r} are keyed by the aggregate id"
    if record.key != aggregate.id.encode():
        return f"key {record.key!r} is not the aggregate id {aggregate.id!r}"
    expected = partition_of(aggregate.id, partitions)
    if record.partition != expected:
        return (
            f"{aggregate.id!r} belongs in partition {expected} (murmur2, Kafka's default "
            f"partitioner), not {record.partition}"
        )
    return None


_REQUEST_SWEEP = 250
"""Request ids forgotten per commit at most, once past the window."""


def _applied_id(event: EventEnvelope) -> str:
    """What marks an event as folded: its command's request id, or its own id."""
    return event.request_id or f"event:{event.id}"


def state_key(ref: AggregateRef) -> str:
    """Where the state store keeps an aggregate: its tenant and id, which two tenants'
    aggregates may share (the tenant is length-prefixed, so no pair is ambiguous)."""
    return f"{len(ref.tenant)}:{ref.tenant}/{ref.id}"


def _command_record(cmd: CommandEnvelope) -> OutRecord:
    # The target's own partition count decides: the key picks it, as any producer's would.
    topic = AggregateTopics(cmd.aggregate.context, cmd.aggregate.aggregate).commands
    return (topic, None, cmd.aggregate.id.encode(), encode(cmd))


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
    out: list[OutRecord] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    stats: BatchStats = field(default_factory=lambda: BatchStats())
    # The last offset of the partition's log read in this batch (other writers' events
    # followed or passed over): the state store's offset moves past them with it, so a
    # restore does not fold them a second time.
    log_offset: int | None = None
    # The due times (`not_before`, epoch ms) of the scheduled commands, every timer's, this
    # batch decided for good: their lateness is measured once the batch commits.
    fired_due: list[int] = field(default_factory=list)
    # The timer events (`wow.*`) decided and not yet carried out on the timer table: the
    # partition's cycle does so at once, before anything of it fires (`take_timer_events`).
    timer_events: list[EventEnvelope] = field(default_factory=list)

    def take_timer_events(self) -> list[EventEnvelope]:
        events, self.timer_events = self.timer_events, []
        return events

    @property
    def empty(self) -> bool:
        """Nothing decided, followed or read: no need to commit it."""
        return not (self.out or self.staged or self.applied or self.offsets)


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
    ) -> None:
        self.agg = agg
        # The cluster's topics: a decision sending to a command topic not there is refused
        # (its send would fail the partition's transaction, again at each retake).
        self.targets = targets
        # How long an applied request id is kept to de-duplicate a command sent again.
        self.request_id_window = request_id_window
        self.partition = partition
        self.partitions = partitions
        self.topics = AggregateTopics(agg.context, agg.name)
        self.results_topic = ContextTopics(agg.context).results
        self._states = states
        self._commit = commit
        self._now = now
        self.busy_backlog = busy_backlog
        self.limits = limits or InputLimits()
        # Batches decided and staged in the partition's transaction, not committed yet
        # (oldest first): later decisions see their aggregates and request ids.
        # Of the batches staged and not committed yet, the latest aggregate and every applied
        # request id, each with the batch that wrote it (removed when that one commits).
        self._pending_states: dict[str, tuple[StoredAggregate, CommandBatch]] = {}
        self._pending_applied: dict[tuple[str, str], CommandBatch] = {}

    async def restore(self, reader: LogReader, progress: RestoreProgress | None = None) -> int:
        """Folds the events after the state store's offset into it; how many were read.
        `progress` hears the log offsets read and to read as it goes.

        The local states are a cache of the log: a copy that is not a prefix of the log the
        broker holds (ahead of its end: a recreated topic, another cluster) is dropped and
        folded again from the start.
        """
        held = self._states.offset(self.partition)
        _, end = await reader.offsets(self.topics.events, self.partition)
        if held is not None and held >= end:
            logger.warning(
                "%s[%d]: local states at offset %d, but the log ends at %d: "
                "not this log's copy, folding it again",
                self.topics.events,
                self.partition,
                held,
                end,
            )
            self._states.drop(self.partition)
            held = None
        start = 0 if held is None else held + 1
        began = time.monotonic()
        count = 0
        to_read = max(end - start, 0)
        if progress is not None:
            progress(0, to_read)
        async for batch in reader.read(self.topics.events, self.partition, start):
            if batch:
                self._fold_records(batch)
                count += len(batch)
                if progress is not None:
                    progress(min(batch[-1].offset + 1 - start, to_read), to_read)
        if progress is not None:
            progress(to_read, to_read)
        logger.info(
            "restored %s[%d] states: %d events in %.3f s",
            self.topics.events,
            self.partition,
            count,
            time.monotonic() - began,
        )
        return count

    def _fold_records(self, batch: list[Record]) -> None:
        by_id: dict[str, list[EventEnvelope]] = {}
        for r in batch:
            try:
                self.limits.check(r.key, r.value)
                event = decode(EventEnvelope, r.value, self.limits.max_record_bytes)
            except BadRecord:
                continue  # the timers subscription dead-letters it; nothing to fold
            if event.aggregate.type_name != self.agg.type_name:
                continue
            if misrouted(r, event.aggregate, self.partitions) is None:
                by_id.setdefault(state_key(event.aggregate), []).append(event)
        states: dict[str, bytes] = {}
        requests: list[tuple[str, str]] = []
        newest = 0
        for aggregate_id, events in by_id.items():
            stored = self._stored(aggregate_id)
            state, folded = self._fold_each(stored, events)
            if state is not None:
                states[aggregate_id] = state
            requests += [(aggregate_id, _applied_id(e)) for e in folded]
            newest = max([newest, *(e.created_at for e in folded)])
        # Kept from the newest event's time: at least the window after each was applied.
        self._states.write(self.partition, states, requests, batch[-1].offset, newest)

    def _fold_each(
        self, stored: StoredAggregate | None, events: list[EventEnvelope]
    ) -> tuple[bytes | None, list[EventEnvelope]]:
        """The aggregate's bytes after those of `events` its appliers take and whose result
        can be written, and those events: one an applier raises on, or that makes an
        aggregate no encoder writes, is passed over (the subscription dead-letters it when
        it follows it; a restore reads it again each time). No bytes: nothing to write."""
        try:
            return encode(fold(self.agg, stored, events)), events
        except Exception as exc:
            if node_fault(exc):
                raise
        current, folded = stored, []
        state = None if current is None else encode(current)
        for e in events:
            try:
                after = fold(self.agg, current, [e])
                state, current = encode(after), after
            except Exception as exc:
                if node_fault(exc):
                    raise
                logger.warning("restore passes over event %s (%s): %r", e.id, e.type, exc)
                continue
            folded.append(e)
        return state, folded

    def _stored(self, aggregate_id: str) -> StoredAggregate | None:
        pending = self._pending_states.get(aggregate_id)
        if pending is not None:
            return pending[0]
        raw = self._states.get(self.partition, aggregate_id)
        if raw is None:
            return None
        try:
            return StoredAggregate.model_validate_json(raw)
        except ValidationError as exc:
            # The local copy is damaged, not the log: it is dropped, and the retake this
            # node fault causes folds the partition again from the log.
            logger.error(
                "%s[%d]: local state of %s unreadable (%s): dropping the partition's states",
                self.topics.events,
                self.partition,
                aggregate_id,
                exc.errors()[0]["msg"],
            )
            self._states.drop(self.partition)
            raise StoreError(f"local state of {aggregate_id} unreadable; states dropped") from exc

    def begin(self) -> CommandBatch:
        """A new batch of decisions, for one transaction of the partition."""
        return CommandBatch(now=self._now())

    def decide_records(self, batch: CommandBatch, records: list[Record], backlog: int = 0) -> None:
        """Decides `records` (commands of this partition, in order) into `batch`.

        `backlog`: how many commands of the partition wait behind these. A command reached
        while more than `busy_backlog` commands wait (itself, the rest of the records and
        those behind them) is answered BUSY without running its handler: the partition
        sheds its oldest work until it is back within bounds, and the senders retry.
        """
        if not records:
            return
        batch.stats.commands += len(records)
        now = batch.now
        for i, r in enumerate(records):
            waiting = len(records) - i + backlog
            try:
                cmd = self._read(r)
            except BadRecord as exc:
                self._dead_letter(batch, r, exc, Stage.READ)
                continue
            if cmd.in_process:
                continue  # fired in-process: decided in the transaction that wrote it
            if (wrong := self._bad_reply(cmd)) is not None:
                # Never written where it asks: answered where its context's answers go.
                batch.out.append(self._result(cmd, ResultCode.ERROR, wrong, None, now, own=True))
                batch.stats.codes[ResultCode.ERROR] += 1
                self._dead_letter(batch, r, BadRecord(wrong), Stage.READ)
                continue
            if waiting > self.busy_backlog:
                message = f"{waiting} commands waiting (bound {self.busy_backlog})"
                batch.out.append(self._result(cmd, ResultCode.BUSY, message, None, now))
                batch.stats.codes[ResultCode.BUSY] += 1
                continue
            try:
                d, version = self._decide(batch, cmd)
            except Exception as exc:
                if node_fault(exc):
                    raise
                # The aggregate this command is decided on cannot be read or folded: the
                # command's fault, answered and kept, and the partition goes on.
                message = f"{type(exc).__name__}: {exc}"[:1000]
                batch.out.append(self._result(cmd, ResultCode.ERROR, message, None, now))
                batch.stats.codes[ResultCode.ERROR] += 1
                self._dead_letter(batch, r, exc, Stage.DECIDE)
                continue
            batch.out.append(self._result(cmd, d.code, d.message, version, now))
            if d.error is not None:
                # Answered ERROR, and kept for an operator: its handler refused to run it.
                self._dead_letter(batch, r, d.error, Stage.DECIDE)
            elif cmd.type not in self.agg.handlers:
                # Answered ERROR, and kept for an operator: no handler will ever take it.
                self._dead_letter(batch, r, BadRecord(d.message), Stage.DECIDE)
        batch.offsets[(self.topics.commands, self.partition)] = records[-1].offset + 1

    def _read(self, r: Record) -> CommandEnvelope:
        """A command record of this partition's, read and checked; `BadRecord` otherwise."""
        self.limits.check(r.key, r.value)
        cmd = decode(CommandEnvelope, r.value, self.limits.max_record_bytes)
        if cmd.aggregate.type_name != self.agg.type_name:
            raise BadRecord(f"command for {cmd.aggregate.type_name} on {r.topic}")
        if (why := misrouted(r, cmd.aggregate, self.partitions)) is not None:
            raise BadRecord(why)
        return cmd

    def _bad_reply(self, cmd: CommandEnvelope) -> str | None:
        """Why the command's reply address is not one this node answers on, or None: only
        its context's results topic, in a partition that topic has."""
        if cmd.reply_to is not None and cmd.reply_to != self.results_topic:
            return (
                f"reply_to {cmd.reply_to[:300]!r} is not {self.results_topic}: commands are "
                "answered on their context's results topic only"
            )
        if cmd.reply_partition is not None and cmd.reply_partition >= self.partitions:
            return (
                f"reply_partition {cmd.reply_partition} does not exist: "
                f"{self.results_topic} has {self.partitions} partitions"
            )
        return None

    def _dead_letter(
        self, batch: CommandBatch, record: Record, error: BaseException, stage: Stage
    ) -> None:
        batch.out.append(dead_letter_record(record, error, stage, batch.now, self.limits))
        batch.stats.dead_letters += 1

    def decide_local(
        self, batch: CommandBatch, commands: Sequence[CommandEnvelope]
    ) -> list[tuple[CommandEnvelope, ResultCode, str]]:
        """Decides commands of timers of this partition fired in-process into `batch`; what
        each came to.

        The same code as for a command read from the topic (dedup, not-before, handler),
        but no result record: the caller settles the timers before the commit, so that
        each settle is in the same transaction as its events. The command itself is
        written to the command topic in that transaction too, as the record of what was
        sent; read back, its request id is found applied and it is passed over.
        """
        batch.stats.commands += len(commands)
        decided: list[tuple[CommandEnvelope, ResultCode, str]] = []
        for cmd in commands:
            try:
                d, _ = self._decide(batch, cmd)
                code, message = d.code, d.message
            except Exception as exc:
                if node_fault(exc):
                    raise
                # As a target answers a command it cannot decide: the timer retries it.
                code, message = ResultCode.ERROR, f"{type(exc).__name__}: {exc}"[:1000]
                batch.stats.codes[code] += 1
            batch.out.append(
                (self.topics.commands, self.partition, cmd.aggregate.id.encode(), encode(cmd))
            )
            decided.append((cmd, code, message))
        return decided

    def staged(self, batch: CommandBatch) -> None:
        """The batch waits for the partition's next commit: what it decided counts for the
        batches decided after it."""
        for aid, stored in batch.staged.items():
            self._pending_states[aid] = (stored, batch)
        for applied in batch.applied:
            self._pending_applied[applied] = batch

    def committed(self, batch: CommandBatch, written: Sequence[int]) -> None:
        """Writes the batch's aggregate states once its transaction committed; `written`:
        the offsets its records were written at."""
        for aid in batch.staged:
            if (pending := self._pending_states.get(aid)) is not None and pending[1] is batch:
                del self._pending_states[aid]
        for applied in batch.applied:
            if self._pending_applied.get(applied) is batch:
                del self._pending_applied[applied]
        last_event = max(
            (o for rec, o in zip(batch.out, written, strict=True) if rec[0] == self.topics.events),
            default=None,
        )
        # Never back: the log read may trail this node's own events committed before.
        marks = (last_event, batch.log_offset, self._states.offset(self.partition))
        known = [o for o in marks if o is not None]
        self._states.write(
            self.partition,
            {a: batch.encoded.get(a) or encode(s) for a, s in batch.staged.items()},
            batch.applied,
            max(known) if known else None,
            batch.now,
        )
        # Bounded, so that a commit never waits long for it; the next commits go on.
        self._states.expire_requests(
            self.partition, batch.now - self.request_id_window, _REQUEST_SWEEP
        )

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
        self.committed(batch, await self._commit(batch.out, batch.offsets))
        return batch.stats

    def follow(self, batch: CommandBatch, event: EventEnvelope, offset: int) -> bool:
        """Folds an event of the log that this partition did not decide (another writer's
        append) into its aggregate when it is ahead of it, so that the versions this node
        appends never go back; whether it did. Its own events, read back, and another
        writer's events at or behind the aggregate's version, change nothing here (their
        timers are ordered by their own versions in the timer table)."""
        if event.aggregate.type_name != self.agg.type_name:
            return False
        batch.log_offset = max(offset, batch.log_offset or 0)
        aid = state_key(event.aggregate)
        applied = (aid, _applied_id(event))
        if self._applied(batch, applied):
            return False
        stored = batch.staged.get(aid) or self._stored(aid)
        if event.version <= (stored.version if stored is not None else 0):
            return False
        folded = fold(self.agg, stored, [event])
        batch.encoded[aid] = encode(folded)  # before the batch changes: it may raise
        batch.staged[aid] = folded
        batch.applied.add(applied)
        return True

    def _seen(self, batch: CommandBatch, cmd: CommandEnvelope) -> bool:
        return self._applied(batch, (state_key(cmd.aggregate), cmd.request_id))

    def _applied(self, batch: CommandBatch, applied: tuple[str, str]) -> bool:
        return (
            applied in batch.applied
            or applied in self._pending_applied
            or self._states.seen(self.partition, *applied)
        )

    def _decide(self, batch: CommandBatch, cmd: CommandEnvelope) -> tuple[Decided, int | None]:
        """Decides one command on the aggregate as the batch left it; its events and
        commands join the batch's records. The decision and the aggregate's version."""
        aid = state_key(cmd.aggregate)
        stored = batch.staged.get(aid) or self._stored(aid)
        d = self._targeted(
            decide(
                self.agg,
                stored,
                cmd,
                now=batch.now,
                seen=self._seen(batch, cmd),
                unreachable=self._unreachable if self.targets is not None else None,
            )
        )
        if d.stored is not None:
            # Everything encoded before the batch changes: a decision whose events, commands
            # or aggregate cannot be written raises here and leaves the batch as it was.
            key = cmd.aggregate.id.encode()
            out: list[OutRecord] = [
                (self.topics.events, self.partition, key, encode(e)) for e in d.events
            ]
            out += [_command_record(c) for c in d.commands]
            state = encode(d.stored)
            batch.staged[aid] = d.stored
            batch.encoded[aid] = state
            batch.applied.add((aid, cmd.request_id))
            batch.out += out
            batch.timer_events += [e for e in d.events if e.type in SYSTEM_EVENTS]
            batch.stats.committed += 1
            batch.stats.events += len(d.events)
        batch.stats.codes[d.code] += 1
        if cmd.not_before is not None and d.code in _FIRED:
            batch.fired_due.append(cmd.not_before)
        version = d.stored.version if d.stored else (stored.version if stored else None)
        return d, version

    def _unreachable(self, target: AggregateRef) -> str | None:
        """Why a command to `target` cannot be sent (`Decision.send` raises it), or None."""
        topic = AggregateTopics(target.context, target.aggregate).commands
        if self.targets is not None and self.targets.missing(topic):
            return no_target_message(topic)
        return None

    def _targeted(self, d: Decided) -> Decided:
        """`d`, or ERROR (dead-lettered, not applied: a retry decides it again) when a
        command it sends goes to a topic the cluster does not have: the backstop of
        `Decision.send`'s check, for commands a handler put in `Decision.commands` itself."""
        if self.targets is None or not d.commands:
            return d
        for topic in dict.fromkeys(_command_record(c)[0] for c in d.commands):
            if self.targets.missing(topic):
                message = no_target_message(topic)
                logger.warning("%s[%d]: %s", self.topics.commands, self.partition, message)
                return Decided(ResultCode.ERROR, message, [], None, error=MissingTopic(message))
        return d

    def _result(
        self,
        cmd: CommandEnvelope,
        code: ResultCode,
        message: str,
        version: int | None,
        now: int,
        *,
        own: bool = False,
    ) -> OutRecord:
        """The command's result record: on its reply address (checked by `_bad_reply`), or
        with `own` on the context's results topic, in the request id's partition."""
        result = CommandResult(
            request_id=cmd.request_id,
            code=code,
            aggregate=cmd.aggregate,
            message=message,
            version=version,
            decided_at=now,
        )
        topic = self.results_topic
        partition = (
            cmd.reply_partition
            if cmd.reply_partition is not None and not own
            else partition_of(cmd.request_id, self.partitions)
        )
        return (topic, partition, cmd.request_id.encode(), encode(result))
