"""librdkafka's reader without a broker: when a read is over (the last record before the
end, or the end-of-partition event past it, commit markers taking the last offsets); a
partition's error or no progress ends it in `KafkaUnavailable`, an event about no
partition (the group it never joins) does not;
`KafkaClients(client="confluent")` reads with it; and a restore leaves the cyclic GC as
it found it, whether it succeeds or fails (it holds the GC off while a batch is applied)."""

from __future__ import annotations

import gc
from collections.abc import AsyncGenerator
from typing import Any, cast

import pytest
from aiokafka.errors import OffsetOutOfRangeError
from confluent_kafka import KafkaError

from app.errors import KafkaUnavailable
from app.kafka import KafkaClients, Reader, Record
from app.kafka.memory import MemoryLog
from app.kafka.rdkafka_reader import RdkafkaReader, batch_end
from app.kafka.records import TopicSpec
from app.timers.restore import restore_partition
from tables import open_timer_store


def test_a_read_is_over_at_its_last_record_or_at_the_partitions_end() -> None:
    assert batch_end([3, 4], None, 5)  # offset 4 is the last before 5
    assert not batch_end([2, 3], None, 5)  # offset 4 may be a record still
    assert batch_end([2, 3], 5, 5)  # 4 was a commit marker: the partition ends at 5
    assert batch_end([], 7, 5)  # records written since: past the end the read took
    assert not batch_end([], 4, 5)  # the end seen before the last records came
    assert not batch_end([], None, 5)
    assert batch_end([9], None, 5)  # a record past the end (written since): over


async def test_the_confluent_client_reads_with_librdkafka() -> None:
    assert isinstance(KafkaClients("127.0.0.1:1", client="confluent").reader(), RdkafkaReader)
    aiokafka = KafkaClients("127.0.0.1:1").reader()
    assert isinstance(aiokafka, Reader)
    await aiokafka.stop()  # aiokafka warns of a consumer made and never closed


async def test_an_unstarted_reader_is_unavailable() -> None:
    reader = RdkafkaReader("127.0.0.1:1")
    with pytest.raises(KafkaUnavailable, match="not started"):
        await reader.offsets("t", 0)
    await reader.stop()


class _FailingReader:
    """A log whose read fails after its first batch (the broker gone mid-restore)."""

    def __init__(self, log: MemoryLog) -> None:
        self._reader = log.reader()

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return await self._reader.offsets(topic, partition)

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        async for batch in self._reader.read(topic, partition, start):
            assert gc.isenabled()  # the previous batch's pause is over
            yield batch
            raise KafkaUnavailable("gone")


async def test_a_restore_leaves_the_collector_on_whether_it_succeeds_or_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = MemoryLog([TopicSpec("t", 1)])
    await log.publisher().send_many([("t", 0, b"k%d" % i, None) for i in range(3)])
    store = open_timer_store("memory://", partitions=1)
    await store.assign({0})
    collecting: list[bool] = []
    apply = store.apply_changelog

    async def applied(partition: int, records: Any) -> Any:
        collecting.append(gc.isenabled())
        return await apply(partition, records)

    monkeypatch.setattr(store, "apply_changelog", applied)
    assert gc.isenabled()
    assert await restore_partition(store, log.reader(batch=2), "t", 0) == 3
    assert collecting == [False, False]  # held off while each batch is applied
    assert gc.isenabled()
    with pytest.raises(KafkaUnavailable, match="gone"):
        await restore_partition(store, _FailingReader(log), "t", 0, clean=False)
    assert gc.isenabled()
    gc.disable()  # a caller's pause is left as it was
    try:
        await restore_partition(store, log.reader(), "t", 0, clean=False)
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Message:
    """What `consume` returns: a record, or an event (an error, the partition's end)."""

    def __init__(
        self, offset: int, error: KafkaError | None = None, topic: str | None = "t"
    ) -> None:
        self._offset, self._error, self._topic = offset, error, topic

    def error(self) -> KafkaError | None:
        return self._error

    def offset(self) -> int:
        return self._offset

    def topic(self) -> str | None:
        return self._topic

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000)

    def headers(self) -> None:
        return None


class _Consumer:
    """Hands out its batches in turn, then nothing (a broker gone)."""

    def __init__(self, *batches: list[_Message]) -> None:
        self._batches = list(batches)

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        return self._batches.pop(0) if self._batches else []


def test_a_batch_ends_the_read_at_the_end_and_an_event_of_no_partition_is_passed() -> None:
    reader = RdkafkaReader("127.0.0.1:1", timeout=5.0)
    group_denied = KafkaError(30, "group")  # the group it never joins: not the read's
    eof = KafkaError(KafkaError._PARTITION_EOF)
    consumer = _Consumer([_Message(0, group_denied, topic=None)], [_Message(3), _Message(5, eof)])
    records, done = reader._next(cast(Any, consumer), ("t", 0), 5)
    assert [(r.topic, r.partition, r.offset, r.value) for r in records] == [("t", 0, 3, b"v3")]
    assert done  # 4 was a commit marker


def test_a_partitions_error_or_no_progress_ends_the_read_unavailable() -> None:
    reader = RdkafkaReader("127.0.0.1:1", timeout=0.1)
    deleted = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "Broker: Unknown topic or partition")
    with pytest.raises(KafkaUnavailable, match=r"cannot read t\[0\]: Broker: Unknown topic"):
        reader._next(cast(Any, _Consumer([_Message(0, deleted)])), ("t", 0), 5)
    denied = KafkaError(29, "Broker: Topic authorization failed")
    with pytest.raises(KafkaUnavailable, match=r"not authorized on a topic"):
        reader._next(cast(Any, _Consumer([_Message(0, denied)])), ("t", 0), 5)
    gone = _Consumer([_Message(2)])  # then nothing: the broker down
    assert [r.offset for r in reader._next(cast(Any, gone), ("t", 0), 5)[0]] == [2]
    with pytest.raises(KafkaUnavailable, match=r"cannot read t\[0\]: no records in 0\.1 s"):
        reader._next(cast(Any, gone), ("t", 0), 5)


def test_a_record_past_the_end_is_not_returned_and_ends_the_read() -> None:
    reader = RdkafkaReader("127.0.0.1:1", timeout=5.0)
    consumer = _Consumer([_Message(3), _Message(4), _Message(5), _Message(6)])
    records, done = reader._next(cast(Any, consumer), ("t", 0), 5)
    assert [r.offset for r in records] == [3, 4]  # 5 and 6 were written since the read began
    assert done


def test_a_position_the_log_no_longer_holds_fails_the_read() -> None:
    # librdkafka reports it (auto.offset.reset=error) rather than jumping to the end past
    # records the read never returned (the log truncated under it)
    reader = RdkafkaReader("127.0.0.1:1", timeout=5.0)
    assert reader._config["auto.offset.reset"] == "error"
    reset = KafkaError(KafkaError._AUTO_OFFSET_RESET, "fetch failed: Offset out of range")
    with pytest.raises(KafkaUnavailable, match=r"cannot read t\[0\]"):
        reader._next(cast(Any, _Consumer([_Message(2, reset)])), ("t", 0), 5)


class _StuckConsumer:
    """aiokafka's consumer with a broker gone mid-read: fetches return nothing, the
    position never moves; or, with `fault`, the fetch raises it."""

    def __init__(self, fault: Exception | None = None) -> None:
        self.fault = fault

    def assign(self, tps: Any) -> None:
        pass

    async def end_offsets(self, tps: Any) -> dict[Any, int]:
        return {tp: 5 for tp in tps}

    async def beginning_offsets(self, tps: Any) -> dict[Any, int]:
        return {tp: 0 for tp in tps}

    def seek(self, tp: Any, offset: int) -> None:
        pass

    async def getmany(self, *tps: Any, timeout_ms: int, max_records: int) -> dict[Any, Any]:
        if self.fault is not None:
            raise self.fault
        return {}

    async def position(self, tp: Any) -> int:
        return 0


@pytest.mark.parametrize("fault", [None, "out of range"])
async def test_aiokafkas_reader_fails_a_read_that_makes_no_progress_or_lost_its_position(
    fault: str | None,
) -> None:
    reader = Reader("127.0.0.1:1", timeout=0.3)
    real = reader._consumer
    reader._consumer = cast(
        Any, _StuckConsumer(None if fault is None else OffsetOutOfRangeError({}))
    )
    expected = "no progress in 0.3 s" if fault is None else "cannot read t"
    with pytest.raises(KafkaUnavailable, match=expected):
        async for _ in reader.read("t", 0, 0):
            pass
    await real.stop()
