"""The operator page's Retry and Skip wait for every partition's answer, as `tickwheel timers
retry|skip` does (`app.ops.op_answers`), and say what came of the request: all carried out,
a 303 back to the page whose confirmation counts what was retried or skipped (and the
DUPLICATE of the same form submitted again); a partition FAILED, a 422 page with its
message; a partition silent past the wait, a 504 page saying the request may still be
carried out there, with the form to send again under the same request id. Everything the
answers and the form hold is escaped.

A whole node on the in-memory log behind its web edge; and a node's page on the in-memory
log whose partitions an owner written here answers as each test says (or not at all).

Before, the page sent the request and confirmed it "requested", whatever came of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import html as html_lib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from fakes import GOOD, NODE, PAGE_PARTITIONS, TYPE, FakeClock, FakeNode, WebNode, web_node
from test_timer_op_answers import OPTIONS, ORDERS, OWNER, SERVICE, park
from yarl import URL

from app.kafka.memory import MemoryLog
from app.node.kept import node_topics
from app.ops.op_answers import REFUSED_WHY
from app.ops.page import OperatorPage
from app.ops.web import WebServer
from app.protocol.wire import OpOutcome, TimerOp, decode
from app.timers.op_answers import answer_record

P = PAGE_PARTITIONS
HOSTILE = '"><script>alert(1)</script>&amp;'


async def post(
    http: aiohttp.ClientSession, url: URL, action: str, form: dict[str, str]
) -> tuple[int, str, str | None]:
    async with http.post(url / "timers" / action, data=form, allow_redirects=False) as r:
        return r.status, await r.text(), r.headers.get("Location")


async def notice(http: aiohttp.ClientSession, url: URL, location: str) -> str:
    async with http.get(url.join(URL(location))) as r:
        found = re.search(r'<div class="notice" id="notice">(.*?)</div>', await r.text(), re.S)
        assert found is not None, "no confirmation on the page"
        return html_lib.unescape(found.group(1))


def hidden(html: str, form_id: str) -> dict[str, str]:
    form = html.split(f'id="{form_id}">', 1)[1].split("</form>", 1)[0]
    fields = re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', form)
    return {k: html_lib.unescape(v) for k, v in fields}


def said(html: str, element: str) -> str:
    """The text of the element with id `element`, unescaped."""
    found = re.search(rf'id="{element}">(.*?)</', html, re.S)
    assert found is not None, f"no {element} on the page"
    return html_lib.unescape(found.group(1))


# --- a whole node ----------------------------------------------------------------------------


async def parked_form(site: WebNode) -> dict[str, str]:
    """The hidden fields of the page's form for its one parked timer."""
    async with site.http.get(site.url) as r:
        page = await r.text()
    form = page.split('<tr class="parked-timer">', 1)[1].split("</form>", 1)[0]
    return dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', form))


async def test_a_retry_counts_what_it_retried_and_the_same_form_again_is_a_duplicate(
    tmp_path: Path,
) -> None:
    # The wall clock's now: the window of a request id runs from its `requested_at`.
    clock = FakeClock(time.time_ns() // 1_000_000)
    async with web_node(SERVICE, tmp_path, clock, WebNode, token=None, timers=OPTIONS) as site:
        await park(site.log, clock, "remind")
        fields = await parked_form(site)
        rid = fields["request_id"]
        status, _, location = await post(site.http, site.url, "retry", fields)
        assert status == 303 and location is not None
        assert await notice(site.http, site.url, location) == (
            f"Retried 1 timer of shop.order parked on {OWNER} in 1 of 2 partitions "
            f"(request {rid}.retry)."
        )
        # The form submitted again (a reload of the POST): each partition's DUPLICATE.
        status, _, location = await post(site.http, site.url, "retry", fields)
        assert status == 303 and location is not None
        assert await notice(site.http, site.url, location) == (
            f"Retried 0 timers of shop.order parked on {OWNER} in 0 of 2 partitions; 2 "
            "partitions had carried it out before under this request id (DUPLICATE: nothing "
            f"done again) (request {rid}.retry)."
        )


async def test_a_retry_past_the_window_is_refused_and_sent_with_the_box_ticked(
    tmp_path: Path,
) -> None:
    """A slot parked eight days ago, its target's window a week: before, Retry sent it
    under the request id its target may have applied and forgotten."""
    clock = FakeClock(time.time_ns() // 1_000_000)
    async with web_node(SERVICE, tmp_path, clock, WebNode, token=None, timers=OPTIONS) as site:
        await park(site.log, clock, "remind")
        clock.advance(8 * 24 * 3_600_000)
        fields = await parked_form(site)
        rid = fields["request_id"]
        status, _, location = await post(site.http, site.url, "retry", fields)
        assert status == 303 and location is not None
        assert await notice(site.http, site.url, location) == (
            f"Retried 0 timers of shop.order parked on {OWNER} in 0 of 2 partitions; 1 timer "
            f'not retried, left parked: {REFUSED_WHY} (request {rid}.retry). Tick "past the '
            'request-id window" by Retry to send them.'
        )
        # The same form with its box ticked: another request, which sends it.
        ticked = {**fields, "past_window": "true"}
        status, _, location = await post(site.http, site.url, "retry", ticked)
        assert status == 303 and location is not None
        assert await notice(site.http, site.url, location) == (
            f"Retried 1 timer of shop.order parked on {OWNER} in 1 of 2 partitions "
            f"(request {rid}.retry.past-window)."
        )


# --- a page whose partitions answer as told -------------------------------------------------

Script = dict[int, tuple[OpOutcome, int, str]]
"""How each partition's owner answers (outcome, timers changed, message); one not named
does not answer."""


async def answer(log: MemoryLog, script: Script) -> None:
    """The owners: each copy of a request in a scripted partition answered, as a node does
    (in the request id's partition of the results topic, naming the copy's offset)."""
    seen: set[tuple[int, int]] = set()
    while True:
        for p, (outcome, changed, message) in script.items():
            for r in log.records(ORDERS.timer_ops, p):
                if (p, r.offset) not in seen:
                    seen.add((p, r.offset))
                    op = decode(TimerOp, r.value)
                    now = op.requested_at
                    record = answer_record(
                        TYPE,
                        op,
                        p,
                        r.offset,
                        outcome,
                        partitions=P,
                        now=now,
                        changed=changed,
                        message=message,
                    )
                    await log.publisher().send_many([record])
        await asyncio.sleep(0.01)


@dataclass
class Page:
    log: MemoryLog
    url: URL
    http: aiohttp.ClientSession

    @contextlib.asynccontextmanager
    async def owners(self, script: Script) -> AsyncIterator[None]:
        task = asyncio.create_task(answer(self.log, script))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def sent(self) -> list[TimerOp]:
        return [
            decode(TimerOp, r.value)
            for p in range(P)
            for r in self.log.records(ORDERS.timer_ops, p)
        ]


WAIT_S = 0.3


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    log = MemoryLog(node_topics([ORDERS], P))
    node = FakeNode(log=log)
    server = WebServer(node, 0, timer_wait_s=WAIT_S)  # type: ignore[arg-type]
    await server.start()
    # As the server makes it (its wait, its node), named as the other page tests name it.
    server.page = OperatorPage(node, NODE, wait_s=WAIT_S)
    try:
        async with aiohttp.ClientSession() as http:
            yield Page(log, URL(f"http://127.0.0.1:{server.port}"), http)
    finally:
        await server.stop()


FORM = {**GOOD, "target_id": HOSTILE, "request_id": "form-1", "back": "/?owner=o"}
TARGET = f"shop.order/(0)/{HOSTILE}"


async def outcome(page: Page, action: str, status: int) -> str:
    """The page `FORM` posted to `action` is answered with (not a 303): `status`, nothing
    of the hostile text markup on it."""
    got, html, location = await post(page.http, page.url, action, FORM)
    assert (got, location) == (status, None), html
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
    return html


async def test_a_failed_partition_is_a_422_page_with_its_message(page: Page) -> None:
    script: Script = {
        0: (OpOutcome.DONE, 2, ""),
        1: (OpOutcome.FAILED, 0, f"store refused: {HOSTILE}"),
        2: (OpOutcome.DONE, 0, ""),
        3: (OpOutcome.DUPLICATE, 0, "carried out at offset 0"),
    }
    async with page.owners(script):
        html = await outcome(page, "retry", 422)
    assert said(html, "summary") == (
        f"Retried 2 timers of {TYPE} parked on {TARGET} in 1 of 4 partitions; 1 partition "
        "had carried it out before under this request id (DUPLICATE: nothing done again) "
        "(request form-1.retry)."
    )
    assert said(html, "failed").startswith("Failed in partition 1: dead-lettered, perhaps")
    rows = re.findall(r"<tr><td[^>]*>(\d+)</td><td>(.*?)</td><td[^>]*>(.*?)</td></tr>", html)
    assert [(p, html_lib.unescape(w), html_lib.unescape(m)) for p, w, m in rows] == [
        ("0", "DONE: retried 2 timers", ""),
        ("1", "FAILED", f"store refused: {HOSTILE}"),
        ("2", "DONE: retried 0 timers", ""),
        ("3", "DUPLICATE", "carried out at offset 0"),
    ]
    # Every partition answered: nothing to send again (its request id is used).
    assert 'id="again"' not in html and 'id="missing"' not in html


async def test_partitions_silent_past_the_wait_are_a_504_page_that_sends_the_form_again(
    page: Page,
) -> None:
    script: Script = {0: (OpOutcome.DONE, 1, ""), 1: (OpOutcome.DONE, 0, "")}
    async with page.owners(script):
        html = await outcome(page, "skip", 504)
        assert said(html, "summary") == (
            f"Skipped 1 timer of {TYPE} parked on {TARGET} in 1 of 4 partitions; 2 of 4 "
            "answered (request form-1.skip)."
        )
        assert said(html, "missing") == (
            f"No answer within {WAIT_S:g} s from partitions 2, 3 of 4: the request may still "
            "be carried out there. Sending the same form again is safe: it goes under the "
            "same request id, so each partition carries it out at most once, and one that "
            "carried it out answers DUPLICATE."
        )
        assert '<form method="post" action="/timers/skip" id="again">' in html
        again = hidden(html, "again")
        assert again == FORM
        # Sent again as the page offers it: the same request, under the same id.
        status, _, _ = await post(page.http, page.url, "skip", again)
        assert status == 504
    sent = page.sent()
    assert [op.request_id for op in sent] == ["form-1.skip"] * 2 * P
    assert {op.target.id for op in sent} == {HOSTILE}
