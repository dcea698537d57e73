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
