"""Upcoming fires: the pure page (sorted, filtered, paged without a repeat or a gap), `tickwheel
timers upcoming` (read-only, over rows as the changelog has them) and the node's
`GET /timers/upcoming` (its own partitions' stores, bounded scans), with their 400s/exit 2."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from fakes import DOCS, PAGE_PARTITIONS, T0, TYPE, FakeNode, ref
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner
from yarl import URL

import app.cli.timers
import app.ops.upcoming_reads
from app.cli import cli
from app.kafka.connection import Connectable
from app.ops.upcoming import (
    BadQuery,
    UpcomingQuery,
    decode_cursor,
    page_share,
    query_of,
    sort_key,
    upcoming_page,
)
from app.ops.web import WebServer
from tables import CommandSpec, OnceRule, StoreError, Timer, TimerChange, TimerStatus
from tables.partitioner import partition_of

STATUSES = list(TimerStatus)


def timer(
    owner: str,
    key: str,
    due: int,
    status: TimerStatus = TimerStatus.PENDING,
    target: str | None = None,
    tenant: str = "(0)",
) -> Timer:
    return Timer(
        id=f"{owner}/{key}",
        owner=ref(owner, tenant=tenant),
        key=key,
        version=1,
        partition=partition_of(owner, PAGE_PARTITIONS),
        status=status,
        rule=OnceRule(at=due),
        target=ref(target or owner),
        command=CommandSpec(type="Remind"),
        slot_due_at=due,
        due_at=due,
    )


rows_strategy = st.lists(
    st.builds(
        timer,
        owner=st.sampled_from(["o1", "o2", "o3"]),
        key=st.sampled_from(["a", "b", "c", "d"]),
        due=st.integers(T0, T0 + 20),
        status=st.sampled_from(STATUSES),
        target=st.sampled_from(["t1", "t2", None]),
        tenant=st.sampled_from(["(0)", "x"]),
    ),
    max_size=30,
    unique_by=lambda t: (str(t.owner), t.key),
)


@settings(max_examples=150, deadline=None)
@given(
    rows=rows_strategy,
    limit=st.integers(1, 7),
    owner=st.sampled_from([None, "o1", "o2"]),
    target=st.sampled_from([None, "t1"]),
    tenant=st.sampled_from([None, "x"]),
    window=st.tuples(st.integers(T0 - 1, T0 + 21), st.integers(T0 - 1, T0 + 21)),
)
def test_the_pages_are_the_filtered_timers_by_due_time_each_once(
    rows: list[Timer],
    limit: int,
    owner: str | None,
    target: str | None,
    tenant: str | None,
    window: tuple[int, int],
) -> None:
    low, high = window
    query = UpcomingQuery(
        owner=owner, target=target, tenant=tenant, due_from=low, due_until=high, limit=limit
    )
    expected = sorted(
        (
            t
            for t in rows
            if t.status in (TimerStatus.PENDING, TimerStatus.FIRING)
            and owner in (None, t.owner.id)
            and target in (None, t.target.id)
            and tenant in (None, t.owner.tenant)
            and low <= t.due_at <= high
        ),
        key=sort_key,  # two tenants' owners of one id make equal timer ids
    )
    listed: list[Timer] = []
    pages = 0
    while True:
        page = upcoming_page(reversed(rows), query)
        assert len(page.timers) <= limit
        listed += page.timers
        pages += 1
        if page.next_cursor is None:
            break
        assert len(page.timers) == limit
        query = query.model_copy(update={"cursor": page.next_cursor})
    assert listed == expected
    assert pages == max(1, -(-len(expected) // limit))


@settings(max_examples=80, deadline=None)
@given(rows=rows_strategy, cut=st.integers(0, 30))
def test_a_horizon_leaves_out_what_the_scan_did_not_reach(rows: list[Timer], cut: int) -> None:
    active = sorted((t for t in rows if t.status.value in ("PENDING", "FIRING")), key=sort_key)
    if not active:
        return
    horizon = sort_key(active[min(cut, len(active) - 1)])
    page = upcoming_page(rows, UpcomingQuery(limit=1000), horizon)
    assert page.timers == [t for t in active if sort_key(t) <= horizon]


def test_query_of_names_what_is_wrong() -> None:
    q = query_of({"due_from": "2026-12-24T00:00:00Z", "limit": "5", "owner": "o1"})
    assert (q.due_from, q.limit, q.owner) == (1798070400000, 5, "o1")
    for params, message in [
        ({"limt": "5"}, "limt: no such parameter"),
        ({"limit": "0"}, "limit: Input should be greater than or equal to 1"),
        ({"limit": "many"}, "limit: a whole number in digits alone (got 'many')"),
        # pydantic read these as 10, 1 and 10: the ledger's page and the settings refuse them
        ({"limit": "1_0"}, "limit: a whole number in digits alone"),
        ({"limit": "1.0"}, "limit: a whole number in digits alone"),
        ({"limit": "\u0661\u0660"}, "limit: a whole number in digits alone"),
        ({"due_until": "2026-12-24"}, "due_until '2026-12-24' has no offset"),
        ({"due_from": "\u00b2"}, "due_from '\u00b2' is neither ISO 8601"),
        ({"due_until": "9" * 5000}, "is outside 1970-01-01 to 9999-12-31"),
        ({"cursor": "nope"}, "cursor 'nope' is not a next_cursor of this listing"),
    ]:
        with pytest.raises(BadQuery, match=re.escape(message)):
            query_of(params)
    assert decode_cursor(
        upcoming_page([timer("o1", "a", T0)] * 2, UpcomingQuery(limit=1)).next_cursor or ""
    ) == sort_key(timer("o1", "a", T0))


# --- the command ---------------------------------------------------------------------------


ROWS = [
    timer("o1", "late", T0 + 3_000, target="t1"),
    timer("o2", "soon", T0 + 1_000),
    timer("o1", "gone", T0 + 500, TimerStatus.FIRED),
    timer("o3", "parked", T0 + 200, TimerStatus.PARKED),
    timer("o3", "claimed", T0 + 2_000, TimerStatus.FIRING),
]


@pytest.fixture
def changelog(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    asked: list[tuple[str, str]] = []

    async def read(bootstrap: Connectable, type_name: str, **kw: Any) -> list[Timer]:
        asked.append((str(bootstrap), type_name))
        return sorted(ROWS, key=lambda t: (t.partition, t.due_at))

    monkeypatch.setattr(app.cli.timers, "read_timers", read)
    return asked


def upcoming(*args: str) -> Any:
    return CliRunner().invoke(cli, ["timers", "upcoming", "--type", "shop.order", *args])


def test_the_command_lists_by_due_time_and_pages(changelog: list[tuple[str, str]]) -> None:
    first = upcoming("--limit", "2")
    assert first.exit_code == 0, first.output
    lines = first.stdout.splitlines()
    assert [line.split("\t")[3] for line in lines] == ["soon", "claimed"]
    assert lines[0].startswith("2027-01-15T08:00:01.000+00:00\tPENDING\tshop.order/(0)/o2\tsoon")
    count, cursor = re.fullmatch(
        r"(\d+) timer\(s\); next page: --cursor (\S+)\n", first.stderr
    ).groups()  # type: ignore[union-attr]
    assert count == "2"
    second = upcoming("--limit", "2", "--cursor", cursor)
    assert [line.split("\t")[3] for line in second.stdout.splitlines()] == ["late"]
    assert second.stderr == "1 timer(s)\n"


def test_the_command_filters_and_prints_one_json_object(
    changelog: list[tuple[str, str]],
) -> None:
    result = upcoming("--target", "t1", "--json", "--due-until", str(T0 + 3_000))
    assert result.exit_code == 0, result.output
    page = orjson.loads(result.stdout)
    assert page == {"timers": [ROWS[0].model_dump(mode="json")], "next_cursor": None}
    window = upcoming("--due-from", str(T0 + 1_500), "--due-until", str(T0 + 2_500), "--json")
    assert [t["key"] for t in orjson.loads(window.stdout)["timers"]] == ["claimed"]
    assert changelog and changelog[0][1] == "shop.order"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--due-from", "tomorrow"], "error: --due-from 'tomorrow' is neither ISO 8601"),
        (["--due-from", "\u00b2"], "error: --due-from '\u00b2' is neither ISO 8601"),
        (
            ["--due-until", "2026-12-24T00:00"],
            "error: --due-until '2026-12-24T00:00' has no offset",
        ),
        (["--cursor", "abc"], "error: cursor 'abc' is not a next_cursor of this listing"),
        (["--limit", "0"], "Invalid value for '--limit'"),
    ],
)
def test_the_commands_bad_options_exit_2_with_one_line(
    changelog: list[tuple[str, str]], args: list[str], message: str
) -> None:
    result = upcoming(*args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert message in line and not changelog


# --- the HTTP route --------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(rows=rows_strategy, limit=st.integers(1, 4), owner=st.sampled_from([None, "o1"]))
def test_a_page_of_each_scans_share_is_the_page_of_the_scans(
    rows: list[Timer], limit: int, owner: str | None
) -> None:
    query = UpcomingQuery(limit=limit, owner=owner)
    while True:
        whole = upcoming_page(rows, query)
        shares = [page_share([t for t in rows if t.partition == p], query) for p in (2, 3)]
        assert all(len(share) <= limit + 1 for share in shares)
        assert upcoming_page([t for share in shares for t in share], query) == whole
        if whole.next_cursor is None:
            break
        query = query.model_copy(update={"cursor": whole.next_cursor})


@pytest.fixture
async def web() -> AsyncIterator[tuple[FakeNode, URL, aiohttp.ClientSession]]:
    node = FakeNode()
    server = WebServer(node, 0)  # type: ignore[arg-type]
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield node, URL(f"http://127.0.0.1:{server.port}"), http
    finally:
        await server.stop()


async def put_rows(node: FakeNode, rows: list[Timer]) -> None:
    for t in rows:
        pending = t.model_copy(update={"status": TimerStatus.PENDING})
        assert await node.store.put(pending)
        if t.status is not TimerStatus.PENDING:
            assert await node.store.settle([TimerChange(loaded=pending, next=t)]) == 1


async def get(http: aiohttp.ClientSession, url: URL, query: str = "") -> tuple[int, Any]:
    async with http.get(url.with_path("/timers/upcoming").with_query(query)) as r:
        return r.status, await r.json()


async def test_the_route_lists_the_nodes_partitions_by_due_time(
    web: tuple[FakeNode, URL, aiohttp.ClientSession],
) -> None:
    node, url, http = web
    node.owned = sorted({t.partition for t in ROWS})
    assert node.owned == [2, 3]  # o1, o3 in 3; o2 in 2
    elsewhere = next(f"x{n}" for n in range(99) if partition_of(f"x{n}", PAGE_PARTITIONS) == 0)
    await put_rows(node, [*ROWS, timer(elsewhere, "other", T0)])  # not this node's: left out
    status, body = await get(http, url, f"type={TYPE}&limit=2")
    assert status == 200, body
    assert [t["key"] for t in body["timers"]] == ["soon", "claimed"]
    assert body["partitions"] == node.owned and body["scanned_all"] is True
    status, body = await get(http, url, f"limit=2&cursor={body['next_cursor']}")
    assert [t["key"] for t in body["timers"]] == ["late"] and body["next_cursor"] is None
    status, body = await get(http, url, "owner=o1")
    assert [t["key"] for t in body["timers"]] == ["late"]


async def test_the_docs_example_query_is_answered(
    web: tuple[FakeNode, URL, aiohttp.ClientSession],
) -> None:
    node, url, http = web
    text = "\n".join(p.read_text() for p in DOCS)
    (query,) = re.findall(r"`curl 'http://127\.0\.0\.1:8080/timers/upcoming\?([^']*)'`", text)
    node.owned = list(range(PAGE_PARTITIONS))
    await put_rows(node, [timer("o1", "a", 1798156800000 - 1), timer("o1", "b", 1798156800001)])
    status, body = await get(http, url, query)
    assert status == 200, body
    assert set(body) == {"timers", "next_cursor", "partitions", "scanned_all", "unread"}
    assert [t["key"] for t in body["timers"]] == ["a"]


async def test_a_scan_that_stops_ends_the_pages_where_it_did(
    web: tuple[FakeNode, URL, aiohttp.ClientSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, url, http = web
    monkeypatch.setattr(app.ops.upcoming_reads, "UPCOMING_SCAN", 2)
    node.owned = list(range(PAGE_PARTITIONS))
    owners = {
        p: next(f"o{n}" for n in range(999) if partition_of(f"o{n}", PAGE_PARTITIONS) == p)
        for p in (0, 1)
    }
    # partition 0: due at +1, +2, +3 (scan stops after +2); partition 1: due at +4
    await put_rows(node, [timer(owners[0], k, T0 + d) for k, d in (("a", 1), ("b", 2), ("c", 3))])
    await put_rows(node, [timer(owners[1], "z", T0 + 4)])
    status, body = await get(http, url, "limit=10")
    assert status == 200
    assert [t["key"] for t in body["timers"]] == ["a", "b"]  # not z, due after the unread c
    assert body["scanned_all"] is False


async def test_a_request_holds_of_each_partitions_scan_what_its_page_may_take(
    web: tuple[FakeNode, URL, aiohttp.ClientSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every partition's scan (10,000 timers at most) was held until the page was cut from
    all of them: an open read's memory grew with the node's partitions. Each scan is now
    let go once its share of the page is kept (`limit` + 1 timers)."""
    node, url, http = web
    node.owned = list(range(PAGE_PARTITIONS))
    owners = [f"o{n}" for n in range(40)]
    await put_rows(node, [timer(o, k, T0 + n) for n, o in enumerate(owners) for k in "abc"])
    held: list[int] = []

    def page(rows: list[Timer], *args: Any) -> Any:
        held.append(len(rows))
        return upcoming_page(rows, *args)

    monkeypatch.setattr(app.ops.upcoming_reads, "upcoming_page", page)
    status, body = await get(http, url, "limit=2")
    assert status == 200, body
    assert [t["owner"]["id"] for t in body["timers"]] == ["o0", "o0"]
    assert len(held) == 1 and held[0] <= 3 * PAGE_PARTITIONS, held  # not the 120 scanned


async def test_a_partition_whose_store_failed_is_named_and_the_others_answer(
    web: tuple[FakeNode, URL, aiohttp.ClientSession],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A damaged block of one partition (a `StoreError` of it: its task restores it) was a
    500 for every partition's timers."""
    node, url, http = web
    node.owned = sorted({t.partition for t in ROWS})
    await put_rows(node, ROWS)
    due_after = node.store.due_after

    async def damaged(partitions: set[int], *args: Any) -> list[Timer]:
        if partitions == {2}:
            raise StoreError("RocksDB read of partition 2 failed: Corruption", partition=2)
        return await due_after(partitions, *args)

    monkeypatch.setattr(node.store, "due_after", damaged)
    status, body = await get(http, url, "limit=10")
    assert status == 200, body
    assert [t["owner"]["id"] for t in body["timers"]] and all(
        t["partition"] == 3 for t in body["timers"]
    )
    assert body["scanned_all"] is False
    assert body["unread"] == {f"{TYPE}[2]": "RocksDB read of partition 2 failed: Corruption"}
    # Told in the log too: a read no timer round makes (far-future timers) is seen nowhere
    # else.
    assert any("a read of partition 2's store failed" in r.getMessage() for r in caplog.records)


async def test_a_store_failure_no_route_answers_is_a_503_not_a_500(
    web: tuple[FakeNode, URL, aiohttp.ClientSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, url, http = web
    node.owned = list(range(PAGE_PARTITIONS))

    async def damaged(*_: object, **__: object) -> list[Timer]:
        raise StoreError("RocksDB read of partition 3 failed: Corruption", partition=3)

    monkeypatch.setattr(node.store, "owner_timers", damaged)
    async with http.get(url.with_path("/").with_query(owner="o1")) as r:
        assert r.status == 503, await r.text()
        assert r.headers["Retry-After"] == "5"
        assert "partition 3 failed" in (await r.json())["error"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=0", "limit: Input should be greater than or equal to 1"),
        ("due_from=soon", "due_from 'soon' is neither ISO 8601"),
        ("due_from=\u00b2", "due_from '\u00b2' is neither ISO 8601"),
        ("due_until=" + "9" * 5000, "due_until '9999999999"),
        ("cursor=zz", "cursor 'zz' is not a next_cursor"),
        ("colour=red", "colour: no such parameter"),
        ("type=shop.basket", "type: this node keeps no timers of shop.basket (shop.order)"),
        ("type=nope", "nope"),
    ],
)
async def test_a_bad_query_is_a_400_naming_it(
    web: tuple[FakeNode, URL, aiohttp.ClientSession], query: str, message: str
) -> None:
    _, url, http = web
    status, body = await get(http, url, query)
    assert status == 400 and message in body["error"], body
