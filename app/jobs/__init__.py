"""Jobs: handlers a service runs by a schedule, kept by the built-in `<context>.schedule`.

A job is declared once per context (name, scope, default rule, handler). Each of its
instances is one `schedule` aggregate: `wow.schedule.Enable` makes it schedule its own
`wow.schedule.Tick` under the key `tick`, and each tick of a slot newer than the last one
run commits `wow.Ticked` and runs the handler, whose commands (`JobRun.send`) commit in the
same transaction as that event. A repeated tick is a DUPLICATE, or changes nothing, and
runs nothing: a job's effects are applied once per slot. A new rule replacing the tick
timer of an enabled instance (Reschedule, or Enable with a new override) first runs the
slots that timer owes, due and not run yet (`app.jobs.slot_runs`): replaced, the timer
would never send them (a coalescing rule's latest due; every one of a rule that does not
coalesce, 100 at most (`app.jobs.runs.MAX_OWED_SLOTS`), the rest logged for a backfill).

A handler that raises does not stop the schedule (nor one whose commands do not fit in
its tick, or one of which is larger than the node writes, `SentCheck`): the tick commits
`wow.Ticked` all the same (the instance ticks on, its later slots on time) with
`wow.schedule.RunFailed`, none of the handler's commands, and a one-off timer of the
instance under the key `run:<timer digest>#<slot>` (`run_key`), due at once, whose
`wow.schedule.Run` runs the handler for that slot again. That timer is retried, parked and
put in the failure ledger (its target: the instance) like any other, by
`TimerOptions.retry`; `tickwheel timers retry|skip --type <context>.schedule --target-id
<instance>` retries or skips the parked slots of an instance. A Run that succeeds commits
`wow.schedule.Ran` with the handler's commands; one that fails again commits nothing
(ERROR). A disabled instance runs nothing.

A tick that fails whole (ERROR: the node's fault, not the handler's) parks the `tick`
timer itself. Skipped, it is gone and the instance's schedule with it, while its state
still says enabled: an Enable answers UNCHANGED, saying so, and sets no timer (it cannot
tell a skipped timer from a live one, which a new timer would replace, and it would run
the slot the skip dropped). Disable, then Enable, the instance after skipping its tick:
it ticks from its next slot (`jobs backfill` runs the skipped ones). Retried instead, the
tick timer sends its slot again and ticks on.

An instance may override parts of its job's default rule. A part is one field of the rule
(`kind`, `expr`, `zone`, `start`, `every`, `at`, `coalesce`), and an override is a partial
rule: the fields it names replace the default's, the others follow the default, also when
the default changes (from the instance's next tick). `{"expr": "*/5 * * * *"}` keeps the
default's zone and coalesce. An override whose `kind` is not the default's is a rule of its
own: fields of two kinds do not mix, so it follows nothing of the default.

May import: `app.model`, `app.protocol`, `tables`, `app.log_limit`.
"""

from app.jobs.backfill import (
    MAX_BACKFILL_SLOTS,
    MAX_BACKFILL_TOTAL_SLOTS,
    BackfillError,
    BackfillSlot,
    TickTimer,
    TooManySlots,
    backfill_slots,
    first_unheld,
    tick_timers,
)
from app.jobs.commands import (
    TRIGGER_SENDS,
    RequestIdTooLong,
    action_request_id,
    backfill_command,
    disable_command,
    enable_command,
    enable_commands,
    request_id_limit,
    reschedule_command,
    shared_request_id,
    trigger_command,
)
from app.jobs.declaration import (
    BACKFILL,
    BACKFILLED,
    DISABLE,
    DISABLED,
    ENABLE,
    ENABLED,
    MAX_JOB_EVERY_MS,
    MIN_JOB_EVERY_MS,
    RAN,
    RESCHEDULE,
    RESCHEDULED,
    RUN,
    RUN_FAILED,
    RUN_KEY_PREFIX,
    SCHEDULE,
    TICK,
    TICK_KEY,
    TICKED,
    TRIGGER,
    TRIGGERED,
    TRIGGERED_SLOT,
    Job,
    JobRun,
    JobScope,
    Rule,
    effective_rule,
    instance_ids,
    is_instance_id,
    job_rule_error,
    ref_of,
    shard_ref,
)
from app.jobs.runs import run_key
from app.jobs.schedule import (
    DEFAULT_EXPIRES_AFTER_MS,
    DEFAULT_REQUEST_ID_WINDOW_MS,
    schedule_aggregate,
)
from app.jobs.schedule_state import ScheduleState
from app.jobs.slot_runs import SentCheck

__all__ = [
    "BACKFILL",
    "BACKFILLED",
    "DEFAULT_EXPIRES_AFTER_MS",
    "DEFAULT_REQUEST_ID_WINDOW_MS",
    "DISABLE",
    "DISABLED",
    "ENABLE",
    "ENABLED",
    "MAX_BACKFILL_SLOTS",
    "MAX_BACKFILL_TOTAL_SLOTS",
    "MAX_JOB_EVERY_MS",
    "MIN_JOB_EVERY_MS",
    "RAN",
    "RESCHEDULE",
    "RESCHEDULED",
    "RUN",
    "RUN_FAILED",
    "RUN_KEY_PREFIX",
    "SCHEDULE",
    "TICK",
    "TICKED",
    "TICK_KEY",
    "TRIGGER",
    "TRIGGERED",
    "TRIGGERED_SLOT",
    "TRIGGER_SENDS",
    "BackfillError",
    "BackfillSlot",
    "Job",
    "JobRun",
    "JobScope",
    "RequestIdTooLong",
    "Rule",
    "ScheduleState",
    "SentCheck",
    "TickTimer",
    "TooManySlots",
    "action_request_id",
    "backfill_command",
    "backfill_slots",
    "disable_command",
    "effective_rule",
    "enable_command",
    "enable_commands",
    "first_unheld",
    "instance_ids",
    "is_instance_id",
    "job_rule_error",
    "ref_of",
    "request_id_limit",
    "reschedule_command",
    "run_key",
    "schedule_aggregate",
    "shard_ref",
    "shared_request_id",
    "tick_timers",
    "trigger_command",
]
