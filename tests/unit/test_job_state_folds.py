"""`GET /jobs?state=true` needs no token and folds schedule logs kept for good, one read at
a time with a backfill's plan (`app.ops.whole_reads`): lists share one fold and its result
for `STATE_FRESH_MS`, and a waiting backfill goes before any fold not begun. A loop of
tokenless lists had made two of three operators' backfills a 503."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import MIN, T0, FakeClock, WebNode, wait_until, web_node
from pydantic import BaseModel

import app.ops.job_api
import app.ops.job_routes
from app.jobs import Job, JobRun, JobScope
from app.model.aggregate import AggregateType, Command, Decision
from app.ops.whole_reads import STATE_FRESH_MS, Turns
from app.service import Service
from tables import AggregateRef, IntervalRule

P = 2
CONTEXT = "ops"
LIST = "/jobs?state=true"
BACKFILL = f"/jobs/{CONTEXT}/minutely/backfill"
DRY_RUN = {"from": T0 - 3 * MIN, "until": T0 - MIN, "dry_run": True}


class Report(BaseModel):
    runs: int = 0


report = AggregateType(CONTEXT, "report", Report)


@report.command("Run")
def _run(state: Report, cmd: Command, d: Decision) -> None:
    d.emit("Ran", {})


def _handler(run: JobRun) -> None:
    run.send(AggregateRef(context=CONTEXT, aggregate="report", id="r-1"), "Run", {})


MINUTELY = Job("minutely", JobScope.SYSTEM, IntervalRule(start=T0 - 60 * MIN, every=MIN), _handler)
SERVICE = Service(aggregates=(report,), jobs={CONTEXT: (MINUTELY,)})


class SlowFolds:
    """`job_api.read_instances`, each call held until its gate is set: the first call's
    `first`, any later one's `later` (a long schedule log)."""

    def __init__(self) -> None:
        self.calls = 0
        self.first, self.later = asyncio.Event(), asyncio.Event()
        self._real = app.ops.job_api.read_instances

    async def __call__(self, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        self.args = args
        await (self.first if self.calls == 1 else self.later).wait()
        return await self._real(*args, **kw)

    def release(self) -> None:
        self.first.set()
        self.later.set()


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[WebNode]:
    async with web_node(SERVICE, tmp_path, FakeClock(T0), WebNode, partitions=P) as e:
        yield e


@pytest.fixture
def folds(monkeypatch: pytest.MonkeyPatch) -> SlowFolds:
    slow = SlowFolds()
    monkeypatch.setattr(app.ops.job_api, "read_instances", slow)
    return slow


async def test_state_lists_share_one_fold_and_a_waiting_backfill_goes_before_a_new_one(
    edge: WebNode, folds: SlowFolds, monkeypatch: pytest.MonkeyPatch
) -> None:
    planning = asyncio.Event()
    refs = app.ops.job_api.instance_refs

    def instance_refs(*args: Any, **kw: Any) -> Any:
        planning.set()  # the backfill asks for its turn next, without a pause
        return refs(*args, **kw)

    monkeypatch.setattr(app.ops.job_api, "instance_refs", instance_refs)

    def lists(n: int) -> list[asyncio.Task[tuple[int, Any]]]:
        return [asyncio.create_task(edge.call("GET", LIST, token=None)) for _ in range(n)]

    early = lists(5)  # tokenless
    late: list[asyncio.Task[tuple[int, Any]]] = []
    backfill: asyncio.Task[tuple[int, Any]] | None = None
    try:
        await wait_until(lambda: folds.calls == 1)
        backfill = asyncio.create_task(edge.call("POST", BACKFILL, DRY_RUN))
        await planning.wait()
        late = lists(5)
        folds.first.set()  # the first fold ends; any other would wait on `later`
        status, planned = await asyncio.wait_for(backfill, 30)
        assert status == 200 and planned["dry_run"], planned  # it was a 503 after 5 s
        answers = await asyncio.wait_for(asyncio.gather(*early, *late), 30)
        assert [s for s, _ in answers] == [200] * 10
        assert all(a == answers[0][1] for _, a in answers)  # one fold's answer
        assert answers[0][1]["jobs"][0]["state"] == []  # as a fold of its own has it
        assert folds.calls == 1
    finally:
        folds.release()
        await asyncio.gather(
            *early, *late, *([backfill] if backfill else []), return_exceptions=True
        )


async def test_a_state_list_answers_a_fold_at_most_fresh_ms_old_and_a_write_reads_anew(
    edge: WebNode, folds: SlowFolds
) -> None:
    folds.release()
    status, first = await edge.call("GET", LIST, token=None)
    assert status == 200 and first["jobs"][0]["state"] == []
    # Held to the node's own record bounds, as its workers hold the log.
    assert folds.args[-1] is edge.node.limits
    edge.clock.set(T0 + STATE_FRESH_MS)
    assert await edge.call("GET", LIST, token=None) == (200, first)
    assert await edge.call("GET", f"{LIST}&context={CONTEXT}", token=None) == (200, first)
    assert folds.calls == 1
    edge.clock.set(T0 + STATE_FRESH_MS + 1)
    assert await edge.call("GET", LIST, token=None) == (200, first)
    assert folds.calls == 2
    # a write through the node's job routes: its own list reads it, however fresh
    status, enabled = await edge.call("POST", f"/jobs/{CONTEXT}/minutely/enable", {})
    assert status == 200, enabled
    status, listed = await edge.call("GET", LIST, token=None)
    assert (status, folds.calls) == (200, 3)
    assert [s["enabled"] for s in listed["jobs"][0]["state"]] == [True]


async def test_a_fold_whose_turn_does_not_come_in_time_is_a_503(
    edge: WebNode, folds: SlowFolds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backfill's plan holding the turn (a long range): a list then waits for its fold's
    turn no longer than STATE_WAIT_S, nor does a backfill behind it."""
    monkeypatch.setattr(app.ops.job_routes, "STATE_WAIT_S", 0.3)
    gate, planning = asyncio.Event(), asyncio.Event()
    plan = app.ops.job_api.plan_backfill

    async def slow_plan(*args: Any, **kw: Any) -> Any:
        planning.set()
        await gate.wait()
        return await plan(*args, **kw)

    monkeypatch.setattr(app.ops.job_api, "plan_backfill", slow_plan)
    first = asyncio.create_task(edge.call("POST", BACKFILL, DRY_RUN))
    try:
        await planning.wait()
        async with (
            asyncio.timeout(10),
            edge.http.get(edge.url.with_path("/jobs").with_query(state="true")) as r,
        ):
            assert (r.status, r.headers["Retry-After"]) == (503, "1")  # 0.3 s, in whole s
            assert "another state=true list or backfill" in (await r.json())["error"]
        status, answer = await edge.call("POST", BACKFILL, DRY_RUN)
        assert status == 503 and "or backfill is being read" in answer["error"]
        assert folds.calls == 0
        gate.set()
        status, planned = await asyncio.wait_for(first, 30)
        assert status == 200, planned
    finally:
        gate.set()
        folds.release()
        await asyncio.gather(first, return_exceptions=True)


async def test_a_waiting_backfill_takes_the_turn_before_a_fold_that_asked_earlier() -> None:
    turns = Turns()
    assert await turns.take(backfill=False, wait_s=1)
    order: list[str] = []

    async def take(name: str, backfill: bool) -> None:
        assert await turns.take(backfill=backfill, wait_s=30)
        order.append(name)
        turns.release()

    fold = asyncio.create_task(take("fold", backfill=False))
    await asyncio.sleep(0)  # queued
    backfill = asyncio.create_task(take("backfill", backfill=True))
    await asyncio.sleep(0)
    assert turns.backfill_waiting
    turns.release()
    await asyncio.wait_for(asyncio.gather(fold, backfill), 30)
    assert order == ["backfill", "fold"]
    assert not turns.backfill_waiting
    # a wait that ends unanswered leaves the turn free
    assert await turns.take(backfill=False, wait_s=1)
    assert not await turns.take(backfill=True, wait_s=0)
    turns.release()
    assert await turns.take(backfill=True, wait_s=0)
