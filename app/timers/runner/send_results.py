"""What a send came back with (`SendResult`), and what its code means for the slot
(`classify`, `error_of`): pure values and functions the runner's decisions (`decisions`,
which exports all of it too) build on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from app.protocol.wire import ResultCode
from tables.timer import Outcome, error_text

__all__ = [
    "FIRED_OUTCOMES",
    "NOT_CLAIMED",
    "RULE_ERROR",
    "SENT",
    "TIMEOUT",
    "TRANSPORT_ERROR",
    "WITHDRAWN",
    "SendResult",
    "Verdict",
    "classify",
    "error_of",
]

SENT: Final = "SENT"
"""A cross-context send the broker acknowledged: the runner hears no command result."""
TIMEOUT: Final = "TIMEOUT"
"""The runner's code for a send not answered within `TimerOptions.send_timeout`."""
TRANSPORT_ERROR: Final = "TRANSPORT_ERROR"
"""The runner's code for a sender that raised: no transport, a broken connection."""
WITHDRAWN: Final = "WITHDRAWN"
"""A send not made: its row changed since its claim (a cancel, a pause or a reschedule
carried out meanwhile), or its partition was let go; nothing is written of it."""
RULE_ERROR: Final = "RULE_ERROR"
"""The runner's code for a timer parked because no decision could be made on it (its rule's
arithmetic failed: `guarded`)."""

FIRED_OUTCOMES: Final = {
    ResultCode.COMMITTED.value: Outcome.COMMITTED,
    ResultCode.DUPLICATE.value: Outcome.DUPLICATE,
    ResultCode.UNCHANGED.value: Outcome.UNCHANGED,
    # A rejection is the target's state guard doing its work: the slot is done, not retried.
    ResultCode.REJECTED.value: Outcome.REJECTED,
    SENT: Outcome.SENT,
}


@dataclass(frozen=True, slots=True)
class SendResult:
    """What a send came back with: a `ResultCode` value, `SENT`, or a runner failure code."""

    code: str
    message: str = ""


NOT_CLAIMED: Final = SendResult(WITHDRAWN, "its row changed since the claim: not sent")
"""The result of a send `WITHDRAWN`."""


class Verdict(StrEnum):
    FIRED = "FIRED"
    BUSY = "BUSY"
    FAILED = "FAILED"


def classify(code: str) -> Verdict:
    """Whether a result code fired the slot, is backpressure, or a technical failure.

    Anything not known to fire the slot is a failure (unknown codes included): retrying a
    command the target de-duplicates is safe, dropping a slot is not.
    """
    if code in FIRED_OUTCOMES:
        return Verdict.FIRED
    if code == ResultCode.BUSY.value:
        return Verdict.BUSY
    return Verdict.FAILED


def error_of(result: SendResult) -> dict[str, str | None]:
    """The row's error fields after an attempt that came back with `result`: none when the
    target took the command (COMMITTED, DUPLICATE, UNCHANGED, or a cross-context SENT),
    else its code and message (bounded, `tables.timer.error_text`). A REJECTED slot is done
    but its command was refused, so it keeps the target's reason."""
    if classify(result.code) is Verdict.FIRED and result.code != ResultCode.REJECTED.value:
        return {"error_code": None, "error_text": None}
    code = (result.code or "UNKNOWN")[:100]
    return {"error_code": code, "error_text": error_text(result.message)}
