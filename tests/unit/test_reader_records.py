"""The `Reader`'s fetches hand out the node's `Record`s themselves
(`app.kafka.lenient_headers.node_records`): the very records the default path makes of
aiokafka's `ConsumerRecord`s, a header key that is not UTF-8 and aborted transactions
included; other consumers still get `ConsumerRecord`s."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.consumer import fetcher
from aiokafka.structs import ConsumerRecord, TopicPartition
from kafka_batches import GZIP, PRODUCER, batch

from app.kafka import consumers
from app.kafka.lenient_headers import node_records
from app.kafka.records import Record

TP = TopicPartition("shop.order.timers.changelog", 0)


def unpacked(raw: bytes, aborted: list[tuple[int, int]] | None, key: Any) -> list[Any]:
    records = fetcher.PartitionRecords(
        TP, fetcher.MemoryRecords(raw), aborted, 0, key, None, True, fetcher.READ_COMMITTED
    )
    return list(records)


@pytest.mark.parametrize("compression", [0, GZIP], ids=["plain", "gzip"])
def test_the_readers_records_are_those_the_consumer_records_make(compression: int) -> None:
    raw = (
        batch(0, 2, timestamp=5, tombstone=1, compression=compression)
        + batch(2, 2, timestamp=5, tombstone=1, producer=PRODUCER)  # aborted
        + batch(4, 1, timestamp=5, tombstone=1, producer=PRODUCER, abort_marker=True)
        + batch(5, 3, timestamp=5, tombstone=1, bad=1, compression=compression)
        + batch(8, 2, timestamp=5, tombstone=1, compression=compression)
    )
    aborted = [(PRODUCER, 2)]
    plain = unpacked(raw, aborted, None)
    assert all(type(r) is ConsumerRecord for r in plain)
    got = unpacked(raw, aborted, node_records)
    assert all(type(r) is Record for r in got)
    assert got == [consumers.as_record(r) for r in plain]
    assert [r.offset for r in got] == [0, 1, 5, 6, 7, 8, 9]
    assert got[3].headers == (("\ufffd\ufffdh", b"v"),)


async def test_the_reader_asks_for_them() -> None:
    reader = consumers.Reader("127.0.0.1:9")
    try:
        assert reader._consumer._key_deserializer is node_records
    finally:
        await reader.stop()
