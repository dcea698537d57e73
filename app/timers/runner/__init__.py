"""The firing side: pure decisions, options, ports, and the runner and loop that use them."""

from app.timers.runner.decision_types import Action, Decision
from app.timers.runner.decisions import (
    RULE_ERROR,
    SENT,
    TIMEOUT,
    TRANSPORT_ERROR,
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
from app.timers.runner.partition import InProcessTargets, PartitionFiring
from app.timers.runner.ports import Clock, FiringStore, Sender, SystemClock
from app.timers.runner.rounds import Round
from app.timers.runner.runner import RoundStats, TimerRunner

__all__ = [
    "RULE_ERROR",
    "SENT",
    "TIMEOUT",
    "TRANSPORT_ERROR",
    "Action",
    "Clock",
    "Decision",
    "FiringStore",
    "InProcessTargets",
    "PartitionFiring",
    "RetryPolicy",
    "Round",
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
