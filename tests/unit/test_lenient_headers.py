"""A record whose header key is not UTF-8, read through aiokafka's own fetcher classes
(`app.kafka.lenient_headers`): every record of the fetch handed out once, in order, the
key with the replacement character, aborted transactions still passed over."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from typing import Any

import pytest
from aiokafka.consumer import fetcher
from aiokafka.errors import CorruptRecordException
from aiokafka.structs import TopicPartition
from kafka_batches import GZIP, PRODUCER, batch

from app.kafka import consumers  # noqa: F401  (installs the lenient reading)
from app.kafka.lenient_headers import _MemoryRecords, _PartitionRecords, lenient_batches

TP = TopicPartition("shop.order.events", 0)


def records(raw: bytes, aborted: list[tuple[int, int]] | None = None) -> list[Any]:
    """What aiokafka's fetcher hands out of the fetch `raw`, as its consumer reads it."""
    unpacked = fetcher.PartitionRecords(
        TP, fetcher.MemoryRecords(raw), aborted, 0, None, None, True, fetcher.READ_COMMITTED
    )
    return list(unpacked)


def test_without_it_aiokafka_stops_on_the_record_and_at_every_read_again() -> None:
    strict = _PartitionRecords(
        TP, _MemoryRecords(batch(0, 3, bad=1)), None, 0, None, None, True, fetcher.READ_COMMITTED
    )
    with pytest.raises(UnicodeDecodeError):
        list(strict)
    assert strict.next_fetch_offset == 1  # the record before it handed out, not past it


@pytest.mark.parametrize("compression", [0, GZIP], ids=["plain", "gzip"])
@pytest.mark.parametrize("bad", [0, 1, 2], ids=["first", "middle", "last"])
def test_every_record_of_the_fetch_is_handed_out_once_in_order(compression: int, bad: int) -> None:
    raw = (
        batch(0, 3, compression=compression)
        + batch(3, 3, bad=bad, compression=compression)
        + batch(6, 2, compression=compression)
    )
    got = records(raw)
    assert [r.offset for r in got] == list(range(8))
    assert [r.key for r in got] == [f"k{i}".encode() for i in range(8)]
    assert [r.headers for r in got] == [
        (("\ufffd\ufffdh" if i == 3 + bad else "h", b"v"),) for i in range(8)
    ]


def test_aborted_transactions_around_the_record_are_still_passed_over() -> None:
    raw = (
        batch(0, 2)
        + batch(2, 2, producer=PRODUCER)  # aborted
        + batch(4, 1, producer=PRODUCER, abort_marker=True)
        + batch(5, 3, bad=1)
        + batch(8, 2, producer=PRODUCER)  # aborted again, after the record
        + batch(10, 1, producer=PRODUCER, abort_marker=True)
        + batch(11, 1)
    )
    got = records(raw, aborted=[(PRODUCER, 2), (PRODUCER, 8)])
    assert [r.offset for r in got] == [0, 1, 5, 6, 7, 11]


def test_a_batch_cut_short_at_the_end_of_the_fetch_is_left_as_aiokafka_leaves_it() -> None:
    whole = batch(0, 2, bad=0)
    raw = whole + batch(2, 2)[:20]
    assert [r.offset for r in records(raw)] == [0, 1]
    assert [b.next_offset for b in lenient_batches(raw, 0)] == [2]
    assert [b.next_offset for b in lenient_batches(whole + batch(2, 2), 2)] == [4]


def test_a_fetch_with_good_keys_is_read_by_aiokafka_alone() -> None:
    unpacked = fetcher.PartitionRecords(
        TP, fetcher.MemoryRecords(batch(0, 3)), None, 0, None, None, True, fetcher.READ_COMMITTED
    )
    kept = unpacked._records
    assert [r.offset for r in unpacked] == [0, 1, 2]
    assert unpacked._records is kept  # never read again


def test_a_batch_too_short_after_the_record_is_corrupt_as_aiokafka_says() -> None:
    tiny = struct.pack(">qi", 9, 2) + b"\x00\x00"
    with pytest.raises(CorruptRecordException):
        records(batch(0, 2, bad=0) + tiny)


def test_aiokafka_without_its_c_extension_is_read_past_too() -> None:
    """Its Python reader wraps the decode error in `CorruptRecordException`."""
    env = {**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"}
    script = (
        "import sys; sys.path[:0] = ['tests/unit', '.'];"
        "from test_lenient_headers import batch, records;"
        "from aiokafka.util import NO_EXTENSIONS; assert NO_EXTENSIONS;"
        "print([r.offset for r in records(batch(0, 3) + batch(3, 3, bad=1))])"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(list(range(6)))
