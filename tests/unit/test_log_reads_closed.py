"""A read (`LogReader.read`, an async generator) holds its reader until it ends or is
closed: the Kafka readers hold their lock (and their consumer's assignment) through it, and
the next read or `offsets` waits. A loop left early (a return, a break, an exception) does
not close it: the event loop's finalizer does, some turns later, once the generator is
collected, and not at all while a frame (a traceback's) still holds it. So every loop over
a read in app/ reads it in `contextlib.aclosing`, and the reader is free when it is left:
shown on the aiokafka reader (a fake consumer), on a memory log's reader that holds a lock
as those do, through callers that leave their read early, and kept by a rule over app/'s
source (librdkafka's reader: `test_rdkafka_reader_stop`)."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import Any, cast

import pytest

from app.kafka import Reader, Record, TopicSpec
from app.kafka.memory import MemoryLog
from app.node.partition_open import _written_since
from app.ops.timer_api import _result_of
from app.protocol.results import CommandResult, ResultCode
from app.protocol.wire import CommandEnvelope, encode
from app.timers.restore import restore_partition
from tables import AggregateRef, open_timer_store

T = "t"
T0 = 1_700_000_000_000
APP = Path(__file__).resolve().parents[2] / "app"


class OneReadAtATime:
    """A memory log's reader that holds a lock through each read and `offsets`, as the
    Kafka readers (`Reader`, `RdkafkaReader`) hold theirs; `busy` while it is held."""

    def __init__(self, log: MemoryLog) -> None:
        self._reader = log.reader(batch=1)
        self._lock = asyncio.Lock()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        async with self._lock:
            return await self._reader.offsets(topic, partition)

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        async with self._lock, aclosing(self._reader.read(topic, partition, start)) as batches:
            async for batch in batches:
                yield batch


async def log_of(*values: bytes, topic: str = T) -> MemoryLog:
    log = MemoryLog([TopicSpec(topic, 1)])
    await log.publisher().send_many([(topic, 0, b"k", v) for v in values])
    return log


async def turns(n: int) -> None:
    """Lets the event loop run `n` times round (no time passes)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_read_left_early_holds_its_reader_until_it_is_closed() -> None:
    reader = OneReadAtATime(await log_of(b"a", b"b", b"c"))
    # Held by a name, as a frame kept in a traceback holds it.
    batches = reader.read(T, 0, 0)
    async for _ in batches:
        break
    asking = asyncio.create_task(reader.offsets(T, 0))
    await turns(10)
    assert reader.busy and not asking.done(), "the read left early let its reader go"
    await batches.aclose()
    assert await asking == (0, 3)

    async def first() -> list[Record]:
        async for batch in reader.read(T, 0, 0):
            return batch
        raise AssertionError("no record")

    assert [r.value for r in await first()] == [b"a"]
    assert reader.busy  # until the event loop's finalizer closes the generator
    assert await reader.offsets(T, 0) == (0, 3)  # which it then waits for

    async with aclosing(reader.read(T, 0, 0)) as closing:
        async for _ in closing:
            break
    assert not reader.busy


class _Consumer:
    """aiokafka's consumer over a partition of four records, fetched two at a time."""

    def __init__(self) -> None:
        self.at = 0

    def assign(self, tps: Any) -> None:
        pass

    async def end_offsets(self, tps: Any) -> dict[Any, int]:
        return {tp: 4 for tp in tps}

    async def beginning_offsets(self, tps: Any) -> dict[Any, int]:
        return {tp: 0 for tp in tps}

    def seek(self, tp: Any, offset: int) -> None:
        self.at = offset

    async def getmany(self, tp: Any, timeout_ms: int, max_records: int) -> dict[Any, Any]:
        got = [Record(T, 0, o, b"k", b"v", T0) for o in range(self.at, min(self.at + 2, 4))]
        self.at += len(got)
        return {tp: got}

    async def position(self, tp: Any) -> int:
        return self.at


async def test_aiokafkas_reader_is_held_by_a_read_left_early_until_it_is_closed() -> None:
    reader = Reader("127.0.0.1:1")
    real = reader._consumer
    reader._consumer = cast(Any, _Consumer())
    try:
        batches = reader.read(T, 0, 0)
        async for _ in batches:
            break
        asking = asyncio.create_task(reader.offsets(T, 0))
        await turns(10)
        assert reader._lock.locked() and not asking.done(), "the read let its reader go"
        await batches.aclose()
        assert await asking == (0, 4)
        async with aclosing(reader.read(T, 0, 0)) as closing:
            async for _ in closing:
                break
        assert not reader._lock.locked()  # free at once
    finally:
        await real.stop()


async def test_a_partition_written_since_leaves_its_reader_free_when_it_knows() -> None:
    reader = OneReadAtATime(await log_of(b"a", b"b", b"c"))
    assert await _written_since(reader, T, 0, 0)
    assert not reader.busy, "the read left at its first batch still holds the reader"


async def test_a_commands_result_found_leaves_the_reader_free() -> None:
    owner = AggregateRef(context="shop", aggregate="order", id="o-1")
    cmd = CommandEnvelope(request_id="r-1", type="Cancel", aggregate=owner, issued_at=T0)

    def result(request_id: str) -> bytes:
        return encode(
            CommandResult(
                request_id=request_id, aggregate=owner, code=ResultCode.COMMITTED, decided_at=T0
            )
        )

    reader = OneReadAtATime(await log_of(result("r-0"), result("r-1"), result("r-2")))

    async def never(seconds: float) -> None:
        raise AssertionError("the result was there to read")

    found = await _result_of(reader, cmd, T, 0, 0, 0.0, never)
    assert found.request_id == "r-1"
    assert not reader.busy, "the read left at the result found still holds the reader"


async def test_a_restore_that_fails_mid_read_leaves_the_reader_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader = OneReadAtATime(await log_of(b"{}", b"{}", b"{}"))
    store = open_timer_store("memory://", partitions=1)
    await store.assign({0})

    async def failing(partition: int, records: Any) -> Any:
        raise OSError("disk full")

    monkeypatch.setattr(store, "apply_changelog", failing)
    with pytest.raises(OSError, match="disk full"):
        await restore_partition(store, reader, T, 0)
    assert not reader.busy, "the read left by the store's failure still holds the reader"


def _async_generators(trees: list[ast.Module]) -> set[str]:
    """The names of app/'s async generator functions (a `yield` in their own body; an
    `asynccontextmanager`'s, decorated, are entered, never iterated)."""

    def yields(fn: ast.AsyncFunctionDef) -> bool:
        todo: list[ast.AST] = list(fn.body)
        while todo:
            node = todo.pop()
            if isinstance(node, ast.Yield | ast.YieldFrom):
                return True
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                todo.extend(ast.iter_child_nodes(node))
        return False

    return {
        node.name
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.AsyncFunctionDef) and not node.decorator_list and yields(node)
    }


def test_no_loop_in_app_iterates_a_generator_made_in_its_own_header() -> None:
    """`async for x in reader.read(...)` (or any of app/'s async generators, which wrap
    reads and consumers): left early, nothing closes it then. Written
    `async with aclosing(reader.read(...)) as batches: async for x in batches:` instead."""
    files = sorted(APP.rglob("*.py"))
    trees = [ast.parse(f.read_text(encoding="utf-8"), str(f)) for f in files]
    generators = _async_generators(trees)
    assert {"read", "_batches", "read_to_end"} <= generators  # the rule sees what it checks
    unclosed = []
    for f, tree in zip(files, trees, strict=True):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.AsyncFor) and isinstance(node.iter, ast.Call)):
                continue
            call = node.iter.func
            name = call.attr if isinstance(call, ast.Attribute) else getattr(call, "id", None)
            if name in generators:
                unclosed.append(f"{f.relative_to(APP.parent)}:{node.lineno} {name}(...)")
    assert unclosed == [], "read in `contextlib.aclosing`:\n" + "\n".join(unclosed)
