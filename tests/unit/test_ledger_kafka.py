"""The Kafka ledger's pure parts: its keys, values, merge, and the view it keeps in memory."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import BadRecord
from app.kafka import Record
from app.timers.ledger import (
    LedgerKey,
    LedgerView,
    decode_key,
    decode_value,
    encode_entry,
    ledger_key,
    merged,
)
from app.timers.runner import TimerOptions
from tables.ledger import LedgerEntry
from tables.refs import AggregateRef
from tables.rules import OnceRule
from tables.timer import CommandSpec, Timer, TimerStatus

SUB = TimerOptions.PARKED_SUBSCRIPTION
TARGET = AggregateRef(context="shop", aggregate="order", tenant="acme", id="o-2")
OTHER = AggregateRef(context="shop", aggregate="order", id="o-3")
TOPIC = "shop.failure-ledger"


def timer(id_: str, slot: int = 0) -> Timer:
    return Timer(
        id=id_,
        owner=AggregateRef(context="shop", aggregate="order", id="o-1"),
        key=f"k-{id_}",
        version=1,
        partition=0,
        status=TimerStatus.PARKED,
        rule=OnceRule(at=1_000),
        target=TARGET,
        command=CommandSpec(type="Remind"),
        slot=slot,
        slot_due_at=1_000,
        due_at=1_000,
    )


def record(key: bytes | None, value: bytes | None, offset: int, partition: int = 0) -> Record:
    return Record(TOPIC, partition, offset, key, value, 0)


def entry(*timers: str, target: AggregateRef = TARGET) -> LedgerEntry:
    return LedgerEntry(subscription=SUB, target=target, timers=timers)


# --- keys and values ----------------------------------------------------------------------


def test_the_key_is_the_sorted_json_of_subscription_and_target() -> None:
    key = ledger_key(SUB, TARGET)
    assert key == (
        b'{"subscription":"tickwheel.timers","target":'
        b'{"aggregate":"order","context":"shop","id":"o-2","tenant":"acme"}}'
    )
    assert decode_key(key) == LedgerKey(SUB, TARGET)


def test_a_key_written_with_its_fields_in_another_order_names_the_same_pair() -> None:
    # Another language's writer need not sort: the pair is what counts, not the bytes.
    shuffled = orjson.dumps({"target": TARGET.model_dump(mode="json"), "subscription": SUB})
    assert shuffled != ledger_key(SUB, TARGET)
    assert decode_key(shuffled) == LedgerKey(SUB, TARGET)


@pytest.mark.parametrize(
    "key",
    [
        None,
        b"not json",
        b"[1, 2]",
        b'{"subscription": "s"}',
        b'{"subscription": "", "target": {"context": "a", "aggregate": "b", "id": "c"}}',
        b'{"subscription": "s", "target": {"context": "a"}}',
        b'{"subscription": "s", "target": {"context": "a", "aggregate": "b", "id": "c"}, "x": 1}',
    ],
)
def test_a_bad_key_is_a_bad_record(key: bytes | None) -> None:
    with pytest.raises(BadRecord):
        decode_key(key)


def test_values_round_trip_and_a_tombstone_is_none() -> None:
    e = entry("t-1#0", "t-2#3")
    key = LedgerKey(SUB, TARGET)
    assert decode_value(key, encode_entry(e)) == e
    assert decode_value(key, None) is None


def test_a_value_under_another_pairs_key_or_unreadable_is_a_bad_record() -> None:
    with pytest.raises(BadRecord, match="under the key of"):
        decode_value(LedgerKey(SUB, OTHER), encode_entry(entry("t-1#0")))
    with pytest.raises(BadRecord, match="unreadable"):
        decode_value(LedgerKey(SUB, TARGET), b'{"subscription": "x"}')


# --- merge --------------------------------------------------------------------------------


def test_record_merges_with_the_known_entry_each_timer_once_in_order() -> None:
    first = merged(None, SUB, TARGET, [timer("t-1"), timer("t-2")])
    assert first == entry("t-1#0", "t-2#0")
    again = merged(first, SUB, TARGET, [timer("t-2"), timer("t-3", slot=4), timer("t-3", slot=4)])
    assert again == entry("t-1#0", "t-2#0", "t-3#4")
    # Parked again after a retry, at the same slot: the same request id, named once.
    assert merged(again, SUB, TARGET, [timer("t-1")]) == again


@settings(deadline=None)
@given(
    st.lists(st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 3)), max_size=5)),
)
def test_merging_keeps_every_request_id_once_in_first_seen_order(
    batches: list[list[tuple[str, int]]],
) -> None:
    known: LedgerEntry | None = None
    seen: list[str] = []
    for batch in batches:
        timers = [timer(i, s) for i, s in batch]
        known = merged(known, SUB, TARGET, timers)
        for t in timers:
            if t.request_id not in seen:
                seen.append(t.request_id)
        assert known.timers == tuple(seen)
        assert (known.subscription, known.target) == (SUB, TARGET)


def test_an_entry_carries_the_error_of_the_latest_park_that_has_one() -> None:
    """#22: why the target's timers were parked, from the parked rows' last error."""
    failed = timer("t-1").model_copy(update={"error_code": "ERROR", "error_text": "no stock"})
    first = merged(None, SUB, TARGET, [timer("t-0"), failed])
    assert (first.error_code, first.error_text) == ("ERROR", "no stock")
    # A later park without an error (a row parked before #22) keeps the entry's.
    assert merged(first, SUB, TARGET, [timer("t-2")]).error_code == "ERROR"
    timeout = timer("t-3").model_copy(update={"error_code": "TIMEOUT"})
    later = merged(first, SUB, TARGET, [timeout])
    assert (later.error_code, later.error_text) == ("TIMEOUT", None)
    assert decode_value(LedgerKey(SUB, TARGET), encode_entry(later)) == later
    assert b'"error_text"' not in encode_entry(later)


def test_an_entry_without_an_error_is_written_as_before() -> None:
    """Records written before #22 read back the same and are written byte for byte."""
    old = b'{"subscription":"tickwheel.timers","target":{"aggregate":"order","context":"shop",'
    old += b'"id":"o-2","tenant":"acme"},"timers":["t-1#0"]}'
    e = decode_value(LedgerKey(SUB, TARGET), old)
    assert e == entry("t-1#0") and e is not None and e.error_code is None
    assert encode_entry(e) == old


# --- the view -----------------------------------------------------------------------------


def test_the_view_keeps_the_newest_record_of_each_key_by_offset() -> None:
    view = LedgerView()
    key = ledger_key(SUB, TARGET)
    assert view.apply_record(record(key, encode_entry(entry("t-1#0")), offset=5))
    # Read again (the follower and the read to the end overlap), or older: changes nothing.
    assert not view.apply_record(record(key, encode_entry(entry("t-1#0")), offset=5))
    assert not view.apply_record(record(key, None, offset=3))
    assert view.entries() == [entry("t-1#0")]
    assert view.apply_record(record(key, encode_entry(entry("t-1#0", "t-2#0")), offset=9))
    assert view.entries() == [entry("t-1#0", "t-2#0")]


def test_a_tombstone_resolves_and_an_older_record_read_late_does_not_bring_it_back() -> None:
    view = LedgerView()
    key = ledger_key(SUB, TARGET)
    view.apply(LedgerKey(SUB, TARGET), 0, 7, entry("t-1#0"))
    assert view.apply_record(record(key, None, offset=8))
    assert view.entries() == [] and view.get(LedgerKey(SUB, TARGET)) is None
    assert not view.apply_record(record(key, encode_entry(entry("t-1#0")), offset=7))
    assert view.entries() == []
    # A newer park of the same target opens it again.
    assert view.apply_record(record(key, encode_entry(entry("t-1#1")), offset=12))
    assert view.entries() == [entry("t-1#1")]


def test_a_tombstone_is_forgotten_once_the_follower_read_past_it() -> None:
    view = LedgerView()
    key, pair = ledger_key(SUB, TARGET), LedgerKey(SUB, TARGET)
    view.apply(pair, 0, 9, None)  # this node's own resolve, at 9 (acknowledged)
    view.read_past(0, 8)  # the follower still behind it: an older record may come
    assert not view.apply_record(record(key, encode_entry(entry("t-1#0")), offset=8))
    assert len(view) == 1
    view.read_past(0, 9)  # read back: what comes next is newer
    assert len(view) == 0 and view.get(pair) is None
    view.read_past(0, 20)  # nothing left to forget
    # A park after it opens the entry again, as with the tombstone held.
    assert view.apply_record(record(key, encode_entry(entry("t-1#1")), offset=21))
    assert view.entries() == [entry("t-1#1")]


def test_only_a_tombstone_read_past_is_forgotten() -> None:
    """An entry opened again after its tombstone, a tombstone in another partition or
    further on: each stays (offsets repeat across partitions and recreated topics)."""
    view = LedgerView()
    a, b, c = (LedgerKey(SUB, AggregateRef(context="s", aggregate="o", id=i)) for i in "abc")
    view.apply(a, 0, 3, None)
    view.apply(a, 0, 5, entry("t-1#0", target=a.target))  # opened again
    view.apply(b, 1, 3, None)  # the same offset in another partition
    view.apply(c, 0, 3, None)
    view.apply(c, 0, 7, None)  # resolved twice: the newer one is held
    view.read_past(0, 6)
    assert view.get(a) == entry("t-1#0", target=a.target)
    assert len(view) == 3  # a open, b in partition 1, c's newer tombstone at 7
    view.read_past(1, 3)
    view.read_past(0, 7)
    assert len(view) == 1 and view.entries() == [entry("t-1#0", target=a.target)]


def test_own_writes_and_read_records_agree_on_the_key() -> None:
    view = LedgerView()
    view.apply(LedgerKey(SUB, TARGET), 1, 4, entry("t-1#0"))
    shuffled = orjson.dumps({"target": TARGET.model_dump(mode="json"), "subscription": SUB})
    assert not view.apply_record(record(shuffled, None, offset=4, partition=1))
    assert view.apply_record(record(shuffled, None, offset=5, partition=1))
    assert view.entries() == []


def test_bad_records_are_skipped_and_logged_and_the_rest_is_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    view = LedgerView()
    key = ledger_key(SUB, TARGET)
    assert not view.apply_record(record(b"garbage", b"{}", offset=1))
    assert not view.apply_record(record(key, b"{not json", offset=2))
    assert not view.apply_record(record(ledger_key(SUB, OTHER), encode_entry(entry()), offset=3))
    assert view.apply_record(record(key, encode_entry(entry("t-1#0")), offset=4))
    assert view.entries() == [entry("t-1#0")]
    # The first in full; the others counted, told by a line a minute (test_log_floods).
    assert caplog.text.count("skipping shop.failure-ledger[0]@") == 1


def test_entries_are_sorted_and_only_the_open_ones() -> None:
    view = LedgerView()
    view.apply(LedgerKey(SUB, TARGET), 0, 1, entry("t-1#0"))
    view.apply(LedgerKey(SUB, OTHER), 2, 1, entry("t-9#0", target=OTHER))
    view.apply(LedgerKey("a-subscription", TARGET), 1, 1, None)
    # by subscription, then target: "shop.order/(0)/o-3" sorts before "shop.order/acme/o-2"
    assert [e.target for e in view.entries()] == [OTHER, TARGET]
