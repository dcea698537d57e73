"""An operator's request on parked timers, as the timer-ops topic carries it (`TimerOp`):
retry them or skip them (`TimerAction`)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from tables import AggregateRef
from tables.bounds import Instant

__all__ = ["TimerAction", "TimerOp"]


class TimerAction(StrEnum):
    RETRY = "retry"
    """The PARKED timers due now, their attempts reset."""
    SKIP = "skip"
    """The PARKED timers CANCELLED with the outcome SKIPPED."""


class TimerOp(BaseModel):
    """One operator's request on the PARKED timers of `target`, on the timer-ops topic.

    Unknown fields are kept, as on every other topic.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    request_id: str = Field(min_length=1, max_length=200, description="unique per request")
    action: TimerAction
    target: AggregateRef = Field(description="the aggregate the parked timers send to")
    requested_at: Instant = Field(description="epoch ms when the operator asked")
