"""The built-in `<context>.schedule` aggregate: the decisions of a job instance's Enable,
Reschedule, Disable, Tick, Run, Trigger and Backfill commands (see `app.jobs`); its state
and how its events fold it are `app.jobs.schedule_state`'s."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn, TypeGuard

from app.jobs.declaration import (
    BACKFILL,
    BACKFILLED,
    DISABLE,
    DISABLED,
    ENABLE,
    ENABLED,
    RAN,
    RESCHEDULE,
    RESCHEDULED,
    RUN,
    RUN_FAILED,
    SCHEDULE,
    TICK,
    TICK_KEY,
    TICKED,
    TRIGGER,
    TRIGGERED,
    TRIGGERED_SLOT,
    Job,
    Rule,
    effective_rule,
    not_its_instance,
)
from app.jobs.runs import (
    MAX_FAILED_RUNS,
    backfill_refusal,
    no_slot_left,
    ran_before,
    run_handler,
    tick_refusal,
)
from app.jobs.schedule_state import ScheduleState, apply_made, apply_schedule_event
from app.jobs.slot_runs import SlotRuns
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.wire import SCHEDULE_CANCELLED, SCHEDULE_SET, ResultCode
from tables import CommandSpec
from tables.exceptions import InvalidRule

logger = logging.getLogger(__name__)


DEFAULT_REQUEST_ID_WINDOW_MS = 7 * 24 * 3_600_000
"""The node's de-duplication window by default (`TICKWHEEL_REQUEST_ID_WINDOW_MS`)."""
DEFAULT_EXPIRES_AFTER_MS = 24 * 3_600_000
"""The timers' `expires_after` by default (`TimerOptions`, `TICKWHEEL_TIMER_OPTIONS`)."""


def schedule_aggregate(
    context: str,
    jobs: Iterable[Job],
    partitions: int,
    *,
    request_id_window_ms: int = DEFAULT_REQUEST_ID_WINDOW_MS,
    max_failed_runs: int = MAX_FAILED_RUNS,
    expires_after_ms: int = DEFAULT_EXPIRES_AFTER_MS,
) -> AggregateType[ScheduleState]:
    """The model of `<context>.schedule`, deciding for `jobs` on a log of `partitions`,
    on a node that keeps applied request ids for `request_id_window_ms` (a Backfill of a
    slot due before that window is refused: its live run may be forgotten) and whose
    timers expire a slot due longer ago than `expires_after_ms` (a once rule due before
    that is refused: its tick would never come); an instance keeps its newest
    `max_failed_runs` failed slots to run again (`runs_to_drop`)."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    if max_failed_runs < 1:
        raise ValueError(f"max_failed_runs must be at least 1, got {max_failed_runs}")
    by_name: dict[str, Job] = {}
    for job in jobs:
        if job.name in by_name:
            raise ValueError(f"job {job.name!r} declared twice in {context}")
        by_name[job.name] = job
    if expires_after_ms < 1:
        raise ValueError(f"expires_after_ms must be at least 1, got {expires_after_ms}")
    model = _ScheduleModel(
        context, by_name, partitions, request_id_window_ms, max_failed_runs, expires_after_ms
    )
    agg = AggregateType(context, SCHEDULE, ScheduleState)
    agg.command(ENABLE)(model.enable)
    agg.command(RESCHEDULE)(model.reschedule)
    agg.command(DISABLE)(model.disable)
    agg.command(TICK)(model.tick)
    agg.command(RUN)(model.run)
    agg.command(TRIGGER)(model.trigger)
    agg.command(BACKFILL)(model.backfill)
    for event in (
        ENABLED,
        RESCHEDULED,
        DISABLED,
        TICKED,
        RUN_FAILED,
        RAN,
        TRIGGERED,
        BACKFILLED,
        SCHEDULE_SET,
        SCHEDULE_CANCELLED,
    ):
        agg.applies(event)(apply_schedule_event)
    return agg


class _ScheduleModel(SlotRuns):
    def __init__(
        self,
        context: str,
        jobs: Mapping[str, Job],
        partitions: int,
        window_ms: int,
        max_failed_runs: int,
        expires_after_ms: int,
    ) -> None:
        self.context = context
        self.jobs = jobs
        self.partitions = partitions
        self.window_ms = window_ms
        self.max_failed_runs = max_failed_runs
        self.expires_after_ms = expires_after_ms

    def enable(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        job = self._job_to_enable(cmd, d)
        override = cmd.body.get("rule")
        if override is None:  # the one kept: stored, perhaps by an earlier, lax version
            self._set_rule(state, job, cmd, state.override, ENABLED, d, strict=False)
        else:
            self._set_rule(state, job, cmd, override, ENABLED, d)

    def reschedule(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        if not state.enabled:
            _invalid(d, f"{cmd.aggregate} is not enabled: Enable it before rescheduling it")
        # Its job declared, and of this instance's scope, as an Enable checks: one whose
        # scope changed would set a timer that runs the job beside its instances.
        job = self._declared(state, cmd, d)
        self._set_rule(state, job, cmd, cmd.body.get("rule"), RESCHEDULED, d)

    def disable(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        if state.enabled:
            d.emit(DISABLED, {"reason": "disabled by command"})
            d.cancel_schedule(TICK_KEY)

    def tick(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        if not state.enabled:
            return
        job = self.jobs.get(state.job)
        why = (
            f"job {state.job!r} is no longer declared"
            if job is None
            else not_its_instance(job, cmd.aggregate, self.partitions)
        )
        if job is None or why is not None:
            # Its job gone, or its scope changed (another instance runs its slots now, or
            # none should): it would run them as well, or fail every tick.
            logger.warning("%s: %s: disabling", cmd.aggregate, why)
            d.emit(DISABLED, {"reason": why})
            d.cancel_schedule(TICK_KEY)
            return
        timer_id, sep, slot_text = cmd.request_id.rpartition("#")
        # isascii: isdigit() is true of "²", which int() refuses.
        if not sep or not (slot_text.isascii() and slot_text.isdigit()):
            d.reject(f"a {TICK} comes from a timer: {cmd.request_id!r} is not '<timer id>#<slot>'")
        slot = int(slot_text)
        if timer_id != state.timer_id or (state.last_slot is not None and slot <= state.last_slot):
            logger.debug(
                "%s: %s is not a newer slot: nothing to run", cmd.aggregate, cmd.request_id
            )
            return
        # A timer's send always carries its slot's due time (no later than now: `decide`
        # answers one sent early SCHEDULE_NOT_DUE); a hand-made tick is due now.
        due_at = cmd.not_before if cmd.not_before is not None else d.now
        if (why := tick_refusal(state, timer_id, slot, due_at)) is not None:
            # Taken, it would run no real slot up to it: the job would stop, silently.
            d.reject(f"{why}: a {TICK} is its timer's send of a slot that is due")
        if _ran_before(state, cmd, timer_id, slot, due_at):
            # A new timer's slot due no later than one an older timer ran (its rule changed
            # at that slot's due time, or the clock stepped back): that instant ran.
            return
        rule = self._new_default(state, job, cmd, d)
        # The switch's two records kept free: a handler's commands taking them would fail
        # the whole tick, every tick (`DecisionTooLarge`), the instance stuck on its old rule.
        room = _SWITCH_RECORDS if rule is not None else 0
        if self._run_slot(state, job, cmd, d, timer_id, slot, due_at, cmd.request_id, room):
            # Interrupted by the handler timeout: the slots its timer owes would be too. It
            # ticks on, sending them, and the next tick takes the new default.
            return
        if rule is not None:
            # Replaced, the old timer would send none of the slots it owes: run here, as a
            # Reschedule runs them (a coalescing rule's latest due alone).
            self._run_owed(apply_made(state, d.events, d.now), job, cmd, d)
            d.emit(
                RESCHEDULED,
                {"override": state.override, "rule": _dump(rule), "reason": "default"},
            )
            _schedule_tick(d, rule)

    def _new_default(
        self, state: ScheduleState, job: Job, cmd: Command, d: Decision
    ) -> Rule | None:
        """The job's default under the instance's override when it is not the rule the
        instance ticks by (a release changed the default), and can be taken."""
        try:
            rule = effective_rule(job.rule, state.override)
        except InvalidRule as exc:
            # The new default does not take the kept override: tick on as before until
            # an operator reschedules the instance.
            logger.error("%s: the default under the override is invalid: %s", cmd.aggregate, exc)
            return None
        if _dump(rule) == state.rule:
            return None
        if (why := no_slot_left(rule, d.now, self.expires_after_ms)) is not None:
            # Scheduled, its tick timer would be cancelled at once, or expire its slot:
            # tick on as before until an operator reschedules the instance.
            logger.error("%s: the new default rule is not taken: %s", cmd.aggregate, why)
            return None
        return rule

    def run(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        """A slot whose handler failed, run again by its `run:` timer."""
        body = cmd.body
        slot, due_at = body.get("slot"), body.get("due_at")
        timer_id, tick_id = body.get("timer_id"), body.get("request_id")
        if not (
            _is_count(slot)
            and _is_count(due_at)
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
        if not (_is_count(slot) and _is_count(due_at) and isinstance(timer_id, str)):
            _invalid(d, f"a {BACKFILL} names its slot: slot, due_at and timer_id")
        if cmd.request_id != f"{timer_id}#{slot}":
            _invalid(
                d,
                f"a {BACKFILL} has its slot's live request id {timer_id}#{slot}, "
                f"not {cmd.request_id!r}",
            )
        if due_at > d.now:
            _invalid(d, f"slot {slot} of {timer_id} is due at {due_at}, after now ({d.now})")
        if timer_id == state.timer_id and (why := backfill_refusal(state, timer_id, slot, due_at)):
            # Its due_at is the sender's word: a slot off the rule, or not due yet, would run
            # early, and its live tick, under the same request id, never.
            _invalid(d, why)
        if timer_id == state.timer_id and _ran_before(state, cmd, timer_id, slot, due_at):
            return  # its live tick ran nothing either: an older timer ran that instant
        # Checked here, when it is decided, not only by its sender: a command that waited
        # in its topic may reach a node that forgot the live run's request id (applied at
        # the slot's due time at the earliest, forgotten `window_ms` after), and run twice.
        if due_at <= d.now - self.window_ms:
            _invalid(
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
            _invalid(d, f"{cmd.aggregate} was never enabled: enable it first")
        job = self.jobs.get(state.job)
        if job is None:
            _invalid(d, f"job {state.job!r} is not declared in {self.context} any more")
        if (why := not_its_instance(job, cmd.aggregate, self.partitions)) is not None:
            _invalid(d, f"{why} (its scope changed since it was enabled)")
        return job

    def _set_rule(
        self,
        state: ScheduleState,
        job: Job,
        cmd: Command,
        parts: object,
        event: str,
        d: Decision,
        *,
        strict: bool = True,
    ) -> None:
        """`strict`: `parts` are a command's (new input), not the instance's kept override."""
        if parts is not None and not isinstance(parts, dict):
            _invalid(d, f"invalid rule for job {job.name!r}: expected an object of rule fields")
        override = parts or None  # no parts: the default itself
        try:
            rule = effective_rule(job.rule, override, strict=strict)
        except InvalidRule as exc:
            _invalid(d, f"invalid rule for job {job.name!r}: {exc}")
        dumped = _dump(rule)
        if state.enabled and state.override == override and state.rule == dumped:
            return
        if (why := no_slot_left(rule, d.now, self.expires_after_ms)) is not None:
            # Its tick timer would be cancelled at once (`app.timers.subscription`), or
            # expire its slot unsent: the job would look enabled and never run. (The rule
            # it already has, sent again, is no change: that answers as before, above.)
            _invalid(d, f"the rule of job {job.name!r} cannot run: {why}")
        # Only a new rule needs a new timer: the current one keeps its slots otherwise.
        new_timer = not state.enabled or state.rule != dumped
        if new_timer:
            self._run_owed(state, job, cmd, d)
        d.emit(event, {"job": job.name, "override": override, "rule": dumped})
        if new_timer:
            _schedule_tick(d, rule)

    def _job_to_enable(self, cmd: Command, d: Decision) -> Job:
        name = cmd.body.get("job")
        if not isinstance(name, str) or not name:
            _invalid(d, f"{ENABLE} names no job: give the job's name as body.job")
        job = self.jobs.get(name)
        if job is None:
            known = ", ".join(sorted(self.jobs)) or "none"
            _invalid(d, f"unknown job {name!r} in {self.context} (its jobs: {known})")
        if (why := not_its_instance(job, cmd.aggregate, self.partitions)) is not None:
            _invalid(d, why)
        return job


_SWITCH_RECORDS = 2
"""A tick's records when it takes a new default: `Rescheduled` and the new timer's."""


def _ran_before(state: ScheduleState, cmd: Command, timer_id: str, slot: int, due: int) -> bool:
    """`ran_before`, said when it is so."""
    if not ran_before(state, due):
        return False
    logger.info(
        "%s: slot %d of %s is due at %d, no later than the last slot run before its timer "
        "was set: not run again",
        *(cmd.aggregate, slot, timer_id, due),
    )
    return True


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _schedule_tick(d: Decision, rule: Rule) -> None:
    # Same key, later aggregate version: the new timer replaces the old one, whose ticks
    # then no longer match `timer_id`.
    d.schedule(TICK_KEY, rule, CommandSpec(type=TICK))


def _invalid(d: Decision, reason: str) -> NoReturn:
    logger.info("refused: %s", reason)
    d.reject(reason, ResultCode.SCHEDULE_JOB_INVALID)


def _dump(rule: Rule) -> dict[str, Any]:
    return rule.model_dump(mode="json")
