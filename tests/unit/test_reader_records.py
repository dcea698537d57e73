"""The `Reader`'s fetches hand out the node's `Record`s themselves
(`app.kafka.lenient_headers.node_records`): the very records the default path makes of
aiokafka's `ConsumerRecord`s, a header key that is not UTF-8 and aborted transactions
included; other consumers still get `ConsumerRecord`s."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from aiokafka.consumer import fetcher
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import ConsumerRecord, TopicPartition

from app.kafka import consumers
from app.kafka.lenient_headers import node_records
from app.kafka.records import Record

TP = TopicPartition("shop.order.timers.changelog", 0)
GZIP = 1
PRODUCER = 7


class NotUtf8(str):
    """A header key the builder writes as bytes that are not UTF-8."""

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"\xff\xfe" + str.encode(self, encoding, errors)


def batch(
    base: int,
    count: int,
    *,
    bad: int | None = None,
    compression: int = 0,
    producer: int = -1,
    abort_marker: bool = False,
) -> bytes:
    """A v2 batch of `count` records from offset `base` (as `test_lenient_headers` makes
    them: `bad`, the one whose header key is not UTF-8; `abort_marker`, an abort's)."""
    builder = _DefaultRecordBatchBuilderPy(
        magic=2,
        compression_type=compression,
        is_transactional=int(producer >= 0),
        producer_id=producer,
        producer_epoch=0 if producer >= 0 else -1,
        base_sequence=0 if producer >= 0 else -1,
        batch_size=1 << 20,
    )
    for i in range(count):
        if abort_marker:
            builder.append(i, timestamp=1, key=struct.pack(">hh", 0, 0), value=b"", headers=[])
            continue
        key = NotUtf8("h") if i == bad else "h"
        value = None if i == 1 else b"{}"  # a tombstone too
        headers = [(key, b"v")]
        builder.append(i, timestamp=5, key=f"k{base + i}".encode(), value=value, headers=headers)
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base)
    if abort_marker:  # the control flag, which the builder does not set
        (attributes,) = struct.unpack_from(">h", raw, 21)
        struct.pack_into(">h", raw, 21, attributes | 0x20)
        struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[21:])))
    return bytes(raw)


def unpacked(raw: bytes, aborted: list[tuple[int, int]] | None, key: Any) -> list[Any]:
    records = fetcher.PartitionRecords(
        TP, fetcher.MemoryRecords(raw), aborted, 0, key, None, True, fetcher.READ_COMMITTED
    )
    return list(records)


@pytest.mark.parametrize("compression", [0, GZIP], ids=["plain", "gzip"])
def test_the_readers_records_are_those_the_consumer_records_make(compression: int) -> None:
    raw = (
        batch(0, 2, compression=compression)
        + batch(2, 2, producer=PRODUCER)  # aborted
        + batch(4, 1, producer=PRODUCER, abort_marker=True)
        + batch(5, 3, bad=1, compression=compression)
        + batch(8, 2, compression=compression)
    )
    aborted = [(PRODUCER, 2)]
    plain = unpacked(raw, aborted, None)
    assert all(type(r) is ConsumerRecord for r in plain)
    got = unpacked(raw, aborted, node_records)
    assert all(type(r) is Record for r in got)
    assert got == [consumers._record(r) for r in plain]
    assert [r.offset for r in got] == [0, 1, 5, 6, 7, 8, 9]
    assert got[3].headers == (("\ufffd\ufffdh", b"v"),)


async def test_the_reader_asks_for_them() -> None:
    reader = consumers.Reader("127.0.0.1:9")
    try:
        assert reader._consumer._key_deserializer is node_records
    finally:
        await reader.stop()
