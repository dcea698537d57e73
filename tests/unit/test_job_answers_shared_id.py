"""Two job requests under one request id at once, for two jobs (a deploy's id given to
each): each answer is its own instance's result. Matched by request id alone
(`app.ops.job_log.send_and_wait`), one answer took the other job's: a trigger whose handler
raised was answered 200 COMMITTED, or one that ran a 502."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import MIN, T0, FakeClock, WebNode, web_node

from app.jobs import Job, JobRun, JobScope
from app.service import Service
from tables import IntervalRule

CONTEXT = "ops"
P = 2


def _ok(run: JobRun) -> None:
    pass


def _slow_ok(run: JobRun) -> None:
    time.sleep(0.2)  # decided after the failing one: its result is read last


def _boom(run: JobRun) -> None:
    raise RuntimeError("boom")


GOOD = Job("good", JobScope.SYSTEM, IntervalRule(start=T0, every=MIN), _ok)
BAD = Job("bad", JobScope.SYSTEM, IntervalRule(start=T0, every=MIN), _boom)
SLOW = Job("slow", JobScope.SYSTEM, IntervalRule(start=T0, every=MIN), _slow_ok)
SERVICE = Service(aggregates=(), jobs={CONTEXT: (GOOD, BAD, SLOW)})


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[WebNode]:
    async with web_node(SERVICE, tmp_path, FakeClock(T0 - 30_000), WebNode, partitions=P) as e:
        yield e


async def test_one_request_id_for_two_jobs_at_once_each_answer_is_its_own(edge: WebNode) -> None:
    for job in ("good", "bad"):
        status, answer = await edge.call("POST", f"/jobs/{CONTEXT}/{job}/enable", {})
        assert status == 200, answer
    body = {"request_id": "deploy-42"}
    (s_good, a_good), (s_bad, a_bad) = await asyncio.gather(
        edge.call("POST", f"/jobs/{CONTEXT}/good/trigger", body),
        edge.call("POST", f"/jobs/{CONTEXT}/bad/trigger", body),
    )
    assert (s_good, a_good["outcomes"][0]["code"]) == (200, "COMMITTED"), a_good
    assert (s_bad, a_bad["outcomes"][0]["code"]) == (502, "ERROR"), a_bad


async def test_a_failed_trigger_is_not_answered_as_another_jobs_success(edge: WebNode) -> None:
    for job in ("slow", "bad"):
        status, answer = await edge.call("POST", f"/jobs/{CONTEXT}/{job}/enable", {})
        assert status == 200, answer
    body = {"request_id": "deploy-43"}
    (s_bad, a_bad), (s_slow, a_slow) = await asyncio.gather(
        edge.call("POST", f"/jobs/{CONTEXT}/bad/trigger", body),
        edge.call("POST", f"/jobs/{CONTEXT}/slow/trigger", body),
    )
    # the bad job's handler raised: nothing of its run committed
    assert (s_bad, a_bad["outcomes"][0]["code"]) == (502, "ERROR"), a_bad
    assert (s_slow, a_slow["outcomes"][0]["code"]) == (200, "COMMITTED"), a_slow
