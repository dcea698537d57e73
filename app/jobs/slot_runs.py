"""The runs of a job instance's slots that the `<context>.schedule` decisions share
(`SlotRuns`, a base of `app.jobs.schedule`'s model, under `app.jobs.extra_runs`): a slot
run as its live tick runs it, by its tick or, before a new rule replaces the tick timer, by
the change itself (the slots the old timer owes: due, and not run), and the `JobRun` a
handler is given."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final

from app.jobs.declaration import RUN, RUN_FAILED, TICKED, Job, JobRun, JobScope, not_its_instance
from app.jobs.runs import (
    MAX_DROPS_PER_FAILURE,
    MAX_OWED_SLOTS,
    drop_oldest_runs,
    handler_failure,
    owed_slots,
    run_key,
)
from app.jobs.schedule_state import ScheduleState, apply_schedule_event
from app.model.aggregate import (
    MAX_DECISION_RECORDS,
    Command,
    Decision,
    DecisionTooLarge,
    Event,
)
from app.model.decide import cut_message
from app.model.user_code import UserCodeTimeout
from app.protocol.wire import CommandEnvelope
from tables import CommandSpec, OnceRule

__all__ = ["SentCheck", "SlotRuns"]

logger = logging.getLogger(__name__)

_ROOM: Final = 2 + 3 + MAX_DROPS_PER_FAILURE
"""The records an owed slot leaves room for in its decision, beside its handler's commands:
the new rule's event and timer, and the next slot's own (`Ticked`, and when it fails
`RunFailed`, its run timer and the run timers it drops), which `Decision.emit` would
refuse past `MAX_DECISION_RECORDS`, failing the whole command."""

SentCheck = Callable[[Sequence[CommandEnvelope]], Exception | None]
"""Why a handler's commands cannot be written (one is a record the node's processor would
refuse: over `TICKWHEEL_MAX_RECORD_BYTES`, or over what its topic takes with its key),
or None: the node gives it
(`app.commands.sent_sizes`), as the command path is not this package's to import."""


class SlotRuns:
    """What the schedule model sets (`app.jobs.schedule`)."""

    context: str
    partitions: int
    max_failed_runs: int
    sent_check: SentCheck | None

    def _run_slot(
        self,
        state: ScheduleState,
        job: Job,
        cmd: Command,
        d: Decision,
        timer_id: str,
        slot: int,
        due_at: int,
        tick_id: str,
        room: int | None = None,
    ) -> bool:
        """Runs `slot` of the tick timer `timer_id` as its live tick does, under its tick's
        request id `tick_id` (its commands' ids are derived from it): `Ticked`, and the
        handler's commands, or, when it fails, `RunFailed` and a timer that runs it again.
        Whether the handler was interrupted by the node's handler timeout. `room`: the
        records the decision keeps free after the slot's, its handler's commands counted:
        commands that would leave fewer fail the slot (`DecisionTooLarge`), which its run
        timer runs again in a decision of its own; None: the caller sees to it. A command
        `sent_check` finds too large to write fails the slot too: joined, the processor
        would refuse the whole tick, every retry of it, and the schedule would stop."""
        d.emit(TICKED, {"slot": slot, "due_at": due_at, "timer_id": timer_id})
        # The handler decides into a scratch decision: a failure keeps none of its commands.
        scratch = Decision(
            aggregate=d.aggregate, now=d.now, request_id=tick_id, unreachable=d.unreachable
        )
        failure = handler_failure(job, self._run(job, cmd, slot, due_at, tick_id, scratch))
        if failure is None and self.sent_check is not None:
            failure = _unwritable(job, cmd, slot, self.sent_check(scratch.commands))
        if failure is None and room is not None:
            failure = _too_many(job, cmd, d, slot, len(scratch.commands), room)
        if failure is None:
            d.commands.extend(scratch.commands)
            return False
        # The schedule ticks on; the slot is run again by a timer of its own, which the
        # runner retries, parks and puts in the ledger as it does any timer.
        key = run_key(timer_id, slot)
        slot_ref = {"slot": slot, "due_at": due_at, "timer_id": timer_id, "request_id": tick_id}
        d.emit(RUN_FAILED, {**slot_ref, "key": key, "error": cut_message(repr(failure))})
        d.schedule(key, OnceRule(at=d.now), CommandSpec(type=RUN, body=slot_ref))
        # Past `max_failed_runs` waiting, the oldest failed slots are given up.
        drop_oldest_runs(state, d, self.max_failed_runs, cmd.aggregate)
        return isinstance(failure, UserCodeTimeout)

    def _run_owed(self, state: ScheduleState, job: Job, cmd: Command, d: Decision) -> None:
        """Before a new rule replaces a live tick timer: runs the slots it owes, due and not
        run (`owed_slots`), in order, each as its tick would. Replaced, the timer would never
        send them (its row goes, and a slot handed to its cycle with it), and a tick of it
        in flight would find a newer timer: the slots were due under the old rule, whose
        timer each instant before the change belongs to (`app.jobs.backfill`). A rule that
        does not coalesce promises each: all are run, `MAX_OWED_SLOTS` at most. Interrupted
        by the node's handler timeout (the change's runs are timed as one), in a handler or
        between two, it keeps the slots settled and leaves the rest to a backfill, logged."""
        if (owed := owed_slots(state, d.now)) is None or state.timer_id is None:
            return
        if (why := not_its_instance(job, cmd.aggregate, self.partitions)) is not None:
            logger.warning("%s: slot due not run: %s", cmd.aggregate, why)
            return
        timer_id = state.timer_id
        ran = 0
        for slot in owed.slots:
            events, commands = len(d.events), len(d.commands)
            tick_id = f"{timer_id}#{slot.index}"
            try:
                interrupted = self._run_slot(
                    state, job, cmd, d, timer_id, slot.index, slot.due_at, tick_id
                )
                if len(d.events) + len(d.commands) > MAX_DECISION_RECORDS - _ROOM:
                    # Its commands would leave no room for the new rule: not run, nor the
                    # rest.
                    del d.events[events:], d.commands[commands:]
                    break
                # Each slot's events folded before the next: its failure counts in the next's.
                settled = state
                for type_, body in d.events[events:]:
                    settled = apply_schedule_event(settled, Event(type_, body, 0, d.now))
            except UserCodeTimeout:
                # The timeout landed outside the handler (in it, it is the slot's failure),
                # making or folding this slot's records. Raised on, it would answer the
                # whole change ERROR, the slots run undone, to be run again by a change as
                # long. Those settled are kept; this one is dropped whole and left, with the
                # rest, to the backfill logged below (under its tick's request id: nothing
                # of this run commits, so it runs once).
                del d.events[events:], d.commands[commands:]
                break
            state = settled
            ran += 1
            if interrupted:
                # The command's time is spent: each next handler would be interrupted too,
                # and the node ends a command that runs on long past its interruption.
                break
        if (left := len(owed.slots) - ran + owed.beyond) > 0:
            # The oldest ran: the ones left are the newest, the furthest from leaving the
            # node's de-duplication window, which a backfill of them must be within.
            last = owed.slots[ran - 1] if ran else None
            logger.error(
                "%s: %d slot(s) of %s (a rule that does not coalesce) due by %d not run "
                "before its rule changed, from slot %d on (a change runs %d at most, within "
                "the handler timeout and %d records): backfill them (jobs backfill --from %d "
                "--until %d)",
                cmd.aggregate,
                left,
                timer_id,
                d.now,
                owed.slots[ran].index if last is None else last.index + 1,
                MAX_OWED_SLOTS,
                MAX_DECISION_RECORDS,
                owed.slots[0].due_at if last is None else last.due_at + 1,
                d.now,
            )

    def _run(
        self,
        job: Job,
        cmd: Command,
        slot: int,
        due_at: int,
        request_id: str,
        d: Decision,
        *,
        retried: bool = False,
        triggered: bool = False,
        backfilled: bool = False,
    ) -> JobRun:
        return JobRun(
            context=self.context,
            job=job.name,
            instance=cmd.aggregate.id,
            tenant=cmd.aggregate.tenant,
            partition=_shard_partition(job, cmd.aggregate.id),
            slot=slot,
            due_at=due_at,
            request_id=request_id,
            now=d.now,
            _decision=d,
            retried=retried,
            triggered=triggered,
            backfilled=backfilled,
        )


def _too_many(
    job: Job, cmd: Command, d: Decision, slot: int, sent: int, room: int
) -> DecisionTooLarge | None:
    """Why the `sent` commands of slot `slot`'s handler do not fit in `d` with `room`
    records kept free, or None. Joined, they would pass `MAX_DECISION_RECORDS`: the
    command committed more than any transaction may hold, or its next record failed it."""
    others = len(d.events) + len(d.commands) + room
    if others + sent <= MAX_DECISION_RECORDS:
        return None
    too_many = DecisionTooLarge(
        f"job {job.name!r} sent {sent} commands on slot {slot}: with the {others} other "
        f"records of its {cmd.type}, over the {MAX_DECISION_RECORDS} a decision makes (its "
        "run: timer runs it again alone, where it may send one less than that)"
    )
    logger.error("%s: %s", cmd.aggregate, too_many)
    return too_many


def _unwritable(job: Job, cmd: Command, slot: int, why: Exception | None) -> Exception | None:
    """`why` the commands of slot `slot`'s handler cannot be written, said, or None."""
    if why is not None:
        logger.error(
            "%s: job %r sent a command on slot %d that cannot be written: %s (its run: "
            "timer runs it again, and parks once its retries are spent)",
            *(cmd.aggregate, job.name, slot, why),
        )
    return why


def _shard_partition(job: Job, instance: str) -> int | None:
    if job.scope is not JobScope.SHARDED:
        return None
    return int(instance.split("~")[1])
