"""The timers subscription on the in-memory log: a batch of the aggregate log read
committed (an aborted transaction's events never in it) is applied to the timer table,
whose rows commit in the partition's transaction with the batch's offset; the table
restored from its changelog is the same, and replaying the batch changes nothing."""

from __future__ import annotations

from app.kafka import OutRecord, Record, TopicSpec
from app.kafka.memory import MemoryLog
from app.node.type_transactions import TypeTransactions as TransactionalChangelog
from app.protocol.topics import AggregateTopics
from app.protocol.wire import (
    SCHEDULE_CANCELLED,
    SCHEDULE_SET,
    EventEnvelope,
    decode,
    encode,
)
from app.timers.restore import restore_partition
from app.timers.subscription import TimerOp, apply_all, timer_op
from tables import AggregateRef, Timer, TimerStatus, TimerStore, open_timer_store
from tables.partitioner import partition_of

T0 = 1_800_000_000_000
PARTITIONS = 4
GROUP = "g"
TOPICS = AggregateTopics("shop", "order")
P = partition_of("o-0", PARTITIONS)
A, B, C = (
    AggregateRef(context="shop", aggregate="order", id=i)
    for i in [f"o-{n}" for n in range(100) if partition_of(f"o-{n}", PARTITIONS) == P][:3]
)


def event(owner: AggregateRef, version: int, type: str, body: dict[str, object]) -> OutRecord:
    e = EventEnvelope(
        id=f"{owner.id}-v{version}",
        type=type,
        aggregate=owner,
        version=version,
        created_at=T0,
        body=body,
    )
    return (TOPICS.events, P, owner.id.encode(), encode(e))


def schedule(owner: AggregateRef, version: int, at: int) -> OutRecord:
    body: dict[str, object] = {
        "key": "remind",
        "rule": {"kind": "once", "at": at},
        "command": {"type": "Remind"},
    }
    return event(owner, version, SCHEDULE_SET, body)


def ops(batch: list[Record]) -> list[TimerOp]:
    found = (timer_op(decode(EventEnvelope, r.value), r.partition) for r in batch)
    return [op for op in found if op is not None]


async def owned(log: MemoryLog) -> tuple[TransactionalChangelog, TimerStore]:
    changelog = TransactionalChangelog(log.transactional_writer, TOPICS.timers_changelog, GROUP)
    store = open_timer_store("memory://", partitions=PARTITIONS, changelog=changelog)
    await changelog.open(P)
    return changelog, store


async def rows(store: TimerStore) -> dict[str, tuple[TimerStatus, int]]:
    timers: list[Timer] = []
    for owner in (A, B, C):
        timers += await store.timers_of(owner)
    return {t.owner.id: (t.status, t.due_at) for t in timers}


async def test_a_log_batch_is_applied_and_committed_with_its_offset() -> None:
    log = MemoryLog([TopicSpec(t, PARTITIONS) for t in (TOPICS.events, TOPICS.timers_changelog)])
    service = log.transactional_writer("service")
    await service.start()
    await service.commit([schedule(A, 1, T0 + 1_000), schedule(B, 1, T0 + 2_000)], {}, "s")
    await service.send([schedule(C, 1, T0 + 3_000)])
    await service.abort()  # C's schedule never happened
    body: dict[str, object] = {"key": "remind"}
    await service.commit([event(B, 2, SCHEDULE_CANCELLED, body)], {}, "s")

    changelog, store = await owned(log)
    batches = [b async for b in log.reader().read(TOPICS.events, P, 0)]
    assert [r.offset for b in batches for r in b] == [0, 1, 5]
    batch = [r for b in batches for r in b]
    changed, put = await apply_all(store, ops(batch))
    assert changed == 3 and [t.owner for t in put] == [A, B]
    assert await changelog.of(P).commit({(TOPICS.events, P): batch[-1].offset + 1}) == []
    assert log.committed(GROUP, TOPICS.events, P) == 6
    expected = {
        A.id: (TimerStatus.PENDING, T0 + 1_000),
        B.id: (TimerStatus.CANCELLED, T0 + 2_000),
    }
    assert await rows(store) == expected

    copy = open_timer_store("memory://", partitions=PARTITIONS)
    await restore_partition(copy, log.reader(), TOPICS.timers_changelog, P)
    assert await rows(copy) == expected

    # Read again (a rebalance before its offset counted): a view, so nothing changes.
    assert await apply_all(store, ops(batch)) == (0, [])
    assert changelog.pending() == []


async def test_a_later_version_wins_whatever_order_two_batches_are_applied_in() -> None:
    log = MemoryLog([TopicSpec(t, PARTITIONS) for t in (TOPICS.events, TOPICS.timers_changelog)])
    publisher = log.publisher()
    await publisher.send_many([schedule(A, 1, T0 + 1_000), schedule(A, 2, T0 + 5_000)])
    first, second = ([r] for r in log.records(TOPICS.events, P))
    changelog, store = await owned(log)
    await apply_all(store, ops(second))
    assert await apply_all(store, ops(first)) == (0, []), "an older version moves nothing"
    await changelog.of(P).commit()
    copy = open_timer_store("memory://", partitions=PARTITIONS)
    await restore_partition(copy, log.reader(), TOPICS.timers_changelog, P)
    assert await rows(copy) == {A.id: (TimerStatus.PENDING, T0 + 5_000)}
