"""A job instance's runs: the key of the timer that runs a failed slot again (`run_key`),
its handler run as user code (`run_handler`), and whether a slot may be due under the
instance's tick timer (`slot_reachable`). Used by `app.jobs.schedule`'s decisions."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

from app.jobs.declaration import RUN_KEY_PREFIX, Job, JobRun
from app.jobs.schedule_state import ScheduleState
from app.log_limit import LogLimit
from app.model.decide import cut_message
from app.model.user_code import not_awaitable, user_code
from tables.exceptions import InvalidRule
from tables.rules import parse_rule
from tables.slots import reachable

__all__ = ["run_handler", "run_key", "slot_reachable"]

logger = logging.getLogger(__name__)

# A job failing on every slot of every instance (a 1-second job, a thousand tenants, each
# run tried again) would log thousands of tracebacks a second: per job and exception type,
# the first in full, then one a minute with the count.
_HANDLER_FAILURES = LogLimit()


def run_key(timer_id: str, slot: int) -> str:
    """The key of the one-off timer that runs `slot` of the tick timer `timer_id` again:
    `run:<digest of the timer id>#<slot>`, one per failed slot of an instance."""
    digest = hashlib.blake2b(timer_id.encode(), digest_size=6).hexdigest()
    return f"{RUN_KEY_PREFIX}{digest}#{slot}"


def run_handler(job: Job, run: JobRun, *, log_limit: LogLimit = _HANDLER_FAILURES) -> str | None:
    """Runs the handler; None when it returned, else what it raised, cut to
    `MAX_ERROR_TEXT` characters (an exception's text has no bound: whole, it could outgrow
    the record of the event or result that carries it). `log_limit` bounds the lines about
    its failures (the node's one, shared by every job, by default)."""
    try:
        with user_code("the handler of job", job.name):
            # Declared returning None; an object whose `__call__` is async returns a
            # coroutine all the same.
            handler: Callable[[JobRun], object] = job.handler
            result = handler(run)
            not_awaitable(result, f"the handler of job {job.name}")
    except Exception as exc:
        if run.retried:
            what = "failed again"
        elif run.triggered or run.backfilled:
            what = "failed (nothing of the run commits)"
        else:
            what = "failed (its run: timer runs it again)"
        if (more := log_limit.check((job.name, type(exc)))) is not None:
            logger.exception(
                "job %s on slot %d of %s %s%s", job.name, run.slot, run.instance, what, more
            )
        return cut_message(repr(exc))
    return None


def slot_reachable(state: ScheduleState, slot: int, by: int) -> bool:
    """Whether `slot` of the instance's tick timer may be due by `by` under the timer's
    rule (`tables.slots.reachable`); True when there is no rule to tell."""
    if state.rule is None:
        return True
    try:
        rule = parse_rule(state.rule)
    except InvalidRule:
        return True  # not this check's to refuse: the timer table has the rule it fires by
    return reachable(rule, slot, state.timer_set_at or 0, by)
