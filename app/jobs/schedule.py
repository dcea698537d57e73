"""The built-in `<context>.schedule` aggregate: the decisions of a job instance's Enable,
Reschedule, Disable and Tick commands, its live schedule (see `app.jobs`); those of its
Run, Trigger and Backfill commands, its runs beside the live ticks, are
`app.jobs.extra_runs`'s; its state and how its events fold it are
`app.jobs.schedule_state`'s."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

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
    Job,
    Rule,
    effective_rule,
    not_its_instance,
)
from app.jobs.extra_runs import ExtraRuns, logged_ran_before, refuse_invalid
from app.jobs.runs import MAX_FAILED_RUNS, no_slot_left, tick_refusal
from app.jobs.schedule_state import ScheduleState, apply_made, apply_schedule_event
from app.jobs.slot_runs import SentCheck
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.wire import SCHEDULE_CANCELLED, SCHEDULE_SET, ResultCode
from tables import DEFAULT_TENANT, CommandSpec
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
    sent_check: SentCheck | None = None,
) -> AggregateType[ScheduleState]:
    """The model of `<context>.schedule`, deciding for `jobs` on a log of `partitions`,
    on a node that keeps applied request ids for `request_id_window_ms` (a Backfill of a
    slot due before that window is refused: its live run may be forgotten) and whose
    timers expire a slot due longer ago than `expires_after_ms` (a once rule due before
    that is refused: its tick would never come); an instance keeps its newest
    `max_failed_runs` failed slots to run again (`runs_to_drop`). `sent_check`: why a
    handler's commands cannot be written on that node (`SentCheck`): a slot sending one
    fails as its handler would have; None checks nothing (the node's processor refuses
    the whole tick then)."""
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
        context,
        by_name,
        partitions,
        request_id_window_ms,
        max_failed_runs,
        expires_after_ms,
        sent_check,
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


class _ScheduleModel(ExtraRuns):
    def __init__(
        self,
        context: str,
        jobs: Mapping[str, Job],
        partitions: int,
        window_ms: int,
        max_failed_runs: int,
        expires_after_ms: int,
        sent_check: SentCheck | None,
    ) -> None:
        self.context = context
        self.jobs = jobs
        self.partitions = partitions
        self.window_ms = window_ms
        self.max_failed_runs = max_failed_runs
        self.expires_after_ms = expires_after_ms
        self.sent_check = sent_check

    def enable(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        job = self._job_to_enable(cmd, d)
        override = cmd.body.get("rule")
        if override is None:  # the one kept: stored, perhaps by an earlier, lax version
            self._set_rule(state, job, cmd, state.override, ENABLED, d, strict=False)
        else:
            self._set_rule(state, job, cmd, override, ENABLED, d)

    def reschedule(self, state: ScheduleState, cmd: Command, d: Decision) -> None:
        if not state.enabled:
            refuse_invalid(d, f"{cmd.aggregate} is not enabled: Enable it before rescheduling it")
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
        if logged_ran_before(state, cmd, timer_id, slot, due_at):
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
            refuse_invalid(
                d, f"invalid rule for job {job.name!r}: expected an object of rule fields"
            )
        override = parts or None  # no parts: the default itself
        try:
            rule = effective_rule(job.rule, override, strict=strict)
        except InvalidRule as exc:
            refuse_invalid(d, f"invalid rule for job {job.name!r}: {exc}")
        dumped = _dump(rule)
        if state.enabled and state.override == override and state.rule == dumped:
            # UNCHANGED, said why: the instance cannot know its tick timer is gone (an
            # operator's skip of it parked, or its cancel), and setting it again here would
            # replace a live one, or run the slot a skip dropped (`_run_owed`).
            ref = cmd.aggregate
            tenant = "" if ref.tenant == DEFAULT_TENANT else f" --tenant {shlex.quote(ref.tenant)}"
            target = f"--target-id {shlex.quote(ref.id)}{tenant}"
            d.reject(
                f"{ref} is enabled under this rule already: nothing changed. If its "
                f"{TICK_KEY!r} timer was skipped or cancelled (timers skip --type "
                f"{self.context}.{SCHEDULE} {target}), nothing ticks it: "
                "disable it, then enable it (it ticks from its next slot)",
                ResultCode.UNCHANGED,
            )
        # Only a new rule needs a new timer: the current one keeps its slots otherwise.
        new_timer = not state.enabled or state.rule != dumped
        if new_timer and (why := no_slot_left(rule, d.now, self.expires_after_ms)) is not None:
            # Its tick timer would be cancelled at once (`app.timers.subscription`), or
            # expire its slot unsent: the job would look enabled and never run. (Its
            # override spelled anew, the rule it ticks by unchanged, sets no timer.)
            refuse_invalid(d, f"the rule of job {job.name!r} cannot run: {why}")
        if new_timer:
            self._run_owed(state, job, cmd, d)
        d.emit(event, {"job": job.name, "override": override, "rule": dumped})
        if new_timer:
            _schedule_tick(d, rule)

    def _job_to_enable(self, cmd: Command, d: Decision) -> Job:
        name = cmd.body.get("job")
        if not isinstance(name, str) or not name:
            refuse_invalid(d, f"{ENABLE} names no job: give the job's name as body.job")
        job = self.jobs.get(name)
        if job is None:
            known = ", ".join(sorted(self.jobs)) or "none"
            refuse_invalid(d, f"unknown job {name!r} in {self.context} (its jobs: {known})")
        if (why := not_its_instance(job, cmd.aggregate, self.partitions)) is not None:
            refuse_invalid(d, why)
        return job


_SWITCH_RECORDS = 2
"""A tick's records when it takes a new default: `Rescheduled` and the new timer's."""


def _schedule_tick(d: Decision, rule: Rule) -> None:
    # Same key, later aggregate version: the new timer replaces the old one, whose ticks
    # then no longer match `timer_id`.
    d.schedule(TICK_KEY, rule, CommandSpec(type=TICK))


def _dump(rule: Rule) -> dict[str, Any]:
    return rule.model_dump(mode="json")
