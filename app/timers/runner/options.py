"""TimerOptions: how the runner expires, claims, retries and parks timers."""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Final, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.backoff import capped_backoff

__all__ = [
    "DAY_MS",
    "FINISHED_RETENTION_MS",
    "MAX_COUNT",
    "MAX_WAIT",
    "REQUEST_ID_WINDOW_MS",
    "YEAR_MS",
    "RetryPolicy",
    "TimerOptions",
    "backoff_ms",
]

logger = logging.getLogger(__name__)

DAY_MS: Final = 24 * 60 * 60 * 1000
YEAR_MS: Final = 365 * DAY_MS
FINISHED_RETENTION_MS: Final = 7 * DAY_MS
"""`finished_retention` when not given (or a day past `expires_after`, when that is longer)."""

REQUEST_ID_WINDOW_MS: Final = 7 * DAY_MS
"""How long a target keeps a request id it applied unless told otherwise (the nodes'
`TICKWHEEL_REQUEST_ID_WINDOW_MS`): a slot sent again within it is answered DUPLICATE."""

# Upper bounds: each far past any use, and each keeps what the runner computes from it (a
# claim's or a retry's due time, now plus a wait) inside the store's 64-bit due times; a
# claim_timeout of 2**63 - 1 loaded, then every claim wrote a row no store could read.
MAX_WAIT: Final = 7 * DAY_MS
"""The longest claim, send or retry wait."""
MAX_COUNT: Final = 100_000
"""The most timers a round loads, sends at once or sweeps; attempts and BUSY retries."""


class RetryPolicy(BaseModel):
    """Exponential backoff between the failed attempts of one slot, and how many it gets."""

    # Strict: JSON's `true` is no count (it was read as 1: one attempt, retries off), "7"
    # no number.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    initial_backoff_ms: int = Field(
        default=1000, gt=0, le=MAX_WAIT, description="wait after the first failure"
    )
    multiplier: float = Field(
        default=2.0, ge=1.0, le=100.0, description="growth per failure; 1 = constant"
    )
    max_backoff_ms: int = Field(default=60_000, gt=0, le=MAX_WAIT, description="the longest wait")
    max_attempts: int = Field(
        default=5, gt=0, le=MAX_COUNT, description="failed attempts before parking"
    )

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
    # The exponent stops at 64, as it did when that alone kept a float from overflowing: a
    # policy's waits are the same from one release to the next.
    step = min(max(failures, 1) - 1, 64)
    wait = capped_backoff(policy.initial_backoff_ms, policy.max_backoff_ms, step, policy.multiplier)
    return int(wait)


class TimerOptions(BaseModel):
    """The runner's knobs; every time is in milliseconds and must be positive."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)  # as RetryPolicy

    PARKED_SUBSCRIPTION: ClassVar[str] = "tickwheel.timers"
    """The subscription name the failure ledger parks this context's targets under."""

    expires_after: int = Field(
        default=DAY_MS,
        gt=0,
        le=YEAR_MS,
        description="a slot due longer ago than this is not sent, its retries included "
        "(they count from when the slot was due, not from the retry); an operator's retry "
        "of a PARKED slot sends it for this long from the retry, within the request-id window",
    )
    claim_timeout: int = Field(
        default=30_000,
        gt=0,
        le=MAX_WAIT,
        description="how long a claim holds before another node may",
    )
    send_timeout: int = Field(
        default=10_000,
        gt=0,
        le=MAX_WAIT,
        description="a send not answered by then is a failed attempt",
    )
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    max_busy_retries: int = Field(
        default=10,
        ge=0,
        le=MAX_COUNT,
        description="BUSY refusals in a row that do not count as attempts",
    )
    batch_limit: int = Field(
        default=1000, gt=0, le=MAX_COUNT, description="timers loaded per round"
    )
    max_in_flight: int = Field(
        default=1000, gt=0, le=MAX_COUNT, description="sends running at once"
    )
    poll_interval_ms: int = Field(
        default=100, gt=0, le=3_600_000, description="longest wait between rounds"
    )
    finished_retention: int = Field(
        default=FINISHED_RETENTION_MS,
        gt=0,
        le=2 * YEAR_MS,
        description="a FIRED or CANCELLED timer's row is deleted this long after it finished, "
        "with a tombstone in the changelog; must exceed expires_after",
    )
    sweep_limit: int = Field(
        default=250, gt=0, le=MAX_COUNT, description="finished rows deleted per round at most"
    )

    @model_validator(mode="before")
    @classmethod
    def _retention_past_expiry(cls, data: Any) -> Any:
        # Not given, it outlasts `expires_after` (a week, or a day past it): a configuration
        # with a long expiry, from before the retention existed, still starts.
        if not isinstance(data, dict) or data.get("finished_retention") is not None:
            return data
        expires = data.get("expires_after")
        if type(expires) is not int or expires < FINISHED_RETENTION_MS:
            return data  # the default, or the field's own error says why
        return {**data, "finished_retention": min(expires + DAY_MS, 2 * YEAR_MS)}

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

    @property
    def request_id_margin(self) -> int:
        """How much sooner than its target's request-id window runs out a slot's sends
        stop: as long as `expires_after`, at most a day. The window counts from when the
        target applied the slot, on its clock, after the command's trip through the
        broker and the target's backlog: the margin covers those and the clocks' skew. So
        the window is at least `expires_after` plus it (the node's settings), and an
        operator's retry of a slot due longer ago than the window less it is refused
        unless asked past the window (`decisions.retry_parked`)."""
        return min(self.expires_after, DAY_MS)

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
