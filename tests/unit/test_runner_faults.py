"""A corrupt stored row fails only the partition it is in (#19): wherever the runner meets
it (its wheel's rows built, a claim written, an outcome written, a previous owner's claims
taken over), that partition's firing stops (`Round.failed`, for its owner to restore it)
and the other partitions fire on. The StoreError names the partition. RocksDB store (the
one whose bytes can go bad), fake clock, scripted sender."""

from __future__ import annotations

import asyncio

from fakes import T0, World, rocks, until

from app.timers.runner import Round, SendResult, TimerRunner
from tables import StoreError
from tables.keys import due_key, encode_timer, row_key
from tables.rules import OnceRule
from tables.timer import Timer, TimerChange, TimerStatus

__all__ = ["rocks"]  # the fixture, imported for pytest


def corrupt(world: World, timer: Timer) -> bytes:
    """`timer`'s row as stored now goes bad on disk; the key of its bytes."""
    key = due_key(timer.due_at, timer.id, row_key(timer.owner, timer.key))
    world.store.inner._db(timer.partition).put(key, b'{"id": "x", "due_at": "soon"}')
    return key


async def one_round(runner: TimerRunner) -> Round:
    """A node's round, every claim committed."""
    async with runner.round() as r:
        r.claims_committed(r.to_commit)
    return r


def failed_in(r: Round) -> dict[int, StoreError]:
    faults = {}
    for p, (_firing, exc) in r.failed.items():
        assert isinstance(exc, StoreError) and exc.partition == p and f"partition {p}" in str(exc)
        faults[p] = exc
    return faults


async def test_a_corrupt_row_loaded_fails_its_partition_alone_until_it_is_started_again(
    rocks: World,
) -> None:
    a = await rocks.put(id="a", key="a", partition=0)
    await rocks.put(id="b", key="b", partition=1)
    key = corrupt(rocks, a)
    runner = rocks.runner(partitions=[0, 1])
    r = await one_round(runner)
    assert list(failed_in(r)) == [0]
    await until(lambda: rocks.sender.request_ids == ["b#0"])
    # Nothing more of partition 0 is loaded; its failure is told each round until its
    # owner restores it (here: its bytes written whole again) and starts it afresh.
    failed = r.failed[0][0]
    rocks.store.due_calls.clear()
    runner.invalidate()
    r = await one_round(runner)
    assert [p for p, _, _ in rocks.store.due_calls] == [frozenset({1})]
    assert r.failed[0][0] is failed
    await runner.stop_partition(0)
    rocks.store.inner._db(0).put(key, encode_timer(a))
    assert runner.start_partition(0) is not failed
    r = await one_round(runner)
    assert r.failed == {}
    await until(lambda: rocks.sender.request_ids == ["b#0", "a#0"])


async def test_a_row_gone_bad_after_it_was_loaded_fails_only_its_partitions_claims(
    rocks: World,
) -> None:
    soon = OnceRule(at=T0 + 50)
    a = await rocks.put(id="a", key="a", partition=0, rule=soon)
    await rocks.put(id="b", key="b", partition=2, rule=soon)
    runner = rocks.runner(partitions=[0, 1, 2])
    assert (await runner.run_round()).loaded == 0  # the wheels hold both rows, not due
    corrupt(rocks, a)
    rocks.clock.set(T0 + 50)
    r = await one_round(runner)
    assert list(failed_in(r)) == [0] and r.stats.claimed == 1
    await until(lambda: rocks.sender.request_ids == ["b#0"] and not runner.in_flight)
    await one_round(runner)  # writes its outcome
    assert (await rocks.row("b")).status is TimerStatus.FIRED


async def test_a_row_gone_bad_while_it_was_sent_fails_only_its_partitions_outcomes(
    rocks: World,
) -> None:
    answer: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()

    async def held_in_0(timer: Timer) -> SendResult:
        return await answer if timer.partition == 0 else SendResult("COMMITTED")

    await rocks.put(id="a", key="a", partition=0)
    await rocks.put(id="b", key="b", partition=1)
    runner = rocks.runner(held_in_0, partitions=[0, 1])
    r = await one_round(runner)
    assert r.failed == {}
    await until(lambda: rocks.sender.request_ids == ["a#0", "b#0"])
    corrupt(rocks, await rocks.row("a"))  # its claim, FIRING
    answer.set_result(SendResult("COMMITTED"))
    await until(lambda: not runner.in_flight)
    r = await one_round(runner)  # writes the outcomes that came back
    assert list(failed_in(r)) == [0]
    assert (await rocks.row("b")).status is TimerStatus.FIRED


async def test_a_corrupt_claim_of_a_previous_owner_fails_only_its_partition(
    rocks: World,
) -> None:
    rocks.runner()
    for p, id in ((0, "a"), (1, "b")):
        loaded = await rocks.put(id=id, key=id, partition=p)
        claim = loaded.model_copy(update={"status": TimerStatus.FIRING, "due_at": T0 + 30_000})
        assert await rocks.store.inner.settle([TimerChange(loaded=loaded, next=claim)]) == 1
        if p == 0:
            corrupt(rocks, claim)
    runner = TimerRunner(rocks.store, rocks.sender, rocks.clock, rocks.ledger)
    runner.start_partition(0)
    runner.start_partition(1)
    rocks.clock.set(T0 + 10)
    r = await one_round(runner)
    assert list(failed_in(r)) == [0]
    await until(lambda: rocks.sender.request_ids == ["b#0"])


async def test_the_rows_due_of_a_failed_partition_never_make_the_loop_spin(
    rocks: World,
) -> None:
    """Its wheel holds rows due that nothing takes any more: a round does not say they are
    due (the loop would run round after round at once, for nothing)."""
    a = await rocks.put(id="a", key="a", partition=0)
    await rocks.put(id="c", key="c", partition=0, rule=OnceRule(at=T0 + 50))
    await rocks.put(id="b", key="b", partition=1)
    corrupt(rocks, a)
    runner = rocks.runner(partitions=[0, 1])
    assert list((await one_round(runner)).failed) == [0]  # "c" stays in its wheel
    rocks.clock.set(T0 + 60)
    r = await one_round(runner)
    assert not r.stats.full and r.stats.next_due is None
    await until(lambda: rocks.sender.request_ids == ["b#0"])
