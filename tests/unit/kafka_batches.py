"""Record batches as a broker hands them to aiokafka's fetcher, made byte for byte (v2):
for the tests of reading them (`test_lenient_headers`, `test_reader_records`)."""

from __future__ import annotations

import struct

from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.record.util import calc_crc32c

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
    tombstone: int | None = None,
    timestamp: int = 1,
) -> bytes:
    """A v2 batch of `count` records from offset `base` (`bad`: the index of the one
    whose header key is not UTF-8; `tombstone`: of the one without a value; `producer`:
    a transaction's), or a control batch of an abort (`abort_marker`)."""
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
        value = None if i == tombstone else b"{}"
        headers = [(key, b"v")]
        builder.append(
            i, timestamp=timestamp, key=f"k{base + i}".encode(), value=value, headers=headers
        )
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base)
    if abort_marker:  # the control flag, which the builder does not set
        (attributes,) = struct.unpack_from(">h", raw, 21)
        struct.pack_into(">h", raw, 21, attributes | 0x20)
        struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[21:])))
    return bytes(raw)
