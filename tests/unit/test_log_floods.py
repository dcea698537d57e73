"""Lines whose rate another party sets (a writer of garbage, a failing store or job) are
logged once in full, then counted: at most one per kind and interval (`LogLimit`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from fakes import T0, World, raw_store, until, world

from app.jobs import JobRun
from app.jobs.declaration import Job, JobScope
from app.jobs.runs import run_handler
from app.kafka import Record, TopicSpec
from app.kafka.memory import MemoryLog
from app.log_limit import LogLimit
from app.model.aggregate import Decision
from app.protocol.topics import ContextTopics
from app.protocol.wire import CommandResult, ResultCode, encode
from app.timers.ledger import LedgerView
from app.timers.runner import RoundStats, TimerLoop
from app.timers.runner.loop import FAILED_ROUND_RETRY_MS
from app.timers.sender import ResultsReader
from tables import AggregateRef
from tables.rules import IntervalRule

__all__ = ["raw_store", "world"]  # the fixtures, imported for pytest


class Seconds:
    """A log clock that moves only when a test moves it."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


# --- the limit ------------------------------------------------------------------------------


def test_the_first_passes_repeats_are_counted_and_told_once_the_interval_passed() -> None:
    clock = Seconds()
    limit = LogLimit(60, clock)
    assert limit.check("a") == ""
    assert [limit.check("a") for _ in range(3)] == [None, None, None]
    assert limit.check("b") == "", "another kind is its own"
    clock.t += 59.9
    assert limit.check("a") is None
    clock.t += 0.2
    assert limit.check("a") == " (4 more like it in the last 60 s, not logged)"
    clock.t += 61
    assert limit.check("a") == "", "none held back since the last line"


def test_kinds_past_the_cap_share_one_and_a_clock_gone_back_lets_a_line_pass() -> None:
    clock = Seconds()
    limit = LogLimit(60, clock, max_kinds=2)
    assert (limit.check(1), limit.check(2), limit.check(3), limit.check(4)) == ("", "", "", None)
    clock.t -= 1
    assert limit.check(1) == ""


# --- the four places ------------------------------------------------------------------------


async def test_garbage_on_the_results_topic_is_logged_once_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    results = ContextTopics("shop").results
    log = MemoryLog([TopicSpec(results, 1)])
    clock = Seconds()
    reader = ResultsReader(log.follower, "shop", log_limit=LogLimit(60, clock))
    await reader.start()
    await reader.add_partition(0)
    target = AggregateRef(context="shop", aggregate="order", id="o-2")

    async def garbage_then_an_answer(n: int, request_id: str) -> None:
        """`n` unreadable results, then one read to its end: all of them were read."""
        answer = reader.expect(request_id, target)
        for _ in range(n):
            await log.publisher().send(results, b"k", b"{not json", 0)
        ok = CommandResult(
            request_id=request_id, code=ResultCode.COMMITTED, aggregate=target, decided_at=T0
        )
        await log.publisher().send(results, b"k", encode(ok), 0)
        await asyncio.wait_for(answer, 5)

    try:
        with caplog.at_level(logging.WARNING, "app.timers.sender"):
            await garbage_then_an_answer(5, "t-1#0")
            [first] = lines(caplog, "unreadable result")
            assert first.getMessage().startswith(f"unreadable result at {results}[0]@0: ")
            clock.t += 60
            await garbage_then_an_answer(1, "t-1#1")
    finally:
        await reader.stop()
    [_, later] = lines(caplog, "unreadable result")
    assert f"{results}[0]@6: " in later.getMessage()
    assert later.getMessage().endswith(" (4 more like it in the last 60 s, not logged)")


def test_bad_ledger_records_are_logged_once_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Seconds()
    view = LedgerView(log_limit=LogLimit(60, clock))
    topic = "shop.failure-ledger"
    for offset in range(1, 6):
        assert not view.apply_record(Record(topic, 2, offset, b"garbage", b"{}", 0))
    [first] = lines(caplog, "skipping")
    assert first.levelno == logging.ERROR
    assert first.getMessage().startswith(f"skipping {topic}[2]@1: ")
    clock.t += 60
    assert not view.apply_record(Record(topic, 2, 9, None, b"{}", 0))
    [_, later] = lines(caplog, "skipping")
    assert later.getMessage().startswith(f"skipping {topic}[2]@9: ")
    assert later.getMessage().endswith(" (4 more like it in the last 60 s, not logged)")


async def test_a_round_failing_for_ever_logs_one_traceback_an_interval(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Seconds()
    loop = TimerLoop(world.runner(), log_limit=LogLimit(60, clock))
    fault: type[Exception] = OSError

    async def failing() -> RoundStats:
        raise fault("store unavailable")

    loop.round = failing  # type: ignore[method-assign]

    async def failed_rounds(n: int) -> None:
        """`n` more failed rounds, the loop then waiting for its next."""
        for _ in range(n):
            if loop.failures_in_a_row:
                world.clock.advance(FAILED_ROUND_RETRY_MS)
            else:
                loop.start()
            await until(waiting_after(loop.failures_in_a_row + 1))

    def waiting_after(failures: int) -> Callable[[], bool]:
        return lambda: loop.failures_in_a_row == failures and bool(world.clock.sleeping_until)

    def tracebacks() -> list[logging.LogRecord]:
        return [r for r in lines(caplog, "timer round failed") if r.exc_info is not None]

    with caplog.at_level(logging.ERROR, "app.timers.runner.loop"):
        try:
            await failed_rounds(5)
            assert len(tracebacks()) == 1
            fault = RuntimeError  # another fault: in full at once
            await failed_rounds(1)
            assert [r.exc_info[0] for r in tracebacks() if r.exc_info] == [OSError, RuntimeError]
            fault = OSError
            clock.t += 60
            await failed_rounds(1)
        finally:
            await loop.stop()
    assert loop.failures_in_a_row == 7, "every round still tried, one a second"
    assert len(tracebacks()) == 3
    assert tracebacks()[-1].getMessage().endswith(" more like it in the last 60 s, not logged)")


def test_a_failing_job_logs_one_traceback_an_interval_per_job_and_fault(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handler(run: JobRun) -> None:
        raise ValueError(f"no report for slot {run.slot}")

    rule = IntervalRule(start=T0, every=1_000)
    jobs = [Job(name, JobScope.TENANT, rule, handler) for name in ("report", "other")]
    clock = Seconds()
    limit = LogLimit(60, clock)

    def run(job: Job, tenant: str, slot: int) -> str | None:
        instance = AggregateRef(context="shop", aggregate="schedule", tenant=tenant, id=job.name)
        decision = Decision(aggregate=instance, now=T0, request_id=f"tick#{slot}")
        return run_handler(
            job,
            JobRun("shop", job.name, job.name, tenant, None, slot, T0, "tick", T0, decision),
            log_limit=limit,
        )

    errors = [run(jobs[0], f"t-{n}", n) for n in range(1_000)]
    assert errors == [f"ValueError('no report for slot {n}')" for n in range(1_000)]
    assert run(jobs[1], "t-0", 0) is not None
    logged = [r for r in lines(caplog, "failed") if r.exc_info is not None]
    assert [r.getMessage().split(" on ")[0] for r in logged] == ["job report", "job other"]
    clock.t += 60
    run(jobs[0], "t-0", 1_000)
    last = lines(caplog, "failed")[-1]
    assert last.getMessage().endswith(" (999 more like it in the last 60 s, not logged)")
