"""aiokafka logs "Unexpected error while fetching data: <error>" (a WARNING naming no
partition) at each fetch the broker answers with an error it has no branch for
(CORRUPT_MESSAGE, KAFKA_STORAGE_ERROR, UNKNOWN_SERVER_ERROR), and fetches again at once:
many lines a second, for as long as it lasts, burying every other line, saying nothing of
what it means. The process's log filter (`app.kafka.log_filter`) now lets one a minute
per error through, whether a `BrokerWatch` listens or not, saying what it means and how
many were not logged."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from fakes_fetch import CORRUPT_MESSAGE, Broker, Clock, Part, close, over, stamped_by
from test_broker_watch import _aiokafka_log_calls

from app.kafka import log_filter as filtering
from app.kafka.fetch_stalls import STALL_S
from app.kafka.log_filter import FETCH_ERROR_EVERY_S, BrokerLogFilter
from app.kafka.partition_reader import PartitionReader

FETCHER = "aiokafka.consumer.fetcher"
UNEXPECTED = "Unexpected error while fetching data: %s"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def installed(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Iterator[BrokerLogFilter]:
    """A filter of the test's own, alone on the fetcher's logger: the process's (which an
    earlier test may have installed) bounds these lines too, by its own count."""
    monkeypatch.setattr(logging.getLogger(FETCHER), "filters", [])
    f = BrokerLogFilter(clock)
    f.install()
    yield f
    f.uninstall()


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == FETCHER]


def test_unexpected_fetch_errors_pass_once_a_minute_per_error_saying_what_they_mean(
    installed: BrokerLogFilter, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    log = logging.getLogger(FETCHER)
    for _ in range(500):
        log.warning(UNEXPECTED, "CorruptRecordException")
        log.warning(UNEXPECTED, "KafkaStorageError")
    [corrupt, storage] = said(caplog)
    assert corrupt == (
        "Unexpected error while fetching data: CorruptRecordException: the broker answered "
        "a partition's fetch with it (aiokafka names none, and fetches it again at once). A "
        f"partition whose fetches all fail so stops the node after {STALL_S:.0f} s, naming "
        "it; look at the partition leader's log"
    )
    assert storage.startswith("Unexpected error while fetching data: KafkaStorageError: ")
    clock.now += FETCH_ERROR_EVERY_S
    log.warning(UNEXPECTED, "CorruptRecordException")
    assert said(caplog)[-1].endswith("leader's log (499 more like it in the last 60 s, not logged)")
    assert len(said(caplog)) == 3


def test_aiokafka_still_logs_the_unexpected_fetch_error_so() -> None:
    """Guards an aiokafka upgrade (as the filter's other records are)."""
    name, msg = filtering._UNEXPECTED
    assert (name, msg) == (FETCHER, UNEXPECTED)
    assert msg in _aiokafka_log_calls()[name]


async def test_a_partition_whose_fetches_all_fail_is_one_line_not_one_a_fetch(
    installed: BrokerLogFilter,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiokafka's real fetcher, its broker answering t[0]'s every fetch CORRUPT_MESSAGE."""
    caplog.set_level(logging.WARNING)
    stamped_by(monkeypatch, clock)
    broker = Broker({0: Part(error=CORRUPT_MESSAGE), 1: Part(records=True, high=10**6, lso=10**6)})
    reader = PartitionReader("localhost:9092", "t", clock=clock)
    over(reader._consumer, broker, {0: 50, 1: 0})
    try:
        for _ in range(20):
            await broker.round()
            clock.now += 1
            await reader.poll(timeout_ms=0)
    finally:
        await close(reader._consumer)
    [line] = said(caplog)
    assert line.startswith("Unexpected error while fetching data: CorruptRecordException: ")
