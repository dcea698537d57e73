"""The operator page in a real headless Chromium (Debian's, driven by Playwright), against
real worker processes on the real broker.

A timer's target fails its command (a closed gate, `tw_page_service`), so after two
attempts the timer is PARKED and its target is in the ledger. Two workers share the
partitions; the page of the node that does NOT own the timer's partition shows the whole
group (#22): every partition with its node, both nodes, the counts, the upcoming fires,
and the other node's parked timer with Retry and Skip; the owner's page shows the same.
The gate is opened, the operator presses Retry in the browser on the node that does not
own the partition: the page confirms it, the timer leaves the parked list, the committed
changelog has it FIRED with the outcome COMMITTED and the log has the target's `Passed`
event of that very slot. An owner search through that page's form then finds the timer,
FIRED, read from its partition's changelog and named with its node. Last, the node that
does not own it stops cleanly: its tombstone takes it off the other node's page, whose
partitions then all show under the remaining node. Screenshots of each step go to a
directory the test prints; with `TICKWHEEL_DOCS_SCREENSHOT=1` the first (the group on
one node's page, the parked timer with its buttons, the ledger, the chart) is also
written to docs/operator-page.png.

The page's buttons (#22): the job `nightly` is enabled from the first page (its next slot
then shows), a timer of the timer book `<context>.reminders`, kept in the partition of the
node that owns the parked timer, is paused and resumed from the OTHER node's page (its
status, read from the partition's changelog, changes), and the job is triggered from the
page (its run's `Tick` reaches the gate `job-ran`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson
import pytest
from harness import ROOT, Client, Cluster, Worker, eventually, owned
from playwright.async_api import Browser, Page, ViewportSize, async_playwright

from tables import Outcome, TimerStatus
from tables.partitioner import partition_of

pytestmark = pytest.mark.kafka

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT: ViewportSize = {"width": 1280, "height": 900}
PARTITIONS = 3
OPTIONS = {
    "retry": {"initial_backoff_ms": 100, "max_backoff_ms": 200, "max_attempts": 2},
    "claim_timeout": 3000,
    "send_timeout": 2000,
}
KEY = "k-page"
BOOK_KEY = "remind-me"


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(
        kafka_bootstrap,
        tmp_path,
        partitions=PARTITIONS,
        env={
            "TICKWHEEL_TIMER_OPTIONS": orjson.dumps(OPTIONS).decode(),
            "TICKWHEEL_STATUS_INTERVAL_MS": "1000",
        },
        service="tw_page_service:service",
    )
    yield c
    c.stop_all()


@pytest.fixture
def chromium() -> str:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: scripts/test installs Debian's chromium package")
    return CHROMIUM


@pytest.fixture
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


async def reload_until(
    page: Page, check: Callable[[], Awaitable[bool]], within: float, message: str
) -> None:
    """Reloads the page until `check` holds: the node's state, read through the page."""

    async def again() -> bool:
        await page.reload()
        return await check()

    await eventually(again, within, message, interval=0.3)


def png_size(path: Path) -> tuple[int, int]:
    """The width and height a PNG's header says; AssertionError if it is not a PNG."""
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert raw[12:16] == b"IHDR"
    width, height = struct.unpack(">II", raw[16:24])
    return int(width), int(height)


async def shoot(page: Page, directory: Path, name: str) -> Path:
    path = directory / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    width, height = png_size(path)
    # The full page at the viewport's width, as tall as its content at least; a page
    # with tables of text compresses to tens of kilobytes, a blank one to a few.
    assert width == VIEWPORT["width"], (path, width)
    assert VIEWPORT["height"] <= height <= 20_000, (path, height)
    assert path.stat().st_size > 20_000, (path, path.stat().st_size)
    return path


async def test_an_operator_retries_a_parked_timer_in_the_browser(
    cluster: Cluster, browser: Browser, tmp_path: Path
) -> None:
    began = time.monotonic()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    print(f"screenshots: {shots}")
    async with Client(cluster, aggregate="gate") as client:
        w1 = cluster.start_worker()
        await cluster.wait_owned(w1)
        w2 = cluster.start_worker()
        workers = [w1, w2]

        def split() -> bool:
            mine = [set(owned(w)) for w in workers]
            return all(mine) and not mine[0] & mine[1] and mine[0] | mine[1] == {0, 1, 2}

        await eventually(split, 90, "two workers sharing the partitions")
        type_name = client.topics.type_name
        target = client.ref("closed-gate")
        owner = "owner-a"
        here: Worker = next(w for w in workers if partition_of(owner, PARTITIONS) in owned(w))
        there: Worker = next(w for w in workers if w is not here)
        now = int(time.time() * 1000)
        schedule = client.command(
            owner,
            "Schedule",
            {
                "key": KEY,
                "rule": {"kind": "once", "at": now},
                "type": "Pass",
                "target": target.model_dump(),
            },
            request_id="schedule-page",
        )
        # Timers that keep firing, two in each partition, so that every node's counts and
        # lateness chart have something.
        names = [f"ticker-{i}" for i in range(100)]
        tickers = [t for p in range(PARTITIONS) for t in _in(names, p)[:2]]
        ticks = [
            client.command(
                ticker,
                "Schedule",
                {
                    "key": "tick",
                    "rule": {"kind": "interval", "start": now, "every": 1000},
                    "type": "Tick",
                    "target": client.ref(ticker).model_dump(),
                },
                request_id=f"schedule-{ticker}",
            )
            for ticker in tickers
        ]
        await client.send(schedule, *ticks)
        await client.wait_results([c.request_id for c in (schedule, *ticks)])
        # A timer of the timer book, in the owner's partition (owned by `here`), set
        # through the other node's JSON route.
        context = type_name.split(".", 1)[0]
        book = f"{context}.reminders"
        async with (
            aiohttp.ClientSession() as http,
            http.put(
                f"http://127.0.0.1:{there.port}/timers/{book}/{owner}/{BOOK_KEY}",
                json={
                    "rule": {"kind": "once", "at": now + 3_600_000},
                    "target": {"type": type_name, "id": "reminded"},
                    "command": {"type": "Tick"},
                },
            ) as put,
        ):
            assert put.status == 200, await put.text()

        async def parked() -> bool:
            rows = {t.key: t for t in (await client.timers()).values()}
            return KEY in rows and rows[KEY].status is TimerStatus.PARKED

        await eventually(parked, 60, "the timer PARKED")

        page = await browser.new_page(viewport=VIEWPORT)
        other = await browser.new_page(viewport=VIEWPORT)
        try:
            # 1. The page of the node that does NOT own the timer's partition shows the
            # whole group: every partition with its node, and the other node's parked
            # timer with its buttons (from that node's status on <ctx>.nodes).
            await page.goto(f"http://127.0.0.1:{there.port}/")
            row = page.locator("tr.parked-timer", has_text=KEY)
            chart = page.locator("svg#lateness polyline")
            partition = partition_of(owner, PARTITIONS)
            # Every declared job, with its buttons: `nightly` enabled from the page.
            job = page.locator("tr.declared-job", has_text="nightly")
            async with page.expect_navigation():
                await job.locator("button", has_text="Enable").click()
            notice = page.locator("#notice")
            await notice.wait_for()
            said = await notice.inner_text()
            assert said.startswith("Enable of job ") and "COMMITTED" in said, said
            next_slot = job.locator("td").nth(5)

            async def listed() -> bool:
                # The chart too: this node's own fires of the last minutes, drawn; and the
                # enabled job's next slot, from the report of the node keeping its timer.
                return (
                    await row.count() == 1
                    and await chart.count() == 2
                    and "(in " in await next_slot.inner_text()
                )

            await reload_until(page, listed, 30, "the other node's parked timer on the page")
            assert await row.locator("td").nth(3).inner_text() == KEY
            assert await row.locator("td").nth(4).inner_text() == str(target)
            assert f":{here.port} " in await row.locator("td.node").inner_text()
            assert await page.locator("tr.ledger-entry", has_text=target.id).count() == 1
            for w in workers:
                for p in owned(w):
                    cells = page.locator("#partitions tr").nth(p + 1).locator("td")
                    assert await cells.nth(1).inner_text() == "running"
                    assert f":{w.port} " in await cells.nth(2).inner_text()
            nodes = page.locator("#nodes tr")
            assert await nodes.count() == 3  # a header and both nodes
            counted = page.locator("#timers tr", has_text=f":{here.port} ").filter(
                has_text=type_name
            )
            assert await counted.count() == len(owned(here))
            assert await page.locator("#upcoming tr").count() > 1
            # The dead-letter topic read from the broker: none in this scenario.
            assert "No dead letter." in await page.content()
            first = await shoot(page, shots, "1-the-group-on-the-other-node")

            # 2. The owner's node shows the same group, the same ledger entry.
            await other.goto(f"http://127.0.0.1:{here.port}/")
            entry = other.locator("tr.ledger-entry", has_text=target.id)

            async def in_ledger() -> bool:
                return await entry.count() == 1

            await reload_until(other, in_ledger, 30, "the ledger entry on the owner's node")
            assert await other.locator("tr.parked-timer", has_text=KEY).count() == 1
            for p in owned(there):
                cells = other.locator("#partitions tr").nth(p + 1).locator("td")
                assert f":{there.port} " in await cells.nth(2).inner_text()
            await shoot(other, shots, "2-the-owners-node")

            # 3. The target is fixed (the gate opened), then Retry in the browser, on the
            # node that does not own the partition: the request travels through Kafka.
            opened = client.command(target.id, "Open", request_id="open-gate")
            await client.send(opened)
            result = (await client.wait_results([opened.request_id]))[opened.request_id]
            assert result.code == "COMMITTED", result
            await row.locator("button", has_text="Retry").click()
            await notice.wait_for()
            # The page waited for every partition's answer: the owner's counts the timer.
            assert (await notice.inner_text()).startswith(
                f"Retried 1 timer of {type_name} parked on {target} in 1 of "
            )
            assert "done=" in page.url
            await shoot(page, shots, "3-retry-requested")

            # 4. It fires on its owner: gone from the parked list (the owner's next
            # report) and the ledger, FIRED in the changelog.
            entry_here = page.locator("tr.ledger-entry", has_text=target.id)

            async def gone() -> bool:
                return await row.count() == 0 and await entry_here.count() == 0

            await reload_until(page, gone, 60, "the timer gone from parked and the ledger")
            rows = {t.key: t for t in (await client.timers()).values()}
            fired = rows[KEY]
            assert (fired.status, fired.outcome) == (TimerStatus.FIRED, Outcome.COMMITTED)
            passed = [
                e for e in await client.events() if e.type == "Passed" and e.aggregate == target
            ]
            assert [e.request_id for e in passed] == [fired.request_id]

            # 5. The owner search, through the page's form, on the node that does not
            # own the partition: read from the partition's changelog.
            await page.fill("#search input[name=owner]", owner)
            await page.click("#search button")
            found = page.locator("#owner-timers tr", has_text=KEY)
            await found.wait_for()
            texts = [await c.inner_text() for c in await found.locator("td").all()]
            assert texts[0:2] == [type_name, str(partition)]
            assert f":{here.port} " in texts[2] and "read from its changelog" in texts[2]
            assert texts[3:5] == [KEY, "FIRED"]
            await shoot(page, shots, "4-owner-search")

            # 5b. The book's timer, in the same partition (the other node's), paused and
            # resumed from this page: the command goes through Kafka to its owner, and the
            # status read from the partition's changelog changes.
            reminder = page.locator("tr.owner-timer", has_text=BOOK_KEY)
            status_cell = reminder.locator("td").nth(4)
            assert await reminder.locator("td").nth(0).inner_text() == book
            assert f":{here.port} " in await reminder.locator("td").nth(2).inner_text()
            assert await status_cell.inner_text() == "PENDING"
            for button, status in (("Pause", "PAUSED"), ("Resume", "PENDING")):
                async with page.expect_navigation():
                    await reminder.locator("button", has_text=button).click()
                await notice.wait_for()
                said = await notice.inner_text()
                assert said.startswith(f"{button} of ") and "COMMITTED" in said, said

                async def shows(status: str = status) -> bool:
                    return await status_cell.inner_text() == status

                await reload_until(page, shows, 30, f"the book's timer {status} on the page")
                if status == "PAUSED":
                    await shoot(page, shots, "5-a-book-timer-paused")
                    assert await reminder.locator("button", has_text="Resume").count() == 1

            # 5c. The job triggered from the page: its run's command reaches its target.
            await page.goto(f"http://127.0.0.1:{there.port}/")
            async with page.expect_navigation():
                await job.locator("button", has_text="Trigger").click()
            await notice.wait_for()
            said = await notice.inner_text()
            assert said.startswith("Trigger of job ") and "COMMITTED" in said, said

            async def ran() -> bool:
                return any(
                    e.type == "Ticked" and e.aggregate.id == "job-ran"
                    for e in await client.events()
                )

            await eventually(ran, 30, "the triggered job's command on its target")

            # 6. A bad query is a 400 page, in the browser too.
            response = await page.goto(
                f"http://127.0.0.1:{here.port}/?owner={'x' * 501}", wait_until="load"
            )
            assert response is not None and response.status == 400
            assert "bad owner" in await page.locator("#error").inner_text()

            # 7. A clean stop: the stopped node's tombstone takes it off the other's page
            # (not left there, stale), and its partitions show under their new owner.
            assert await asyncio.to_thread(there.stop) == 0
            await other.goto(f"http://127.0.0.1:{here.port}/")

            async def moved() -> bool:
                if await other.locator("#nodes tr").count() != 2:  # a header and `here`
                    return False
                for p in range(PARTITIONS):
                    cells = other.locator("#partitions tr").nth(p + 1).locator("td")
                    if await cells.nth(1).inner_text() != "running":
                        return False
                    if f":{here.port} " not in await cells.nth(2).inner_text():
                        return False
                return True

            await reload_until(other, moved, 90, "the stopped node's partitions on `here`")
            await shoot(other, shots, "6-after-a-clean-stop")
        finally:
            await page.close()
            await other.close()
        if os.environ.get("TICKWHEEL_DOCS_SCREENSHOT") == "1":
            shutil.copyfile(first, ROOT / "docs" / "operator-page.png")
        assert here.alive
        for w in workers:
            assert "Traceback" not in w.text()
    print(f"operator page scenario: {time.monotonic() - began:.1f} s")


def _in(ids: list[str], partition: int) -> list[str]:
    return [i for i in ids if partition_of(i, PARTITIONS) == partition]
