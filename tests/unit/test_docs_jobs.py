"""The docs' job examples run as written (#22): docs/operations.md's `curl` lines of "Jobs
over HTTP" against a node running docs/concepts.md's service, and docs/concepts.md's
`tickwheel jobs backfill` lines at the "now" the page gives them, on an instance of that
service decided here."""

from __future__ import annotations

import asyncio
import re
import shlex
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import orjson
import pytest
from fakes import ROOT, WEB_TOKEN, FakeClock, WebNode, doc_modules, web_node
from typer.testing import CliRunner
from yarl import URL

import app.cli.job_options
import app.cli.job_runs
from app.cli import cli
from app.jobs import enable_command, ref_of, schedule_aggregate
from app.kafka.memory import MemoryLog
from app.kafka.records import Replication
from app.model.decide import StoredAggregate, decide
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, CommandResult, EventEnvelope, ResultCode, decode
from tables import AggregateRef

TOKEN = WEB_TOKEN
P = 2
CONCEPTS = ROOT / "docs" / "concepts.md"
OPERATIONS = ROOT / "docs" / "operations.md"
SCHEDULE = AggregateTopics("shop", "schedule")
REPORTS = AggregateTopics("shop", "report")


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


@pytest.fixture
def myjobs(tmp_path: Path) -> Iterator[ModuleType]:
    """docs/concepts.md's `myjobs` module (and the `mymodule` it imports), importable."""
    for name, code in doc_modules(CONCEPTS).items():
        (tmp_path / f"{name}.py").write_text(code)
    sys.path.insert(0, str(tmp_path))
    before = set(sys.modules)
    try:
        import myjobs  # type: ignore[import-not-found]

        yield myjobs
    finally:
        sys.path.remove(str(tmp_path))
        for name in set(sys.modules) - before:
            if str(tmp_path) in str(getattr(sys.modules[name], "__file__", "") or ""):
                del sys.modules[name]


# --- docs/concepts.md: `tickwheel jobs backfill` at the page's "now" ------------------------


def concepts_now() -> int:
    (now,) = re.findall(r'their "now" is `([^`]+)`', CONCEPTS.read_text())
    return ms(now)


def backfill_lines() -> list[list[str]]:
    """The page's backfill lines as written, without their optional parts (`[--tenant t1]`:
    the page's job is a SYSTEM one)."""
    text = CONCEPTS.read_text()
    lines = re.findall(r"^tickwheel jobs backfill .*$", text, flags=re.M)
    return [shlex.split(re.sub(r" \[[^\]]*\]", "", line))[1:] for line in lines]


def test_the_concepts_backfill_lines_run_at_their_now(
    myjobs: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = concepts_now()
    service = myjobs.service
    agg = schedule_aggregate("shop", service.jobs["shop"], 12)
    (nightly,) = service.jobs["shop"]
    instance = ref_of("shop", nightly)
    # Enabled a month before, then a week's outage: no slot of the range ran live.
    enabled_at = now - 30 * 24 * 3_600_000
    stored: list[StoredAggregate | None] = [None]
    log: list[EventEnvelope] = []
    seen: set[str] = set()

    def run(cmd: CommandEnvelope, at: int) -> ResultCode:
        d = decide(agg, stored[0], cmd, now=at, seen=cmd.request_id in seen)
        if d.stored is not None:
            stored[0] = d.stored
            seen.add(cmd.request_id)
            log.extend(d.events)
        return d.code

    assert run(enable_command("shop", nightly, now=enabled_at), enabled_at) is (
        ResultCode.COMMITTED
    )

    async def events(
        bootstrap: object, ref: AggregateRef, partitions: int, limits: object
    ) -> list[Any]:
        assert ref == instance
        return list(log)

    async def send(
        bootstrap: object,
        partitions: int,
        commands: list[CommandEnvelope],
        wait: float,
        replication: Replication,
    ) -> dict[str, CommandResult]:
        return {
            c.request_id: CommandResult(
                request_id=c.request_id, aggregate=c.aggregate, code=run(c, now), decided_at=now
            )
            for c in commands
        }

    monkeypatch.setattr(app.cli.job_runs, "read_instance_events", events)
    monkeypatch.setattr(app.cli.job_options, "send_and_wait", send)
    monkeypatch.setattr(app.cli.job_runs, "now_ms", lambda: now)
    dry, real = backfill_lines()
    assert "--dry-run" in dry and "--dry-run" not in real
    shown = CliRunner().invoke(cli, [*dry, "--json"])
    assert shown.exit_code == 0, shown.output
    slots = [orjson.loads(line) for line in shown.stdout.splitlines()]
    # 2 to 7 November at 02:00 in Berlin (01:00 UTC), as the page says
    assert [s["due_at"] for s in slots] == [ms(f"2026-11-0{d}T02:00:00+01:00") for d in range(2, 8)]
    assert not any(e.type == "wow.schedule.Backfilled" for e in log)
    ran = CliRunner().invoke(cli, [*real, "--json"])
    assert ran.exit_code == 0, ran.output
    assert [orjson.loads(line)["code"] for line in ran.stdout.splitlines()] == ["COMMITTED"] * 6
    again = CliRunner().invoke(cli, real)
    assert again.exit_code == 0 and again.stdout.count(": DUPLICATE") == 6, again.output


# --- docs/operations.md: the curl lines of "Jobs over HTTP" ----------------------------------


def curl_lines() -> list[str]:
    text = OPERATIONS.read_text()
    section = text[text.index("### Jobs over HTTP") :]
    section = section[: section.index("\n### ", 1)]
    return re.findall(r"^curl .*$", section, flags=re.M)


async def until(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


def events(log: MemoryLog, topics: AggregateTopics, type_: str) -> list[EventEnvelope]:
    return [
        e
        for p in range(P)
        for r in log.records(topics.events, p)
        if (e := decode(EventEnvelope, r.value)).type == type_
    ]


def sent(log: MemoryLog) -> int:
    return sum(len(log.records(SCHEDULE.commands, p, committed=False)) for p in range(P))


@pytest.fixture
async def edge(myjobs: ModuleType, tmp_path: Path) -> AsyncIterator[WebNode]:
    clock = FakeClock(ms("2026-10-31T12:00:00+01:00"))
    async with web_node(myjobs.service, tmp_path, clock, WebNode, partitions=P) as e:
        yield e


async def curl(http: aiohttp.ClientSession, base: URL, line: str) -> tuple[int, Any]:
    words = shlex.split(line.replace("$TICKWHEEL_WEB_TOKEN", TOKEN))
    method = words[words.index("-X") + 1] if "-X" in words else "GET"
    headers = dict(words[i + 1].split(": ", 1) for i, w in enumerate(words) if w == "-H")
    body = words[words.index("-d") + 1] if "-d" in words else None
    url = URL(words[-1])
    assert (url.host, url.port) == ("127.0.0.1", 8080)
    async with http.request(
        method, base.with_path(url.path).with_query(url.query), data=body, headers=headers
    ) as r:
        return r.status, await r.json()


async def test_the_operations_curl_lines_are_answered_as_they_say(edge: WebNode) -> None:
    log, clock, base = edge.log, edge.clock, edge.url
    enable, trigger, disable, backfill, listing = curl_lines()
    async with aiohttp.ClientSession() as http:
        status, enabled = await curl(http, base, enable)
        assert (status, enabled["outcomes"][0]["code"]) == (200, "COMMITTED"), enabled
        assert enabled["outcomes"][0]["request_id"] == "enable:resume-1"
        for _ in range(2):  # sent again with its request id: it runs once
            status, triggered = await curl(http, base, trigger)
            assert status == 200, triggered
        assert triggered["outcomes"][0]["code"] == "DUPLICATE"
        await until(lambda: len(events(log, REPORTS, "shop.ReportRan")) == 1)
        status, paused = await curl(http, base, disable)
        assert (status, paused["outcomes"][0]["request_id"]) == (200, "disable:pause-1"), paused

        clock.set(concepts_now())  # 2026-11-08T09:00:00+01:00, paused all week
        before = sent(log)
        status, planned = await curl(http, base, backfill)
        assert (status, planned["dry_run"]) == (200, True), planned
        assert [o["due_at"] for o in planned["outcomes"]] == [
            ms(f"2026-11-0{d}T02:00:00+01:00") for d in range(2, 8)
        ]
        assert sent(log) == before, "a dry run sends nothing"

        status, listed = await curl(http, base, listing)
        assert status == 200, listed
        (job,) = listed["jobs"]
        assert (job["job"], job["scope"]) == ("unpaid-report", "SYSTEM")
        (state,) = job["state"]
        assert state["enabled"] is False and state["job"] == "unpaid-report"
