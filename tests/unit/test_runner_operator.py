"""Operators' retry and skip: the TimerOp record, its fan-out to every partition, the
owner acting on its own partition only, the expiry jump in a round, and the CLI's errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from fakes import (
    MIN,
    OWNER,
    T0,
    TARGET,
    AnsweringSender,
    CountingStore,
    FakeClock,
    StillClock,
    parked_slot_timer,
    slot_timer,
)
from pydantic import ValidationError
from typer.testing import CliRunner

from app.cli import cli
from app.errors import BadRecord
from app.protocol.wire import (
    TimerAction,
    TimerOp,
    decode,
    encode,
)
from app.timers.operator import (
    carry_out,
    new_op,
    op_records,
)
from app.timers.runner import TimerOptions, TimerRunner, operating
from app.timers.runner.operating import EXPECTED_TRIES, RESOLVE_BACKOFF_MS, Operated
from tables import open_timer_store
from tables.ledger import MemoryFailureLedger
from tables.refs import AggregateRef
from tables.rules import IntervalRule
from tables.store import TimerStore
from tables.timer import Outcome, Timer, TimerStatus

DAY = 24 * 60 * MIN
SUB = TimerOptions.PARKED_SUBSCRIPTION


@pytest.fixture
async def store() -> AsyncIterator[TimerStore]:
    s = open_timer_store("memory://", partitions=3)
    yield s
    await s.close()


def make(key: str, partition: int, **fields: Any) -> Timer:
    return slot_timer(id=f"t-{key}", key=key, partition=partition, **fields)


# --- the record ---------------------------------------------------------------------------


def test_a_timer_op_round_trips_and_keeps_unknown_fields() -> None:
    op = new_op(TimerAction.SKIP, TARGET, now=T0)
    assert decode(TimerOp, encode(op)) == op
    raw = orjson.loads(encode(op))
    raw["comment"] = "from a newer client"
    again = decode(TimerOp, orjson.dumps(raw))
    assert again.action is TimerAction.SKIP and orjson.loads(encode(again))["comment"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"action": "delete"}, "action"),
        ({"action": None}, "action"),
        ({"target": {"context": "shop"}}, "target"),
        ({"target": {"context": "shop/x", "aggregate": "o", "id": "1"}}, "target.context"),
        ({"request_id": ""}, "request_id"),
        ({"requested_at": -1}, "requested_at"),
    ],
)
def test_a_bad_timer_op_is_a_bad_record_that_says_why(change: dict[str, Any], message: str) -> None:
    raw = orjson.loads(encode(new_op(TimerAction.RETRY, TARGET, now=T0)))
    raw.update(change)
    with pytest.raises(BadRecord, match=message):
        decode(TimerOp, orjson.dumps(raw))


def test_a_timer_op_must_have_every_field() -> None:
    with pytest.raises(ValidationError):
        TimerOp.model_validate({"action": "retry", "target": TARGET.model_dump()})
    with pytest.raises(BadRecord, match="not a valid TimerOp"):
        decode(TimerOp, b"{not json")
    with pytest.raises(BadRecord, match="tombstone"):
        decode(TimerOp, None)


def test_an_op_goes_once_to_every_partition_keyed_by_its_target() -> None:
    op = new_op(TimerAction.RETRY, TARGET, now=T0)
    records = op_records("shop.order.timer-ops", op, 4)
    assert [r[1] for r in records] == [0, 1, 2, 3]
    assert {(r[0], r[2], r[3]) for r in records} == {
        ("shop.order.timer-ops", b"shop.order/(0)/o-2", encode(op))
    }


# --- the owner of a partition carries it out for that partition ---------------------------


async def test_retry_in_one_partition_leaves_the_others_parked(store: TimerStore) -> None:
    for key, p in [("a", 0), ("b", 1), ("c", 1)]:
        await parked_slot_timer(store, key, p)
    ledger = MemoryFailureLedger()
    await ledger.record(SUB, TARGET, [make("a", 0)])
    runner = TimerRunner(
        store, AnsweringSender(), StillClock(T0 + MIN), ledger, partitions=[0, 1, 2]
    )
    op = new_op(TimerAction.RETRY, TARGET, now=T0)
    assert await carry_out(runner, op, 1) == Operated(2)
    rows = {t.key: t for t in [await store.find(OWNER, k) for k in "abc"] if t is not None}
    assert rows["a"].status is TimerStatus.PARKED
    for key in "bc":
        assert (rows[key].status, rows[key].attempts, rows[key].due_at) == (
            TimerStatus.PENDING,
            0,
            T0 + MIN,
        )
    assert await ledger.entries() == []
    # The copy of the op in partition 0, read by that partition's owner.
    assert await carry_out(runner, op, 0) == Operated(1)
    assert await carry_out(runner, op, 2) == Operated(0)


async def test_skip_in_one_partition_cancels_only_its_parked_timers(store: TimerStore) -> None:
    await parked_slot_timer(store, "a", 0)
    await parked_slot_timer(store, "b", 2)
    assert await store.put(make("c", 2))
    runner = TimerRunner(store, AnsweringSender(), StillClock(T0), MemoryFailureLedger())
    assert await runner.skip(TARGET, partitions={2}) == 1
    b = await store.find(OWNER, "b")
    assert b is not None and (b.status, b.outcome) == (TimerStatus.CANCELLED, Outcome.SKIPPED)
    a, c = await store.find(OWNER, "a"), await store.find(OWNER, "c")
    assert a is not None and a.status is TimerStatus.PARKED
    assert c is not None and c.status is TimerStatus.PENDING
    # Without partitions: every partition the store serves, as before.
    assert await runner.skip(TARGET) == 1


# --- carried out in a cycle: the entry resolved by the partition's next round -------------


class FlakyLedger(MemoryFailureLedger):
    """Its first `fail` resolves raise (as a ledger that did not answer in time); each
    resolve waits for `held` when it is set."""

    def __init__(self, fail: int = 0) -> None:
        super().__init__()
        self.fail = fail
        self.resolves = 0
        self.held: asyncio.Event | None = None
        self.calling = asyncio.Event()

    async def resolve(self, subscription: str, target: AggregateRef) -> bool:
        self.resolves += 1
        self.calling.set()
        if self.held is not None:
            await self.held.wait()
        if self.fail > 0:
            self.fail -= 1
            raise TimeoutError("the ledger did not answer")
        return await super().resolve(subscription, target)


async def parked_ledger(store: TimerStore, ledger: MemoryFailureLedger, *keys: str) -> None:
    """Timers of TARGET in partition 1 parked, their target recorded first (as a park)."""
    for key in keys:
        await ledger.record(SUB, TARGET, [make(key, 1)])
        await parked_slot_timer(store, key, 1)


def skipping(store: TimerStore, ledger: FlakyLedger, clock: Any = None) -> TimerRunner:
    clock = clock or StillClock(T0)
    return TimerRunner(store, AnsweringSender(), clock, ledger, partitions=[0, 1, 2])


SKIP = new_op(TimerAction.SKIP, TARGET, now=T0)


async def test_a_request_in_a_cycle_settles_at_once_and_its_round_resolves_the_entry(
    store: TimerStore,
) -> None:
    """A partition's cycle holds its lock: its operator's request settles the PARKED rows
    there and calls no ledger; the partition's next round resolves the entry."""
    ledger = FlakyLedger()
    await parked_ledger(store, ledger, "a", "b")
    runner = skipping(store, ledger)
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(2)
    rows = [await store.find(OWNER, k) for k in "ab"]
    assert [r.status if r else None for r in rows] == [TimerStatus.CANCELLED] * 2
    assert ledger.resolves == 0 and len(await ledger.entries()) == 1
    await runner.run_round()
    assert ledger.resolves == 1 and await ledger.entries() == []
    await runner.run_round()
    assert ledger.resolves == 1  # resolved once


async def test_an_entry_whose_target_was_parked_again_meanwhile_stays(
    store: TimerStore,
) -> None:
    """A park between the request and the round recorded the target first: the round
    resolves nothing, so the PARKED timer stays named (never a timer no entry names)."""
    ledger = FlakyLedger()
    await parked_ledger(store, ledger, "a")
    runner = skipping(store, ledger)
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(1)
    await parked_ledger(store, ledger, "c")  # parked after the skip, before its resolve
    await runner.run_round()
    [entry] = await ledger.entries()
    c = await store.find(OWNER, "c")
    assert c is not None and c.request_id in entry.timers and ledger.resolves == 0


async def test_an_entry_the_ledger_does_not_resolve_waits_then_is_resolved_again(
    store: TimerStore,
) -> None:
    ledger = FlakyLedger(fail=1)
    await parked_ledger(store, ledger, "a")
    clock = FakeClock(T0)
    runner = skipping(store, ledger, clock)
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(1)
    await runner.run_round()  # the ledger fails it: kept for a later round
    assert len(await ledger.entries()) == 1
    clock.set(T0 + RESOLVE_BACKOFF_MS - 1)
    await runner.run_round()
    assert ledger.resolves == 1, "tried again before its backoff"
    clock.set(T0 + RESOLVE_BACKOFF_MS)
    await runner.run_round()
    assert (ledger.resolves, await ledger.entries()) == (2, [])


async def test_two_requests_for_one_target_are_resolved_by_one_ledger_write(
    store: TimerStore,
) -> None:
    """Asked twice before its round (an operator's second click, or a request read again):
    queued once, resolved once; and once more when a request comes while its resolve fails."""
    ledger = FlakyLedger(fail=1)
    await parked_ledger(store, ledger, "a")
    clock = FakeClock(T0)
    runner = skipping(store, ledger, clock)
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(1)
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(0)
    ledger.held = asyncio.Event()
    round_ = asyncio.create_task(runner.run_round())
    await ledger.calling.wait()  # the resolve under way (it fails) ...
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(
        0
    )  # ... and asked again
    ledger.held.set()
    await asyncio.wait_for(round_, 5)
    assert ledger.resolves == 1 and len(await ledger.entries()) == 1
    clock.set(T0 + RESOLVE_BACKOFF_MS)
    await runner.run_round()
    await runner.run_round()
    assert (ledger.resolves, await ledger.entries()) == (2, [])


class LaggingLedger(FlakyLedger):
    """A followed ledger that has not read the entry yet while `hidden`: its resolve
    finds none and writes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = True

    async def resolve(self, subscription: str, target: AggregateRef) -> bool:
        if self.hidden:
            self.resolves += 1
            return False
        return await super().resolve(subscription, target)


async def test_an_entry_the_ledger_has_not_read_yet_is_asked_for_again_after_the_wait(
    store: TimerStore,
) -> None:
    """Another node parked the target, and this node's ledger has not followed that
    record yet (a re-park after a tombstone it read included): the partition settled
    PARKED rows of it, so the round asks again after `RESOLVE_BACKOFF_MS`, not never."""
    ledger = LaggingLedger()
    await parked_ledger(store, ledger, "a")
    clock = FakeClock(T0)
    runner = skipping(store, ledger, clock)
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(1)
    await runner.run_round()
    assert ledger.resolves == 1 and len(await ledger.entries()) == 1
    await runner.run_round()
    assert ledger.resolves == 1, "asked again before the wait"
    ledger.hidden = False  # followed meanwhile
    clock.set(T0 + RESOLVE_BACKOFF_MS)
    await runner.run_round()
    assert (ledger.resolves, await ledger.entries()) == (2, [])


async def test_an_entry_never_found_is_asked_for_a_bounded_number_of_times(
    store: TimerStore,
) -> None:
    """An entry never found although rows were settled (its names lost to another
    node's write, say): `EXPECTED_TRIES` asks, then it is let be."""
    ledger = LaggingLedger()
    await parked_ledger(store, ledger, "a")
    clock = FakeClock(T0)
    runner = skipping(store, ledger, clock)
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(1)
    for n in range(EXPECTED_TRIES + 2):
        clock.set(T0 + n * RESOLVE_BACKOFF_MS)
        await runner.run_round()
    firing = runner.firing_of(1)
    assert ledger.resolves == EXPECTED_TRIES
    assert firing is not None and not firing.resolving and not firing.expecting


async def test_no_entry_is_expected_where_the_request_settled_nothing(store: TimerStore) -> None:
    """A copy of the request that found nothing PARKED in its partition expects no
    entry: one resolve, not asked again."""
    ledger = LaggingLedger()
    clock = FakeClock(T0)
    runner = skipping(store, ledger, clock)
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(0)
    for n in range(3):
        clock.set(T0 + n * RESOLVE_BACKOFF_MS)
        await runner.run_round()
    assert ledger.resolves == 1


async def test_a_partitions_stop_resolves_what_its_round_had_not_yet(store: TimerStore) -> None:
    ledger = FlakyLedger()
    await parked_ledger(store, ledger, "a")
    runner = skipping(store, ledger)
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(1)
    await runner.stop_partition(1)
    assert await ledger.entries() == []


async def test_a_partitions_stop_waits_for_the_ledger_a_bounded_time(
    store: TimerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger that does not answer holds a stop (a close has a deadline) for
    `STOP_RESOLVE_S` at most: the entry stays as it was."""
    monkeypatch.setattr(operating, "STOP_RESOLVE_S", 0.05)
    ledger = FlakyLedger()
    await parked_ledger(store, ledger, "a")
    runner = skipping(store, ledger)
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(1)
    ledger.held = asyncio.Event()  # never set
    await asyncio.wait_for(runner.stop_partition(1), 5)
    assert ledger.resolves == 1 and len(await ledger.entries()) == 1


async def test_a_stop_during_a_rounds_resolve_resolves_each_entry_once(
    store: TimerStore,
) -> None:
    ledger = FlakyLedger()
    await parked_ledger(store, ledger, "a")
    runner = skipping(store, ledger)
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(1)
    ledger.held = asyncio.Event()
    round_ = asyncio.create_task(runner.run_round())
    await ledger.calling.wait()
    stop = asyncio.create_task(runner.stop_partition(1))
    await asyncio.sleep(0.01)
    ledger.held.set()
    await asyncio.wait_for(asyncio.gather(round_, stop), 5)
    assert (ledger.resolves, await ledger.entries()) == (1, [])


async def test_a_partition_not_fired_yet_leaves_its_entry_to_its_next_firing(
    store: TimerStore,
) -> None:
    """A cycle's request in a partition whose timers are not fired here yet (held since a
    failure, its cycles running): its rows settled, no ledger call (the cycle holds the
    partition's lock); the first round of its next firing here resolves the entry."""
    ledger = FlakyLedger()
    await parked_ledger(store, ledger, "a")
    runner = TimerRunner(store, AnsweringSender(), StillClock(T0), ledger, partitions=[0])
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(1)
    row = await store.find(OWNER, "a")
    assert row is not None and row.status is TimerStatus.CANCELLED
    assert ledger.resolves == 0 and len(await ledger.entries()) == 1
    await runner.run_round()
    assert ledger.resolves == 0  # no round of partition 1 yet
    runner.start_partition(1)
    await runner.run_round()
    assert (ledger.resolves, await ledger.entries()) == (1, [])
    await runner.run_round()
    assert ledger.resolves == 1  # resolved once


async def test_a_partition_stopped_before_it_fired_again_resolves_its_entry_at_its_stop(
    store: TimerStore,
) -> None:
    """The partition whose cycle settled the rows is let go before its timers fired here
    again (revoked while held, or the node stops): its stop tries the entry once more, as
    a firing's stop does; nothing is left for a firing that will not come."""
    ledger = FlakyLedger()
    await parked_ledger(store, ledger, "a")
    runner = TimerRunner(store, AnsweringSender(), StillClock(T0), ledger, partitions=[0])
    assert await carry_out(runner, SKIP, 1, resolve_later=True) == Operated(1)
    assert ledger.resolves == 0
    await runner.stop_partition(1)
    assert (ledger.resolves, await ledger.entries()) == (1, [])
    runner.start_partition(1)
    await runner.run_round()
    assert ledger.resolves == 1  # nothing was left to hand over


async def test_a_request_not_in_a_cycle_resolves_its_entry_at_once(store: TimerStore) -> None:
    """An operator's request of its own (the HTTP API's): the entry is resolved by the
    request itself, in a partition fired here or not."""
    ledger = FlakyLedger()
    await parked_ledger(store, ledger, "a")
    runner = TimerRunner(store, AnsweringSender(), StillClock(T0), ledger, partitions=[0])
    assert await runner.skip(TARGET, {1}) == 1
    assert (ledger.resolves, await ledger.entries()) == (1, [])


# --- the expiry jump, in a round ----------------------------------------------------------


async def test_a_recurring_timer_days_behind_jumps_in_one_write_and_sends_once(
    store: TimerStore,
) -> None:
    rule = IntervalRule(start=T0, every=MIN)
    assert await store.put(make("r", 0, rule=rule))
    counting = CountingStore(store)
    clock, sender = StillClock(T0 + 3 * DAY + 1), AnsweringSender()
    runner = TimerRunner(counting, sender, clock, MemoryFailureLedger(), partitions=[0])
    stats = await runner.run_round()
    assert (stats.expired, stats.claimed, len(counting.settle_calls)) == (1, 0, 1)
    row = await store.find(OWNER, "r")
    first = 2 * 24 * 60 + 1  # the first slot due less than a day ago
    assert row is not None
    assert (row.status, row.slot, row.skipped, row.outcome) == (
        TimerStatus.PENDING,
        first,
        first,
        Outcome.EXPIRED,
    )
    # Due already: the next round sends the latest slot (it coalesces), not each in turn.
    await runner.run_round()
    row = await store.find(OWNER, "r")
    assert row is not None and len(sender.sent) == 1
    assert row.slot == 3 * 24 * 60 + 1 and row.outcome is Outcome.COMMITTED


# --- the CLI's errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["retry", "--type", "shop", "--target-id", "x"], 2, "must be '<context>.<aggregate>'"),
        (["skip", "--type", "shop.order", "--target-id", ""], 2, "bad target: id"),
        (["skip", "--type", "a.b", "--target-id", "x", "--target-type", "x.y.z"], 2, "x.y.z"),
        (["list", "--type", "shop.order", "--status", "LOST"], 2, "unknown status 'LOST'"),
        (["list", "--type", "a.b", "--bootstrap", "127.0.0.1:1"], 1, "127.0.0.1:1"),
        (["ledger", "--context", "a", "--bootstrap", "127.0.0.1:1"], 1, "127.0.0.1:1"),
        (["retry", "--type", "a.b", "--target-id", "x", "--bootstrap", "127.0.0.1:1"], 1, "1"),
    ],
)
def test_bad_input_exits_2_and_no_broker_1_with_a_message(
    args: list[str], code: int, message: str
) -> None:
    result = CliRunner().invoke(cli, ["timers", *args])
    assert result.exit_code == code, result.output
    assert "error: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.output
