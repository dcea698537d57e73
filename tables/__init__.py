"""Storage and the record types it stores. Never imports `app`."""

from tables.backends import open_timer_store
from tables.exceptions import InvalidRule, StoreClosed, StoreError, TablesError
from tables.refs import DEFAULT_TENANT, AggregateRef
from tables.rules import CronRule, IntervalRule, OnceRule, ScheduleRule, parse_rule
from tables.store import ChangelogRecord, ChangelogSink, DueRow, TimerStore
from tables.timer import ACTIVE, CommandSpec, Outcome, Timer, TimerChange, TimerStatus

__all__ = [
    "ACTIVE",
    "DEFAULT_TENANT",
    "AggregateRef",
    "ChangelogRecord",
    "ChangelogSink",
    "CommandSpec",
    "CronRule",
    "DueRow",
    "IntervalRule",
    "InvalidRule",
    "OnceRule",
    "Outcome",
    "ScheduleRule",
    "StoreClosed",
    "StoreError",
    "TablesError",
    "Timer",
    "TimerChange",
    "TimerStatus",
    "TimerStore",
    "open_timer_store",
    "parse_rule",
]
