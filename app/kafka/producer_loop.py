"""A partition's transactional producer whose client runs on an event loop of its own
(`OwnLoopProducer`), the loop of a thread that does nothing else (`kafka_loop`): what
`KafkaClients(producer_thread=True)` makes (`TICKWHEEL_PRODUCER_THREAD`; off by default,
as the trade-off below costs a saturated steady load more than it gains).

aiokafka takes a commit through ~24 turns of the event loop its client was made on (the
tasks and futures of AddPartitionsToTxn, Produce, the flush before EndTxn, EndTxn). On a
node's loop each of those turns waits behind all else that is ready there (the
partitions' cycles and rounds): in a burst of 10,000 timers the first commits spent ~60
of their ~170 ms between their requests, and their answers waited as long to be read
(`bench.timers_bench --trace`, 2026-12-03). On a loop of its own a turn waits only for
the GIL (a switch interval, 5 ms, at most).

Nothing of the transaction changes: it is the same `TransactionalProducer`, made on that
loop at the start, and each call is handed over to it and waited for, one at a time as
the callers make them. A caller that gives up (cancelled: a deadline, a partition's close)
has the producer's call cancelled and waits for it to end (its abort), as when it ran on
the caller's loop: a commit never ends for its caller while its producer is mid-way.

What it costs: the loop's thread takes the GIL whenever a commit wants it, so at a steady
load that saturates the machine the node's firing waits behind commit work it would
otherwise have run first (5,000 timers/s on two cores: lateness p50 and p99 ~1.5-2x
worse, docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from app.errors import KafkaUnavailable
from app.kafka.connection import Connectable
from app.kafka.producers import TRANSACTION_BATCH_BYTES
from app.kafka.records import OutRecord
from app.kafka.transactional_producer import TransactionalProducer

__all__ = ["OwnLoopProducer", "kafka_loop", "on_loop"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

_LOCK = threading.Lock()
_LOOP: list[tuple[asyncio.AbstractEventLoop, threading.Thread]] = []

CANCEL_WAIT_S = 10.0
"""How long a cancelled caller waits for its producer's call to end (its abort: 5 s at
most) before its cancellation goes on anyway, loudly: a loop that no longer runs (its
thread ended) never answers, and a caller must not wait for ever."""


SWITCH_INTERVAL_S = 0.001
"""The process's GIL switch interval once the loop runs (Python's default is 5 ms): a turn
of the loop that waits for the GIL while the node's loop computes waits this long at most,
and a commit takes ~24 of them."""


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    try:
        loop.run_forever()
    finally:  # only if something escaped the loop (a SystemExit raised in a callback)
        logger.error("the producers' event loop ended; producers made later run on a new one")


def kafka_loop() -> asyncio.AbstractEventLoop:
    """The process's loop for its producers' clients, in a daemon thread started at the
    first call (one for all: each client's work is a few requests at a time); a new one if
    that thread ended (its producers' callers give up at their deadlines, `on_loop`, and
    their partitions are taken afresh, with producers made here)."""
    with _LOCK:
        if not _LOOP or _LOOP[0][0].is_closed() or not _LOOP[0][1].is_alive():
            if _LOOP and not _LOOP[0][0].is_running():
                _LOOP[0][0].close()  # its thread ended: what it held is dropped
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=_serve, args=(loop,), name="tickwheel-kafka", daemon=True
            )
            thread.start()
            _LOOP[:] = [(loop, thread)]
        return _LOOP[0][0]


def _copy(source: asyncio.Future[T], done: asyncio.Future[T]) -> None:
    """`source`'s outcome (another loop's future, done) onto `done` (the caller's)."""
    if done.done():
        return
    if source.cancelled():
        done.cancel()
    elif (exc := source.exception()) is not None:
        done.set_exception(exc)
    else:
        done.set_result(source.result())


async def on_loop(loop: asyncio.AbstractEventLoop, call: Callable[[], Awaitable[T]]) -> T:
    """Runs `call()` as a task of `loop` (another thread's) and returns what it returned,
    or raises what it raised. Cancelled, the task is cancelled and waited for to its end
    (`CANCEL_WAIT_S` at most) before the cancellation goes on: what it does on its way out
    (an abort) is not cut off from its caller. A second cancel meanwhile ends the wait."""
    here = asyncio.get_running_loop()
    done: asyncio.Future[T] = here.create_future()
    tasks: list[asyncio.Task[T]] = []

    def report(task: asyncio.Task[T]) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop closed: nobody waits
            here.call_soon_threadsafe(_copy, task, done)

    def begin() -> None:
        async def run() -> T:
            return await call()

        task = loop.create_task(run())
        tasks.append(task)
        task.add_done_callback(report)

    loop.call_soon_threadsafe(begin)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        # `begin` ran before this (the loop runs its callbacks in order).
        with contextlib.suppress(RuntimeError):  # its loop closed: nothing runs there
            loop.call_soon_threadsafe(lambda: tasks[0].cancel())
        await asyncio.wait([done], timeout=CANCEL_WAIT_S)
        if not done.done():
            logger.error(
                "a producer's call did not end within %g s of its cancel: its loop is stuck "
                "or ended; the caller goes on",
                CANCEL_WAIT_S,
            )
        raise


class OwnLoopProducer(TransactionalProducer):
    """A `TransactionalProducer` whose client is made and runs on `loop()` (`kafka_loop`):
    the same producer, its calls handed over (see the module). `make` makes the producer
    on that loop (the default: a `TransactionalProducer` of these arguments)."""

    def __init__(  # its base's is not called: the client is made on its loop, at the start
        self,
        bootstrap: Connectable,
        transactional_id: str,
        *,
        max_batch_bytes: int = TRANSACTION_BATCH_BYTES,
        topics: Iterable[str] = (),
        loop: Callable[[], asyncio.AbstractEventLoop] = kafka_loop,
        make: Callable[[], TransactionalProducer] | None = None,
    ) -> None:
        self.transactional_id = transactional_id
        kept = tuple(topics)
        self._make = make or (
            lambda: TransactionalProducer(
                bootstrap, transactional_id, max_batch_bytes=max_batch_bytes, topics=kept
            )
        )
        self._loop_of = loop
        self._io: asyncio.AbstractEventLoop | None = None
        self._inner: TransactionalProducer | None = None
        self.broken: KafkaUnavailable | None = None

    async def _on(self, call: Callable[[TransactionalProducer], Awaitable[T]]) -> T:
        inner, io = self._inner, self._io
        if inner is None or io is None:
            raise KafkaUnavailable(f"{self.transactional_id}: not started")
        try:
            return await on_loop(io, lambda: call(inner))
        finally:
            self.broken = inner.broken  # set only during its calls

    async def start(self) -> None:
        io = self._io = self._loop_of()

        async def start() -> None:
            if self._inner is None:
                self._inner = self._make()  # on its loop: aiokafka binds it to the running one
            await self._inner.start()

        try:
            await on_loop(io, start)
        finally:
            if self._inner is not None:
                self.broken = self._inner.broken

    async def warm(self, topics: Iterable[str]) -> None:
        wanted = list(topics)
        await self._on(lambda p: p.warm(wanted))

    async def stop(self) -> None:
        """Closes the client on its loop; never raises."""
        if self._inner is None or self._io is None:
            return
        try:
            await self._on(lambda p: p.stop())
        except Exception:  # its stop never raises; a hand-over that did is logged there
            return

    async def commit(
        self,
        records: Sequence[OutRecord],
        offsets: dict[tuple[str, int], int],
        group_id: str,
    ) -> list[int]:
        taken, at = list(records), dict(offsets)
        return await self._on(lambda p: p.commit(taken, at, group_id))

    async def flush(
        self, offsets: dict[tuple[str, int], int] | None = None, group_id: str = ""
    ) -> bool:
        at = None if offsets is None else dict(offsets)
        return await self._on(lambda p: p.flush(at, group_id))

    @property
    def pending(self) -> bool:
        return self._inner is not None and self._inner.pending

    async def _append(self, records: Sequence[OutRecord]) -> list[tuple[asyncio.Future[Any], int]]:
        """Its producer's `_append` (a test's open transaction), each batch's future one of
        the caller's loop."""
        taken = list(records)
        placed = await self._on(lambda p: p._append(taken))
        here, io = asyncio.get_running_loop(), self._io
        assert io is not None
        mirrors: dict[int, asyncio.Future[Any]] = {}

        def mirror(sent: asyncio.Future[Any]) -> asyncio.Future[Any]:
            if (got := mirrors.get(id(sent))) is None:
                got = mirrors[id(sent)] = here.create_future()

                def report(f: asyncio.Future[Any], got: asyncio.Future[Any] = got) -> None:
                    with contextlib.suppress(RuntimeError):
                        here.call_soon_threadsafe(_copy, f, got)

                io.call_soon_threadsafe(sent.add_done_callback, report)
            return got

        return [(mirror(sent), delta) for sent, delta in placed]
