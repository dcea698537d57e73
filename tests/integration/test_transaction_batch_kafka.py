"""A partition's transaction against a topic whose `max.message.bytes` is below the
producer's 512 KiB batches, on a real broker: with the default batch size every commit
fails (the broker refuses the batch, aiokafka neither splits nor retries it); with the
batch size the topic's limit gives (`transaction_batch_bytes`), it commits. The refusal
is told apart as one (`records.too_large`), whichever writer met it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest
from writer_kinds import MakeWriter, each_writer

from app.errors import KafkaUnavailable
from app.kafka import OutRecord
from app.kafka.clients import KafkaAdmin
from app.kafka.consumers import read_partitions
from app.kafka.producers import transaction_batch_bytes
from app.kafka.records import too_large

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_next]

TopicFactory = Callable[..., Awaitable[str]]
LIMIT = 64 * 1024


async def _commit(
    make: MakeWriter, bootstrap: str, records: list[OutRecord], batch: int | None
) -> list[int]:
    tid = f"batch-{uuid.uuid4().hex[:8]}"
    producer = (
        make(bootstrap, tid) if batch is None else make(bootstrap, tid, max_batch_bytes=batch)
    )
    await producer.start()
    try:
        return await producer.commit(records, {}, "g")
    finally:
        await producer.stop()


@each_writer
async def test_a_transaction_commits_under_a_topics_smaller_limit(
    kafka_bootstrap: str, topic_factory: TopicFactory, make: MakeWriter
) -> None:
    topic = await topic_factory(configs={"max.message.bytes": str(LIMIT)})
    takes = await KafkaAdmin(kafka_bootstrap).max_message_bytes(topic)
    assert takes == LIMIT
    # 256 records of 1 KiB to one partition: 4 times what one batch of the topic may hold.
    records: list[OutRecord] = [(topic, 0, b"k%d" % i, bytes(1024)) for i in range(256)]
    with pytest.raises(KafkaUnavailable) as refused:
        await _commit(make, kafka_bootstrap, records, None)  # 512 KiB batches: refused
    assert too_large(refused.value)  # told apart: its partition reads the limits again
    offsets = await _commit(make, kafka_bootstrap, records, transaction_batch_bytes([takes]))
    assert len(offsets) == 256 and offsets == sorted(offsets)


@each_writer
async def test_each_record_is_told_the_offset_it_was_written_at(
    kafka_bootstrap: str, topic_factory: TopicFactory, make: MakeWriter
) -> None:
    """A transaction's records go in per partition batches, and a topic with records left
    to the key's partition record by record: every record, in whichever way it went, is
    told its own offset (its partition's committed work is told by them)."""
    batched = await topic_factory(partitions=2)
    keyed = await topic_factory(partitions=3)
    # Three batches of partition 0 (4 KiB batches, 1 KiB records), partition 1
    # interleaved, a record with headers, and records placed by their key.
    records: list[OutRecord] = []
    for i in range(10):
        records.append((batched, 0, b"a%d" % i, bytes(1024)))
        records.append((batched, 1, b"b%d" % i, b"small"))
        records.append((keyed, None, b"k%d" % i, b"v%d" % i))
    records.append((batched, 1, b"h", b"with headers", (("why", b"test"),)))
    offsets = await _commit(make, kafka_bootstrap, records, 4 * 1024)
    written: dict[tuple[str, int, int], bytes | None] = {}
    # The commit is answered once the coordinator has it; its markers reach the partitions
    # just after, and a read_committed read stops at the markers: read until all are in.
    deadline = asyncio.get_running_loop().time() + 30
    while len(written) < len(records) and asyncio.get_running_loop().time() < deadline:
        for topic, partitions in ((batched, range(2)), (keyed, range(3))):
            async for batch in read_partitions(kafka_bootstrap, topic, partitions):
                for r in batch:
                    written[(topic, r.partition, r.offset)] = r.key
    for out, at in zip(records, offsets, strict=True):
        topic, partition, key = out[0], out[1], out[2]
        where = [p for (t, p, o), k in written.items() if (t, o, k) == (topic, at, key)]
        assert where, f"{key!r} is not at offset {at} of {topic}"
        assert partition is None or where == [partition], (key, where)
    assert len(written) == len(records)
