"""A partition's aggregate states copy found damaged (a state the service cannot read, a
RocksDB read that fails) is marked bad, not dropped at once: a commit of the failing take
still in flight would write its batch and a recent offset into a copy opened afresh, and
the retake would fold only the events after it, every other aggregate's state and applied
request ids lost. A bad copy reads as empty and takes no write; the retake's restore drops
it and folds the log whole. A sweep that meets a block it cannot read fails rather than stop
early as at the end; a drop that leaves the copy behind fails, naming it."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import T0, OneBatchLog, RunningNode, order_type, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, results, schedule, task_of

from app.commands.batch import CommandBatch
from app.commands.records import state_key
from app.commands.states import PartitionStates
from app.kafka import Record
from app.kafka.memory import MemoryLog
from app.model.decide import StoredAggregate
from app.protocol.dead_letters import DeadLetter
from app.protocol.limits import InputLimits
from app.protocol.topics import ContextTopics
from app.protocol.wire import CommandResult, EventEnvelope, decode, encode
from tables import AggregateRef, StoreError
from tables.aggregate_store import AggregateStateStore, MemoryAggregateStore, RocksAggregateStore
from tables.partitioner import partition_of

HOUR = 3_600_000

# --- a partition's states, on either store ------------------------------------------------

EVENTS = "shop.order.events"
SHOP_PARTITIONS = 4


def orders(n: int) -> list[AggregateRef]:
    """`n` orders of one partition."""
    ids = [f"o-{i}" for i in range(1, 999)]
    p = partition_of(ids[0], SHOP_PARTITIONS)
    same = [i for i in ids if partition_of(i, SHOP_PARTITIONS) == p][:n]
    return [AggregateRef(context="shop", aggregate="order", id=i) for i in same]


ORDERS = orders(3)
SP = partition_of(ORDERS[0].id, SHOP_PARTITIONS)


def log_of(refs: list[AggregateRef]) -> OneBatchLog:
    """One event of each order, at offsets 0, 1, …"""
    return OneBatchLog(
        [
            Record(
                EVENTS,
                SP,
                n,
                ref.id.encode(),
                encode(
                    EventEnvelope(
                        id=f"e-{n}",
                        type="shop.Reminded",
                        aggregate=ref,
                        version=1,
                        request_id=f"r-{n}",
                        created_at=T0,
                        body={"n": 1},
                    )
                ),
                T0,
            )
            for n, ref in enumerate(refs)
        ]
    )


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AggregateStateStore]:
    made: AggregateStateStore = (
        MemoryAggregateStore() if request.param == "memory" else RocksAggregateStore(tmp_path)
    )
    yield made
    made.close()


def states_on(store: AggregateStateStore) -> PartitionStates:
    return PartitionStates(
        order_type(),
        SP,
        partitions=SHOP_PARTITIONS,
        store=store,
        limits=InputLimits(),
        events_topic=EVENTS,
        request_id_window=7 * 24 * HOUR,
        now=lambda: T0,
    )


async def test_an_unreadable_state_refuses_the_copy_until_the_next_restore_folds_it_whole(
    store: AggregateStateStore,
) -> None:
    """The first take folded A and X; X's bytes are damaged. Deciding on X fails the take,
    and the take's batch in flight (C's, offset 2) then commits: its write is refused,
    and the next take's restore folds all three again, A's state and request id kept."""
    a, x, c = (state_key(ref) for ref in ORDERS)
    first = states_on(store)
    assert await first.restore(log_of(ORDERS[:2])) == 2
    kept = first.stored(a)
    assert kept is not None
    store.write(SP, {x: b"\x00not json"}, [], None)
    in_flight = CommandBatch(now=T0, staged={c: kept}, log_offset=2)
    first.staged(in_flight)

    with pytest.raises(StoreError) as unreadable:
        first.stored(x)
    marked = store.is_bad(SP) and store.get(SP, a) is None and store.offset(SP) is None
    try:
        first.committed(in_flight, [])
        refused = False
    except StoreError:
        refused = True

    retake = states_on(store)
    assert await retake.restore(log_of(ORDERS)) == 3, "not folded whole"
    assert retake.stored(a) == kept, "A's state lost"
    assert retake.applied(CommandBatch(now=T0), (a, "r-0")), "A's request id forgotten"
    assert retake.stored(x) is not None and retake.stored(c) is not None
    assert store.offset(SP) == 2 and not store.is_bad(SP)
    assert unreadable.value.partition == SP and marked
    assert refused, "a commit in flight wrote into the bad copy"


# --- the RocksDB store's faults -----------------------------------------------------------

P = 1


def corrupt_sweep_entries(store: RocksAggregateStore, directory: Path, ids: int) -> None:
    """`ids` request ids of P written and flushed to one table file, a block of their sweep
    entries (the second half of the file, after the `q` entries) then overwritten."""
    for n in range(0, ids, 1_000):
        store.write(P, {}, [("agg", f"{i:032x}") for i in range(n, n + 1_000)], None, n)
    store._dbs[P].flush(True)
    store.release(P)
    (table,) = (directory / f"p{P}.db").glob("*.sst")
    size = table.stat().st_size
    with table.open("r+b") as f:
        f.seek(size * 3 // 4)
        f.write(b"\xde\xad" * 64)


def test_a_sweep_that_meets_an_unreadable_block_fails_rather_than_stop_there(
    tmp_path: Path,
) -> None:
    store = RocksAggregateStore(tmp_path)
    try:
        corrupt_sweep_entries(store, tmp_path, 20_000)
        with pytest.raises(StoreError) as failed:
            store.expire_requests(P, 20_000, 100_000)
        assert failed.value.partition == P
        assert store.is_bad(P), "read on, the copy would fail each sweep"
        store.drop(P)
        assert store.offset(P) is None and store.expire_requests(P, 20_000, 10) == 0
    finally:
        store.close()


def test_a_sweep_reads_every_entry_of_a_sound_copy(tmp_path: Path) -> None:
    store = RocksAggregateStore(tmp_path)
    try:
        for n in range(0, 3_000, 1_000):
            store.write(P, {}, [("agg", f"{i:032x}") for i in range(n, n + 1_000)], None, n)
        store._dbs[P].flush(True)
        assert store.expire_requests(P, 1_999, 10_000) == 2_000
        assert store.expire_requests(P, 5_000, 600) == 600
        assert store.expire_requests(P, 5_000, 600) == 400
        assert not store.seen(P, "agg", f"{2_999:032x}")
    finally:
        store.close()


def test_a_drop_that_leaves_the_copy_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RocksAggregateStore(tmp_path)
    try:
        store.drop(P)  # never opened: nothing to drop, nothing failed
        store.write(P, {"a": b"{}"}, [], 7)
        rmtree = shutil.rmtree

        def refused(path: Any, *args: Any, **kwargs: Any) -> None:
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(shutil, "rmtree", refused)
        with pytest.raises(StoreError, match=str(tmp_path / f"p{P}.db")) as failed:
            store.drop(P)
        assert failed.value.partition == P
        assert store.is_bad(P) and store.offset(P) is None, "left in part: never read on"
        with pytest.raises(StoreError):
            store.write(P, {"a": b"{}"}, [], 8)
        monkeypatch.setattr(shutil, "rmtree", rmtree)
        store.drop(P)
        assert not (tmp_path / f"p{P}.db").exists()
        assert store.offset(P) is None
    finally:
        store.close()


class FailingReads:
    """A partition's DB whose reads fail (a table file gone, say); the rest its own."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def get(self, key: bytes) -> Any:
        raise Exception("IO error: No such file or directory: While open a file: 000042.sst")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_a_failed_read_is_the_partitions_store_fault_and_marks_its_copy_bad(
    tmp_path: Path,
) -> None:
    store = RocksAggregateStore(tmp_path)
    try:
        store.write(P, {"a": b"{}"}, [], 3)
        store._dbs[P] = FailingReads(store._dbs[P])  # type: ignore[assignment]
        with pytest.raises(StoreError, match=r"000042\.sst") as failed:
            store.get(P, "a")
        assert failed.value.partition == P and store.is_bad(P)
        with pytest.raises(StoreError):
            store.write(P, {"b": b"{}"}, [], 4)
        store.release(P)
        assert store.is_bad(P), "kept until the next restore drops the copy"
        store.drop(P)
        assert store.get(P, "a") is None and store.offset(P) is None
    finally:
        store.close()


def test_a_failed_read_of_a_request_id_is_the_partitions_store_fault_too(tmp_path: Path) -> None:
    store = RocksAggregateStore(tmp_path)
    try:
        store.write(P, {"a": b"{}"}, [("a", "req-1")], 3)
        store._dbs[P] = FailingReads(store._dbs[P])  # type: ignore[assignment]
        with pytest.raises(StoreError, match=r"000042\.sst") as failed:
            store.folded(P, "a", "req-1")
        assert failed.value.partition == P and store.is_bad(P)
        assert not store.seen(P, "a", "req-1"), "a bad copy reads as empty"
    finally:
        store.close()


# --- a whole node ---------------------------------------------------------------------------

NP = 0


def owners(n: int) -> list[str]:
    """`n` counter ids of partition NP."""
    return [f"o{i}" for i in range(1, 999) if partition_of(f"o{i}", PARTITIONS) == NP][:n]


def counter(owner: str) -> str:
    return state_key(AggregateRef(context="mem", aggregate="counter", id=owner))


def answers(log: MemoryLog, request_id: str) -> list[CommandResult]:
    topic = ContextTopics("mem").results
    got = [decode(CommandResult, r.value) for p in range(PARTITIONS) for r in log.records(topic, p)]
    return [r for r in got if r.request_id == request_id]


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    yield n
    await n.stop()


async def test_a_commit_in_flight_when_a_state_is_found_unreadable_loses_no_other_state(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    a, y, x = owners(3)
    at = int(time.time() * 1000) + HOUR
    first = await schedule(log, a, at)
    await wait_until(lambda: first.request_id in results(log))
    assert results(log)[first.request_id].version == 1
    states = node.node.types[TOPICS.type_name].states
    assert states is not None and states.get(NP, counter(a)) is not None
    states.write(NP, {counter(x): b"\x00not json"}, [], None)  # X's local state damaged

    unreadable = asyncio.Event()
    stored = PartitionStates.stored

    def reading(self: PartitionStates, aggregate_id: str) -> StoredAggregate | None:
        try:
            return stored(self, aggregate_id)
        except StoreError:
            unreadable.set()
            raise

    monkeypatch.setattr(PartitionStates, "stored", reading)
    held = asyncio.Event()

    async def before_commit(transactional_id: str) -> None:
        if transactional_id.endswith(f".{NP}") and not unreadable.is_set():
            held.set()
            await unreadable.wait()  # Y's commit lands once X's cycle has failed

    log.before_commit = before_commit
    for_y = await schedule(log, y, at)
    await wait_until(held.is_set)
    for_x = await schedule(log, x, at)
    await wait_until(unreadable.is_set)
    task = node.node._tasks[task_of(NP)]
    await wait_until(lambda: task.takes >= 2 and node.runs(), within=15)
    await wait_until(lambda: {for_y.request_id, for_x.request_id} <= results(log).keys())
    assert states.get(NP, counter(a)) is not None, "A's state lost under a commit in flight"

    again = await schedule(log, a, at)
    await wait_until(lambda: again.request_id in results(log))
    assert (results(log)[again.request_id].code, results(log)[again.request_id].version) == (
        "COMMITTED",
        2,
    ), "A decided on as a new aggregate: a second version 1 in its log"
    await log.publisher().send(TOPICS.commands, a.encode(), encode(first), NP)
    await wait_until(lambda: len(answers(log, first.request_id)) == 2)
    assert answers(log, first.request_id)[1].code == "DUPLICATE", "A's request ids forgotten"


async def test_a_failed_states_read_retakes_the_partition_and_never_answers_the_command(
    node: RunningNode,
) -> None:
    """A states read that fails (rocksdict's own exception) is no fault of the command:
    not answered ERROR nor dead-lettered, the partition is taken again, its copy folded
    afresh, and the command decided."""
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    await wait_until(node.runs)
    (a,) = owners(1)
    at = int(time.time() * 1000) + HOUR
    first = await schedule(log, a, at)
    await wait_until(lambda: first.request_id in results(log))
    states = node.node.types[TOPICS.type_name].states
    assert states is not None
    states._dbs[NP] = FailingReads(states._dbs[NP])  # type: ignore[assignment]
    cmd = await schedule(log, a, at)
    await wait_until(lambda: cmd.request_id in results(log))
    topic = ContextTopics("mem").dead_letters
    letters = [
        DeadLetter.read(r.key, r.value, r.headers)
        for p in range(log.partitions(topic))
        for r in log.records(topic, p)
    ]
    assert (results(log)[cmd.request_id].code, results(log)[cmd.request_id].version) == (
        "COMMITTED",
        2,
    )
    assert not letters
    assert node.node._tasks[task_of(NP)].takes >= 2
