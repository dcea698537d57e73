"""A partition's cycle decides for a bounded time (`DECIDE_BUDGET_S`), then stages and
commits what it decided and leaves the rest to the cycles after it, the event loop let
run between: a service's handler that is slow but finishes (a sync HTTP call) made one
cycle of 256 commands hold the loop for minutes, the node was expelled from its group
mid-cycle, its commit fenced, and the next owner did the same cycle again, for ever.

On the in-memory log, with the budget at 100 ms and handlers of 60 ms: a burst is decided
two commands a cycle, each answered once, in order, the committed offset moving cycle by
cycle; another task on the loop is never held up much longer than the budget and one
handler; a retake in the middle loses and doubles nothing; in-process timers fired at
once are decided a few a cycle, each once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter as Count
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fakes import RunningNode, wait_until
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from test_processor import P, make, record
from test_processor import command as order_command

from app.commands.batch import CommandBatch
from app.commands.processor import CommandProcessor
from app.kafka import Record
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.node import cycle_work
from app.node.cycle_work import records_decided, records_to_do
from app.node.task_id import TaskId
from app.node.task_state import TaskState
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, CommandResult, EventEnvelope, ResultCode, decode
from app.protocol.wire import encode as encode_wire
from app.service import Service
from tables import AggregateRef, CommandSpec, OnceRule, StoreError
from tables.partitioner import partition_of

PARTITIONS = 2
TOPICS = AggregateTopics("bud", "thing")
BUDGET_S = 0.1
HANDLER_S = 0.06
PER_CYCLE = 2  # 60 ms, then 120 ms: past the 100 ms budget, the cycle decides no more
SLACK_S = 0.15  # a shared machine's hiccups

CALLS: Count[str] = Count()  # handler calls, by request id


class Thing(BaseModel):
    n: int = 0


thing = AggregateType("bud", "thing", Thing)


@thing.command("Slow")
def _slow(state: Thing, cmd: Command, d: Decision) -> None:
    CALLS[cmd.request_id] += 1
    time.sleep(HANDLER_S)  # a sync HTTP call: it finishes, but holds the loop meanwhile
    d.emit("Done", {"i": cmd.body["i"]})


@thing.command("Arm")
def _arm(state: Thing, cmd: Command, d: Decision) -> None:
    for k in range(int(cmd.body["timers"])):
        d.schedule(f"k{k}", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Fire"))


@thing.command("Fire")
def _fire(state: Thing, cmd: Command, d: Decision) -> None:
    CALLS[cmd.request_id] += 1
    time.sleep(HANDLER_S)
    d.emit("Fired", {})


@thing.applies("Done")
def _done(state: Thing, e: Event) -> Thing:
    return state.model_copy(update={"n": state.n + 1})


@thing.applies("Fired")
def _fired(state: Thing, e: Event) -> Thing:
    return state


@thing.applies("Grown")
def _grown(state: Thing, e: Event) -> Thing:
    CALLS[e.id] += 1
    time.sleep(HANDLER_S)  # an applier as slow as a handler
    return state.model_copy(update={"n": state.n + 1})


SERVICE = Service(aggregates=(thing,))


def owner_in(p: int) -> str:
    return next(f"o{i}" for i in range(1_000) if partition_of(f"o{i}", PARTITIONS) == p)


OWNER = owner_in(0)


def command(type_: str, **body: Any) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type=type_,
        aggregate=AggregateRef(context="bud", aggregate="thing", id=OWNER),
        body=body,
        issued_at=int(time.time() * 1000),
    )


async def send_all(log: MemoryLog, commands: Sequence[CommandEnvelope]) -> None:
    """Sent one after the other, the loop not let run between: one burst for the node."""
    publisher = log.publisher()
    for cmd in commands:
        await publisher.send(TOPICS.commands, OWNER.encode(), encode_wire(cmd), 0)


def events(log: MemoryLog, type_: str) -> list[EventEnvelope]:
    found = (decode(EventEnvelope, r.value) for r in log.records(TOPICS.events, 0))
    return [e for e in found if e.type == type_]


def results(log: MemoryLog) -> list[CommandResult]:
    topic = ContextTopics("bud").results
    return [
        decode(CommandResult, r.value) for p in range(PARTITIONS) for r in log.records(topic, p)
    ]


class Watch:
    """On the node's loop: the longest gap between two ticks of a task sleeping 5 ms (a
    heartbeat, another partition's round), and each committed offset of the commands (or
    `topic`) of partition 0 seen, in order."""

    def __init__(self, log: MemoryLog, topic: str = TOPICS.commands) -> None:
        self.log, self.topic = log, topic
        self.longest = 0.0
        self.committed: list[int] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            self.longest, last = max(self.longest, now - last), now
            at = self.log.committed("g", self.topic, 0)
            if at is not None and (not self.committed or self.committed[-1] != at):
                self.committed.append(at)

    def stop(self) -> None:
        self.task.cancel()


@pytest.fixture
async def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RunningNode]:
    monkeypatch.setattr(cycle_work, "DECIDE_BUDGET_S", BUDGET_S)
    CALLS.clear()
    n = await RunningNode(MemoryLog(), tmp_path, "a", SERVICE, PARTITIONS).start()
    await wait_until(n.runs)
    yield n
    await n.stop()


def log_of(node: RunningNode) -> MemoryLog:
    log = node.node.clients
    assert isinstance(log, MemoryLog)
    return log


def assert_each_once_in_order(log: MemoryLog, burst: list[CommandEnvelope]) -> None:
    answered = [r.request_id for r in results(log)]
    assert sorted(answered) == sorted(c.request_id for c in burst), "a result lost or doubled"
    assert all(r.code is ResultCode.COMMITTED for r in results(log))
    done = events(log, "Done")
    assert [e.body["i"] for e in done] == list(range(len(burst)))
    assert [e.version for e in done] == list(range(1, len(burst) + 1))


async def test_a_slow_burst_is_decided_a_budget_a_cycle_each_once_in_order(
    node: RunningNode,
) -> None:
    log, n = log_of(node), 12
    burst = [command("Slow", i=i) for i in range(n)]
    watch = Watch(log)
    try:
        await send_all(log, burst)
        await wait_until(lambda: len(results(log)) == n, within=20)
        await wait_until(lambda: log.committed("g", TOPICS.commands, 0) == n)
    finally:
        watch.stop()
    assert_each_once_in_order(log, burst)
    assert all(CALLS[c.request_id] == 1 for c in burst), CALLS
    # Committed cycle by cycle, each cycle's decisions once it staged (one cycle of all
    # 12 before: its offset went from nothing to 12 at once).
    steps = [b - a for a, b in zip([0, *watch.committed], watch.committed, strict=False)]
    assert watch.committed == sorted(watch.committed) and watch.committed[-1] == n
    assert len(steps) >= n // PER_CYCLE // 2, watch.committed
    assert max(steps) <= 2 * PER_CYCLE, watch.committed


async def test_another_task_on_the_loop_waits_a_budget_and_one_handler_at_most(
    node: RunningNode,
) -> None:
    log, n = log_of(node), 16
    burst = [command("Slow", i=i) for i in range(n)]
    watch = Watch(log)
    try:
        await send_all(log, burst)
        await wait_until(lambda: len(results(log)) == n, within=20)
    finally:
        watch.stop()
    assert_each_once_in_order(log, burst)
    # Before: 16 handlers of 60 ms in one cycle, the loop held for 0.96 s.
    assert watch.longest < BUDGET_S + HANDLER_S + SLACK_S, watch.longest


async def test_a_retake_in_the_middle_of_a_burst_loses_and_doubles_nothing(
    node: RunningNode,
) -> None:
    log, n = log_of(node), 14
    burst = [command("Slow", i=i) for i in range(n)]
    await send_all(log, burst)
    # Some answered, the rest still in the worker's hands (or staged): its take fails.
    await wait_until(lambda: 0 < len(results(log)) < n - 2 * PER_CYCLE)
    task = node.node.tasks.running[TaskId(TOPICS.type_name, 0)]
    task.failed("a cycle", StoreError("the disk is gone"))
    await wait_until(lambda: task.state is TaskState.RUNNING and task.takes == 2, within=20)
    await wait_until(lambda: log.committed("g", TOPICS.commands, 0) == n, within=20)
    await wait_until(lambda: len(results(log)) >= n, within=5, what=lambda: f"{results(log)}")
    # Read again from the committed offset: those decided but not committed are decided
    # again (their first decision thrown away with the take), none answered twice.
    assert_each_once_in_order(log, burst)


async def test_in_process_timers_fired_at_once_are_decided_a_budget_a_cycle_each_once(
    node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, timers = log_of(node), 8
    fired_per_cycle: list[int] = []
    decide_local = CommandProcessor.decide_local

    def spied(
        self: CommandProcessor, batch: CommandBatch, commands: Sequence[CommandEnvelope]
    ) -> list[tuple[CommandEnvelope, ResultCode, str]]:
        decided = decide_local(self, batch, commands)
        fired_per_cycle.append(len(decided))
        return decided

    monkeypatch.setattr(CommandProcessor, "decide_local", spied)
    # Due together, after the command that sets them committed: claimed in one round.
    await send_all(log, [command("Arm", timers=timers, at=int(time.time() * 1000) + 500)])
    await wait_until(lambda: len(results(log)) == 1)
    watch = Watch(log)
    try:
        await wait_until(lambda: len(events(log, "Fired")) >= timers, within=20)
        await asyncio.sleep(0.3)  # none fired twice meanwhile
    finally:
        watch.stop()
    fired = events(log, "Fired")
    assert len(fired) == timers and sorted(CALLS.values()) == [1] * timers, CALLS
    assert sum(fired_per_cycle) == timers and max(fired_per_cycle) <= PER_CYCLE, fired_per_cycle
    assert watch.longest < BUDGET_S + HANDLER_S + SLACK_S, watch.longest


async def test_another_writers_events_with_slow_appliers_are_followed_a_budget_a_cycle(
    node: RunningNode,
) -> None:
    """The appliers of another writer's events, which the node follows, are the service's
    code too: a log batch of them was followed whole in one cycle, the loop held for the
    batch's appliers (0.96 s here). Now cut as commands are; each folded once, in order."""
    log, n = log_of(node), 16
    grown = [
        EventEnvelope(
            id=uuid.uuid4().hex,
            type="Grown",
            aggregate=AggregateRef(context="bud", aggregate="thing", id=OWNER),
            version=v,
            created_at=int(time.time() * 1000),
        )
        for v in range(1, n + 1)
    ]
    watch = Watch(log, TOPICS.events)
    try:
        publisher = log.publisher()
        for e in grown:
            await publisher.send(TOPICS.events, OWNER.encode(), encode_wire(e), 0)
        await wait_until(lambda: log.committed("g", TOPICS.events, 0) == n, within=20)
    finally:
        watch.stop()
    assert [CALLS[e.id] for e in grown] == [1] * n, CALLS
    assert watch.longest < BUDGET_S + HANDLER_S + SLACK_S, watch.longest
    assert len(watch.committed) >= n // PER_CYCLE // 2, watch.committed
    # Folded whole: the next decision is on the aggregate at version n.
    await send_all(log, [command("Slow", i=0)])
    await wait_until(lambda: len(events(log, "Done")) == 1)
    assert events(log, "Done")[0].version == n + 1


def batch(topic: str, offsets: range) -> tuple[str, list[Record]]:
    return (topic, [Record(topic, 0, o, None, None, 0) for o in offsets])


batches = st.lists(
    st.tuples(st.sampled_from(["a.events", "a.commands"]), st.integers(1, 30)), max_size=6
)


@given(batches, st.integers(0, 200))
def test_a_cycle_cut_by_its_budget_leaves_the_rest_in_order_none_twice(
    sizes: list[tuple[str, int]], unreached: int
) -> None:
    """What a cycle decided (`records_decided`) and what is left to do after it
    (`records_to_do`, from the offsets it marked done) are its records, in order, each
    in one of them."""
    items = [batch(topic, range(100 * i, 100 * i + n)) for i, (topic, n) in enumerate(sizes)]
    total = sum(n for _, n in sizes)
    unreached = min(unreached, total)
    decided = records_decided(items, unreached)
    done = {topic: records[-1].offset for topic, records in decided}
    rest = records_to_do(items, done)
    flat = [(topic, r.offset) for topic, records in items for r in records]
    assert [(t, r.offset) for t, rs in decided + rest for r in rs] == flat
    assert sum(len(rs) for _, rs in rest) == unreached
    assert all(rs for _, rs in decided + rest), "an empty batch"


def test_a_batch_read_again_behind_its_first_read_is_done_once() -> None:
    # After a lost membership the consumer reads again from the committed offset: the
    # second read of records queued behind the first holds them again.
    first, again = batch("a.commands", range(10, 20)), batch("a.commands", range(5, 25))
    rest = records_to_do([first, again], {"a.commands": 9})
    assert [r.offset for _, rs in rest for r in rs] == list(range(10, 25))


def test_past_its_deadline_a_batch_decides_its_first_command_alone() -> None:
    """At least one a call (progress, whatever the handler takes); the offset committed
    passes the command decided alone, and the count is of those decided."""
    processor, _, _ = make()
    records = [record(order_command(f"r-{i}"), offset=10 + i) for i in range(3)]
    spent = processor.begin()
    spent.deadline = time.monotonic() - 1.0
    assert processor.decide_records(spent, records) == 1
    assert spent.offsets == {("shop.order.commands", P): 11} and spent.stats.commands == 1
    rest = processor.begin()  # no deadline: every one
    assert processor.decide_records(rest, records[1:]) == 2
    assert rest.offsets == {("shop.order.commands", P): 13}
    timers = processor.begin()
    timers.deadline = time.monotonic() - 1.0
    fired = processor.decide_local(timers, [order_command(f"t-{i}#0") for i in range(3)])
    assert [cmd.request_id for cmd, _, _ in fired] == ["t-0#0"] and timers.stats.commands == 1
