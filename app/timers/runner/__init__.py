"""The firing side: pure decisions, options, ports, and the runner and loop that use them."""

from app.timers.runner.decisions import (
    RULE_ERROR,
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
from app.timers.runner.loop import TimerLoop
from app.timers.runner.options import RetryPolicy, TimerOptions, backoff_ms
from app.timers.runner.ports import BeforeSend, Clock, FiringStore, LocalFirer, Sender, SystemClock
from app.timers.runner.runner import RoundStats, TimerRunner

__all__ = [
    "RULE_ERROR",
    "SENT",
    "TIMEOUT",
    "TRANSPORT_ERROR",
    "Action",
    "BeforeSend",
    "Clock",
    "Decision",
    "FiringStore",
    "LocalFirer",
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
