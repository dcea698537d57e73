"""The firing side: decisions (pure), options, and the runner and loop that carry them out."""

from app.runner.decisions import (
    SENT,
    TIMEOUT,
    TRANSPORT_ERROR,
    Action,
    Decision,
    SendResult,
    Verdict,
    classify,
    expire_or_claim,
    on_outcome,
    release,
    retry_parked,
    skip_parked,
)
from app.runner.loop import (
    Clock,
    FiringStore,
    RoundStats,
    Sender,
    SystemClock,
    TimerLoop,
    TimerRunner,
)
from app.runner.options import RetryPolicy, TimerOptions, backoff_ms

__all__ = [
    "SENT",
    "TIMEOUT",
    "TRANSPORT_ERROR",
    "Action",
    "Clock",
    "Decision",
    "FiringStore",
    "RetryPolicy",
    "RoundStats",
    "SendResult",
    "Sender",
    "SystemClock",
    "TimerLoop",
    "TimerOptions",
    "TimerRunner",
    "Verdict",
    "backoff_ms",
    "classify",
    "expire_or_claim",
    "on_outcome",
    "release",
    "retry_parked",
    "skip_parked",
]
