"""Records whose header keys are not UTF-8, read as Kafka's Java clients read them.

Kafka's wire format calls a header key a string, but any producer may write any bytes
there. Java's clients decode them with the replacement character; aiokafka decodes them
strictly (in its C and its Python record readers alike) and its fetch raises
`UnicodeDecodeError` (wrapped in `CorruptRecordException` by the Python reader), which
its consumer neither skips nor can be told to: the fetch position stays on the record and
every later poll raises again, so one such record would stop whatever reads its
partition, and every node the partition moved to after.

So a fetch is unpacked as aiokafka unpacks it, and only should a header key's decoding
raise is the rest of it read again by a Python reader that decodes keys as Java does
(`install()` puts both in aiokafka's fetcher). The records already handed out are passed
over by offset, and the batches before the failing one are not looked at again (their
abort markers were taken once), so nothing is handed out twice, and a record skipped as
aborted is not handed out. The record then goes its usual way: used when it is good,
dead-lettered when it is not.

This reaches into aiokafka's private record classes; the aiokafka range in
`pyproject.toml` and the tests of this module hold it to the version in use.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from typing import Any

from aiokafka.consumer import fetcher
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import _DefaultRecordBatchPy
from aiokafka.record.legacy_records import LegacyRecordBatch

from app.kafka.records import Record

__all__ = ["install", "lenient_batches", "node_records"]

logger = logging.getLogger(__name__)

_MemoryRecords = fetcher.MemoryRecords
_PartitionRecords: type[Any] = fetcher.PartitionRecords

# A batch in a fetch: base offset (int64), length (int32), then `length` bytes whose
# fifth is the magic byte (format v2 and later: headers).
_LOG_OVERHEAD = 12
_MAGIC_OFFSET = 16


class _KeyBytes(bytes):
    """A header key's bytes, decoded as Java decodes them (the replacement character)."""

    __slots__ = ()

    def decode(self, encoding: str = "utf-8", errors: str = "replace") -> str:
        return bytes.decode(self, encoding, "replace")


class _Buffer(bytearray):
    """A batch's bytes whose slices are `_KeyBytes`: aiokafka's Python reader decodes a
    header key from a slice and copies keys and values with `bytes()`, which keeps them
    as they are."""

    def __getitem__(self, index: Any) -> Any:
        got = bytearray.__getitem__(self, index)
        return _KeyBytes(got) if isinstance(index, slice) else got


class LenientBatch(_DefaultRecordBatchPy):  # type: ignore[misc]
    """aiokafka's Python reader of a v2 batch, its header keys decoded as Java does."""

    def __init__(self, buffer: Any) -> None:
        super().__init__(buffer)
        # A copy already (a bytearray); aiokafka's attribute, untyped.
        self._buffer = _Buffer(self._buffer)  # type: ignore[has-type]

    def _maybe_uncompress(self) -> None:
        decompressed = self._decompressed
        super()._maybe_uncompress()
        if not decompressed and not isinstance(self._buffer, _Buffer):
            self._buffer = _Buffer(self._buffer)


def lenient_batches(raw: bytes, after: int) -> Iterator[Any]:
    """The batches of a fetch's bytes `raw` that end after offset `after` (the ones before
    were read): v2 and later read by `LenientBatch`, older ones (no headers) as aiokafka
    reads them. A batch cut short at the end of a fetch is left, as aiokafka leaves it."""
    view = memoryview(raw)
    pos = 0
    while len(raw) - pos >= _LOG_OVERHEAD:
        (length,) = struct.unpack_from(">i", raw, pos + 8)
        end = pos + _LOG_OVERHEAD + length
        if end > len(raw) or length < 0:
            return
        piece = view[pos:end]
        if len(piece) <= _MAGIC_OFFSET:  # as aiokafka's reader says of it
            raise CorruptRecordException(f"a batch of {length} bytes is too short")
        magic = piece[_MAGIC_OFFSET]
        batch = LenientBatch(piece) if magic >= 2 else LegacyRecordBatch(piece, magic)
        pos = end
        if batch.next_offset > after:
            yield batch


class _Batches:
    """A fetch's batches as `PartitionRecords` asks for them (`has_next`, `next_batch`)."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches
        self._next = next(batches, None)

    def has_next(self) -> bool:
        return self._next is not None

    def next_batch(self) -> Any:
        batch, self._next = self._next, next(self._batches, None)
        return batch


class _KeptRecords:
    """aiokafka's reader of a fetch, keeping the fetch's bytes for `_LenientRecords`."""

    __slots__ = ("_records", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._records = _MemoryRecords(raw)

    def size_in_bytes(self) -> int:
        return len(self.raw)

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        return self._records.next_batch()


def node_records(key: bytes | None) -> bytes | None:
    """As a consumer's `key_deserializer`: its fetches hand out the node's `Record`s
    themselves, not aiokafka's `ConsumerRecord`s made into them (`app.kafka.consumers.
    Reader`: ~0.9 µs a record less of the event loop's thread). Never called."""
    return key


class _LenientRecords(_PartitionRecords):  # type: ignore[misc]
    """aiokafka's records of a partition's fetch; should a header key stop them, the rest
    of the fetch read by `LenientBatch`. Those of a consumer made with `node_records` are
    the node's `Record`s."""

    def __init__(self, *args: Any) -> None:
        # aiokafka's arguments, in its order: tp, records, aborted transactions, fetch
        # offset, key deserializer, value deserializer, check CRCs, isolation level.
        if args[4] is node_records:
            args = (*args[:4], None, *args[5:])
            self._consumer_record = _node_record
        super().__init__(*args)

    # aiokafka's own `__next__` and one clause more: no layer between the consumer and
    # aiokafka's generator of the records (~0.25 µs a record, a generator around it).
    def __next__(self) -> Any:
        try:
            return next(self._records_iterator)  # type: ignore[has-type]
        except StopIteration:
            self._records_iterator = None
            raise
        except (UnicodeDecodeError, CorruptRecordException) as exc:
            # aiokafka's Python reader (no C extension) wraps the decode error.
            cause = exc if isinstance(exc, UnicodeDecodeError) else exc.__cause__
            kept = self._records  # type: ignore[has-type]
            if not isinstance(kept, _KeptRecords) or not isinstance(cause, UnicodeDecodeError):
                raise
            logger.warning(
                "%s: a record at or after offset %d has a header key that is not UTF-8 (%s):"
                " read with the replacement character, as Java's clients read it",
                self._tp,
                self.next_fetch_offset,
                cause.reason,
            )
            self._records = _Batches(lenient_batches(kept.raw, self.next_fetch_offset))
            self._records_iterator = self._unpack_records()
            return next(self)


def _node_record(tp: Any, record: Any) -> Record:
    # aiokafka's `_consumer_record` (no deserializers) as the node's `Record`, made with
    # `tuple.__new__` from its seven fields (as `app.kafka.consumers._record` makes one).
    return _new_record(
        Record,
        (tp.topic, tp.partition, record.offset, record.key, record.value, record.timestamp,
         tuple(record.headers)),
    )  # fmt: skip


_new_record = tuple.__new__


def install() -> None:
    """Puts the lenient reading in aiokafka's fetcher (once; every consumer of the process
    reads so, faust's included)."""
    fetcher.MemoryRecords = _KeptRecords
    fetcher.PartitionRecords = _LenientRecords
