"""A type's transactions registry (`TypeTransactions`) keeps every producer stop still
running in view, a partition's earlier ones included: a stop left past its close's
deadline, the partition taken and let go again since, is still waited for (bounded) and
named when the node stops, never cut half way unseen."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.kafka.memory import MemoryLog
from app.kafka.memory_clients import MemoryWriter
from app.node.type_transactions import TypeTransactions


async def test_an_earlier_stop_of_a_partition_is_still_waited_for(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = MemoryLog()
    release = asyncio.Event()
    stopped: list[int] = []
    stop = MemoryWriter.stop

    async def slow_stop(writer: MemoryWriter) -> None:
        n = len(stopped)  # which stop this is, by order of calls
        stopped.append(n)
        if n == 0:
            await release.wait()  # the first producer's broker slow to answer
        await stop(writer)

    monkeypatch.setattr(MemoryWriter, "stop", slow_stop)
    txns = TypeTransactions(log.transactional_writer, "t.timers", "g")
    await txns.open(0)
    await txns.abandon(0, within=0.01)  # left to stop on its own
    await txns.open(0)  # taken again
    await txns.abandon(0, within=1)  # let go again: this stop ends at once
    txns.stop_deadline_s = 0.05
    with caplog.at_level(logging.WARNING):
        await txns.stopped()
    assert "producer still stopping when the node stops" in caplog.text, "the first stop"
    release.set()
    txns.stop_deadline_s = 5
    await txns.stopped()
    assert not txns._unstopped


class _OneCallAtATime:
    """A producer as librdkafka's runs one (`RdkafkaTransactionalWriter`): its calls one
    at a time on its own thread, each left running when its caller gives up; its start
    (`init_transactions`) blocks up to its own timeout."""

    transactional_id = "g.t.0"
    broken = None

    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None
        self._calls: list[asyncio.Future[None]] = []
        self.stopped = asyncio.Event()

    def cut(self) -> None:
        """Ends its calls (the test's end)."""
        for call in self._calls:
            call.cancel()

    def _call(self, seconds: float) -> asyncio.Future[None]:
        before = self._last

        async def call() -> None:
            if before is not None:
                await asyncio.wait([before])
            await asyncio.sleep(seconds)

        self._last = asyncio.ensure_future(call())
        self._calls.append(self._last)
        return self._last

    async def start(self) -> None:
        await asyncio.shield(self._call(30))

    async def stop(self) -> None:
        await asyncio.shield(self._call(0))
        self.stopped.set()


async def test_a_cancelled_open_does_not_wait_for_its_producers_stop() -> None:
    """A revoke cancels the take that opens p (found by a failure-path hunt: the open
    waited for librdkafka's stop behind its start, up to 30 s and more, and the revoke
    with it, past the group's rebalance timeout); the stop goes on, in view."""
    producer = _OneCallAtATime()
    txns = TypeTransactions(lambda _tid: producer, "t.timers", "g")  # type: ignore[arg-type,return-value]
    opening = asyncio.create_task(txns.open(0))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    opening.cancel()
    await asyncio.wait_for(asyncio.gather(opening, return_exceptions=True), 1)
    assert opening.cancelled() and not producer.stopped.is_set()
    assert list(txns._unstopped.values()) == [0]  # its stop still running, waited at the end
    producer.cut()
    await asyncio.gather(*txns._unstopped, return_exceptions=True)
