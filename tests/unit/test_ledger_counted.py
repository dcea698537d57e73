"""A ledger of every parked target is counted and read newest first without being listed
and sorted whole: the view counts its open entries as it takes records (a scrape reads
that), and its newest `limit` (the page's) come out as the whole ordered list's first."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.node.metrics import NodeMetrics
from app.ops.page_ledger import ledger_rows
from app.protocol.topics import ContextTopics
from app.timers.ledger import KafkaFailureLedger, LedgerKey, LedgerView
from app.timers.runner import TimerOptions
from tables.ledger import LedgerEntry
from tables.refs import AggregateRef

SUB = TimerOptions.PARKED_SUBSCRIPTION
T0 = 1_800_000_000_000

# A few subscriptions and targets (tenants and ids that sort apart by their text), so
# that keys repeat and ties of time are ordered by them.
keys = st.builds(
    LedgerKey,
    st.sampled_from([SUB, "a-subscription", "z-subscription"]),
    st.builds(
        AggregateRef,
        context=st.just("shop"),
        aggregate=st.sampled_from(["order", "inv"]),
        tenant=st.sampled_from(["(0)", "acme"]),
        id=st.sampled_from(["o-1", "o-2", "o-10", "O-3"]),
    ),
)
# (key, partition, offset, open or a tombstone, written at): written at within a few
# ms, so that many share a time.
records = st.lists(
    st.tuples(keys, st.integers(0, 2), st.integers(0, 30), st.booleans(), st.integers(0, 4)),
    max_size=60,
)
# Reads of the follower past an offset of a partition, between the records.
reads = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30)), max_size=10)


def taken(
    view: LedgerView,
    recs: list[tuple[LedgerKey, int, int, bool, int]],
    past: list[tuple[int, int]],
) -> None:
    """Takes `recs`, reading past `past` between them, and checks the count at each step."""
    for n, (key, partition, offset, is_open, at) in enumerate(recs):
        entry = LedgerEntry(subscription=key.subscription, target=key.target) if is_open else None
        view.apply(key, partition, offset, entry, T0 + at)
        if n < len(past):
            view.read_past(*past[n])
        assert view.open_count == len(view.entries())


@settings(max_examples=300, deadline=None)
@given(records, reads)
def test_the_open_entries_are_counted_as_records_are_taken(
    recs: list[tuple[LedgerKey, int, int, bool, int]], past: list[tuple[int, int]]
) -> None:
    """Parks, tombstones, older records read late, records of a key in another partition,
    tombstones forgotten once read past: the count is what `entries()` lists."""
    taken(LedgerView(), recs, past)


def full_sort(view: LedgerView) -> list[tuple[int, LedgerEntry]]:
    """The order the page shows: newest first, ties by subscription then target's text."""
    dated = view.dated()
    by_pair = sorted(dated, key=lambda d: (d[1].subscription, str(d[1].target)))
    assert [e for _, e in by_pair] == view.entries(), "every open entry, once"
    assert dated == sorted(by_pair, key=lambda d: -d[0])
    return dated


@settings(max_examples=300, deadline=None)
@given(records, reads, st.integers(0, 70))
def test_the_newest_limit_are_the_first_of_the_whole_order(
    recs: list[tuple[LedgerKey, int, int, bool, int]], past: list[tuple[int, int]], limit: int
) -> None:
    view = LedgerView()
    taken(view, recs, past)
    assert view.dated(limit) == full_sort(view)[:limit]


async def test_a_scrape_counts_the_ledger_without_listing_it() -> None:
    """The gauge of open entries follows parks and resolves, and no scrape lists the
    ledger (which sorted every entry at each)."""
    log = MemoryLog([TopicSpec(ContextTopics("shop").ledger, 2, compacted=True)])
    ledger = KafkaFailureLedger(log, "shop", 2, log.publisher())
    await ledger.start()
    listed = 0
    real_entries = ledger.entries

    async def entries() -> list[LedgerEntry]:
        nonlocal listed
        listed += 1
        return await real_entries()

    ledger.entries = entries  # type: ignore[method-assign]
    metrics = NodeMetrics()

    async def scraped() -> float | None:
        await metrics.refresh(T0, [], {"shop": ledger})
        return metrics.registry.get_sample_value("tickwheel_ledger_entries", {"context": "shop"})

    try:
        targets = [AggregateRef(context="shop", aggregate="inv", id=f"i-{n}") for n in range(3)]
        assert await scraped() == 0
        for target in targets:
            await ledger.record(SUB, target, [])
        assert await scraped() == 3
        await ledger.record(SUB, targets[0], [])  # written again: still one entry
        assert await ledger.resolve(SUB, targets[1])
        assert await scraped() == 2
        assert listed == 0, "a scrape listed the whole ledger"
    finally:
        await ledger.stop()


class Dated:
    """A dated ledger of `n` entries, one a millisecond, that remembers what it was asked."""

    def __init__(self, n: int, context: str) -> None:
        targets = [AggregateRef(context=context, aggregate="inv", id=f"i-{i}") for i in range(n)]
        self._dated = [
            (T0 + i, LedgerEntry(subscription=SUB, target=t)) for i, t in enumerate(targets)
        ][::-1]
        self.asked: list[int | None] = []

    async def dated(self, limit: int | None = None) -> list[tuple[int, LedgerEntry]]:
        self.asked.append(limit)
        return self._dated[:limit]

    @property
    def open_entries(self) -> int:
        return len(self._dated)

    async def entries(self) -> list[LedgerEntry]:
        raise AssertionError("the page listed a dated ledger whole")

    async def record(self, *_: object) -> None:
        raise NotImplementedError

    async def resolve(self, *_: object) -> bool:
        raise NotImplementedError

    async def entry(self, *_: object) -> LedgerEntry | None:
        raise NotImplementedError


async def test_the_page_asks_each_ledger_for_its_newest_limit_alone() -> None:
    """Two contexts' ledgers of 30 and 20 entries, 5 shown: the newest 5 of both, asked of
    each as 5, and the 45 others counted."""
    shop, billing = Dated(30, "shop"), Dated(20, "billing")
    found = await ledger_rows([shop, billing], [], limit=5)
    assert [str(r.entry.target.id) for r in found.rows] == [
        "i-29",
        "i-28",
        "i-27",
        "i-26",
        "i-25",
    ]
    assert found.more == 45
    assert shop.asked == [5] and billing.asked == [5]
