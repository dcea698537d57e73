"""A node's partition producers run their clients on a loop of their own (`OwnLoopProducer`):
each call is the same producer's, handed over and waited for; a caller that gives up waits
for the producer's call to end (its abort) before its cancellation goes on."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import cast

import pytest

from app.errors import Fenced, KafkaUnavailable
from app.kafka import KafkaClients, OutRecord, TransactionalProducer, producer_loop
from app.kafka.producer_loop import SWITCH_INTERVAL_S, OwnLoopProducer, kafka_loop


class FakeInner:
    """The producer made on the loop: records where each call ran and how it ended."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, asyncio.AbstractEventLoop]] = []
        self.broken: KafkaUnavailable | None = None
        self.pending = False
        self.fail: KafkaUnavailable | None = None
        self.hold = False  # its commit waits until cancelled
        self.entered = threading.Event()
        self.release = threading.Event()  # its abort ends once set
        self.ended: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append((name, threading.get_ident(), asyncio.get_running_loop()))

    async def start(self) -> None:
        self._call("start")

    async def stop(self) -> None:
        self._call("stop")

    async def warm(self, topics: Iterable[str]) -> None:
        self._call("warm")

    async def commit(
        self, records: Sequence[OutRecord], offsets: dict[tuple[str, int], int], group_id: str
    ) -> list[int]:
        self._call("commit")
        if self.fail is not None:
            self.broken = self.fail
            raise self.fail
        if self.hold:
            self.entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                # as `TransactionalProducer._fail`: an abort, a round trip
                await asyncio.to_thread(self.release.wait)
                self.ended.append("aborted")
                raise
        return list(range(len(records)))


def producer(inner: FakeInner) -> OwnLoopProducer:
    return OwnLoopProducer(
        "127.0.0.1:1", "g.shop.order.timers.3", make=lambda: cast(TransactionalProducer, inner)
    )


async def test_with_producer_thread_a_writer_is_a_transactional_producer_on_its_own_loop() -> None:
    clients = KafkaClients("127.0.0.1:1", producer_thread=True)
    writer = clients.transactional_writer("g.shop.order.timers.3")
    assert isinstance(writer, OwnLoopProducer)
    assert isinstance(writer, TransactionalProducer)  # its tests' steps (`_append`)
    await writer.stop()  # never started: nothing to close


async def test_by_default_a_writer_runs_on_the_callers_loop() -> None:
    writer = KafkaClients("127.0.0.1:1").transactional_writer("g.shop.order.timers.3")
    assert type(writer) is TransactionalProducer
    await writer.stop()


async def test_every_call_runs_on_the_producers_loop_not_the_callers() -> None:
    inner = FakeInner()
    p = producer(inner)
    await p.start()
    await p.warm(["shop.order.events"])
    assert await p.commit([("t", 3, b"k", b"v"), ("t", 3, b"k", b"w")], {}, "g") == [0, 1]
    await p.stop()
    here = threading.get_ident()
    assert [name for name, _, _ in inner.calls] == ["start", "warm", "commit", "stop"]
    assert {thread for _, thread, _ in inner.calls} != {here}
    assert all(thread != here for _, thread, _ in inner.calls)
    assert {loop for _, _, loop in inner.calls} == {kafka_loop()}


async def test_a_failed_commit_is_raised_to_its_caller_and_breaks_it() -> None:
    inner = FakeInner()
    p = producer(inner)
    await p.start()
    inner.fail = Fenced("g.shop.order.timers.3 was fenced by a newer owner")
    with pytest.raises(Fenced, match="fenced by a newer owner"):
        await p.commit([], {("shop.order.commands", 3): 1}, "g")
    assert p.broken is inner.fail
    await p.stop()


async def test_a_caller_that_gives_up_waits_for_the_producers_abort() -> None:
    """A commit cancelled (its deadline, a partition's close) ends for its caller only once
    the producer's own call ended, its abort done: a close then stops a producer that is
    not mid-way through a commit, as when the commit ran on the caller's loop."""
    inner = FakeInner()
    p = producer(inner)
    await p.start()
    inner.hold = True
    commit = asyncio.create_task(p.commit([("t", 3, b"k", b"v")], {}, "g"))
    await asyncio.to_thread(inner.entered.wait)  # the producer's commit is under way
    commit.cancel()
    # the abort's answer comes from elsewhere, later (its caller's loop waits meanwhile)
    threading.Timer(0.05, inner.release.set).start()
    with pytest.raises(asyncio.CancelledError):
        await commit
    assert inner.ended == ["aborted"]
    await p.stop()


async def test_a_producer_never_started_is_not_usable() -> None:
    p = producer(FakeInner())
    with pytest.raises(KafkaUnavailable, match="not started"):
        await p.commit([], {}, "g")
    assert not p.pending


def test_its_loop_waits_for_the_gil_a_millisecond_at_most() -> None:
    """Each of a commit's turns on its loop waits for the GIL while the node's loop
    computes: at Python's default 5 ms a turn, a steady 1,000 timers/s fired ~2x later at
    p99 (docs/performance.md)."""
    kafka_loop()
    assert sys.getswitchinterval() <= SWITCH_INTERVAL_S


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # its end
async def test_a_loop_whose_thread_ended_is_replaced_and_its_callers_give_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The producers' loop thread ended (a SystemExit escaped it: not closed, not running):
    a call waits only until its caller's deadline, its cancel only `CANCEL_WAIT_S`, and
    producers made later get a new loop, which runs their calls."""
    monkeypatch.setattr(producer_loop, "CANCEL_WAIT_S", 0.2)
    inner = FakeInner()
    p = producer(inner)
    await p.start()
    dead = kafka_loop()

    def end_thread() -> None:
        raise SystemExit

    dead.call_soon_threadsafe(end_thread)
    for _ in range(200):
        if not producer_loop._LOOP[0][1].is_alive():
            break
        await asyncio.sleep(0.01)
    assert not producer_loop._LOOP[0][1].is_alive() and not dead.is_closed()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):  # its deadline; its cancel waits 0.2 s, no more
            await p.commit([("t", 3, b"k", b"v")], {}, "g")
    assert kafka_loop() is not dead
    again = FakeInner()
    fresh = producer(again)
    await fresh.start()
    assert await fresh.commit([("t", 3, b"k", b"v")], {}, "g") == [0]
    assert [loop for _, _, loop in again.calls] == [kafka_loop()] * 2
    await fresh.stop()
