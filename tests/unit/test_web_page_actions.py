"""The operator page's timer and job buttons (`app.ops.page_actions`, #22) on a whole node on
the in-memory log with a fake clock: each button's form is on the page with its hidden
fields, posting it sends its command (seen on the log) and redirects back with a
confirmation, a form submitted again is the same request (DUPLICATE, nothing written
twice), a form without the web token, with a forged one or from another site is refused,
and a bad form is a 400 page naming its field that sends nothing."""

from __future__ import annotations

import asyncio
import contextlib
import html as html_lib
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fakes import MIN, T0, WEB_TOKEN, FakeClock, WebNode, web_node
from pydantic import BaseModel
from yarl import URL

from app.clients.book_commands import scoped_request_id, unscoped_request_id
from app.clients.timer_book import timer_book
from app.errors import BadRecord
from app.jobs import Job, JobRun, JobScope
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, EventEnvelope, decode
from app.service import Service
from tables import AggregateRef, IntervalRule, Timer, TimerChange, TimerStatus

P = 2
TOKEN = WEB_TOKEN
BOOK = AggregateTopics("shop", "reminders")
ORDERS = AggregateTopics("shop", "order")
SCHEDULE = AggregateTopics("shop", "schedule")
TARGET = AggregateRef(context="shop", aggregate="order", id="p-1")


class Pings(BaseModel):
    n: int = 0


order = AggregateType("shop", "order", Pings)


@order.command("RemindToPay")
def _ping(state: Pings, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {"n": state.n + 1})


@order.command("Run")
def _run(state: Pings, cmd: Command, d: Decision) -> None:
    d.emit("Ran", {"slot": cmd.body["slot"]})


def _handler(run: JobRun) -> None:
    run.send(TARGET, "Run", {"slot": run.slot})


NIGHTLY = Job(
    "nightly", JobScope.SYSTEM, IntervalRule(start=T0 + 60 * MIN, every=60 * MIN), _handler
)
SERVICE = Service(aggregates=(timer_book("shop", "reminders"), order), jobs={"shop": (NIGHTLY,)})


def events(log: MemoryLog, topics: AggregateTopics, type_: str) -> list[EventEnvelope]:
    out = []
    for p in range(P):
        for r in log.records(topics.events, p):
            with contextlib.suppress(BadRecord):
                if (e := decode(EventEnvelope, r.value)).type == type_:
                    out.append(e)
    return out


def commands(log: MemoryLog, topics: AggregateTopics) -> list[CommandEnvelope]:
    return [
        decode(CommandEnvelope, r.value)
        for p in range(P)
        for r in log.records(topics.commands, p, committed=False)
    ]


def book_rows(log: MemoryLog) -> dict[str, Timer]:
    latest: dict[bytes, bytes | None] = {}
    for p in range(P):
        for r in log.records(BOOK.timers_changelog, p):
            assert r.key is not None
            latest[r.key] = r.value
    rows = [Timer.model_validate_json(v) for v in latest.values() if v is not None]
    return {t.key: t for t in rows}


async def until(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


class Site(WebNode):
    """The node of `SERVICE` with its web edge and page (`fakes.web_node`), on a fake clock;
    its session keeps the page's cookie."""

    async def page(self, **query: str) -> str:
        async with self.http.get(self.url.with_query(query)) as r:
            assert r.status == 200
            return await r.text()

    async def post(
        self, path: str, form: dict[str, str], *, headers: dict[str, str] | None = None
    ) -> tuple[int, str, str | None]:
        async with self.http.post(
            self.url.with_path(path), data=form, headers=headers, allow_redirects=False
        ) as r:
            return r.status, await r.text(), r.headers.get("Location")

    async def notice(self, location: str) -> str:
        async with self.http.get(self.url.join(URL(location))) as r:
            found = re.search(r'<div class="notice" id="notice">(.*?)</div>', await r.text(), re.S)
            assert found is not None, "no confirmation on the page"
            return html_lib.unescape(found.group(1))


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    async with web_node(SERVICE, tmp_path, FakeClock(T0), Site, partitions=P, cookies=True) as s:
        yield s


async def set_timer(site: Site, owner: str, key: str) -> None:
    body = {
        "rule": {"kind": "once", "at": T0 + 60 * MIN},
        "target": {"type": "shop.order", "id": "p-1"},
        "command": {"type": "RemindToPay"},
    }
    status, answer = await site.call("PUT", f"/timers/shop.reminders/{owner}/{key}", body)
    assert status == 200, answer
    await until(lambda: key in book_rows(site.log))


def forms(html: str, css: str) -> list[tuple[dict[str, str], list[str]]]:
    """Each form of class `css`: its hidden fields and its buttons' actions."""
    out = []
    for form in re.findall(rf'<form class="inline {css}"(.*?)</form>', html, re.S):
        hidden = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', form))
        out.append((hidden, re.findall(r'name="action" value="(\w+)"', form)))
    return out


def with_token(hidden: dict[str, str], action: str) -> dict[str, str]:
    return {**hidden, "action": action, "web_token": TOKEN}


# --- the timers' buttons -------------------------------------------------------------------


async def test_a_book_timer_has_its_form_and_pause_then_resume_change_its_status(
    site: Site,
) -> None:
    await set_timer(site, "o-1", "remind")
    [(hidden, buttons)] = forms(await site.page(owner="o-1"), "timer-actions")
    assert buttons == ["pause", "trigger", "cancel"]
    rid = hidden.pop("request_id")
    assert re.fullmatch(r"[0-9a-f]{32}", rid)
    assert hidden == {
        "type": "shop.reminders",
        "owner": "o-1",
        "tenant": "(0)",
        "key": "remind",
        "back": "/?owner=o-1",
    }
    status, _, location = await site.post(
        "/page/timer", with_token({**hidden, "request_id": rid}, "pause")
    )
    assert status == 303 and location == f"/?owner=o-1&done={rid}.pause"
    [sent] = [c for c in commands(site.log, BOOK) if c.type == "wow.PauseTimer"]
    # The form's id, scoped to the change (`scoped_request_id`).
    assert (unscoped_request_id(sent.request_id), sent.aggregate.id, sent.body) == (
        f"{rid}.pause",
        "o-1",
        {"key": "remind"},
    )
    assert "COMMITTED" in await site.notice(location)
    await until(lambda: book_rows(site.log)["remind"].status is TimerStatus.PAUSED)

    # The page now offers Resume (the cookie the token set carries the next form).
    [(hidden, buttons)] = forms(await site.page(owner="o-1"), "timer-actions")
    assert buttons == ["resume", "trigger", "cancel"]
    status, _, location = await site.post("/page/timer", {**hidden, "action": "resume"})
    assert status == 303 and location is not None
    await until(lambda: book_rows(site.log)["remind"].status is TimerStatus.PENDING)


async def test_trigger_now_sends_the_command_once_and_cancel_ends_the_timer(site: Site) -> None:
    await set_timer(site, "o-2", "k")
    [(hidden, _)] = forms(await site.page(owner="o-2"), "timer-actions")
    status, _, _ = await site.post("/page/timer", with_token(hidden, "trigger"))
    assert status == 303
    await until(lambda: len(events(site.log, ORDERS, "Pinged")) == 1)
    status, _, location = await site.post("/page/timer", with_token(hidden, "cancel"))
    assert status == 303 and location is not None
    [sent] = [c for c in commands(site.log, BOOK) if c.type == "wow.CancelTimer"]
    assert sent.request_id == scoped_request_id("cancel", "k", f"{hidden['request_id']}.cancel")
    await until(lambda: book_rows(site.log)["k"].status is TimerStatus.CANCELLED)
    # An ended timer has no buttons.
    assert '<form class="inline timer-actions"' not in await site.page(owner="o-2")


async def test_a_form_submitted_again_is_the_same_request_and_writes_nothing_more(
    site: Site,
) -> None:
    await set_timer(site, "o-3", "k")
    [(hidden, _)] = forms(await site.page(owner="o-3"), "timer-actions")
    first = await site.post("/page/timer", with_token(hidden, "pause"))
    again = await site.post("/page/timer", with_token(hidden, "pause"))
    assert first[0] == again[0] == 303 and first[2] == again[2]
    assert again[2] is not None and "DUPLICATE" in await site.notice(again[2])
    assert len([c for c in commands(site.log, BOOK) if c.type == "wow.PauseTimer"]) == 2
    assert len(events(site.log, BOOK, "wow.SchedulePaused")) == 1


@pytest.mark.parametrize(
    ("token", "headers", "status"),
    [
        (None, {}, 401),
        (None, {"Accept": "text/html"}, 401),  # a browser: the page asking for the token
        ("forged", {}, 401),
        (TOKEN, {"Origin": "http://evil.example"}, 403),
        (TOKEN, {"Origin": "http://["}, 403),  # no URL yarl reads: not a 500
        (TOKEN, {"Sec-Fetch-Site": "cross-site"}, 403),
    ],
)
async def test_a_form_without_the_token_or_from_another_site_is_refused(
    site: Site, token: str | None, headers: dict[str, str], status: int
) -> None:
    await set_timer(site, "o-4", "k")
    [(hidden, _)] = forms(await site.page(owner="o-4"), "timer-actions")
    form = {**hidden, "action": "pause"} | ({"web_token": token} if token else {})
    got, _, _ = await site.post("/page/timer", form, headers=headers)
    assert got == status
    job = {"context": "shop", "job": "nightly", "request_id": "r", "action": "trigger"}
    got, _, _ = await site.post(
        "/page/job", job | ({"web_token": token} if token else {}), headers=headers
    )
    assert got == status
    assert [c.type for c in commands(site.log, BOOK)] == ["wow.SetTimer"]
    assert commands(site.log, SCHEDULE) == []


async def test_a_broker_away_is_a_503_page_and_the_form_sent_again_is_carried_out_once(
    site: Site,
) -> None:
    await set_timer(site, "o-6", "k")
    [(hidden, _)] = forms(await site.page(owner="o-6"), "timer-actions")
    site.log.down = True
    status, body, _ = await site.post("/page/timer", with_token(hidden, "pause"))
    assert status == 503
    assert "submit the form again" in html_lib.unescape(body)
    site.log.down = False
    await until(lambda: bool(site.node.health()["ready"]) and len(site.node.owned) == P)
    status, _, location = await site.post("/page/timer", with_token(hidden, "pause"))
    assert status == 303 and location is not None
    assert "COMMITTED" in await site.notice(location)
    await until(lambda: book_rows(site.log)["k"].status is TimerStatus.PAUSED)
    assert len(events(site.log, BOOK, "wow.SchedulePaused")) == 1


GOOD_TIMER = {
    "type": "shop.reminders",
    "owner": "o-5",
    "key": "k",
    "request_id": "r-1",
    "action": "pause",
}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"action": "explode"}, "action"),
        ({"key": ""}, "key"),
        ({"owner": None}, "owner"),
        ({"request_id": None}, "request_id"),
        ({"type": "shop.order"}, "type"),
        ({"tenant": "t" * 201}, "tenant"),
        ({"extra": "1"}, "extra"),
    ],
)
async def test_a_bad_timer_form_is_a_400_naming_its_field_and_sends_nothing(
    site: Site, change: dict[str, str | None], named: str
) -> None:
    form = {k: v for k, v in (GOOD_TIMER | change).items() if v is not None}
    status, body, _ = await site.post("/page/timer", form | {"web_token": TOKEN})
    assert status == 400
    assert re.search(rf"\b{named}\b", html_lib.unescape(body)), body
    assert commands(site.log, BOOK) == []


async def test_a_field_given_twice_is_a_400(site: Site) -> None:
    form = aiohttp.FormData([*GOOD_TIMER.items(), ("key", "other"), ("web_token", TOKEN)])
    async with site.http.post(site.url.with_path("/page/timer"), data=form) as r:
        assert r.status == 400
        assert "'key' given more than once" in html_lib.unescape(await r.text())
    assert commands(site.log, BOOK) == []


# --- the jobs' buttons ---------------------------------------------------------------------


def declared_row(html: str) -> list[str]:
    row = html.split('<tr class="declared-job">', 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    return [html_lib.unescape(re.sub(r"<[^>]+>", "", c).strip()) for c in cells]


async def test_every_declared_job_is_listed_with_its_next_slot_and_its_form(site: Site) -> None:
    html = await site.page()
    row = declared_row(html)
    assert row[:3] == ["shop", "nightly", "SYSTEM"]
    assert row[4:8] == ["1", "no timer reported (not enabled?)", "—", "—"]
    [(hidden, buttons)] = forms(html, "job-actions")
    assert buttons == ["trigger", "enable", "disable"]
    assert set(hidden) == {"context", "job", "request_id", "back"}
    assert (hidden["context"], hidden["job"], hidden["back"]) == ("shop", "nightly", "/")
    # Enabled from the page, its instance's timer is reported with its next slot.
    status, _, location = await site.post("/page/job", with_token(hidden, "enable"))
    assert status == 303 and location is not None
    [sent] = commands(site.log, SCHEDULE)
    assert (sent.type, sent.request_id) == ("wow.schedule.Enable", f"enable:{hidden['request_id']}")
    assert "COMMITTED" in await site.notice(location)
    await until(lambda: [t.status for t in job_timers(site)] == [TimerStatus.PENDING])
    row = declared_row(await site.page())
    assert row[5].endswith("(in 1.0 h)") and row[6] == "PENDING x1", row


def job_timers(site: Site) -> list[Timer]:
    out = []
    for p in range(P):
        latest: dict[bytes, bytes | None] = {}
        for r in site.log.records(SCHEDULE.timers_changelog, p):
            assert r.key is not None
            latest[r.key] = r.value
        out += [Timer.model_validate_json(v) for v in latest.values() if v is not None]
    return out


async def test_trigger_runs_the_job_once_even_submitted_twice(site: Site) -> None:
    [(hidden, _)] = forms(await site.page(), "job-actions")
    status, _, location = await site.post("/page/job", with_token(hidden, "trigger"))
    assert status == 303 and location is not None  # refused: said so on the page
    assert "SCHEDULE_JOB_INVALID" in await site.notice(location)
    assert "never enabled: enable it first" in await site.notice(location)
    assert (await site.post("/page/job", with_token(hidden, "enable")))[0] == 303
    await until(lambda: len(job_timers(site)) == 1)
    sent_before = len(commands(site.log, SCHEDULE))
    [(hidden, _)] = forms(await site.page(), "job-actions")
    first = await site.post("/page/job", with_token(hidden, "trigger"))
    assert first[0] == 303 and first[2] == f"/?done=trigger:{hidden['request_id']}"
    sent = commands(site.log, SCHEDULE)[sent_before]
    assert (sent.type, sent.request_id) == (
        "wow.schedule.Trigger",
        f"trigger:{hidden['request_id']}",
    )
    assert "COMMITTED" in await site.notice(first[2])
    await until(lambda: len(events(site.log, ORDERS, "Ran")) == 1)
    again = await site.post("/page/job", with_token(hidden, "trigger"))
    assert again[0] == 303 and again[2] is not None
    assert "DUPLICATE" in await site.notice(again[2])
    assert len(events(site.log, ORDERS, "Ran")) == 1


async def test_enable_then_disable_start_and_end_the_jobs_timer(site: Site) -> None:
    [(hidden, _)] = forms(await site.page(), "job-actions")
    assert (await site.post("/page/job", with_token(hidden, "enable")))[0] == 303
    await until(lambda: [t.status for t in job_timers(site)] == [TimerStatus.PENDING])
    [(hidden, _)] = forms(await site.page(), "job-actions")
    assert (await site.post("/page/job", with_token(hidden, "disable")))[0] == 303
    await until(lambda: [t.status for t in job_timers(site)] == [TimerStatus.CANCELLED])
    assert [c.type for c in commands(site.log, SCHEDULE)] == [
        "wow.schedule.Enable",
        "wow.schedule.Disable",
    ]
    row = declared_row(await site.page())
    assert row[5:7] == ["no timer reported (not enabled?)", "—"]


@pytest.mark.parametrize(
    ("form", "named"),
    [
        ({"context": "nowhere", "job": "nightly"}, "context"),
        ({"context": "shop", "job": "weekly"}, "job"),
        ({"context": "shop", "job": "nightly", "action": "backfill"}, "action"),
        ({"context": "shop"}, "job"),
    ],
)
async def test_a_bad_job_form_is_a_400_naming_its_field_and_sends_nothing(
    site: Site, form: dict[str, str], named: str
) -> None:
    full: dict[str, Any] = {"action": "trigger", "request_id": "r-1", "web_token": TOKEN} | form
    status, body, _ = await site.post("/page/job", full)
    assert status == 400
    assert re.search(rf"\b{named}\b", html_lib.unescape(body)), body
    assert commands(site.log, SCHEDULE) == []


async def test_a_stale_forms_trigger_of_a_skipped_timer_sends_nothing(site: Site) -> None:
    """The page rendered, then its recurring timer parked and skipped by another operator
    (CANCELLED in the table; the book, which learns nothing of it, still keeps it): its
    Trigger now sent the skipped timer's command (COMMITTED, "carried out"), where the
    JSON route answers 409. It is a 409 page now, and nothing is sent."""
    body = {
        "rule": {"kind": "interval", "start": T0 + 60 * MIN, "every": 60 * MIN},
        "target": {"type": "shop.order", "id": "p-1"},
        "command": {"type": "RemindToPay"},
    }
    assert (await site.call("PUT", "/timers/shop.reminders/o-9/k", body))[0] == 200
    await until(lambda: "k" in book_rows(site.log))
    [(hidden, buttons)] = forms(await site.page(owner="o-9"), "timer-actions")
    assert "trigger" in buttons
    kept = site.node.types["shop.reminders"]
    held = book_rows(site.log)["k"]
    parked = held.model_copy(update={"status": TimerStatus.PARKED})
    assert await kept.store.settle([TimerChange(loaded=held, next=parked)]) == 1
    assert await kept.runner.skip(TARGET) == 1
    await until(lambda: book_rows(site.log)["k"].status is TimerStatus.CANCELLED)
    status, text, _ = await site.post("/page/timer", with_token(hidden, "trigger"))
    assert status == 409 and "is CANCELLED: nothing to trigger" in html_lib.unescape(text)
    assert [c for c in commands(site.log, BOOK) if c.type == "wow.TriggerTimer"] == []
    assert events(site.log, ORDERS, "Pinged") == []
