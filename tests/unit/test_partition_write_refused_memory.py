"""One RocksDB write of one partition fails (a full disk for a moment), on the in-memory
log: RocksDB then refuses that DB's every write, its close's included (rocksdict raises a
plain `Exception`, and closes it all the same: `test_rocksdb_close_refused`). The
partition fails alone: its task closed dirty, its copy not marked clean, taken afresh
(restored whole) and serving again, while the other partition goes on untouched. The
close's refused sync stopped the whole node (`CloseFailed`, then `NodeFailed`). The
same for its aggregate states' DB (written once the partition's transaction committed),
whose copy is marked bad and folded again from the log whole."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from fakes import T0, FakeClock, RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, events, schedule, task_of
from test_partition_fault_memory import owners_in
from test_rocksdb_close_refused import WriteFailed

from app.commands.records import state_key
from app.errors import NodeFailed
from app.kafka.memory import MemoryLog
from app.timers.restore import restore_partition
from tables import AggregateRef
from tables.rocksdb_store import RocksDBTimerStore


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    clock = FakeClock(T0)
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS, clock=clock).start()
    yield n
    await n.stop()


@pytest.mark.parametrize("refusing", ["timers", "states"])
async def test_a_write_refused_once_fails_its_partition_alone_which_is_taken_afresh(
    node: RunningNode,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    refusing: str,
) -> None:
    caplog.set_level(logging.WARNING)
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    tasks = {key.p: task for key, task in node.node._tasks.items()}  # one type: by p
    bad, good = 0, 1
    restores: list[tuple[int, bool]] = []
    kept = node.node.types[TOPICS.type_name]
    states = kept.states
    assert states is not None
    drop = states.drop
    dropped: list[int] = []

    async def restoring(store: Any, reader: Any, topic: str, p: int, **kw: Any) -> int:
        restores.append((p, kw["clean"]))
        return await restore_partition(store, reader, topic, p, **kw)

    def dropping(p: int) -> None:
        dropped.append(p)
        drop(p)

    monkeypatch.setattr("app.node.partition_open.restore_partition", restoring)
    monkeypatch.setattr(states, "drop", dropping)
    first, later = owners_in(bad)[:2]
    other = owners_in(good)[0]
    clock = cast(FakeClock, node.node.clock)
    far = T0 + 3_600_000

    refused: Any = kept.store if refusing == "timers" else states  # RocksDB's own
    dbs: dict[int, Any] = refused._dbs

    async def stored(owner: str) -> bool:
        ref = AggregateRef(context="mem", aggregate="counter", id=owner)
        return (
            await kept.store.find(ref, "k") is not None
            and states.get(bad, state_key(ref)) is not None
        )

    await schedule(log, first, far)
    await wait_until(lambda: stored(first))
    # From now on p's DB refuses its writes, as RocksDB does once one of them failed.
    db = dbs[bad] = WriteFailed(dbs[bad])
    await schedule(log, later, T0 + 1_000)
    await wait_until(lambda: tasks[bad].takes == 2 or node.task is None or node.task.done())
    assert node.node._failure is None and node.task is not None and not node.task.done()
    assert db.calls[:1] == ["write"] and db.calls[-1] == "close", db.calls
    failures = [r.getMessage() for r in caplog.records if "taken afresh" in r.getMessage()]
    assert len(failures) == 1 and f"partition {bad} of" in failures[0], failures
    assert "No space left on device" in failures[0]
    # Not marked clean as it closed, restored whole (a timer copy the cycle failed in),
    # or its states folded again whole, with what it held before the fault.
    if refusing == "timers":
        assert restores == [(bad, False)] and dropped == []
    else:
        assert restores == [(bad, True)] and dropped == [bad] and not states.is_bad(bad)
    assert await stored(first)
    # It serves again: the command its failed cycle read is decided again, and fires.
    await wait_until(lambda: stored(later))
    clock.advance(1_000)
    await wait_until(lambda: later in [e.aggregate.id for e in events(log, "Fired")], within=15)
    assert dbs[bad] is not db
    # The other partition untouched: never failed, never taken again, and firing.
    await schedule(log, other, T0 + 1_200)

    async def set_other() -> bool:
        ref = AggregateRef(context="mem", aggregate="counter", id=other)
        return await kept.store.find(ref, "k") is not None

    await wait_until(set_other)
    clock.advance(200)
    await wait_until(lambda: other in [e.aggregate.id for e in events(log, "Fired")])
    assert node.node._tasks[task_of(good)] is tasks[good] and tasks[good].takes == 1
    await wait_until(node.runs)
    assert node.node.health()["ready"]


async def test_a_fault_that_lasts_through_the_retakes_stops_the_node_loudly(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each DB of the partition opened refuses its writes (the disk stays full): the
    retake's restore fails at each attempt, each close of it refused too, and once the
    partition cannot be taken the node stops, saying why; until then /healthz says the
    partition is not ready, and why it failed."""
    monkeypatch.setattr("app.node.partition_take.TAKE_BACKOFF_S", 0.01)
    monkeypatch.setattr("app.node.partition_take.TAKE_BACKOFF_MAX_S", 0.02)
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    kept = node.node.types[TOPICS.type_name]
    bad = 0
    first, later = owners_in(bad)[:2]
    ref = AggregateRef(context="mem", aggregate="counter", id=first)
    await schedule(log, first, T0 + 3_600_000)

    async def stored() -> bool:
        return await kept.store.find(ref, "k") is not None

    await wait_until(stored)  # in its changelog: each restore writes it again
    opened = RocksDBTimerStore._open_db

    def refusing(store: RocksDBTimerStore, partition: int, *, bulk: bool) -> Any:
        db = opened(store, partition, bulk=bulk)
        return WriteFailed(db) if partition == bad else db

    monkeypatch.setattr(RocksDBTimerStore, "_open_db", refusing)
    store: Any = kept.store  # RocksDB's own
    dbs: dict[int, Any] = store._dbs
    dbs[bad] = WriteFailed(dbs[bad])
    await schedule(log, later, T0 + 1_000)
    health: list[dict[str, Any]] = []

    def stopped() -> bool:
        health.append(node.node.health())
        return node.task is not None and node.task.done()

    await wait_until(stopped, within=30)
    assert node.task is not None
    with pytest.raises(NodeFailed, match="could not be taken in 10 attempts: RocksDB write"):
        node.task.result()
    # Until it stopped, the partition is not ready, and /healthz says why at each look.
    unready = [h for h in health if not h["ready"]]
    assert unready and all(bad not in h["owned"] for h in unready)
    assert all("No space left on device" in h["failing"][str(bad)]["error"] for h in unready)
    node.task = None  # its failure checked: the fixture's stop does not raise it again
