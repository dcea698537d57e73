"""The node's consumer loop (`app.node.polling.poll_loop`) over aiokafka on a real broker:
a partition whose worker is stuck is paused on the consumer (aiokafka's pause drops what
it fetched ahead of it, and fetches again from its position on resume), while the other
partition's records are handed over and their offsets committed; unstuck, it gets every
record once, in order. Records deleted before the group read them, at a take or under a
paused partition, are read past loudly and counted, never silently."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

import pytest
from fakes_poll import Workers
from harness import eventually

from app.kafka import Producer
from app.kafka.admin import delete_records
from app.kafka.group_admin import GroupOffsets
from app.kafka.group_consumer import GroupConsumer
from app.node.polling import poll_loop

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_next]

TopicFactory = Callable[..., Awaitable[str]]


async def test_a_stuck_partition_is_paused_and_the_other_flows_on_aiokafka(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(partitions=2)
    group = f"poll-{uuid.uuid4().hex[:8]}"
    given: set[tuple[str, int]] = set()

    async def assigned(tps: set[tuple[str, int]]) -> None:
        given.update(tps)

    async def revoked(tps: set[tuple[str, int]]) -> None:
        given.difference_update(tps)

    consumer = GroupConsumer(
        kafka_bootstrap, group, [topic], on_assigned=assigned, on_revoked=revoked
    )
    producer = Producer(kafka_bootstrap)
    workers = Workers()
    w0, w1 = workers.of[0], workers.of[1]
    w1.go.set()
    failures: list[str] = []
    await consumer.start()
    await producer.start()
    running = workers.start()
    tasks = [*workers.tasks]
    tasks.append(
        asyncio.create_task(
            poll_loop(consumer, running, workers, failures.append, workers.type_of([topic]))
        )
    )

    async def send(p: int, n: int) -> None:
        await producer.send_many([(topic, p, b"k", b"%d" % i) for i in range(n)])

    try:
        async with GroupOffsets(kafka_bootstrap, group) as offsets:

            async def committed(p: int) -> int | None:
                return (await offsets.fetch([(topic, p)]))[(topic, p)]

            await eventually(lambda: len(given) == 2, 60, "the group never gave both")
            await send(0, 3)
            await eventually(w0.queue.full, 30, "partition 0's batch never queued")
            await send(0, 2)  # kept: partition 0 is paused
            for n in (4, 8, 12):
                await send(1, 4)

                async def at(n: int = n) -> bool:
                    return await committed(1) == n

                await eventually(at, 30, "partition 1's offsets were not committed")
            await eventually(lambda: (topic, 0) in consumer.paused(), 30, "never paused")
            await send(0, 4)  # fetched only once partition 0 is resumed
            assert w1.got == list(range(12))
            assert w0.got == [] and await committed(0) is None
            w0.go.set()

            async def all_of_zero() -> bool:
                return await committed(0) == 9

            await eventually(all_of_zero, 30, "partition 0 never caught up")
            assert w0.got == list(range(9)), "every record once, in order"
            assert (topic, 0) not in consumer.paused()
        assert failures == [] and not tasks[-1].done()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await producer.stop()
        await consumer.stop()


async def test_a_group_rewound_below_the_start_reads_on_from_it_and_says_so(
    kafka_bootstrap: str, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Records deleted before the group read them (a committed offset below the start, as
    retention leaves it): the take reads on from the start, as aiokafka's reset would, but
    says how many were missed (`app.kafka.resume_offset`); as the in-memory group does
    (`tests/unit/test_resume_offset.py`)."""
    topic = await topic_factory(partitions=1)
    group = f"gap-{uuid.uuid4().hex[:8]}"
    given: set[tuple[str, int]] = set()

    async def assigned(tps: set[tuple[str, int]]) -> None:
        given.update(tps)

    async def revoked(tps: set[tuple[str, int]]) -> None:
        given.difference_update(tps)

    producer = Producer(kafka_bootstrap)
    consumer = GroupConsumer(
        kafka_bootstrap, group, [topic], on_assigned=assigned, on_revoked=revoked
    )
    await producer.start()
    await consumer.start()
    try:
        await producer.send_many([(topic, 0, b"k", b"%d" % i) for i in range(10)])

        async def assigned_after_a_poll() -> bool:
            await consumer.poll(200)
            return (topic, 0) in given

        await eventually(assigned_after_a_poll, 60, "the group never gave the partition")
        await consumer.commit({(topic, 0): 2})
        assert await delete_records(kafka_bootstrap, topic, {0: 6}) == {0: 6}
        with caplog.at_level(logging.ERROR, logger="app.kafka.resume_offset"):
            assert await consumer.rewind([(topic, 0)]) == {(topic, 0): 6}
        assert "4 records were deleted before this group read them" in caplog.text
        offsets: list[int] = []

        async def read_on() -> bool:
            offsets.extend(r.offset for r in (await consumer.poll(200)).get((topic, 0), []))
            return len(offsets) >= 4

        await eventually(read_on, 30, "nothing read after the rewind")
        assert offsets == [6, 7, 8, 9]
    finally:
        await consumer.stop()
        await producer.stop()


async def test_records_deleted_under_a_paused_partition_are_read_past_loudly_and_counted(
    kafka_bootstrap: str, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A running member's partition paused (restoring, its queue full) while a retention or
    DeleteRecords removes records ahead of its position: the broker refuses the fetch at
    that position (OFFSET_OUT_OF_RANGE), and the poll reads on from the start saying and
    counting how many were missed (aiokafka's "earliest" reset had done it silently), while
    the other partition's records flow; as the in-memory member does
    (`tests/unit/test_deleted_unread.py`). A fresh group (no committed offsets, nothing
    sought) reads from the start, never stalls."""
    topic = await topic_factory(partitions=2)
    group = f"deleted-{uuid.uuid4().hex[:8]}"
    given: set[tuple[str, int]] = set()
    counted: list[tuple[str, int, int]] = []

    async def assigned(tps: set[tuple[str, int]]) -> None:
        given.update(tps)

    async def revoked(tps: set[tuple[str, int]]) -> None:
        given.difference_update(tps)

    producer = Producer(kafka_bootstrap)
    consumer = GroupConsumer(
        kafka_bootstrap,
        group,
        [topic],
        on_assigned=assigned,
        on_revoked=revoked,
        on_deleted=lambda t, p, n: counted.append((t, p, n)),
    )
    await producer.start()
    await consumer.start()
    read: dict[int, list[int]] = {0: [], 1: []}

    async def send(p: int, n: int) -> None:
        await producer.send_many([(topic, p, b"k", b"%d" % i) for i in range(n)])

    def reads(p: int, offsets: list[int]) -> Callable[[], Awaitable[bool]]:
        async def polled() -> bool:
            for (_, q), records in (await consumer.poll(200)).items():
                read[q].extend(r.offset for r in records)
            return read[p] == offsets

        return polled

    try:
        await send(0, 3)
        await send(1, 3)
        await eventually(reads(0, [0, 1, 2]), 60, "partition 0 never read from its start")
        await eventually(reads(1, [0, 1, 2]), 30, "partition 1 never read from its start")
        assert len(given) == 2
        consumer.pause([(topic, 0)])
        await send(0, 6)  # offsets 3 to 8, of which 3, 4 and 5 are deleted unread
        assert await delete_records(kafka_bootstrap, topic, {0: 6}) == {0: 6}
        await send(1, 2)
        await eventually(reads(1, [0, 1, 2, 3, 4]), 30, "the other partition stopped")
        assert read[0] == [0, 1, 2] and counted == []
        consumer.resume([(topic, 0)])
        with caplog.at_level(logging.ERROR, logger="app.kafka.resume_offset"):
            await eventually(reads(0, [0, 1, 2, 6, 7, 8]), 30, "never read on past the gap")
        assert counted == [(topic, 0, 3)]
        assert f"{topic}[0]: 3 records were deleted before this group read them" in caplog.text
        assert read[1] == [0, 1, 2, 3, 4], "every record of the other partition once"
    finally:
        await consumer.stop()
        await producer.stop()
