"""What a partition's cycles do to its timer table (`TimerTableCycles`, the base of
`app.node.cycles.PartitionCycles`): a log batch applied to it (the subscription: each
record's events, its bad records dead-lettered in the cycle), the timer operations of the
cycle's own decisions carried out at once, operators' retry/skip requests carried out (and
answered), and the timers just set offered to their partitions' wheels. A record whose operation the
store refuses is that record's; only a fault of the node ends the cycle."""

from __future__ import annotations

import logging

from app.commands.processor import CommandBatch, misrouted
from app.errors import BadRecord, KafkaUnavailable, node_fault
from app.kafka import OutRecord, Record
from app.model.decide import command_of_event
from app.model.user_code import UserCodeTimeout
from app.node.cycle_work import CycleWork, past_deadline
from app.node.kept import KeptType
from app.node.metrics import NodeMetrics
from app.node.own_records import NOT_OWN
from app.protocol.dead_letters import Stage
from app.protocol.limits import InputLimits
from app.protocol.wire import EventEnvelope, OpOutcome, decode, decode_event, unknown_system_event
from app.protocol.wire import TimerOp as OperatorRequest
from app.timers.op_answers import answer_record
from app.timers.operator import carry_out
from app.timers.subscription import CancelTimer, PutTimer, TimerOp, apply_all, op_key, timer_op
from tables import Timer
from tables.writes import alike

__all__ = ["TimerTableCycles"]

logger = logging.getLogger(__name__)


class TimerTableCycles:
    """The timer-table side of `PartitionCycles` (which sets what it reads)."""

    _partitions: int
    """The partitions of the node's topics (a record's key decides its partition)."""
    _metrics: NodeMetrics
    limits: InputLimits
    """The bounds of an input record."""

    async def _carry_out(self, w: CycleWork, batch: CommandBatch, p: int) -> bool:
        """Carries out on the timer table, at once, what the batch's decisions did to the
        timers (a cancel, a reschedule): a timer must not fire after its cancel was
        decided, and the subscription reads the events back only once they commit. Read
        back, they find it done (every timer operation is idempotent). Whether it wrote."""
        ops: list[TimerOp] = []
        ids: list[str] = []
        for event, checked in batch.take_timer_events():
            try:
                # As its decision was checked (`decided_timer_op`), or else now: the
                # batch's events go to p's log.
                op = (
                    checked
                    if isinstance(checked, TimerOp)
                    else timer_op(
                        event,
                        p,
                        self.limits.max_record_bytes,
                        w.now,
                        topic_bytes=self.limits.topic_record_bytes,
                    )
                )
            except BadRecord:
                continue  # dead-lettered when the subscription reads it back
            if op is not None:
                ops.append(op)
                ids.append(event.id)
        if not ops:
            return False
        # One the store refuses is dead-lettered when the subscription reads it back; the
        # ops after it are carried out now all the same (a cancel among them included).
        refused: set[int] = set()

        def refused_now(i: int, exc: Exception) -> None:
            refused.add(i)
            _refused_now(i, exc)

        writes, put = await apply_all(w.timers, ops, refused_now)
        w.carried.update(event_id for i, event_id in enumerate(ids) if i not in refused)
        self._offer(w, put)
        return writes > 0

    def _offer(self, w: CycleWork, put: list[Timer]) -> None:
        """Timers the table was just given (set or rescheduled): counted with the cycle (at
        its commit), and offered to their partitions' wheels, whose loops are woken to look
        at them without reloading."""
        if put:
            kept = w.kept
            w.counts.add(self._metrics.puts.labels(kept.name), len(put))
            kept.runner.offer(put)
            for p in sorted({t.partition for t in put}):
                kept.loop.wake_partition(p, reload=False)

    async def _subscribe(
        self, kept: KeptType, records: list[Record], w: CycleWork
    ) -> tuple[bool, int]:
        """Applies a log batch to the timer table, its bad records' dead letters added to
        the cycle's records; whether it wrote anything, and how many of `records` it took
        (all, or those before the cycle's budget was spent: the appliers of another
        writer's events it follows are a service's code, as slow as its handlers; one
        record at least)."""
        ops: list[tuple[Record, TimerOp]] = []  # not carried out yet
        wrote, put = False, list[Timer]()
        p = records[0].partition
        batch = w.batch_of(p)  # None: p's aggregates are not decided here
        appliers = kept.agg.appliers if kept.agg is not None else {}
        taken = len(records)
        for i, record in enumerate(records):
            if i and w.deadline is not None and past_deadline(w.deadline):
                taken = i  # the rest is the next cycle's
                break
            if (own := w.own.take(record.topic, record.offset)) is not NOT_OWN:
                # Its own event, committed: one that does nothing to the timers, or whose
                # operation was carried out when its command was decided, is done (as the
                # reads below would find); one refused then goes on, to be dead-lettered.
                if own is None:
                    continue
                if own in w.carried:
                    w.carried.discard(own)
                    continue
            stage = Stage.READ
            try:
                self.limits.check(record.key, record.value)
                event, lax = decode_event(record.value, self.limits.max_record_bytes)
                if event.aggregate.type_name != kept.name:
                    raise BadRecord(f"event of {event.aggregate.type_name} on {record.topic}")
                if (why := misrouted(record, event.aggregate, self._partitions)) is not None:
                    w.counts.add(self._metrics.misplaced.labels(kept.name, str(p), "log"))
                    raise BadRecord(why)
                if (why := unknown_system_event(event.type, appliers)) is not None:
                    raise BadRecord(why)
                stage = Stage.FOLLOW
                if batch is not None and w.decider.follow(batch, event, record.offset):
                    w.counts.add(self._metrics.followed.labels(kept.name))
                if lax is not None:
                    # Folded as a restore folds it, but no timer from what a strict read
                    # refuses: dead-lettered with why.
                    stage = Stage.READ
                    raise BadRecord(lax)
                stage = Stage.APPLY
                op = timer_op(
                    event,
                    record.partition,
                    self.limits.max_record_bytes,
                    w.now,
                    topic_bytes=self.limits.topic_record_bytes,
                )
                if op is not None and event.id in w.carried:
                    # Its own event, carried out when its command was decided: done.
                    w.carried.discard(event.id)
                    continue
                if isinstance(op, CancelTimer) and op.refused is not None:
                    if await _stored_from(w, event, op):
                        # Taken when its command was decided (or read before a restart),
                        # under limits lowered since: done. Undone now, its sender, told
                        # COMMITTED, would never see it fire.
                        continue
                    # Its timer not stored, the one it replaces cancelled: it is a letter.
                    w.dead_letter(record, BadRecord(op.refused), stage)
                if op is not None and await _superseded(w, event, op):
                    continue
            except UserCodeTimeout:
                # The machine's load or the timeout, not the event's: passed over, the live
                # state would differ from what a restore of the same log folds (a restore
                # fails on it too). The cycle fails; the partition is taken again.
                raise
            except Exception as exc:
                if node_fault(exc):
                    raise
                w.dead_letter(record, exc, stage)
                continue
            if op is not None:
                ops.append((record, op))
                if not isinstance(op, PutTimer):
                    # Carried out now, with the puts before it (as `apply_all` would), not
                    # after the batch's last record: the budget checked above then counts
                    # its store call (an owner's deletion reads its live rows), and the
                    # records it leaves hold no operation carried out. Their offsets are
                    # not committed: exactly the records whose operations were.
                    writes, done = await self._apply(kept, ops, w)
                    wrote, put = wrote or writes > 0, put + done
                    ops.clear()
        if ops:
            writes, done = await self._apply(kept, ops, w)
            wrote, put = wrote or writes > 0, put + done
        self._offer(w, put)
        return wrote, taken

    async def _apply(
        self, kept: KeptType, ops: list[tuple[Record, TimerOp]], w: CycleWork
    ) -> tuple[int, list[Timer]]:
        """Carries the batch's timer operations out; one the store refuses (not a fault of
        the store's own) is its record's: that record is dead-lettered, the others carried
        out all the same."""

        def refused(i: int, exc: Exception) -> None:
            w.dead_letter(ops[i][0], exc, Stage.APPLY)

        return await apply_all(w.timers, [op for _, op in ops], refused)

    async def _operate(self, kept: KeptType, records: list[Record], w: CycleWork) -> None:
        """Carries out operators' retry/skip requests on this partition's parked timers;
        one sent again under its request id within the window is its DUPLICATE, passed
        over (`AppliedOps`): carried out again, a retry would fire the timers parked again
        since, a skip skip those parked since. Each request is answered on the results
        topic, in the cycle's transaction (`app.timers.op_answers`): DONE with what it
        changed, DUPLICATE, or FAILED (dead-lettered)."""
        for record in records:
            stage = Stage.READ
            applied = kept.applied_ops.get(record.partition)
            try:
                self.limits.check(record.key, record.value)
                # It names parked timers' target as stored: not refused for its characters.
                op = decode(
                    OperatorRequest, record.value, self.limits.max_record_bytes, new_names=False
                )
                first = None if applied is None else applied.duplicate_of(op, record.offset, w.now)
                if first is not None:
                    logger.info(
                        "operator %s of %s (request %s) in partition %d: DUPLICATE of the "
                        "request carried out (or dead-lettered) at offset %d: nothing done; "
                        "send it under a new request id to carry it out again",
                        op.action,
                        op.target,
                        op.request_id,
                        record.partition,
                        first,
                    )
                    said = f"the copy at offset {first} was carried out (or failed): nothing done"
                    w.out.append(self._answer(kept, op, record, w, OpOutcome.DUPLICATE, said))
                    continue
                if applied is not None and (old := applied.past_window(op, record, w.now)):
                    # Its id used, dated as a take's reading of the topic dates it (one
                    # dated ahead kept a window from now: a copy is its DUPLICATE either
                    # way; one too old forgotten at once), and answered: one dated ahead
                    # has a sender waiting.
                    applied.note(op, record.offset, w.now, max(op.requested_at, record.timestamp))
                    w.dead_letter(record, BadRecord(old), stage)
                    w.out.append(self._answer(kept, op, record, w, OpOutcome.FAILED, old))
                    continue
                stage = Stage.OPERATE
                # The entry resolved by the partition's next round: a cycle holds its
                # partition's lock, and the ledger's calls may take seconds.
                done = await carry_out(kept.runner, op, record.partition, resolve_later=True)
                if applied is not None:
                    applied.note(op, record.offset, w.now)
            except TimeoutError as exc:
                # Not carried out, and not the request's fault (a call that timed out):
                # read it again, never dead-lettered.
                raise KafkaUnavailable(f"operator request at {record.offset}: {exc!r}") from exc
            except Exception as exc:
                if node_fault(exc):
                    raise
                w.dead_letter(record, exc, stage)
                if stage is Stage.OPERATE:
                    if applied is not None:
                        # Its id used (perhaps half carried out), as a take's reading of the
                        # topic counts it (`read_applied_ops`): a copy is its DUPLICATE here too.
                        applied.note(op, record.offset, w.now)
                    why = str(exc) or type(exc).__name__
                    w.out.append(self._answer(kept, op, record, w, OpOutcome.FAILED, why))
                continue
            w.out.append(
                self._answer(
                    kept, op, record, w, OpOutcome.DONE, changed=done.changed, refused=done.refused
                )
            )
            w.counts.add(
                self._metrics.operator_requests.labels(
                    kept.name, op.action.value, str(record.partition)
                )
            )

    def _answer(
        self,
        kept: KeptType,
        op: OperatorRequest,
        record: Record,
        w: CycleWork,
        outcome: OpOutcome,
        message: str = "",
        *,
        changed: int = 0,
        refused: int = 0,
    ) -> OutRecord:
        """The answer to the request `record` holds, staged with its offset."""
        return answer_record(
            kept.name,
            op,
            record.partition,
            record.offset,
            outcome,
            partitions=self._partitions,
            now=w.now,
            changed=changed,
            refused=refused,
            message=message,
        )


async def _superseded(w: CycleWork, event: EventEnvelope, op: TimerOp) -> bool:
    """Whether the row `op` is about holds what a later event of `event`'s own command did
    to it: a node's own events read back by a take that did not carry them out (a retake
    between their commit and their read-back). Applied again, the command's cancel (or
    pause) of a key would hit the timer it set after it, which then never fired. Only ids
    a node made tell a command's events apart (`command_of_event`); the row is looked up
    only for those."""
    made = command_of_event(event.id)
    key = op_key(op)
    if made is None or key is None:
        return False
    held = await w.timers.find(*key)
    if held is None or held.version != event.version:
        return False
    setter = command_of_event(held.id)
    return setter is not None and setter[0] == made[0] and setter[1] > made[1]


async def _stored_from(w: CycleWork, event: EventEnvelope, op: CancelTimer) -> bool:
    """Whether the row of the set `event` (refused now, `op`) holds the timer that very
    event set: stored at its version, with its id, or set alike by another set of the
    same command (one setting the key twice alike keeps the first set's timer:
    `tables.writes.rewritten`), fired or parked since or not; one that set it otherwise
    first is replaced by this set, so its row is not this set's doing. `w.carried` names
    such an event only in the run that decided it: after a restart or a take-over, the
    row says so."""
    held = await w.timers.find(op.owner, op.key)
    if held is None or held.version != event.version:
        return False
    if held.id == event.id:
        return True
    made, setter = command_of_event(event.id), command_of_event(held.id)
    return (
        made is not None
        and setter is not None
        and made[0] == setter[0]
        and op.refused_timer is not None
        and alike(held, op.refused_timer)
    )


def _refused_now(i: int, exc: Exception) -> None:
    """A timer op the store refused as a cycle carried it out (dead-lettered later, when its
    event is read back): said at debug level, so a store bug does not vanish unseen."""
    logger.debug("timer op %d refused by the store, left for its read-back: %s", i, exc)
