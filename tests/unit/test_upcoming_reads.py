"""`GET /timers/upcoming`'s reads are bounded by its page: each partition is read from
where the page starts (its cursor, its `due_from`), a chunk a store call with the event
loop's turn after each, and no further than a row that can be on the page. It read up to
10,000 timers a partition in one synchronous call (0.1-0.3 s on RocksDB), holding the loop
that fires the node's timers. The pages are as `upcoming_page` cuts them from all rows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fakes import PAGE_PARTITIONS, T0, TYPE, FakeNode, Kept
from hypothesis import given, settings
from hypothesis import strategies as st
from test_upcoming import get, put_rows, rows_strategy, timer
from yarl import URL

import app.ops.upcoming_reads
from app.ops.upcoming import UpcomingQuery, upcoming_page
from app.ops.upcoming_reads import upcoming_answer
from app.ops.web import WebServer
from tables import Timer, TimerChange, TimerStatus, TimerStore, open_timer_store
from tables.memory_store import MemoryTimerStore

EVERY = list(range(PAGE_PARTITIONS))


class Reads:
    """Counts the rows the store hands the route (any of its due reads), each call's."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch, turns: Turns) -> None:
        self.calls: list[tuple[int, int]] = []  # (loop turns before the call, rows read)
        for name in ("due", "due_after"):
            if (read := getattr(store, name, None)) is not None:
                monkeypatch.setattr(store, name, self._counted(read, turns))

    def _counted(self, read: Any, turns: Turns) -> Any:
        async def counted(*args: Any, **kwargs: Any) -> list[Timer]:
            at = turns.count
            got: list[Timer] = await read(*args, **kwargs)
            self.calls.append((at, len(got)))
            return got

        return counted

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.calls)


class Turns:
    """Counts the turns the event loop gives another task."""

    def __init__(self) -> None:
        self.count = 0
        self._done = asyncio.Event()

    async def run(self) -> None:
        while not self._done.is_set():
            await asyncio.sleep(0)
            self.count += 1

    def stop(self) -> None:
        self._done.set()


@pytest.fixture
async def web() -> AsyncIterator[tuple[FakeNode, URL, aiohttp.ClientSession, Turns]]:
    node = FakeNode(owned=EVERY)
    server = WebServer(node, 0)  # type: ignore[arg-type]
    await server.start()
    turns = Turns()
    counter = asyncio.create_task(turns.run())
    try:
        async with aiohttp.ClientSession() as http:
            yield node, URL(f"http://127.0.0.1:{server.port}"), http, turns
    finally:
        turns.stop()
        await counter
        await server.stop()


def owners(n: int) -> Iterator[str]:
    return (f"o{i}" for i in range(n))


async def test_a_page_reads_what_it_shows_and_two_more_a_partition(
    web: tuple[FakeNode, URL, aiohttp.ClientSession, Turns], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, url, http, turns = web
    rows = [timer(o, "k", T0 + i) for i, o in enumerate(owners(400))]
    await put_rows(node, rows)
    reads = Reads(node.store, monkeypatch, turns)
    query = UpcomingQuery(limit=5)
    for _ in range(3):  # the first page, and the next two from their cursors
        cursor = "" if query.cursor is None else f"&cursor={query.cursor}"
        status, body = await get(http, url, "limit=5" + cursor)
        assert status == 200, body
        expected = upcoming_page(rows, query)
        assert [t["id"] for t in body["timers"]] == [t.id for t in expected.timers]
        assert body["next_cursor"] == expected.next_cursor and body["scanned_all"] is True
        assert reads.rows <= PAGE_PARTITIONS * (5 + 2), reads.calls  # not 400
        reads.calls.clear()
        query = query.model_copy(update={"cursor": body["next_cursor"]})


async def test_a_page_from_a_due_time_on_reads_nothing_before_it(
    web: tuple[FakeNode, URL, aiohttp.ClientSession, Turns], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, url, http, turns = web
    rows = [timer(o, "k", T0 + i) for i, o in enumerate(owners(400))]
    await put_rows(node, rows)
    reads = Reads(node.store, monkeypatch, turns)
    status, body = await get(http, url, f"limit=3&due_from={T0 + 300}&due_until={T0 + 310}")
    assert status == 200, body
    assert [t["due_at"] for t in body["timers"]] == [T0 + 300, T0 + 301, T0 + 302]
    assert reads.rows <= PAGE_PARTITIONS * (3 + 2), reads.calls


async def test_a_sparse_filter_reads_in_chunks_with_the_loops_turn_between(
    web: tuple[FakeNode, URL, aiohttp.ClientSession, Turns], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner's few timers among many others': its page reads the partition through
    (up to `UPCOMING_SCAN`), a chunk a call, the loop let run between any two."""
    node, url, http, turns = web
    monkeypatch.setattr(app.ops.upcoming_reads, "UPCOMING_CHUNK", 10)
    rows = [timer(o, "k", T0 + i) for i, o in enumerate(owners(300))]
    rows += [timer("o7", "late", T0 + 1_000)]
    await put_rows(node, rows)
    reads = Reads(node.store, monkeypatch, turns)
    status, body = await get(http, url, "owner=o7&limit=5")
    assert status == 200, body
    assert [t["key"] for t in body["timers"]] == ["k", "late"]
    assert reads.rows == len(rows)  # every partition read through (o7's rows are few)
    assert all(n <= 10 for _, n in reads.calls), reads.calls
    assert all(a < b for (a, _), (b, _) in pairwise(reads.calls)), reads.calls


async def test_a_timer_moved_between_two_chunks_is_listed_once(
    web: tuple[FakeNode, URL, aiohttp.ClientSession, Turns], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write may land between two reads of a partition: a timer read in the first and
    moved later (rescheduled, or claimed) is read again in the next, as it is now."""
    node, url, http, _ = web
    node.owned = [0]
    monkeypatch.setattr(app.ops.upcoming_reads, "UPCOMING_CHUNK", 3)
    names = [o for o in owners(200) if timer(o, "k", T0).partition == 0][:8]
    rows = [timer(o, "k", T0 + i) for i, o in enumerate(names)]
    await put_rows(node, rows)
    due_after = node.store.due_after
    moved = rows[0].model_copy(update={"status": TimerStatus.FIRING, "due_at": T0 + 100})

    async def racing(*args: Any) -> list[Timer]:
        got = await due_after(*args)
        if got and got[0] == rows[0]:  # the first chunk: claimed (due at its deadline)
            assert await node.store.settle([TimerChange(loaded=rows[0], next=moved)]) == 1
        return got

    monkeypatch.setattr(node.store, "due_after", racing)
    status, body = await get(http, url, "limit=20")
    assert status == 200, body
    listed = [(t["owner"]["id"], t["status"], t["due_at"]) for t in body["timers"]]
    assert listed == [(o, "PENDING", T0 + i) for i, o in enumerate(names) if i] + [
        (names[0], "FIRING", T0 + 100)
    ]


# --- the pages as upcoming_page cuts them, on both backends ----------------------------


async def answer_pages(store: TimerStore, query: UpcomingQuery) -> list[list[Timer]]:
    """Every page of `query` from its first, as the route reads them."""
    pages = []
    while True:
        got = await upcoming_answer([(TYPE, store, EVERY)], query, EVERY)
        assert got.scanned_all
        pages.append(got.timers)
        if got.next_cursor is None:
            return pages
        query = query.model_copy(update={"cursor": got.next_cursor})


def whole_pages(rows: list[Timer], query: UpcomingQuery) -> list[list[Timer]]:
    pages = []
    while True:
        page = upcoming_page(rows, query)
        pages.append(page.timers)
        if page.next_cursor is None:
            return pages
        query = query.model_copy(update={"cursor": page.next_cursor})


async def stored(store: TimerStore, rows: list[Timer]) -> None:
    for t in rows:
        pending = t.model_copy(update={"status": TimerStatus.PENDING})
        assert await store.put(pending)
        if t.status is not TimerStatus.PENDING:
            assert await store.settle([TimerChange(loaded=pending, next=t)]) == 1


@settings(max_examples=150, deadline=None)
@given(
    rows=rows_strategy,
    limit=st.integers(1, 6),
    chunk=st.integers(1, 4),
    owner=st.sampled_from([None, "o1", "o2"]),
    target=st.sampled_from([None, "t1"]),
    window=st.tuples(st.integers(T0 - 1, T0 + 21), st.integers(T0 - 1, T0 + 21)),
)
def test_the_pages_read_a_chunk_at_a_time_are_the_pages_of_all_rows(
    rows: list[Timer],
    limit: int,
    chunk: int,
    owner: str | None,
    target: str | None,
    window: tuple[int, int],
) -> None:
    query = UpcomingQuery(
        owner=owner, target=target, due_from=window[0], due_until=window[1], limit=limit
    )

    async def pages() -> list[list[Timer]]:
        store = MemoryTimerStore(PAGE_PARTITIONS)
        await stored(store, rows)
        return await answer_pages(store, query)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app.ops.upcoming_reads, "UPCOMING_CHUNK", chunk)
        assert asyncio.run(pages()) == whole_pages(rows, query)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
async def test_the_pages_are_the_same_on_both_backends(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "memory://" if backend == "memory" else f"rocksdb://{tmp_path / 'db'}"
    store = open_timer_store(url, partitions=PAGE_PARTITIONS)
    statuses = [TimerStatus.PENDING, TimerStatus.FIRING, TimerStatus.PARKED, TimerStatus.FIRED]
    rows = [
        timer(f"o{i % 13}", f"k{i}", T0 + i % 17, statuses[i % 7 % 4], f"t{i % 2}")
        for i in range(120)
    ]
    try:
        await stored(store, rows)
        monkeypatch.setattr(app.ops.upcoming_reads, "UPCOMING_CHUNK", 4)
        for query in [
            UpcomingQuery(limit=7),
            UpcomingQuery(limit=1, target="t1"),
            UpcomingQuery(limit=50, owner="o3"),
            UpcomingQuery(limit=4, due_from=T0 + 5, due_until=T0 + 9),
        ]:
            assert await answer_pages(store, query) == whole_pages(rows, query), query
    finally:
        await store.close()


async def test_a_node_of_a_rocksdb_store_answers_the_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_timer_store(f"rocksdb://{tmp_path / 'db'}", partitions=PAGE_PARTITIONS)
    node = FakeNode(owned=EVERY, types={TYPE: Kept(store)})  # type: ignore[arg-type]
    rows = [timer(o, "k", T0 + i) for i, o in enumerate(owners(60))]
    await stored(store, rows)
    server = WebServer(node, 0)  # type: ignore[arg-type]
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            status, body = await get(http, URL(f"http://127.0.0.1:{server.port}"), "limit=5")
        assert status == 200, body
        assert [t["id"] for t in body["timers"]] == [t.id for t in rows[:5]]
    finally:
        await server.stop()
        await store.close()


async def test_a_partition_is_read_past_the_pages_last_row_and_the_one_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition is read no further once it is past the page's `limit` + 1st row (the
    sign of a next page), not merely past its `limit`th: a scan stopped at `UPCOMING_SCAN`
    cuts the pages at its last row, and a row before that cut left unread would have the
    page say it is the last (the row never listed)."""
    monkeypatch.setattr(app.ops.upcoming_reads, "UPCOMING_CHUNK", 1)
    monkeypatch.setattr(app.ops.upcoming_reads, "UPCOMING_SCAN", 3)
    owner_of = {timer(f"o{n}", "k", T0).partition: f"o{n}" for n in range(40, -1, -1)}
    rows = [
        # partition 0: no row listed, its scan stops at +30 (the pages end there)
        *(timer(owner_of[0], f"x{d}", T0 + d, target="t0") for d in (5, 15, 30, 50)),
        # partition 1: the first page's row, and a row past the cut
        timer(owner_of[1], "r0", T0 + 10, target="t1"),
        timer(owner_of[1], "r1", T0 + 40, target="t1"),
        # partition 2: a row before the cut, after one not listed
        timer(owner_of[2], "q", T0 + 15, target="t0"),
        timer(owner_of[2], "u", T0 + 20, target="t1"),
    ]
    store = MemoryTimerStore(PAGE_PARTITIONS)
    await stored(store, rows)
    query = UpcomingQuery(limit=1, target="t1")
    listed: list[str] = []
    while True:
        got = await upcoming_answer([(TYPE, store, EVERY)], query, EVERY)
        listed += [t.key for t in got.timers]
        if got.next_cursor is None:
            break
        query = query.model_copy(update={"cursor": got.next_cursor})
    assert listed == ["r0", "u", "r1"], listed
