"""Every PARKED timer named by a ledger entry after a resolve (`app.node.parked_names`):
a copy of an operator's request read late in one partition resolves the entry a newer
park in another partition recorded after the request; the node records that timer again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import OWNER, T0, TARGET, AnsweringSender, StillClock, parked_slot_timer, slot_timer

from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.node.parked_names import keep_parked_named
from app.protocol.topics import ContextTopics
from app.protocol.wire import TimerAction
from app.timers.ledger import KafkaFailureLedger, encode_entry, ledger_key
from app.timers.operator import carry_out, new_op
from app.timers.runner import TimerOptions, TimerRunner
from tables import AggregateRef, TimerStore, open_timer_store
from tables.ledger import LedgerEntry, MemoryFailureLedger
from tables.timer import Timer, TimerStatus

SUB = TimerOptions.PARKED_SUBSCRIPTION
PARTITIONS = 3


async def round_of(runner: TimerRunner, p: int) -> None:
    async with runner.partition_round(p) as r:
        r.claims_committed(r.to_commit)


@pytest.fixture
def log() -> MemoryLog:
    return MemoryLog([TopicSpec(ContextTopics("shop").ledger, PARTITIONS, compacted=True)])


@pytest.fixture
async def ledger(log: MemoryLog) -> AsyncIterator[KafkaFailureLedger]:
    kept = KafkaFailureLedger(log, "shop", PARTITIONS, log.publisher())
    await kept.start()
    yield kept
    await kept.stop()


@contextlib.asynccontextmanager
async def keeping(
    ledger: KafkaFailureLedger, after_s: float, *, keeper: bool = True
) -> AsyncIterator[tuple[TimerStore, TimerRunner]]:
    """A store and a runner firing every partition, with a keeper of `ledger` running
    (`after_s`) unless `keeper` is False; all stopped after."""
    store = open_timer_store("memory://", partitions=PARTITIONS)
    runner = TimerRunner(
        store, AnsweringSender(), StillClock(T0), ledger, partitions=range(PARTITIONS)
    )
    naming = asyncio.create_task(keep_parked_named(ledger, lambda: [runner], after_s=after_s))
    if not keeper:
        naming.cancel()
    try:
        yield store, runner
    finally:
        naming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await naming
        await store.close()


async def entries_naming(ledger: KafkaFailureLedger, timer: Timer) -> list[LedgerEntry]:
    """The entries once one names `timer` (a few turns of the loop), or none after them."""
    for _ in range(200):
        entries = await ledger.entries()
        if any(timer.request_id in e.timers for e in entries):
            return entries
        await asyncio.sleep(0)
    return await ledger.entries()


@pytest.mark.parametrize("keeper", [True, False], ids=["named-again", "without-the-keeper"])
async def test_a_late_copy_of_a_request_leaves_no_parked_timer_unnamed(
    ledger: KafkaFailureLedger, keeper: bool
) -> None:
    async with keeping(ledger, after_s=0, keeper=keeper) as (store, runner):
        a, b = await parked_slot_timer(store, "a", 1), await parked_slot_timer(store, "b", 2)
        await ledger.record(SUB, TARGET, [a, b])
        skip = new_op(TimerAction.SKIP, TARGET, now=T0)
        # Partition 2 reads its copy at once; its round resolves the entry.
        await carry_out(runner, skip, 2, resolve_later=True)
        await round_of(runner, 2)
        # The target fails again: a timer of it in partition 2 parked (the ledger first).
        c = await parked_slot_timer(store, "c", 2)
        await ledger.record(SUB, TARGET, [c])
        # Partition 1 reads its copy of the same request only now: it settles its own
        # row, and its round resolves the entry as it is, the newer park's.
        await carry_out(runner, skip, 1, resolve_later=True)
        await round_of(runner, 1)
        row = await store.find(OWNER, "c")
        assert row is not None and row.status is TimerStatus.PARKED
        entries = await entries_naming(ledger, c)
        if keeper:
            [entry] = entries
            assert entry.timers == (c.request_id,)
        else:
            assert entries == []  # what the keeper is for


async def written_by_another(log: MemoryLog, target: AggregateRef, *named: str) -> None:
    """The entry of `target` naming `named` alone, as another node writes it."""
    entry = LedgerEntry(subscription=SUB, target=target, timers=named)
    topic = ContextTopics("shop").ledger
    await log.publisher().send(topic, ledger_key(SUB, target), encode_entry(entry))


async def names(ledger: KafkaFailureLedger, request_id: str) -> tuple[str, ...]:
    """The names of TARGET's entry once they hold `request_id` (a few turns of the loop),
    or as they are after them."""
    for _ in range(200):
        entry = await ledger.entry(SUB, TARGET)
        if entry is not None and request_id in entry.timers:
            break
        await asyncio.sleep(0)
    entry = await ledger.entry(SUB, TARGET)
    return () if entry is None else entry.timers


@pytest.mark.parametrize("keeper", [True, False], ids=["named-again", "without-the-keeper"])
async def test_another_nodes_record_over_this_nodes_names_is_followed_by_them_again(
    log: MemoryLog, ledger: KafkaFailureLedger, keeper: bool
) -> None:
    """Two nodes parking timers of one target at once each write the entry they know: the
    later write names the other node's timers only. Following it, this node records its
    own again."""
    async with keeping(ledger, after_s=0, keeper=keeper) as (store, _):
        a = await parked_slot_timer(store, "a", 1)
        await ledger.record(SUB, TARGET, [a])
        b = slot_timer(id="t-b", key="b", partition=2)  # parked on the other node
        await written_by_another(log, TARGET, b.request_id)
        assert await names(ledger, b.request_id) == (b.request_id,)  # followed
        if keeper:
            assert set(await names(ledger, a.request_id)) == {a.request_id, b.request_id}
        else:
            assert await names(ledger, a.request_id) == (b.request_id,)  # what it is for


async def test_a_burst_of_changes_of_one_target_is_looked_at_once(
    log: MemoryLog, ledger: KafkaFailureLedger
) -> None:
    """Every change taken before a target is looked for is answered by that look: one a
    target per `after_s` (here 0.2 s), however many parks elsewhere wrote its entry."""
    looked: list[str] = []

    class Runner:
        async def name_parked(self, target: AggregateRef) -> int:
            looked.append(target.id)
            return 0

    other = AggregateRef(context="shop", aggregate="inv", id="i-2")
    naming = asyncio.create_task(
        keep_parked_named(ledger, lambda: [Runner()], after_s=0.2)  # type: ignore[list-item]
    )
    try:
        for n in range(20):
            await written_by_another(log, TARGET, *(f"r{i}" for i in range(n + 1)))
        await written_by_another(log, other, "r")
        assert "r19" in await names(ledger, "r19")
        await asyncio.sleep(0.5)
        assert looked == [TARGET.id, other.id]
    finally:
        naming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await naming


async def test_a_burst_of_another_nodes_records_of_one_target_is_held_as_one_change(
    log: MemoryLog, ledger: KafkaFailureLedger
) -> None:
    """What waits to be looked at is bounded by the targets, not by the records: a queue
    held one item per record another node wrote."""
    other = AggregateRef(context="shop", aggregate="inv", id="i-2")
    for n in range(200):
        await written_by_another(log, TARGET, f"r{n}")
    await written_by_another(log, other, "r")
    assert await names(ledger, "r199") == ("r199",)  # followed
    for _ in range(200):
        if await ledger.entry(SUB, other) is not None:
            break
        await asyncio.sleep(0)
    assert ledger.changed.qsize() == 2


async def test_naming_again_records_only_what_the_entry_does_not_name() -> None:
    recorded: list[int] = []

    class Ledger(MemoryFailureLedger):
        async def record(self, subscription: str, target: AggregateRef, timers: Any) -> None:
            recorded.append(len(timers))
            await super().record(subscription, target, timers)

    ledger = Ledger()
    store = open_timer_store("memory://", partitions=PARTITIONS)
    runner = TimerRunner(
        store, AnsweringSender(), StillClock(T0), ledger, partitions=range(PARTITIONS)
    )
    try:
        a, b = await parked_slot_timer(store, "a", 1), await parked_slot_timer(store, "b", 2)
        await ledger.record(SUB, TARGET, [a])
        assert await runner.name_parked(TARGET) == 1  # b
        assert await runner.name_parked(TARGET) == 0
        assert recorded == [1, 1]
        entry = await ledger.entry(SUB, TARGET)
        assert entry is not None and entry.timers == (a.request_id, b.request_id)
    finally:
        await store.close()


async def test_a_target_that_failed_is_tried_again_later_behind_no_other(
    ledger: KafkaFailureLedger,
) -> None:
    """A record refused puts the target back `retry_s` later: meanwhile another target's
    resolve is heard at once, and the keeper never ends on a failure."""
    calls: list[str] = []
    fail = {"i-bad"}

    class Runner:
        async def name_parked(self, target: AggregateRef) -> int:
            calls.append(target.id)
            if target.id in fail:
                raise RuntimeError("the ledger did not answer")
            return 0

    naming = asyncio.create_task(
        keep_parked_named(ledger, lambda: [Runner()], after_s=0, retry_s=0.3)  # type: ignore[list-item]
    )
    store = open_timer_store("memory://", partitions=PARTITIONS)
    try:
        a = await parked_slot_timer(store, "a", 1)
        bad, good = (AggregateRef(context="shop", aggregate="inv", id=i) for i in ("i-bad", "i-ok"))
        for target in (bad, good):
            await ledger.record(SUB, target, [a])
            assert await ledger.resolve(SUB, target)
        await asyncio.sleep(0.1)
        assert calls == ["i-bad", "i-ok"] and not naming.done()
        fail.clear()
        await asyncio.sleep(0.4)
        assert calls == ["i-bad", "i-ok", "i-bad"] and not naming.done()
    finally:
        naming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await naming
        await store.close()


async def test_a_copy_carried_out_soon_after_is_not_recorded_again(
    ledger: KafkaFailureLedger,
) -> None:
    """The request's copies carried out within the wait (`NAME_AFTER_S`, here 0.2 s) leave
    nothing to record: no entry brought back only to be resolved again."""
    async with keeping(ledger, after_s=0.2) as (store, runner):
        a, b = await parked_slot_timer(store, "a", 1), await parked_slot_timer(store, "b", 2)
        await ledger.record(SUB, TARGET, [a, b])
        skip = new_op(TimerAction.SKIP, TARGET, now=T0)
        await carry_out(runner, skip, 2, resolve_later=True)
        await round_of(runner, 2)
        await asyncio.sleep(0.05)
        assert await ledger.entries() == []  # a, still PARKED, not recorded again yet
        await carry_out(runner, skip, 1, resolve_later=True)  # a moment later
        await round_of(runner, 1)
        await asyncio.sleep(0.4)
        assert await ledger.entries() == []


async def test_a_partition_started_here_names_its_parked_timers_that_no_entry_names(
    ledger: KafkaFailureLedger,
) -> None:
    """A resolve read while its partition changed owner found its firing on neither
    node: the partition's first round here records what no open entry names, once."""
    store = open_timer_store("memory://", partitions=PARTITIONS)
    runner = TimerRunner(store, AnsweringSender(), StillClock(T0), ledger, partitions=[])
    try:
        c, d = await parked_slot_timer(store, "c", 2), await parked_slot_timer(store, "d", 1)
        other = AggregateRef(context="shop", aggregate="inv", id="named")
        named = await parked_slot_timer(store, "e", 2, target=other)
        await ledger.record(SUB, other, [named])
        # Its target's entry open, but not naming it (another node's write over it).
        unnamed = await parked_slot_timer(store, "f", 2, target=other)
        runner.start_partition(2, check_named=True)
        runner.start_partition(1)  # not asked: its rows are left as they are
        await round_of(runner, 2)
        await round_of(runner, 1)
        entries = {e.target: e.timers for e in await ledger.entries()}
        assert entries == {
            TARGET: (c.request_id,),
            other: (named.request_id, unnamed.request_id),
        }
        await ledger.resolve(SUB, TARGET)
        await round_of(runner, 2)  # once: not at every round
        assert TARGET not in {e.target for e in await ledger.entries()}
        assert d.partition == 1
    finally:
        await store.close()


async def test_a_partition_start_reads_its_targets_entries_not_the_whole_ledger(
    ledger: KafkaFailureLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check at a take asks the ledger for the entries of its parked timers' targets
    alone: a ledger of every parked target was listed and sorted whole at each take."""
    store = open_timer_store("memory://", partitions=PARTITIONS)
    runner = TimerRunner(store, AnsweringSender(), StillClock(T0), ledger, partitions=[])
    others = [AggregateRef(context="shop", aggregate="inv", id=f"i-{n}") for n in range(20)]
    try:
        for target in others:  # the rest of the ledger
            parked = await parked_slot_timer(store, target.id, 1, target=target)
            await ledger.record(SUB, target, [parked])
        named = await parked_slot_timer(store, "a", 2)
        await ledger.record(SUB, TARGET, [named])
        unnamed = await parked_slot_timer(store, "b", 2)

        async def listed() -> list[LedgerEntry]:
            raise AssertionError("the whole ledger listed")

        monkeypatch.setattr(ledger, "entries", listed)
        runner.start_partition(2, check_named=True)
        await round_of(runner, 2)
        entry = await ledger.entry(SUB, TARGET)
        assert entry is not None and entry.timers == (named.request_id, unnamed.request_id)
    finally:
        await store.close()


async def test_a_running_node_keeps_its_contexts_parked_timers_named(tmp_path: Path) -> None:
    """The node runs a keeper per context ledger while it runs, stopped with it."""
    from fakes import RunningNode, running
    from test_cycle_partition_handle import SERVICE, TOPICS

    name = f"naming the parked timers of {TOPICS.context}"
    node = RunningNode(MemoryLog(), tmp_path, "a", SERVICE, 2)
    async with running(node):
        assert name in {t.get_name() for t in asyncio.all_tasks() if not t.done()}
    await asyncio.sleep(0)
    assert name not in {t.get_name() for t in asyncio.all_tasks() if not t.done()}
