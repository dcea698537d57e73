"""A partition's results let go as its last type's task closes (`let_results_go`), while a
type's task of the same partition opens again on this node (a task waits only for the close
of its own type's task of p): every context's results reader must go on reading p, or the
remote sends of the new task's timers are never answered (each times out, then parks)."""

from __future__ import annotations

import asyncio

from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.node.partition_release import let_results_go
from app.protocol.topics import ContextTopics
from app.protocol.wire import CommandResult, ResultCode, encode
from app.timers.sender import ResultsReader
from tables import AggregateRef

T0 = 1_800_000_000_000
PARTITIONS = 2
P = 1


class SlowRemove(ResultsReader):
    """A reader whose remove takes effect at once and returns only once `gate` opens, as
    `PartitionReader.remove` drops p from what it wants at its call, then waits for its
    lock and the read positions."""

    def __init__(self, log: MemoryLog, context: str) -> None:
        super().__init__(log.follower, context)
        self.removing = asyncio.Event()
        self.gate = asyncio.Event()

    async def remove_partition(self, partition: int) -> None:
        await super().remove_partition(partition)
        self.removing.set()
        await self.gate.wait()


async def answered(
    log: MemoryLog, reader: ResultsReader, context: str, *, partition: int = P
) -> ResultCode:
    """A send's answer on `partition`'s results, as `reader` reads it (TimeoutError if it
    does not); answers to "t-2#0" written there first, on p."""
    target = AggregateRef(context=context, aggregate="order", id="o-1")
    waiting = reader.expect("t-1#0", target)
    topic = ContextTopics(context).results
    for request_id, p in (("t-2#0", P), ("t-1#0", partition)):
        result = CommandResult(
            request_id=request_id, code=ResultCode.COMMITTED, aggregate=target, decided_at=T0
        )
        await log.publisher().send(topic, request_id.encode(), encode(result), p)
    return (await asyncio.wait_for(waiting, 2)).code


async def test_a_task_of_p_opening_between_two_readers_removes_keeps_both_reading_p() -> None:
    log = MemoryLog([TopicSpec(ContextTopics(c).results, PARTITIONS) for c in ("a", "b")])
    first, second = SlowRemove(log, "a"), ResultsReader(log.follower, "b")
    for reader in (first, second):
        await reader.start()
        await reader.add_partition(P)
    reading = {P: {"a.order"}}
    loop = asyncio.get_running_loop()
    try:
        release = asyncio.create_task(
            let_results_go(reading, {"a": first, "b": second}, P, "a.order", loop.time() + 30)
        )
        await first.removing.wait()
        # Another type's task of p opens meanwhile (`partition_open`): p read on by both.
        reading.setdefault(P, set()).add("b.order")
        await first.add_partition(P)
        await second.add_partition(P)
        first.gate.set()
        await release
        assert reading == {P: {"b.order"}}
        assert await answered(log, first, "a") is ResultCode.COMMITTED
        assert await answered(log, second, "b") is ResultCode.COMMITTED, "p let go"
    finally:
        first.gate.set()
        for reader in (first, second):
            await reader.stop()


async def test_the_last_task_of_p_closing_lets_every_reader_go_of_p() -> None:
    log = MemoryLog([TopicSpec(ContextTopics(c).results, PARTITIONS) for c in ("a", "b")])
    readers = {c: ResultsReader(log.follower, c) for c in ("a", "b")}
    for reader in readers.values():
        await reader.start()
        await reader.add_partition(P)
    reading = {P: {"a.order", "b.order"}}
    loop = asyncio.get_running_loop()
    try:
        await let_results_go(reading, readers, P, "a.order", loop.time() + 30)
        assert reading == {P: {"b.order"}}
        assert await answered(log, readers["a"], "a") is ResultCode.COMMITTED, "still read"
        await let_results_go(reading, readers, P, "b.order", loop.time() + 30)
        assert reading == {}
        for c, reader in readers.items():
            await reader.add_partition(0)  # read after p: its answer read, p's is not
            let_go = reader.expect("t-2#0", AggregateRef(context=c, aggregate="order", id="o-1"))
            assert await answered(log, reader, c, partition=0) is ResultCode.COMMITTED
            assert not let_go.done(), f"{c}: p still read"
    finally:
        for reader in readers.values():
            await reader.stop()
