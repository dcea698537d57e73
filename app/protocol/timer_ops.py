"""An operator's request on parked timers, as the timer-ops topic carries it (`TimerOp`):
retry them or skip them (`TimerAction`); and each owner's answer to it for its partition,
on the context's results topic (`TimerOpAnswer`, its `OpOutcome`)."""

from __future__ import annotations

import functools
import operator
from enum import StrEnum
from typing import Final, Literal

from pydantic import Field

from app.protocol.envelope import Envelope
from tables import AggregateRef
from tables.bounds import MAX_INT64, Instant

__all__ = ["TIMER_OP_ANSWER", "OpOutcome", "TimerAction", "TimerOp", "TimerOpAnswer"]

_false: Final = functools.partial(operator.is_, False)
"""Whether a flag is False: `exclude_if`'s test (a C callable, as `tables.timer`'s)."""
_zero: Final = functools.partial(operator.eq, 0)
"""Whether a count is 0: `exclude_if`'s test."""


class TimerAction(StrEnum):
    RETRY = "retry"
    """The PARKED timers due now, their attempts reset."""
    SKIP = "skip"
    """The PARKED timers CANCELLED with the outcome SKIPPED."""


class TimerOp(Envelope):
    """One operator's request on the PARKED timers of `target`, on the timer-ops topic.

    Unknown fields are kept, as on every other topic, within a body's bounds
    (`tables.bounds`): a request holding one past them is a bad record, dead-lettered
    unanswered, never carried out.
    """

    request_id: str = Field(min_length=1, max_length=200, description="unique per request")
    action: TimerAction
    target: AggregateRef = Field(description="the aggregate the parked timers send to")
    requested_at: Instant = Field(description="epoch ms when the operator asked")
    past_window: bool = Field(
        default=False,
        exclude_if=_false,
        description="a retry's: also the parked timers whose slot was due longer ago than "
        "TICKWHEEL_REQUEST_ID_WINDOW_MS less expires_after (at most a day), which the "
        "target may have applied and forgotten (sent again, applied twice); without it "
        "they are refused, left parked (an earlier version's node takes it for an unknown "
        "field and retries them all); left out of the JSON when false, as before it existed",
    )


class OpOutcome(StrEnum):
    DONE = "DONE"
    """Carried out in the partition: its counts say what it changed (none: nothing of the
    target was PARKED there)."""
    DUPLICATE = "DUPLICATE"
    """A copy of a request carried out (or FAILED) in the partition under its request id
    within the de-duplication window: nothing done again."""
    FAILED = "FAILED"
    """Its carrying out failed, perhaps in part: dead-lettered, its request id used."""


TIMER_OP_ANSWER: Final = "timer-op-answer"
"""`TimerOpAnswer.kind`: what tells an answer from a command's result on the results topic
(a result has no `kind`)."""


class TimerOpAnswer(Envelope):
    """What the owner of one partition did with its copy of a `TimerOp`, on the owner
    type's context's results topic, keyed by the request id, in its partition (murmur2):
    written in the partition's transaction that commits the request's offset, so once with
    it. No command's result: it lacks `aggregate` and `decided_at`, which a reader of
    results requires: a node passes it over, one of 0.2.0 logs it as an unreadable result
    (bounded) and passes it over.

    Unknown fields are kept, as on every other topic, within a body's bounds
    (`tables.bounds`): a reader writes an answer out again (`timers retry --json`).
    """

    kind: Literal["timer-op-answer"] = Field(description="always `timer-op-answer`")
    request_id: str = Field(min_length=1, max_length=200, description="the request's")
    action: TimerAction
    target: AggregateRef = Field(description="the request's target")
    partition: int = Field(ge=0, le=65_535, description="the timer-ops partition it answers for")
    offset: int = Field(ge=0, le=MAX_INT64, description="the request's offset there")
    outcome: OpOutcome
    retried: int = Field(default=0, ge=0, le=MAX_INT64, description="PARKED timers retried")
    skipped: int = Field(default=0, ge=0, le=MAX_INT64, description="PARKED timers skipped")
    refused: int = Field(
        default=0,
        exclude_if=_zero,
        ge=0,
        le=MAX_INT64,
        description="PARKED timers a retry left parked: their slot due longer ago than the "
        "request-id window allows, the request not asking past_window; left out of the "
        "JSON when 0, as before it existed",
    )
    message: str = Field(
        default="",
        max_length=2_000,
        description="with DUPLICATE, the offset of the copy carried out; with FAILED, why",
    )
    answered_at: Instant = Field(description="epoch ms when the owner carried it out")
