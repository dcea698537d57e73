"""The in-memory log's own semantics, Kafka's: offsets with transaction markers, read-committed
visibility, aborts, fencing by transactional id, consumer-group offsets committed within a
transaction, the default partitioner, deleted records, followers."""

from __future__ import annotations

import asyncio

import pytest

from app.errors import Fenced, KafkaUnavailable
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from tables.partitioner import partition_of

T = "t"
G = "g"


def log_with(partitions: int = 1) -> MemoryLog:
    return MemoryLog([TopicSpec(T, partitions), TopicSpec("in", partitions)])


def values(log: MemoryLog, partition: int = 0, *, committed: bool = True) -> list[bytes | None]:
    return [r.value for r in log.records(T, partition, committed=committed)]


async def test_a_committed_transaction_takes_an_offset_per_record_and_one_for_its_marker() -> None:
    log = log_with()
    writer = log.transactional_writer("id")
    await writer.start()
    assert await writer.commit([(T, 0, b"k", b"a"), (T, 0, b"k", b"b")], {}, G) == [0, 1]
    assert log.offsets(T, 0) == (0, 3), "the commit marker is offset 2"
    assert [(r.offset, r.value) for r in log.records(T, 0)] == [(0, b"a"), (1, b"b")]
    assert await writer.commit([(T, 0, b"k", b"c")], {}, G) == [3]
    assert log.offsets(T, 0) == (0, 5)


async def test_an_open_transaction_is_invisible_to_read_committed_and_holds_the_stable_end() -> (
    None
):
    log = log_with()
    writer = log.transactional_writer("id")
    await writer.start()
    assert await writer.send([(T, 0, None, b"txn")]) == [0]
    # A plain write after it waits behind it, as in Kafka: the last stable offset is 0.
    assert await log.publisher().send(T, None, b"plain", 0) == 1
    assert log.offsets(T, 0) == (0, 0)
    assert values(log) == []
    assert values(log, committed=False) == [b"txn", b"plain"]
    reader = log.reader()
    assert [b async for b in reader.read(T, 0, 0)] == []
    await writer.commit_transaction()
    assert log.offsets(T, 0) == (0, 3)
    assert values(log) == [b"txn", b"plain"]


async def test_an_aborted_transaction_is_skipped_for_good_and_its_group_offsets_dropped() -> None:
    log = log_with()
    writer = log.transactional_writer("id")
    await writer.start()
    await writer.send([(T, 0, None, b"gone")])
    await writer.send_offsets({("in", 0): 7}, G)
    await writer.abort()
    assert log.offsets(T, 0) == (0, 2), "the record and the abort marker took offsets"
    assert values(log) == [] and values(log, committed=False) == [b"gone"]
    assert log.committed(G, "in", 0) is None
    assert await writer.commit([(T, 0, None, b"kept")], {("in", 0): 8}, G) == [2]
    assert values(log) == [b"kept"]
    assert log.committed(G, "in", 0) == 8


async def test_group_offsets_sent_in_a_transaction_count_only_once_it_commits() -> None:
    log = log_with()
    writer = log.transactional_writer("id")
    await writer.start()
    await writer.send_offsets({("in", 0): 5}, G)
    assert log.committed(G, "in", 0) is None
    await writer.commit_transaction()
    assert log.committed(G, "in", 0) == 5
    assert log.offsets("in", 0) == (0, 0), "an offsets-only transaction marks no partition"


async def test_a_new_writer_of_the_id_fences_the_old_one_and_aborts_its_transaction() -> None:
    log = log_with()
    old = log.transactional_writer("id")
    await old.start()
    await old.send([(T, 0, None, b"zombie")])
    await old.send_offsets({("in", 0): 3}, G)
    new = log.transactional_writer("id")
    await new.start()
    assert log.epoch("id") == 2
    assert not log.open_transaction("id")
    assert log.offsets(T, 0) == (0, 2), "aborted by the new writer's start: its marker"
    with pytest.raises(Fenced):
        await old.commit_transaction()
    assert isinstance(old.broken, Fenced)
    with pytest.raises(Fenced):
        await old.commit([(T, 0, None, b"again")], {}, G)
    assert await new.commit([(T, 0, None, b"owner")], {("in", 0): 4}, G) == [2]
    assert values(log) == [b"owner"]
    assert log.committed(G, "in", 0) == 4
    other = log.transactional_writer("other-id")
    await other.start()
    assert log.epoch("other-id") == 1, "epochs are per transactional id"


async def test_a_zombie_fenced_between_its_writes_and_its_commit_leaves_nothing_visible() -> None:
    log = log_with()
    old = log.transactional_writer("id")
    await old.start()

    async def fence(transactional_id: str) -> None:
        log.before_commit = None
        await log.transactional_writer(transactional_id).start()

    log.before_commit = fence
    with pytest.raises(Fenced):
        await old.commit([(T, 0, None, b"zombie")], {("in", 0): 1}, G)
    assert values(log) == [] and values(log, committed=False) == [b"zombie"]
    assert log.committed(G, "in", 0) is None
    assert log.offsets(T, 0) == (0, 2)


async def test_a_failed_transaction_is_aborted_and_breaks_the_writer() -> None:
    log = log_with()
    writer = log.transactional_writer("id")
    await writer.start()
    await writer.send([(T, 0, None, b"first")])
    with pytest.raises(KafkaUnavailable, match="transaction failed") as failed:
        await writer.commit([(T, 5, None, b"nowhere")], {}, G)
    assert not isinstance(failed.value, Fenced)
    assert writer.broken is failed.value and not writer.pending
    assert values(log) == [] and log.offsets(T, 0) == (0, 2)
    with pytest.raises(KafkaUnavailable):
        await writer.commit([], {}, G)


async def test_a_writer_failing_on_an_unreachable_broker_leaves_its_transaction_open() -> None:
    log = log_with()
    writer = log.transactional_writer("id")
    await writer.start()
    await writer.send([(T, 0, None, b"stuck")])
    await log.publisher().send(T, None, b"behind", 0)
    log.down = True
    with pytest.raises(KafkaUnavailable):
        await writer.commit([], {}, G)
    log.down = False
    assert writer.broken is not None
    assert log.offsets(T, 0) == (0, 0), "the open transaction holds the stable end back"
    await log.transactional_writer("id").start()  # the next owner fences it
    assert log.offsets(T, 0) == (0, 3)
    assert values(log) == [b"behind"]


async def test_an_expired_transaction_is_aborted_and_its_writer_fenced() -> None:
    log = log_with()
    writer = log.transactional_writer("id")
    await writer.start()
    await writer.send([(T, 0, None, b"late")])
    assert log.expire("id") and not log.expire("id")
    assert log.offsets(T, 0) == (0, 2) and values(log) == []
    with pytest.raises(Fenced):
        await writer.commit([], {}, G)


async def test_writing_before_start_or_to_an_unknown_topic_fails() -> None:
    log = log_with()
    with pytest.raises(KafkaUnavailable, match="not started"):
        await log.transactional_writer("id").commit([(T, 0, None, b"x")], {}, G)
    with pytest.raises(KafkaUnavailable, match="unknown topic"):
        await log.publisher().send("nope", None, b"x")
    with pytest.raises(KafkaUnavailable, match="unknown partition"):
        await log.publisher().send(T, None, b"x", 1)
    with pytest.raises(KafkaUnavailable, match="expected 3"):
        log.ensure_topics([TopicSpec(T, 3)])


async def test_a_keyed_record_goes_to_the_default_partitioners_partition() -> None:
    log = log_with(partitions=7)
    publisher = log.publisher()
    for key in ["o-1", "o-2", "an order", "ü"]:
        await publisher.send(T, key.encode(), b"v")
        assert [r.value for r in log.records(T, partition_of(key, 7))], key
    assert sum(len(log.records(T, p)) for p in range(7)) == 4


async def test_a_reader_reads_from_the_first_offset_held_in_batches_to_the_stable_end() -> None:
    log = log_with()
    publisher = log.publisher()
    await publisher.send_many([(T, 0, None, bytes([n])) for n in range(7)])
    log.delete_records(T, 0, 2)
    reader = log.reader(batch=2)
    assert await reader.offsets(T, 0) == (2, 7)
    batches = [[r.offset for r in b] async for b in reader.read(T, 0, 0)]
    assert batches == [[2, 3], [4, 5], [6]]
    assert [[r.offset for r in b] async for b in reader.read(T, 0, 5)] == [[5, 6]]
    assert [b async for b in reader.read(T, 0, 7)] == []
    with pytest.raises(KafkaUnavailable):
        log.delete_records(T, 0, 8)


async def test_a_reader_reads_only_to_the_end_as_it_was_when_the_read_began() -> None:
    log = log_with()
    publisher = log.publisher()
    await publisher.send_many([(T, 0, None, b"a"), (T, 0, None, b"b")])
    seen: list[int] = []
    async for batch in log.reader(batch=1).read(T, 0, 0):
        seen += [r.offset for r in batch]
        await publisher.send(T, None, b"later", 0)
    assert seen == [0, 1]


async def test_an_unreachable_log_fails_every_client_call() -> None:
    log = log_with()
    log.down = True
    with pytest.raises(KafkaUnavailable):
        await log.reader().offsets(T, 0)
    with pytest.raises(KafkaUnavailable):
        await log.publisher().send(T, None, b"x", 0)
    with pytest.raises(KafkaUnavailable):
        await log.transactional_writer("id").start()
    with pytest.raises(KafkaUnavailable):
        await log.follower(T).poll(timeout_ms=0)


async def test_a_follower_reads_from_the_end_when_added_committed_records_only() -> None:
    log = log_with(partitions=2)
    publisher = log.publisher()
    await publisher.send(T, None, b"before", 0)
    follower = log.follower(T)
    await follower.start()
    assert await follower.poll(timeout_ms=1) == [], "nothing assigned: waits, then nothing"
    await follower.add(0)
    await follower.add(1)
    writer = log.transactional_writer("id")
    await writer.start()
    await writer.send([(T, 1, None, b"txn")])
    await publisher.send(T, None, b"plain", 0)
    assert [r.value for r in await follower.poll(timeout_ms=1)] == [b"plain"]
    assert await follower.poll(timeout_ms=1) == []
    waiting = asyncio.create_task(follower.poll(timeout_ms=10_000))
    await asyncio.sleep(0)
    assert not waiting.done()
    await writer.commit_transaction()
    assert [r.value for r in await asyncio.wait_for(waiting, 1)] == [b"txn"]
    await follower.remove(0)
    await publisher.send(T, None, b"unfollowed", 0)
    assert await follower.poll(timeout_ms=1) == []


async def test_timestamps_come_from_the_given_clock_or_count_up() -> None:
    counted = log_with()
    await counted.publisher().send_many([(T, 0, None, b"a"), (T, 0, None, b"b")])
    assert [r.timestamp for r in counted.records(T, 0)] == [0, 1]
    clocked = MemoryLog([TopicSpec(T, 1)], now=lambda: 1_800_000_000_000)
    await clocked.publisher().send(T, None, b"a", 0)
    assert clocked.records(T, 0)[0].timestamp == 1_800_000_000_000
