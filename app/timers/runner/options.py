"""TimerOptions: how the runner expires, claims, retries and parks timers."""

from __future__ import annotations

import logging
from typing import ClassVar, Final, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DAY_MS", "RetryPolicy", "TimerOptions", "backoff_ms"]

logger = logging.getLogger(__name__)

DAY_MS: Final = 24 * 60 * 60 * 1000


class RetryPolicy(BaseModel):
    """Exponential backoff between the failed attempts of one slot, and how many it gets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_backoff_ms: int = Field(default=1000, gt=0, description="wait after the first failure")
    multiplier: float = Field(default=2.0, ge=1.0, description="growth per failure; 1 = constant")
    max_backoff_ms: int = Field(default=60_000, gt=0, description="the longest wait")
    max_attempts: int = Field(default=5, gt=0, description="failed attempts before parking")

    @model_validator(mode="after")
    def _ceiling_above_floor(self) -> Self:
        if self.max_backoff_ms < self.initial_backoff_ms:
            raise ValueError(
                f"max_backoff_ms ({self.max_backoff_ms}) must be at least "
                f"initial_backoff_ms ({self.initial_backoff_ms})"
            )
        return self


def backoff_ms(policy: RetryPolicy, failures: int) -> int:
    """The wait after `failures` failed attempts in a row (1 → the initial backoff).

    Pure arithmetic on purpose: tenacity's wait functions want a RetryCallState and
    own the sleeping, while the runner only needs a number to add to `now`.
    """
    # Cap the exponent before raising, so that a huge attempt count cannot overflow a float.
    exponent = min(max(failures, 1) - 1, 64)
    return int(min(policy.initial_backoff_ms * policy.multiplier**exponent, policy.max_backoff_ms))


class TimerOptions(BaseModel):
    """The runner's knobs; every time is in milliseconds and must be positive."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    PARKED_SUBSCRIPTION: ClassVar[str] = "tickwheel.timers"
    """The subscription name the failure ledger parks this context's targets under."""

    expires_after: int = Field(
        default=DAY_MS,
        gt=0,
        description="a slot due longer ago than this is not sent; a retry (a send's or an "
        "operator's) counts from when it was due",
    )
    claim_timeout: int = Field(
        default=30_000, gt=0, description="how long a claim holds before another node may"
    )
    send_timeout: int = Field(
        default=10_000, gt=0, description="a send not answered by then is a failed attempt"
    )
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    max_busy_retries: int = Field(
        default=10, ge=0, description="BUSY refusals in a row that do not count as attempts"
    )
    batch_limit: int = Field(default=1000, gt=0, description="timers loaded per round")
    max_in_flight: int = Field(default=1000, gt=0, description="sends running at once")
    poll_interval_ms: int = Field(default=100, gt=0, description="longest wait between rounds")
    finished_retention: int = Field(
        default=7 * DAY_MS,
        gt=0,
        description="a FIRED or CANCELLED timer's row is deleted this long after it finished, "
        "with a tombstone in the changelog; must exceed expires_after",
    )
    sweep_limit: int = Field(
        default=250, gt=0, description="finished rows deleted per round at most"
    )

    @model_validator(mode="after")
    def _replay_expires(self) -> Self:
        # A replay of a schedule whose finished row was deleted makes the timer again; its
        # slot, due more than `expires_after` ago, is then expired and never sent.
        if self.finished_retention <= self.expires_after:
            raise ValueError(
                f"finished_retention ({self.finished_retention}) must exceed "
                f"expires_after ({self.expires_after})"
            )
        return self

    @model_validator(mode="after")
    def _send_within_claim(self) -> Self:
        # A send still running when its claim lapses could be sent twice at once by two nodes;
        # dedup makes that safe, but it is waste, so the deadline must fall inside the claim.
        if self.send_timeout > self.claim_timeout:
            raise ValueError(
                f"send_timeout ({self.send_timeout}) must not exceed "
                f"claim_timeout ({self.claim_timeout})"
            )
        return self
