"""The runs of a job instance's slots that the `<context>.schedule` decisions share
(`SlotRuns`, a base of `app.jobs.schedule`'s model): a slot run as its live tick runs it,
by its tick or, before a new rule replaces the tick timer, by the change itself (the slot
the old timer owes: due, and not run), and the `JobRun` a handler is given."""

from __future__ import annotations

import logging

from app.jobs.declaration import RUN, RUN_FAILED, TICKED, Job, JobRun, JobScope, not_its_instance
from app.jobs.runs import drop_oldest_runs, owed_slot, run_handler, run_key
from app.jobs.schedule_state import ScheduleState
from app.model.aggregate import Command, Decision
from tables import CommandSpec, OnceRule

__all__ = ["SlotRuns"]

logger = logging.getLogger(__name__)


class SlotRuns:
    """What the schedule model sets (`app.jobs.schedule`)."""

    context: str
    partitions: int
    max_failed_runs: int

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
    ) -> None:
        """Runs `slot` of the tick timer `timer_id` as its live tick does, under its tick's
        request id `tick_id` (its commands' ids are derived from it): `Ticked`, and the
        handler's commands, or, when it fails, `RunFailed` and a timer that runs it again."""
        d.emit(TICKED, {"slot": slot, "due_at": due_at, "timer_id": timer_id})
        # The handler decides into a scratch decision: a failure keeps none of its commands.
        scratch = Decision(
            aggregate=d.aggregate, now=d.now, request_id=tick_id, unreachable=d.unreachable
        )
        error = run_handler(job, self._run(job, cmd, slot, due_at, tick_id, scratch))
        if error is None:
            d.commands.extend(scratch.commands)
            return
        # The schedule ticks on; the slot is run again by a timer of its own, which the
        # runner retries, parks and puts in the ledger as it does any timer.
        key = run_key(timer_id, slot)
        slot_ref = {"slot": slot, "due_at": due_at, "timer_id": timer_id, "request_id": tick_id}
        d.emit(RUN_FAILED, {**slot_ref, "key": key, "error": error})
        d.schedule(key, OnceRule(at=d.now), CommandSpec(type=RUN, body=slot_ref))
        # Past `max_failed_runs` waiting, the oldest failed slots are given up.
        drop_oldest_runs(state, d, self.max_failed_runs, cmd.aggregate)

    def _run_owed(self, state: ScheduleState, job: Job, cmd: Command, d: Decision) -> None:
        """Before a new rule replaces a live tick timer: runs the slot it owes, due and not
        run (`owed_slot`). Replaced, the timer would never send it (its row goes, and a slot
        handed to its cycle with it), and a tick of it in flight would find a newer timer:
        the slot was due under the old rule, whose timer each instant before the change
        belongs to (`app.jobs.backfill`)."""
        if (owed := owed_slot(state, d.now)) is None or state.timer_id is None:
            return
        if (why := not_its_instance(job, cmd.aggregate, self.partitions)) is not None:
            logger.warning("%s: slot due not run: %s", cmd.aggregate, why)
            return
        slot, left = owed
        if left:
            logger.warning(
                "%s: %d more slot(s) of %s due after slot %d not run before its rule changed "
                "(it does not coalesce): a backfill runs them",
                cmd.aggregate,
                left,
                state.timer_id,
                slot.index,
            )
        timer_id = state.timer_id
        tick_id = f"{timer_id}#{slot.index}"
        self._run_slot(state, job, cmd, d, timer_id, slot.index, slot.due_at, tick_id)

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


def _shard_partition(job: Job, instance: str) -> int | None:
    if job.scope is not JobScope.SHARDED:
        return None
    return int(instance.split("~")[1])
