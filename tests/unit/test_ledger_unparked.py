"""A ledger entry names only timers an operator can still act on (`app.timers.unparked`).

An entry named a parked timer until an operator retried or skipped its target: a timer
cancelled by its owner (a job dropping its oldest failed slot, a `cancel_schedule`),
replaced under its key, or deleted with its owner stayed named for ever, and an entry
naming only such timers stayed on the operator page with nothing to retry. The
partition's changelog sink notes the rows that leave PARKED (`Unparked.note`) and its
round takes their names out (`Unparked.forget`): wired here as a node's partition wires it
(its sink, its round after the outcome writes), on the memory store, ledgers and runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
from fakes import T0, StillClock
from test_jobs_failed_runs import INSTANCE, Cluster, Handler

from app.jobs import enable_command
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.protocol.topics import ContextTopics
from app.protocol.wire import ResultCode
from app.timers.ledger import KafkaFailureLedger
from app.timers.runner import SendResult, TimerOptions, TimerRunner
from app.timers.runner.options import RetryPolicy
from app.timers.unparked import (
    RETRY_AFTER_MS,
    TARGETS_PER_ROUND,
    Unparked,
    forget_unparked,
    pruned_entry,
)
from tables import open_timer_store
from tables.ledger import MAX_NAMED, FailureLedger, LedgerEntry, MemoryFailureLedger
from tables.refs import AggregateRef
from tables.rules import OnceRule
from tables.store import ChangelogRecord, TimerStore
from tables.timer import CommandSpec, Timer, TimerStatus

SUB = TimerOptions.PARKED_SUBSCRIPTION
SEC = 1000
OWNER = AggregateRef(context="shop", aggregate="order", id="o-1")
TARGET = AggregateRef(context="billing", aggregate="invoice", id="i-1")
OPTIONS = TimerOptions(retry=RetryPolicy(max_attempts=2))
PARTITIONS = 2
TOPIC = ContextTopics("shop").ledger


def timer(n: int, *, owner: AggregateRef = OWNER, partition: int = 0) -> Timer:
    return Timer(
        id=f"t-{n}",
        owner=owner,
        key=f"k-{n}",
        version=1,
        partition=partition,
        rule=OnceRule(at=T0),
        target=TARGET,
        command=CommandSpec(type="billing.Remind"),
        slot_due_at=T0,
        due_at=T0,
    )


def parked(n: int, *, partition: int = 0) -> Timer:
    return timer(n, partition=partition).model_copy(update={"status": TimerStatus.PARKED})


def entry(*names: str, truncated: bool = False) -> LedgerEntry:
    return LedgerEntry(subscription=SUB, target=TARGET, timers=names, truncated=truncated)


def noting_store(notes: Unparked) -> TimerStore:
    """A memory store whose changelog sink notes the rows leaving PARKED, as the wiring
    proposed for a partition's sink (`app.node.partition_open._sink`) does."""

    async def sink(records: list[ChangelogRecord]) -> None:
        notes.note(r.before for r in records)

    return open_timer_store("memory://", partitions=1, changelog=sink)


# --- which names go ------------------------------------------------------------------------


def test_pruned_entry_takes_out_the_names_gone_and_names_what_is_parked() -> None:
    known = entry("t-1#0", "t-2#0", "t-3#0")
    assert pruned_entry(known, {"t-9#0"}, []) is known, "names none of them: nothing to write"
    assert pruned_entry(known, {"t-2#0"}, [parked(2)]) is known, "parked again: kept"
    assert pruned_entry(known, {"t-2#0"}, []) == entry("t-1#0", "t-3#0")
    assert pruned_entry(known, {"t-2#0"}, [parked(4)]) == entry("t-1#0", "t-3#0", "t-4#0")
    assert pruned_entry(known, {"t-1#0", "t-2#0", "t-3#0"}, []) is None, "nothing left: resolved"


def test_pruned_entry_makes_room_in_a_full_entry() -> None:
    """A truncated entry names no more; once names go, the PARKED timers it did not name
    are named again (`parked` here, another node's when it follows the write)."""
    full = entry(*(f"t-{n}#0" for n in range(MAX_NAMED)), truncated=True)
    after = pruned_entry(full, {f"t-{n}#0" for n in range(10)}, [parked(MAX_NAMED)])
    assert after is not None and not after.truncated
    assert after.timers[-1] == f"t-{MAX_NAMED}#0" and len(after.timers) == MAX_NAMED - 9


async def test_the_memory_ledger_is_resolved_only_when_it_names_nothing_else() -> None:
    ledger = MemoryFailureLedger()
    await ledger.record(SUB, TARGET, [parked(1), parked(2, partition=1)])
    # t-2 is another partition's, which this caller did not look at: left as it is.
    assert not await forget_unparked(ledger, SUB, TARGET, {"t-1#0"}, [])
    assert (await ledger.entry(SUB, TARGET)) == entry("t-1#0", "t-2#0")
    assert await forget_unparked(ledger, SUB, TARGET, {"t-1#0"}, [parked(2, partition=1)])
    assert (await ledger.entry(SUB, TARGET)) == entry("t-2#0")
    assert await forget_unparked(ledger, SUB, TARGET, {"t-2#0"}, [])
    assert await ledger.entries() == []


async def test_the_kafka_ledger_forgets_in_one_write_that_other_nodes_follow() -> None:
    log = MemoryLog([TopicSpec(TOPIC, PARTITIONS)])
    first = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    second = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    await first.start()
    await second.start()
    try:
        await first.record(SUB, TARGET, [parked(1), parked(2)])
        await eventually(second, entry("t-1#0", "t-2#0"))
        assert not await first.forget(SUB, AggregateRef(context="x", aggregate="y", id="z"), {"a"})
        assert not await first.forget(SUB, TARGET, {"t-9#0"})
        assert await second.forget(SUB, TARGET, {"t-1#0"})
        await eventually(first, entry("t-2#0"))
        assert await first.forget(SUB, TARGET, {"t-2#0"})
        await eventually(second, None)
        assert await first.entries() == []
    finally:
        await second.stop()
        await first.stop()


async def eventually(ledger: KafkaFailureLedger, expected: LedgerEntry | None) -> None:
    for _ in range(50):
        if await ledger.entry(SUB, TARGET) == expected:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{expected} expected, {await ledger.entry(SUB, TARGET)} held")


async def test_the_kafka_ledger_lists_the_newest_entry_first() -> None:
    log = MemoryLog([TopicSpec(TOPIC, PARTITIONS)])
    ledger = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    await ledger.start()
    try:
        targets = [
            AggregateRef(context="billing", aggregate="invoice", id=f"i-{n}") for n in (3, 1, 2)
        ]
        for target in targets:
            await ledger.record(SUB, target, [timer(1).model_copy(update={"target": target})])
            await asyncio.sleep(0.002)  # each record a millisecond later at least
        dated = await ledger.dated()
        assert [e.target for _, e in dated] == targets[::-1]
        assert dated[0][0] >= dated[1][0] + 1 >= dated[2][0] + 2
        assert [e.target.id for e in await ledger.entries()] == ["i-1", "i-2", "i-3"]
    finally:
        await ledger.stop()


# --- with the firing machinery ------------------------------------------------------------


class Failing:
    """A sender whose target answers ERROR to everything: each timer is parked."""

    async def send(self, timer: Timer) -> SendResult:
        return SendResult(ResultCode.ERROR.value, "down")


async def names(ledger: FailureLedger) -> tuple[str, ...] | None:
    held = await ledger.entry(SUB, TARGET)
    return None if held is None else held.timers


async def parked_in(
    store: TimerStore, ledger: FailureLedger, notes: Unparked | None, *timers: Timer
) -> tuple[TimerRunner, StillClock]:
    clock = StillClock(T0)
    runner = TimerRunner(store, Failing(), clock, ledger, OPTIONS, [0])
    for t in timers:
        await store.put(t)
    for _ in range(20):
        clock.t += 5 * SEC
        await runner.run_round()
        if notes is not None:
            await notes.forget(store, ledger, SUB, clock.now())
    return runner, clock


@pytest.fixture(params=["memory", "kafka"])
async def ledger(request: pytest.FixtureRequest) -> AsyncIterator[FailureLedger]:
    if request.param == "memory":
        yield MemoryFailureLedger()
        return
    log = MemoryLog([TopicSpec(TOPIC, PARTITIONS)])
    kafka = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    await kafka.start()
    yield kafka
    await kafka.stop()


async def test_an_entry_of_timers_cancelled_by_their_owner_goes(ledger: FailureLedger) -> None:
    notes = Unparked(0)
    store = noting_store(notes)
    other = AggregateRef(context="shop", aggregate="order", id="o-2")
    _, clock = await parked_in(store, ledger, notes, timer(1), timer(2, owner=other))
    assert await names(ledger) == ("t-1#0", "t-2#0")
    assert [t.status for t in await store.parked(TARGET)] == [TimerStatus.PARKED] * 2

    assert await store.cancel(OWNER, "k-1", 2)  # its owner cancelled it
    await notes.forget(store, ledger, SUB, clock.now())
    assert await names(ledger) == ("t-2#0",), "the one left is named"

    assert await store.cancel_all(other, 2) == 1  # its owner deleted
    await notes.forget(store, ledger, SUB, clock.now())
    assert await ledger.entries() == [], "nothing left to retry: resolved"
    assert len(notes) == 0
    await store.close()


async def test_a_timer_parked_again_after_a_retry_stays_named(ledger: FailureLedger) -> None:
    notes = Unparked(0)
    store = noting_store(notes)
    runner, clock = await parked_in(store, ledger, notes, timer(1))
    assert await runner.retry(TARGET) == 1  # noted: it left PARKED
    for _ in range(10):  # fails again: parked again under its request id
        clock.t += 5 * SEC
        await runner.run_round()
    await notes.forget(store, ledger, SUB, clock.now())
    assert [t.id for t in await store.parked(TARGET)] == ["t-1"]
    assert await names(ledger) == ("t-1#0",)
    await store.close()


async def test_a_parked_timer_paused_leaves_its_entry_and_is_named_again_once_resumed(
    ledger: FailureLedger,
) -> None:
    """A paused timer is no longer parked: its name goes (a retry or skip passes over it),
    and its resume, which parks it again, names it again (`Unparked.note` keeps the rows
    that were PAUSED when PARKED; `name_again`)."""
    notes = Unparked(0)
    store = noting_store(notes)
    other = AggregateRef(context="shop", aggregate="order", id="o-2")
    runner, clock = await parked_in(store, ledger, notes, timer(1), timer(2, owner=other))
    assert await names(ledger) == ("t-1#0", "t-2#0")

    assert await store.pause(OWNER, "k-1", 2)
    await notes.forget(store, ledger, SUB, clock.now())
    assert await names(ledger) == ("t-2#0",), "a paused timer is not named"
    assert await store.pause(other, "k-2", 2)
    await notes.forget(store, ledger, SUB, clock.now())
    assert await ledger.entries() == [], "nothing left to retry: resolved"
    assert await runner.retry(TARGET) == 0, "a retry passes over the paused timers"

    assert await store.resume(OWNER, "k-1", 3, clock.now()) is not None
    await notes.forget(store, ledger, SUB, clock.now())
    assert await names(ledger) == ("t-1#0",), "parked again: named again"
    assert len(notes) == 0
    # Paused and resumed before a round: named as it was, once.
    assert await store.pause(OWNER, "k-1", 4)
    assert await store.resume(OWNER, "k-1", 5, clock.now()) is not None
    await notes.forget(store, ledger, SUB, clock.now())
    assert await names(ledger) == ("t-1#0",)
    # A retry sends it (and only it: the other is still paused).
    assert await runner.retry(TARGET) == 1
    assert [t.key for t in await store.parked(TARGET)] == []
    held = await store.find(other, "k-2")
    assert held is not None and held.status is TimerStatus.PAUSED
    await store.close()


async def test_a_parked_timer_paused_then_cancelled_is_named_no_more(
    ledger: FailureLedger,
) -> None:
    notes = Unparked(0)
    store = noting_store(notes)
    _, clock = await parked_in(store, ledger, notes, timer(1), timer(2))
    assert await store.pause(OWNER, "k-1", 2)
    assert await store.cancel(OWNER, "k-1", 3)  # noted as parked again, it is not
    await notes.forget(store, ledger, SUB, clock.now())
    assert await names(ledger) == ("t-2#0",)
    assert len(notes) == 0
    await store.close()


async def test_a_failing_jobs_entry_names_its_newest_parked_slots_only() -> None:
    """The jobs' bound (`test_jobs_failed_runs`) cancels the oldest run timers: without
    the notes, the instance's entry named every slot that ever failed (up to `MAX_NAMED`,
    then only the oldest ones, all of them cancelled)."""
    notes = Unparked(0)
    store = noting_store(notes)
    c = Cluster(store, Handler(), keep=3)
    assert await c.decide(enable_command("ops", c.instance.job)) is ResultCode.COMMITTED
    while c.clock.t < T0 + 8 * 60 * SEC + 30 * SEC:
        c.clock.t += 5 * SEC
        await c.runner.run_round()
        await notes.forget(store, c.ledger, SUB, c.clock.now())
    runs = await c.runs()
    (e,) = await c.ledger.entries()
    assert e.target == INSTANCE
    assert sorted(e.timers) == sorted(runs[n].request_id for n in (6, 7, 8))
    await store.close()


# --- the notes ----------------------------------------------------------------------------


def test_notes_keep_rows_that_were_parked_in_their_partition_and_are_bounded() -> None:
    notes = Unparked(0, limit=2)
    notes.note([None, timer(1), parked(2), parked(3, partition=1), parked(2)])
    assert len(notes) == 1
    notes.note([parked(4), parked(5)])
    assert (len(notes), notes.dropped) == (2, 1)


class Refusing:
    """A ledger that does not answer."""

    async def record(
        self, subscription: str, target: AggregateRef, timers: Sequence[Timer]
    ) -> None:
        raise TimeoutError

    async def resolve(self, subscription: str, target: AggregateRef) -> bool:
        raise TimeoutError

    async def entry(self, subscription: str, target: AggregateRef) -> LedgerEntry | None:
        raise TimeoutError

    async def entries(self) -> list[LedgerEntry]:
        raise TimeoutError


async def test_a_ledger_that_does_not_answer_keeps_the_notes_for_later() -> None:
    notes = Unparked(0)
    store = open_timer_store("memory://", partitions=1)
    notes.note([parked(1), parked(2)])
    assert await notes.forget(store, Refusing(), SUB, T0) == 0
    assert len(notes) == 2 and notes.after == T0 + RETRY_AFTER_MS
    ledger = MemoryFailureLedger()
    await ledger.record(SUB, TARGET, [parked(1), parked(2)])
    assert await notes.forget(store, ledger, SUB, T0 + 1) == 0, "waits"
    assert await notes.forget(store, ledger, SUB, T0 + RETRY_AFTER_MS) == 1
    assert len(notes) == 0 and await ledger.entries() == []
    await store.close()


async def test_a_round_writes_a_bounded_number_of_entries() -> None:
    """Owners that cancelled thousands of parked timers of as many targets at once: each
    round writes `TARGETS_PER_ROUND` entries at most (each an acknowledged ledger write),
    the rest in the next rounds, so none of them is held up for long."""
    notes = Unparked(0)
    store = open_timer_store("memory://", partitions=1)
    ledger = MemoryFailureLedger()
    targets = [TARGET.model_copy(update={"id": f"i-{n}"}) for n in range(TARGETS_PER_ROUND + 5)]
    rows = [
        parked(n).model_copy(update={"target": t, "id": f"t-{n}"}) for n, t in enumerate(targets)
    ]
    for row in rows:
        await ledger.record(SUB, row.target, [row])
    notes.note(rows)
    assert await notes.forget(store, ledger, SUB, T0) == TARGETS_PER_ROUND
    assert len(await ledger.entries()) == 5 and len(notes) == 5
    assert await notes.forget(store, ledger, SUB, T0) == 5
    assert await ledger.entries() == [] and len(notes) == 0
    await store.close()
