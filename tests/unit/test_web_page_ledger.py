"""The operator page shows the failure ledger's newest entries, bounded (`app.ops.page_ledger`).

It rendered every entry with every name: a ledger of thousands of parked targets, each
naming up to `MAX_NAMED` timers, made a page of megabytes on every load."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from test_web_page import Site, cells, owner_in, put, site

from app.ops.page_ledger import LEDGER_LIMIT, LEDGER_ROWS, NAMES_SHOWN, ledger_rows
from tables import AggregateRef
from tables.ledger import LedgerEntry, MemoryFailureLedger
from tables.timer import Timer

__all__ = ["site"]  # the fixture, used by name

SUB = "tickwheel.timers"
T0 = 1_800_000_000_000


def target(n: int) -> AggregateRef:
    return AggregateRef(context="shop", aggregate="order", id=f"t-{n:03d}")


async def test_the_page_shows_the_newest_entries_and_counts_the_rest(site: Site) -> None:
    owner = owner_in(1)
    total = LEDGER_ROWS + 7
    for n in range(total):
        t = await put(site.node.store, owner, f"k{n}", T0, target=target(n))
        await site.node.ledger.record(SUB, target(n), [t])
    status, html = await site.get()
    assert status == 200
    rows = cells(html, "ledger")
    assert len(rows) == LEDGER_ROWS
    # The memory ledger lists its entries as first recorded: the newest shown first.
    assert [r[1] for r in rows] == [str(target(n)) for n in reversed(range(7, total))]
    assert "and 7 older ones" in " ".join(html.split())


async def test_an_entry_shows_its_first_names_and_counts_the_others(site: Site) -> None:
    owner = owner_in(1)
    timers = [await put(site.node.store, owner, f"k{n}", T0, target=target(1)) for n in range(25)]
    await site.node.ledger.record(SUB, target(1), timers)
    _, html = await site.get()
    [row] = cells(html, "ledger")
    shown = ", ".join(t.request_id for t in timers[:NAMES_SHOWN])
    assert row[2] == f"{shown}, and {25 - NAMES_SHOWN} more"
    assert 'id="ledger-more"' not in html


class Dated:
    """A ledger that tells when its entries were written (as `KafkaFailureLedger`)."""

    def __init__(self, dated: list[tuple[int, LedgerEntry]]) -> None:
        self._dated = dated

    async def dated(self, limit: int | None = None) -> list[tuple[int, LedgerEntry]]:
        return sorted(self._dated, key=lambda d: d[0], reverse=True)[:limit]

    @property
    def open_entries(self) -> int:
        return len(self._dated)

    async def entries(self) -> list[LedgerEntry]:
        return [e for _, e in self._dated]

    async def record(
        self, subscription: str, target: AggregateRef, timers: Sequence[Timer]
    ) -> None:
        raise NotImplementedError

    async def resolve(self, subscription: str, target: AggregateRef) -> bool:
        raise NotImplementedError

    async def entry(self, subscription: str, target: AggregateRef) -> LedgerEntry | None:
        raise NotImplementedError


async def test_the_contexts_ledgers_are_merged_newest_first() -> None:
    def entry(n: int) -> LedgerEntry:
        return LedgerEntry(subscription=SUB, target=target(n))

    shop = Dated([(T0 + 1, entry(1)), (T0 + 5, entry(5))])
    billing = Dated([(T0 + 3, entry(3)), (T0 + 2, entry(2))])
    found = await ledger_rows([shop, billing], ["shop.order"], limit=3)
    assert [r.entry.target.id for r in found.rows] == ["t-005", "t-003", "t-002"]
    assert found.more == 1
    assert found.rows[0].default_type == "shop.order"
    assert (await ledger_rows([MemoryFailureLedger()], [])).rows == []


async def test_get_ledger_lists_the_newest_entries_whole_and_counts_the_rest(site: Site) -> None:
    """`GET /ledger` listed every open entry: a flooded ledger made one answer of its whole
    size on every call. It lists the newest `limit` (whole: every named timer)."""
    owner = owner_in(1)
    for n in range(12):
        timers = [
            await put(site.node.store, owner, f"k{n}-{m}", T0, target=target(n)) for m in (0, 1)
        ]
        await site.node.ledger.record(SUB, target(n), timers)
    status, text = await site.get("/ledger", limit="5")
    body = json.loads(text)
    assert status == 200
    assert [e["target"]["id"] for e in body["entries"]] == [f"t-{n:03d}" for n in (11, 10, 9, 8, 7)]
    assert [len(e["timers"]) for e in body["entries"]] == [2] * 5
    assert body["more"] == 7
    status, text = await site.get("/ledger")
    assert status == 200 and len(json.loads(text)["entries"]) == 12
    assert json.loads(text)["more"] == 0
    assert LEDGER_LIMIT == 1_000


@pytest.mark.parametrize("bad", ["0", "-1", "x", "10001", "1e3", "٣", "99999999999", ""])
async def test_get_ledger_refuses_a_bad_limit(site: Site, bad: str) -> None:
    status, text = await site.get("/ledger", limit=bad)
    assert status == 400
    assert json.loads(text)["field"] == "limit"
    status, text = await site.get("/ledger", limt="5")
    assert status == 400 and "limt" in json.loads(text)["error"]
