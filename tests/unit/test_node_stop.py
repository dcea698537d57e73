"""A node's stop (the worker's SIGTERM: its run cancelled, then `Node.stop`), as a rolling
restart does it: its partitions are closed (committed, marked clean) while it is still the
group's member, before it leaves (aiokafka's stop leaves the group without revoking: the
other members took them and fenced this one's open transactions, its last work rolled back
and done again); each close is bounded by the close deadline (a park's hung ledger write
held the stop for ever); a close that fails fails the stop (the worker exited 0); and what
the group gives while it stops is not taken."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from fakes import RunningNode, wait_until
from test_close_deadline_firing import ONE_ATTEMPT, PARTITIONS, SERVICE, TOPICS, hung_park

import app.node.partition_release
from app.errors import NodeFailed
from app.kafka.memory import MemoryLog
from app.node.in_process import NodeTimerLoop
from app.node.node_stop import stop_parts
from app.node.task_id import TaskId
from tables import StoreError


async def cancelled_run(node: RunningNode) -> None:
    """The node's run cancelled, as a signal does: its stop comes next."""
    assert node.task is not None
    node.task.cancel()
    await asyncio.gather(node.task, return_exceptions=True)


async def test_its_partitions_are_closed_before_it_leaves_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = MemoryLog()
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    b: RunningNode | None = None
    try:
        await wait_until(a.runs)
        b = await RunningNode(log, tmp_path, "b", SERVICE, PARTITIONS).start()
        await wait_until(lambda: a.runs(1) and b is not None and b.runs(1))
        other = b.node
        seen: list[tuple[int, bool]] = []
        release = app.node.partition_release.release_partition

        async def watched(shared: Any, task: Any, **kw: Any) -> None:
            if shared is a.node.tasks.shared:  # a's close: has b been given p yet?
                seen.append((task.p, any(k.p == task.p for k in other.tasks.leftover())))
            await release(shared, task, **kw)

        monkeypatch.setattr("app.node.partition_task.release_partition", watched)
        mine = sorted(a.node.owned)
        await cancelled_run(a)
        caplog.set_level(logging.INFO, logger="app")
        await a.node.stop()
        assert seen == [(p, False) for p in mine]
        await wait_until(b.runs)
        assert not [r for r in caplog.records if "rolled back" in r.getMessage()]
        # a's copy of its partition was closed clean: a restart of it restores nothing.
        kept = a.node.types[TOPICS.type_name]
        assert all(kept.marks.take(p) for p in mine)
    finally:
        if b is not None:
            await b.stop()


async def test_a_close_whose_timers_last_write_hangs_holds_no_stop_past_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = MemoryLog()
    node = await RunningNode(
        log, tmp_path, "a", SERVICE, PARTITIONS, timers=ONE_ATTEMPT, options=ONE_ATTEMPT
    ).start()
    await wait_until(node.runs)
    answered = await hung_park(log, monkeypatch)
    try:
        shared = node.node.tasks.shared
        assert shared is not None
        shared.close_deadline_s = 0.5
        await cancelled_run(node)
        # Unbounded before: the runner's stop_all waited as long as the write (for ever).
        await asyncio.wait_for(node.node.stop(), 10)
    finally:
        answered.set()


async def test_a_close_that_fails_in_the_stop_fails_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    revoke = kept.store.revoke

    async def failing(partitions: set[int]) -> None:
        if 0 in partitions:
            raise OSError("disk gone")  # the store's sync failing as it lets p go
        await revoke(partitions)

    monkeypatch.setattr(kept.store, "revoke", failing)
    await cancelled_run(node)
    with pytest.raises(NodeFailed, match=r"closing partition 0 of mem\.boom failed"):
        await node.node.stop()
    assert not kept.marks.take(0) and kept.marks.take(1)


async def test_what_the_group_gives_while_it_stops_is_not_taken(tmp_path: Path) -> None:
    node = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    await wait_until(node.runs)
    await cancelled_run(node)
    stopping = asyncio.create_task(node.node.stop())
    await asyncio.sleep(0)  # the stop began
    await node.node._assigned({(TOPICS.commands, 0), (TOPICS.events, 0), (TOPICS.timer_ops, 0)})
    assert TaskId(TOPICS.type_name, 0) not in node.node.tasks.tasks  # no take began
    await stopping
    assert not node.node.tasks.tasks


async def test_every_timer_loop_is_ended_within_the_deadline_at_once() -> None:
    """Each partition's loop whose round hangs (a queued ledger write): the stop's bound
    cancelled only the loop it awaited, and left the others running past the stores'
    close."""
    ended: list[int] = []

    class Hanging:
        def __init__(self, p: int) -> None:
            self.p = p

        async def stop(self) -> None:
            try:
                await asyncio.Event().wait()  # its round's write never comes back
            finally:
                ended.append(self.p)

    loops = NodeTimerLoop(cast(Any, None))
    loops._ending = {cast(Any, Hanging(0)), cast(Any, Hanging(1))}
    began = time.monotonic()
    await asyncio.wait_for(loops.stop(within=0.2), 5)
    assert sorted(ended) == [0, 1]
    assert time.monotonic() - began < 2


class _Tasks:
    def leftover(self) -> set[TaskId]:
        return set()

    async def revoke(self, gone: set[TaskId]) -> None:
        return None


def _kept(name: str, closed: list[str], refused: bool) -> Any:
    async def store_close() -> None:
        closed.append(f"{name} store")

    async def done(*_: object, **__: object) -> None:
        return None

    class States:
        def close(self) -> None:
            closed.append(f"{name} states")
            if refused:
                raise StoreError(f"closing {name}'s states failed: Writer has previous error")

    return SimpleNamespace(
        name=name,
        store=SimpleNamespace(close=store_close),
        states=States(),
        loop=SimpleNamespace(stop=done),
        runner=SimpleNamespace(stop_all=done),
        transactions=SimpleNamespace(stopped=done),
    )


async def test_a_states_close_refused_in_the_stop_closes_the_next_types_stores_all_the_same(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A type's aggregate states whose close is refused (a RocksDB write that failed before
    it) is logged as a store's is, and the next types' stores are closed all the same,
    before the data directory's lock is let go: its raise ended the stop there."""
    closed: list[str] = []
    released: list[bool] = []
    types = {"a": _kept("a", closed, True), "b": _kept("b", closed, False)}
    await stop_parts(
        cast(Any, _Tasks()),
        types,
        deadline_s=1.0,
        consumer=None,
        followers={},
        clients={},
        data_lock=cast(Any, SimpleNamespace(release=lambda: released.append(True))),
    )
    assert closed == ["a store", "a states", "b store", "b states"]
    assert released == [True]
    assert "stopping a states failed" in caplog.text
