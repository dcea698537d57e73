"""The failure ledger as every node reads it, fed records no node writes.

Every node reads the whole `<context>.failure-ledger` at each start and holds it
(`LedgerView`), whoever wrote it; the topic is compacted, so another producer's records
stay for good. What the view holds is bounded as the writers bound what they write: an
entry names at most `MAX_NAMED` timers in `MAX_NAMED_BYTES` (cut to them, `truncated`
then); the view takes `max_held` pairs and `names_room` of names at most; a key's
subscription is short. And a record sits in its key's partition (`partition_of` the key,
where every writer puts it): a copy elsewhere, read after the tombstone in the key's own
partition, brought a resolved entry back at every start. Memory is checked by what is
held (counts and lengths), never by timing or RSS.
"""

from __future__ import annotations

import logging

import orjson
import pytest

from app.kafka import Record, TopicSpec
from app.kafka.memory import MemoryLog
from app.protocol.topics import ContextTopics
from app.timers.ledger import KafkaFailureLedger, LedgerKey, LedgerView, ledger_key, read_ledger
from app.timers.ledger_view import MAX_SUBSCRIPTION, NAME_COST, decode_key
from app.timers.runner import TimerOptions
from tables import CommandSpec, OnceRule, Timer
from tables.ledger import MAX_NAMED, MAX_NAMED_BYTES, LedgerEntry
from tables.partitioner import partition_of
from tables.refs import AggregateRef

SUB = TimerOptions.PARKED_SUBSCRIPTION
PARTITIONS = 12
TOPIC = ContextTopics("shop").ledger
T0 = 1_800_000_000_000


def target(n: int = 1) -> AggregateRef:
    return AggregateRef(context="shop", aggregate="order", id=f"t-{n}")


def key_of(t: AggregateRef) -> bytes:
    return ledger_key(SUB, t)


def home(t: AggregateRef) -> int:
    """The partition every writer puts the key of `t` in."""
    return partition_of(key_of(t).decode(), PARTITIONS)


def value(t: AggregateRef, names: list[str]) -> bytes:
    """An entry as another producer may write it: any number of names."""
    return orjson.dumps({"subscription": SUB, "target": t.model_dump(mode="json"), "timers": names})


def record(t: AggregateRef, names: list[str] | None, offset: int, partition: int = -1) -> Record:
    """A record of `t`'s key, in its own partition unless `partition` is given."""
    data = None if names is None else value(t, names)
    return Record(TOPIC, home(t) if partition < 0 else partition, offset, key_of(t), data, 0)


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# --- names ----------------------------------------------------------------------------------


def test_an_entry_naming_more_timers_than_a_writer_names_is_held_cut_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """50,000 names (~0.7 MB on the wire) were held whole, ~5 MB a record: a ledger of such
    ran every node out of memory at every start."""
    view = LedgerView(PARTITIONS)
    names = [f"x-{n}#0" for n in range(50_000)]
    assert view.apply_record(record(target(), names, offset=0))
    [held] = view.entries()
    assert held.timers == tuple(names[:MAX_NAMED]) and held.truncated
    [line] = lines(caplog, "cutting")
    assert f"naming {MAX_NAMED} of its 50000 timer(s)" in line


def test_an_entry_whose_names_outgrow_a_writers_bytes_is_cut_to_them() -> None:
    """Fewer than `MAX_NAMED` names, but long ones: cut where a writer's JSON would end."""
    view = LedgerView(PARTITIONS)
    names = [f"{n}-".ljust(10_000, "x") + "#0" for n in range(100)]
    view.apply_record(record(target(), names, offset=0))
    [held] = view.entries()
    assert held.truncated and 0 < len(held.timers) < len(names)
    assert sum(len(orjson.dumps(n)) + 1 for n in held.timers) <= MAX_NAMED_BYTES
    assert held.timers == tuple(names[: len(held.timers)])


def test_an_entry_within_a_writers_bounds_is_held_as_written() -> None:
    view = LedgerView(PARTITIONS)
    names = [f"t-{n}#0" for n in range(MAX_NAMED)]
    view.apply_record(record(target(), names, offset=0))
    assert view.entries() == [LedgerEntry(subscription=SUB, target=target(), timers=names)]


def test_the_names_held_in_all_are_bounded_and_entries_past_them_name_what_fits() -> None:
    """A flood of entries each within a writer's bounds (1,000 names each) is bounded in
    all: past `names_room`, an entry names what fits, none once it is spent."""
    one = len(orjson.dumps("t-0000#0")) + 1 + NAME_COST
    view = LedgerView(PARTITIONS, names_room=one * 1_500)
    for n in range(4):
        view.apply_record(record(target(n), [f"t-{i:04}#0" for i in range(1_000)], offset=n))
    held = {e.target.id: e for e in view.entries()}
    assert [len(held[f"t-{n}"].timers) for n in range(4)] == [1_000, 500, 0, 0]
    assert [held[f"t-{n}"].truncated for n in range(4)] == [False, True, True, True]
    # A newer record of a pair held counts instead of its older one: room freed is used.
    view.apply_record(record(target(0), None, offset=10))
    view.apply_record(record(target(2), [f"t-{i:04}#0" for i in range(1_000)], offset=11))
    assert len(view.get(LedgerKey(SUB, target(2))).timers) == 1_000  # type: ignore[union-attr]


def test_a_key_with_a_subscription_longer_than_any_is_unreadable() -> None:
    view = LedgerView(PARTITIONS)
    long = ledger_key("s" * (MAX_SUBSCRIPTION + 1), target())
    assert not view.apply_record(Record(TOPIC, 0, 0, long, None, 0))
    assert len(view) == 0
    assert decode_key(ledger_key("s" * MAX_SUBSCRIPTION, target())).subscription


# --- pairs ----------------------------------------------------------------------------------


def test_past_max_held_pairs_new_ones_are_passed_over_and_held_ones_still_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """50,000 small entries (10.8 MB on the wire) were held as ~100 MB: a flood of keys is
    bounded by count, as the status view's `MAX_HELD_KEYS` bounds the nodes' reports."""
    view = LedgerView(PARTITIONS, max_held=3)
    for n in range(6):
        view.apply_record(record(target(n), [f"t-{n}#0"], offset=n))
    assert [e.target for e in view.entries()] == [target(0), target(1), target(2)]
    assert len(view) == 3 and view.passed_over == 3
    # One line, then counted (one a minute of the kind, `LogLimit`).
    [line] = lines(caplog, "passing over")
    assert "3 pairs held already (1 passed over)" in line
    # A held pair still takes its newer records: a park, its tombstone.
    assert view.apply_record(record(target(0), ["t-0#0", "t-0#1"], offset=10))
    assert view.apply_record(record(target(1), None, offset=11))
    assert [e.target for e in view.entries()] == [target(0), target(2)]
    # This node's own writes are always taken (it resolves what it parked).
    assert view.apply(
        LedgerKey(SUB, target(9)),
        home(target(9)),
        12,
        LedgerEntry(subscription=SUB, target=target(9), timers=("t-9#0",)),
    )
    assert len(view) == 4


# --- partitions -----------------------------------------------------------------------------


def test_a_resolved_entry_does_not_come_back_from_a_copy_in_another_partition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node's start reads the partitions in order: a copy in a later partition than the
    key's own, read after the tombstone there, showed the entry open again at every start
    of every node (no tombstone is ever written beside the copy)."""
    t = target(0)
    own, other = home(t), PARTITIONS - 1
    assert own < other
    view = LedgerView(PARTITIONS)  # as a start reads them: the key's own partition first
    view.apply_record(record(t, ["o-1/k#0"], offset=10))
    view.apply_record(record(t, None, offset=11))  # resolved by an operator's retry
    assert not view.apply_record(record(t, ["o-1/k#0"], offset=0, partition=other))
    assert view.entries() == [] and view.open_count == 0
    [line] = lines(caplog, "passing over")
    assert f"{TOPIC}[{other}]@0" in line and f"belongs in partition {own}" in line


def test_records_outside_their_partition_are_logged_once_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    view = LedgerView(PARTITIONS)
    for n in range(20):
        t = target(n)
        view.apply_record(record(t, [f"t-{n}#0"], offset=n, partition=(home(t) + 1) % PARTITIONS))
    assert view.entries() == [] and len(view) == 0
    assert len(lines(caplog, "passing over")) == 1


def timer(n: int) -> Timer:
    return Timer(
        id=f"t-{n}",
        owner=AggregateRef(context="shop", aggregate="order", id="o-1"),
        key=f"k-{n}",
        version=1,
        partition=0,
        rule=OnceRule(at=T0),
        target=target(0),
        command=CommandSpec(type="shop.Remind"),
        slot_due_at=T0,
        due_at=T0,
    )


async def test_a_start_and_the_cli_pass_over_a_copy_of_a_resolved_entry_elsewhere() -> None:
    """On the log: a node parks and resolves; another producer's copy of the entry sits in
    a later partition. A node started after, and `timers ledger`, show no open entry."""
    log = MemoryLog([TopicSpec(TOPIC, PARTITIONS, compacted=True)])
    ledger = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    await ledger.start()
    try:
        await ledger.record(SUB, target(0), [timer(1)])
        assert await ledger.resolve(SUB, target(0))
    finally:
        await ledger.stop()
    later = PARTITIONS - 1  # read after the key's own
    assert home(target(0)) < later
    await log.publisher().send(TOPIC, key_of(target(0)), value(target(0), ["t-1#0"]), later)
    again = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    await again.start()
    try:
        assert await again.entries() == [] and again.open_entries == 0
    finally:
        await again.stop()
    assert await read_ledger(log, "shop") == []


def test_a_view_fed_by_hand_checks_no_partition() -> None:
    """Without a count (tests, tools), every record is taken as in its key's partition."""
    view = LedgerView()
    assert view.apply_record(record(target(), ["t-1#0"], offset=0, partition=7))
    assert len(view.entries()) == 1


def test_the_bounds_are_logged_by_kind(caplog: pytest.LogCaptureFixture) -> None:
    """A flood of one kind (cut entries) does not hide the first line of another."""
    caplog.set_level(logging.WARNING)
    view = LedgerView(PARTITIONS, max_held=3)
    for n in range(5):
        view.apply_record(record(target(n), [f"x-{i}#0" for i in range(MAX_NAMED + 1)], n))
    t = target(0)
    view.apply_record(record(t, ["t#0"], offset=0, partition=(home(t) + 1) % PARTITIONS))
    assert len(lines(caplog, "cutting")) == 1
    assert len(lines(caplog, "pairs held already")) == 1
    assert len(lines(caplog, "belongs in partition")) == 1
