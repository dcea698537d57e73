"""A ledger entry names at most `MAX_NAMED` timers in `MAX_NAMED_BYTES`, and says when
its target parked more (`truncated`): a target parking tens of thousands of timers would
otherwise outgrow a Kafka record, and every later park of it would fail."""

from __future__ import annotations

import asyncio
import functools

import orjson
import pytest
from fakes import OWNER, T0, TARGET, AnsweringSender, StillClock, parked_slot_timer, slot_timer
from hypothesis import given
from hypothesis import strategies as st

import tables.ledger
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.node.parked_names import keep_parked_named
from app.protocol.topics import ContextTopics
from app.timers.ledger import KafkaFailureLedger, decode_key, decode_value, encode_entry
from app.timers.runner import TimerOptions, TimerRunner
from tables import open_timer_store
from tables.ledger import MAX_NAMED, MAX_NAMED_BYTES, LedgerEntry, MemoryFailureLedger, merged
from tables.timer import MAX_ERROR_TEXT, Timer

SUB = TimerOptions.PARKED_SUBSCRIPTION
PARTITIONS = 3
ONE_MB = 1_000_000


def ends(log: MemoryLog, topic: str) -> list[int]:
    return [log.offsets(topic, p)[1] for p in range(PARTITIONS)]


def timer(i: int, id_chars: str = "x") -> Timer:
    """A timer whose request id is as long as ids go (200 characters)."""
    return slot_timer(id=f"{i}-".ljust(200, id_chars), key=f"k{i}")


def test_an_entry_names_the_first_timers_parked_and_says_it_names_no_more() -> None:
    timers = [timer(i) for i in range(MAX_NAMED + 5)]
    entry = merged(None, SUB, TARGET, timers[:10])
    assert not entry.truncated and len(entry.timers) == 10
    entry = merged(entry, SUB, TARGET, timers[10:])
    assert entry.truncated
    assert entry.timers == tuple(t.request_id for t in timers[:MAX_NAMED])
    # Once it said so, it keeps saying so; a name it holds is never dropped.
    again = merged(entry, SUB, TARGET, [timers[0]])
    assert again.truncated and again.timers == entry.timers


def test_another_writers_entry_naming_more_than_the_bounds_is_cut_when_written_again() -> None:
    """An entry another writer put on the ledger topic may name 5,000 timers (a record of
    ~1 MB): kept whole beside a new park's names, the rewrite outgrew the record, the
    park's write failed and the target's timers never parked (every backoff they sent
    again, for good). Written again, it names the first within the bounds, truncated."""
    forged = LedgerEntry(
        subscription=SUB, target=TARGET, timers=tuple(timer(i).request_id for i in range(5_000))
    )
    assert len(encode_entry(forged)) > ONE_MB // 2
    entry = merged(forged, SUB, TARGET, [timer(9_999)])
    assert entry.truncated and len(entry.timers) <= MAX_NAMED
    assert entry.timers == forged.timers[: len(entry.timers)]
    assert len(encode_entry(entry)) < ONE_MB // 2


@pytest.mark.parametrize("chars", ["x", "\U0001f600", "\u0001"], ids=["ascii", "emoji", "escaped"])
def test_the_largest_entry_fits_a_kafka_record(chars: str) -> None:
    """Names of 200 characters of 4 bytes each, or of 6 once escaped: the byte cap holds
    where the count alone would not (and the error text at its longest besides)."""
    timers = [
        timer(i, chars).model_copy(update={"error_code": "E", "error_text": "e" * MAX_ERROR_TEXT})
        for i in range(MAX_NAMED + 1)
    ]
    entry = merged(None, SUB, TARGET, timers)
    assert entry.truncated
    raw = encode_entry(entry)
    assert len(orjson.dumps(list(entry.timers))) <= MAX_NAMED_BYTES + 2
    assert len(raw) < ONE_MB // 2
    # It reads back as it was written.
    key = decode_key(orjson.dumps({"subscription": SUB, "target": TARGET.model_dump()}))
    assert decode_value(key, raw) == entry


def test_an_entry_not_truncated_is_written_as_before() -> None:
    entry = merged(None, SUB, TARGET, [timer(1)])
    assert b"truncated" not in encode_entry(entry)
    older = {"subscription": SUB, "target": TARGET.model_dump(), "timers": ["a#0"]}
    assert LedgerEntry.model_validate_json(orjson.dumps(older)).truncated is False


@given(st.lists(st.lists(st.integers(0, 40), max_size=15), max_size=6))
def test_merged_names_each_once_in_the_order_parked_within_the_caps(parks: list[list[int]]) -> None:
    """Whatever the parks: each name once, the first parked first, within the caps, and
    `truncated` exactly when a timer parked is not named."""
    cap = 12
    entry: LedgerEntry | None = None
    parked: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tables.ledger, "MAX_NAMED", cap)
        for park in parks:
            timers = [timer(i) for i in park]
            entry = merged(entry, SUB, TARGET, timers)
            for t in timers:
                if t.request_id not in parked:
                    parked.append(t.request_id)
    if entry is None:
        return
    assert entry.timers == tuple(parked[:cap])
    assert entry.truncated == (len(parked) > cap)


async def test_a_truncated_entry_is_not_recorded_again_by_naming() -> None:
    """`name_parked` leaves an entry that says it names no more as it is: each record of
    it would be followed by every other node, which would look and record it again."""
    recorded: list[int] = []

    class Ledger(MemoryFailureLedger):
        async def record(self, subscription: str, target: object, timers: object) -> None:
            recorded.append(len(timers))  # type: ignore[arg-type]
            await super().record(subscription, target, timers)  # type: ignore[arg-type]

    ledger = Ledger()
    store = open_timer_store("memory://", partitions=PARTITIONS)
    runner = TimerRunner(
        store, AnsweringSender(), StillClock(T0), ledger, partitions=range(PARTITIONS)
    )
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tables.ledger, "MAX_NAMED", 2)
            a, b, c = [await parked_slot_timer(store, k, 1) for k in "abc"]
            await ledger.record(SUB, TARGET, [a, b])  # full, not yet saying so
            assert await runner.name_parked(TARGET) == 1  # c: recorded, as `truncated`
            entry = await ledger.entry(SUB, TARGET)
            assert entry is not None and entry.truncated
            assert entry.timers == (a.request_id, b.request_id)
            assert await runner.name_parked(TARGET) == 0
            assert recorded == [2, 1]
            # A partition started here names what no entry names: not a truncated one's.
            runner.start_partition(1, check_named=True)
            async with runner.partition_round(1) as r:
                r.claims_committed(r.to_commit)
            assert recorded == [2, 1]
        assert c.owner == OWNER
    finally:
        await store.close()


async def test_two_nodes_keeping_a_truncated_entry_named_stop_writing_it() -> None:
    """Two nodes' keepers, each following the other's records, with more PARKED timers of
    one target than its entry names: they write it a few times, then not again."""
    topic = ContextTopics("shop").ledger
    log = MemoryLog([TopicSpec(topic, PARTITIONS, compacted=True)])
    ledgers = [KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher()) for _ in range(2)]
    stores = [open_timer_store("memory://", partitions=PARTITIONS) for _ in range(2)]
    keepers: list[asyncio.Task[None]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tables.ledger, "MAX_NAMED", 2)
        try:
            runners = []
            for i, (ledger, store) in enumerate(zip(ledgers, stores, strict=True)):
                await ledger.start()
                runner = TimerRunner(store, AnsweringSender(), StillClock(T0), ledger)
                runner.start_partition(i)
                runners.append(runner)
                keepers.append(
                    asyncio.create_task(
                        keep_parked_named(ledger, functools.partial(list, [runner]), after_s=0)
                    )
                )
            first = [await parked_slot_timer(stores[0], k, 0) for k in "abc"]
            second = [await parked_slot_timer(stores[1], k, 1) for k in "de"]
            await ledgers[0].record(SUB, TARGET, first[:1])
            await ledgers[1].record(SUB, TARGET, second[:1])  # over the first's names
            await asyncio.sleep(0.3)
            written = ends(log, topic)
            await asyncio.sleep(0.3)
            assert ends(log, topic) == written  # quiet
            for ledger in ledgers:
                entry = await ledger.entry(SUB, TARGET)
                assert entry is not None and entry.truncated and len(entry.timers) == 2
        finally:
            for task in keepers:
                task.cancel()
            await asyncio.gather(*keepers, return_exceptions=True)
            for ledger in ledgers:
                await ledger.stop()
            for store in stores:
                await store.close()
