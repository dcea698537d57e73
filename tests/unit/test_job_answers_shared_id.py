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


@pytest.mark.parametrize(
    ("jobs", "request_id"),
    [
        ((("good", 200, "COMMITTED"), ("bad", 502, "ERROR")), "deploy-42"),
        # The failing one decided first, its result read before the other's.
        ((("bad", 502, "ERROR"), ("slow", 200, "COMMITTED")), "deploy-43"),
    ],
)
async def test_one_request_id_for_two_jobs_at_once_each_answer_is_its_own(
    edge: WebNode, jobs: tuple[tuple[str, int, str], ...], request_id: str
) -> None:
    for job, _, _ in jobs:
        status, answer = await edge.call("POST", f"/jobs/{CONTEXT}/{job}/enable", {})
        assert status == 200, answer
    body = {"request_id": request_id}
    answers = await asyncio.gather(
        *(edge.call("POST", f"/jobs/{CONTEXT}/{job}/trigger", body) for job, _, _ in jobs)
    )
    # A handler that raised: nothing of its run committed, whatever the other's answer.
    for (job, status, code), (got, answer) in zip(jobs, answers, strict=True):
        assert (got, answer["outcomes"][0]["code"]) == (status, code), (job, answer)
