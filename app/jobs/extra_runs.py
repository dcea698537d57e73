"""The decisions of a job instance's runs beside its live ticks (`ExtraRuns`, a base of
`app.jobs.schedule`'s model): Run (a slot whose handler failed, run again by its `run:`
timer), Trigger (one run now, outside the rule) and Backfill (a past slot, under its live
tick's request id); the tick timer is left as it is. With what the schedule's decisions
share: the refusal of a command that is not valid (`refuse_invalid`), a slot that ran
before its timer was set (`logged_ran_before`), a count in a command's body (`is_count`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NoReturn, TypeGuard

from app.jobs.declaration import (
    BACKFILL,
    BACKFILLED,
    RAN,
    RUN,
    TRIGGERED,
    TRIGGERED_SLOT,
    Job,
    not_its_instance,
)
from app.jobs.runs import backfill_refusal, ran_before, run_handler
from app.jobs.schedule_state import ScheduleState
from app.jobs.slot_runs import SlotRuns
from app.model.aggregate import Command, Decision
from app.protocol.wire import ResultCode

__all__ = ["ExtraRuns", "is_count", "logged_ran_before", "refuse_invalid"]

# The schedule's own logger, as before its extra runs had a module of their own: operators
# filter its records by that name.
logger = logging.getLogger("app.jobs.schedule")


class ExtraRuns(SlotRuns):
    """What the schedule model sets (`app.jobs.schedule`)."""

    jobs: Mapping[str, Job]
    window_ms: int

    def run(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        """A slot whose handler failed, run again by its `run:` timer."""
        body = cmd.body
        slot, due_at = body.get("slot"), body.get("due_at")
        timer_id, tick_id = body.get("timer_id"), body.get("request_id")
        if not (
            is_count(slot)
            and is_count(due_at)
            and isinstance(timer_id, str)
            and isinstance(tick_id, str)
        ):
            d.reject(f"a {RUN} names the slot it runs: slot, due_at, timer_id and request_id")
        if timer_id == state.timer_id and (state.last_slot is None or slot > state.last_slot):
            # Only a slot that ticked can have failed: run now, it would run again live.
            d.reject(
                f"slot {slot} of {timer_id} has not ticked: a {RUN} runs again a slot "
                "whose handler failed"
            )
        job = self.jobs.get(state.job)
        why = None if job is None else not_its_instance(job, cmd.aggregate, self.partitions)
        if job is None or why is not None:
            logger.warning(
                "%s: nothing run: %s", cmd.aggregate, why or f"job {state.job!r} is not declared"
            )
            return
        if not state.enabled:
            # Not answered UNCHANGED: its run timer would count the slot as done, and the
            # slot, which failed, would never run again once enabled (a backfill of it is
            # its tick's DUPLICATE). ERROR: the run timer retries it, then parks it, and a
            # retry of the parked timer after the enable runs it.
            d.reject(
                f"{cmd.aggregate} is disabled: slot {slot} of {timer_id} waits to run again "
                "(retry its parked run timer once enabled)",
                ResultCode.ERROR,
            )
        d.emit(
            RAN,
            {"slot": slot, "due_at": due_at, "timer_id": timer_id, "request_id": tick_id},
        )
        error = run_handler(job, self._run(job, cmd, slot, due_at, tick_id, d, retried=True))
        if error is not None:
            # ERROR: nothing commits; the run timer retries the slot, then parks it.
            d.reject(f"job {job.name!r} failed again on slot {slot}: {error}", ResultCode.ERROR)

    def trigger(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        """One run now, outside the rule: the tick timer and `last_slot` are left as they
        are. A paused (disabled) instance runs it too: the operator asked for it. Its
        request id is the trigger's, so a re-sent trigger is a DUPLICATE; a handler that
        fails commits nothing (ERROR), and the same trigger sent again runs it again."""
        job = self._declared(state, cmd, d)
        d.emit(TRIGGERED, {"at": d.now})
        run = self._run(job, cmd, TRIGGERED_SLOT, d.now, cmd.request_id, d, triggered=True)
        if (error := run_handler(job, run)) is not None:
            d.reject(f"job {job.name!r} failed on its triggered run: {error}", ResultCode.ERROR)

    def backfill(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        """One past slot of a tick timer (`app.jobs.backfill` finds them), under the request
        id its live tick has, so a slot that ran live (or was backfilled) is a DUPLICATE
        before it gets here. Any slot due by now, of the current timer or an older one, and
        on a paused instance too: the live schedule is left as it is."""
        job = self._declared(state, cmd, d)
        slot, due_at, timer_id = (cmd.body.get(k) for k in ("slot", "due_at", "timer_id"))
        if not (is_count(slot) and is_count(due_at) and isinstance(timer_id, str)):
            refuse_invalid(d, f"a {BACKFILL} names its slot: slot, due_at and timer_id")
        if cmd.request_id != f"{timer_id}#{slot}":
            refuse_invalid(
                d,
                f"a {BACKFILL} has its slot's live request id {timer_id}#{slot}, "
                f"not {cmd.request_id!r}",
            )
        if due_at > d.now:
            refuse_invalid(d, f"slot {slot} of {timer_id} is due at {due_at}, after now ({d.now})")
        if timer_id == state.timer_id and (why := backfill_refusal(state, timer_id, slot, due_at)):
            # Its due_at is the sender's word: a slot off the rule, or not due yet, would run
            # early, and its live tick, under the same request id, never.
            refuse_invalid(d, why)
        if timer_id == state.timer_id and logged_ran_before(state, cmd, timer_id, slot, due_at):
            return  # its live tick ran nothing either: an older timer ran that instant
        # Checked here, when it is decided, not only by its sender: a command that waited
        # in its topic may reach a node that forgot the live run's request id (applied at
        # the slot's due time at the earliest, forgotten `window_ms` after), and run twice.
        if due_at <= d.now - self.window_ms:
            refuse_invalid(
                d,
                f"slot {slot} of {timer_id} was due at {due_at}, before the node's "
                f"de-duplication window ({self.window_ms} ms before now, {d.now}): whether "
                "it ran live may be forgotten, so it is not run again",
            )
        d.emit(BACKFILLED, {"slot": slot, "due_at": due_at, "timer_id": timer_id})
        run = self._run(job, cmd, slot, due_at, cmd.request_id, d, backfilled=True)
        if (error := run_handler(job, run)) is not None:
            d.reject(f"job {job.name!r} failed on slot {slot}: {error}", ResultCode.ERROR)

    def _declared(self, state: ScheduleState, cmd: Command, d: Decision) -> Job:
        """The job of an instance that was enabled once (paused or not)."""
        if not state.job:
            refuse_invalid(d, f"{cmd.aggregate} was never enabled: enable it first")
        job = self.jobs.get(state.job)
        if job is None:
            refuse_invalid(d, f"job {state.job!r} is not declared in {self.context} any more")
        if (why := not_its_instance(job, cmd.aggregate, self.partitions)) is not None:
            refuse_invalid(d, f"{why} (its scope changed since it was enabled)")
        return job


def logged_ran_before(
    state: ScheduleState, cmd: Command, timer_id: str, slot: int, due: int
) -> bool:
    """`ran_before`, said when it is so."""
    if not ran_before(state, due):
        return False
    logger.info(
        "%s: slot %d of %s is due at %d, no later than the last slot run before its timer "
        "was set: not run again",
        *(cmd.aggregate, slot, timer_id, due),
    )
    return True


def is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def refuse_invalid(d: Decision, reason: str) -> NoReturn:
    logger.info("refused: %s", reason)
    d.reject(reason, ResultCode.SCHEDULE_JOB_INVALID)
