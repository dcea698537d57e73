"""The firer's Kafka side on the in-memory log: a timer's command goes to its target's
command topic, the target's owner decides it in a transaction whose result lands on the
results partition of the timer, and the `ResultsReader` hands it to the waiting send."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import orjson
import pytest
from pydantic import BaseModel

from app.commands.processor import CommandProcessor
from app.kafka import OutRecord, TopicSpec
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.node.type_transactions import TypeTransactions as TransactionalChangelog
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, CommandResult, ResultCode, decode, encode
from app.timers.runner import SENT
from app.timers.runner.decisions import SendResult, Verdict, classify, error_of
from app.timers.sender import KafkaSender, ResultsReader, timer_command
from tables import AggregateRef, CommandSpec, OnceRule, Timer
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

T0 = 1_800_000_000_000
PARTITIONS = 4
TOPICS = AggregateTopics("shop", "order")
RESULTS = ContextTopics("shop").results
OWNER = AggregateRef(context="shop", aggregate="order", id="o-1")
TARGET = AggregateRef(context="shop", aggregate="order", id="o-2")
P = partition_of(OWNER.id, PARTITIONS)
Q = partition_of(TARGET.id, PARTITIONS)


class Order(BaseModel):
    pass


orders = AggregateType("shop", "order", Order)


@orders.command("shop.Remind")
def remind(state: Order, cmd: Command, d: Decision) -> None:
    d.emit("shop.Reminded", {})


def memory_log() -> MemoryLog:
    names = [TOPICS.commands, TOPICS.events, TOPICS.timers_changelog, RESULTS]
    other = AggregateTopics("billing", "invoice").commands
    dead = ContextTopics("shop").dead_letters
    specs = [TopicSpec(n, PARTITIONS) for n in names]
    return MemoryLog([*specs, TopicSpec(other, 2), TopicSpec(dead, 1)], now=lambda: T0)


def timer(target: AggregateRef = TARGET) -> Timer:
    return Timer(
        id="t-1",
        owner=OWNER,
        key="remind",
        version=1,
        partition=P,
        rule=OnceRule(at=T0),
        target=target,
        command=CommandSpec(type="shop.Remind"),
        slot_due_at=T0,
        due_at=T0,
    )


@pytest.fixture
async def results() -> AsyncIterator[tuple[MemoryLog, ResultsReader]]:
    log = memory_log()
    reader = ResultsReader(log.follower, "shop")
    await reader.start()
    await reader.add_partition(P)
    yield log, reader
    await reader.stop()


async def target_owner(log: MemoryLog, reading: asyncio.Event | None = None) -> None:
    """The target partition's owner: reads its commands, decides them in its transaction;
    sets `reading` once it reads its partition (from its end)."""
    changelog = TransactionalChangelog(log.transactional_writer, TOPICS.timers_changelog, "g")
    await changelog.open(Q)

    async def commit(
        records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]
    ) -> list[int]:
        return await changelog.of(Q).commit(offsets, records)

    processor = CommandProcessor(
        orders,
        Q,
        partitions=PARTITIONS,
        states=MemoryAggregateStore(),
        commit=commit,
        now=lambda: T0,
    )
    commands = log.follower(TOPICS.commands)
    await commands.add(Q)
    if reading is not None:
        reading.set()
    while True:
        records = await commands.poll(timeout_ms=1_000)
        if records:
            await processor.handle(records)


async def test_a_command_to_its_own_context_waits_for_its_result_from_the_log(
    results: tuple[MemoryLog, ResultsReader],
) -> None:
    log, reader = results
    owner = asyncio.create_task(target_owner(log))
    await asyncio.sleep(0)
    try:
        sender = KafkaSender(log.publisher(), reader, "shop", lambda: T0)
        outcome = await asyncio.wait_for(sender.send(timer()), 5)
        assert outcome.code == "COMMITTED"
        again = await asyncio.wait_for(sender.send(timer()), 5)
        assert again.code == "DUPLICATE"
    finally:
        owner.cancel()
        await asyncio.gather(owner, return_exceptions=True)
    sent = [decode(CommandEnvelope, r.value) for r in log.records(TOPICS.commands, Q)]
    assert [(c.request_id, c.reply_to, c.reply_partition) for c in sent] == [
        ("t-1#0", RESULTS, P),
        ("t-1#0", RESULTS, P),
    ]
    assert [r.partition for r in log.records(RESULTS, P)] == [P, P], "on the timer's partition"


async def test_a_command_to_another_context_is_sent_and_not_waited_for(
    results: tuple[MemoryLog, ResultsReader],
) -> None:
    log, reader = results
    invoice = AggregateRef(context="billing", aggregate="invoice", id="i-1")
    sender = KafkaSender(log.publisher(), reader, "shop", lambda: T0)
    assert (await sender.send(timer(target=invoice))).code == SENT
    topic = AggregateTopics("billing", "invoice").commands
    [record] = [r for p in range(2) for r in log.records(topic, p)]
    assert record.partition == partition_of(invoice.id, 2), "the key picks the partition"
    command = decode(CommandEnvelope, record.value)
    assert command.reply_to is None and command.reply_partition is None


async def test_only_results_committed_after_the_partition_was_added_are_read(
    results: tuple[MemoryLog, ResultsReader],
) -> None:
    log, reader = results
    waiting = reader.expect("t-1#0", TARGET)
    # A result of another partition, and an uncommitted one on ours: neither resolves it.
    writer = log.transactional_writer("x")
    await writer.start()
    result = encode(
        CommandResult(
            request_id="t-1#0", code=ResultCode.COMMITTED, aggregate=TARGET, decided_at=T0
        )
    )
    await log.publisher().send(RESULTS, b"t-1#0", result, (P + 1) % PARTITIONS)
    await writer.send([(RESULTS, P, b"t-1#0", result)])
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await writer.commit_transaction()
    assert (await asyncio.wait_for(waiting, 5)).code.value == "COMMITTED"


async def test_a_result_naming_another_aggregate_is_no_answer_to_a_send(
    results: tuple[MemoryLog, ResultsReader],
) -> None:
    """Another writer's result for the request id of a send in flight, of an aggregate the
    send did not go to, settled the send (its slot counted as done, a real failure of it
    never retried): it is passed over, and the target's answer settles it."""
    log, reader = results
    sender = KafkaSender(log.publisher(), reader, "shop", lambda: T0)
    sending = asyncio.create_task(sender.send(timer()))
    await asyncio.sleep(0.05)
    other = AggregateRef(context="elsewhere", aggregate="x", id="y")
    forged = CommandResult(
        request_id="t-1#0", code=ResultCode.REJECTED, aggregate=other, decided_at=T0, message="x"
    )
    await log.publisher().send(RESULTS, b"t-1#0", encode(forged), P)
    await asyncio.sleep(0.05)
    assert not sending.done(), "settled by a result of another aggregate"
    answer = forged.model_copy(update={"code": ResultCode.COMMITTED, "aggregate": TARGET})
    await log.publisher().send(RESULTS, b"t-1#0", encode(answer), P)
    outcome = await asyncio.wait_for(sending, 5)
    assert outcome.code == "COMMITTED"


async def test_results_naming_another_aggregate_are_logged_within_the_limit(
    results: tuple[MemoryLog, ResultsReader], caplog: pytest.LogCaptureFixture
) -> None:
    """Any writer of the results topic may repeat the request id of a send in flight (its
    timer's id is on the log) under another aggregate, as often as it likes: one line, as
    for garbage, not one a record (it would set this node's log volume)."""
    log, reader = results
    waiting = reader.expect("t-1#0", TARGET)
    other = AggregateRef(context="elsewhere", aggregate="x", id="y")
    forged = CommandResult(
        request_id="t-1#0", code=ResultCode.REJECTED, aggregate=other, decided_at=T0
    )
    for _ in range(50):
        await log.publisher().send(RESULTS, b"t-1#0", encode(forged), P)
    answer = forged.model_copy(update={"code": ResultCode.COMMITTED, "aggregate": TARGET})
    with caplog.at_level("WARNING", logger="app.timers.sender"):
        await log.publisher().send(RESULTS, b"t-1#0", encode(answer), P)
        assert (await asyncio.wait_for(waiting, 5)).code is ResultCode.COMMITTED
    lines = [r for r in caplog.records if "not an aggregate it was sent to" in r.message]
    assert len(lines) == 1


async def answer_each_command(log: MemoryLog, code: str, message: str) -> None:
    """A target of a newer writer: answers each command on its reply address with `code`."""
    commands = log.follower(TOPICS.commands)
    await commands.add(Q)
    while True:
        for r in await commands.poll(timeout_ms=1_000):
            cmd = decode(CommandEnvelope, r.value)
            answer = {
                "request_id": cmd.request_id,
                "code": code,
                "aggregate": cmd.aggregate.model_dump(),
                "message": message,
                "decided_at": T0,
            }
            assert cmd.reply_to is not None and cmd.reply_partition is not None
            await log.publisher().send(
                cmd.reply_to, cmd.request_id.encode(), orjson.dumps(answer), cmd.reply_partition
            )


async def test_a_result_code_this_version_does_not_know_fails_the_send_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A newer writer's code was an unreadable result: passed over, and every send it
    answered waited out its timeout (TIMEOUT, retried, parked as TIMEOUT). It is read as
    ERROR: the send fails at once, a failed attempt retried by the timer's policy, with the
    code in its reason; each is counted and logged (bounded)."""
    log = memory_log()
    counted: list[None] = []
    reader = ResultsReader(log.follower, "shop", on_unknown_code=lambda: counted.append(None))
    await reader.start()
    await reader.add_partition(P)
    target = asyncio.create_task(answer_each_command(log, "DEFERRED", "held for review"))
    try:
        sender = KafkaSender(log.publisher(), reader, "shop", lambda: T0)
        with caplog.at_level("WARNING", logger="app.timers.sender"):
            first = await asyncio.wait_for(sender.send(timer()), 5)
            again = await asyncio.wait_for(sender.send(timer()), 5)
    finally:
        target.cancel()
        await asyncio.gather(target, return_exceptions=True)
        await reader.stop()
    reason = "result code DEFERRED (unknown to this version, read as ERROR): held for review"
    assert first == again == SendResult("ERROR", reason)
    assert classify(first.code) is Verdict.FAILED
    assert error_of(first) == {"error_code": "ERROR", "error_text": reason}
    assert len(counted) == 2
    [line] = [r for r in caplog.records if "does not know" in r.getMessage()]
    assert "'DEFERRED'" in line.getMessage() and "t-1#0" in line.getMessage()


async def test_a_command_its_target_cannot_read_is_answered_with_why(
    results: tuple[MemoryLog, ResultsReader],
) -> None:
    """A command whose envelope reads but whose body does not (an integer past 64 bits: an
    older target, another writer) was dead-lettered with no answer: its send waited out
    its timeout at each attempt and parked as TIMEOUT. The target answers ERROR with why on
    the send's reply address, and still dead-letters it."""
    log, reader = results
    waiting = reader.expect("t-1#0", TARGET)
    command = timer_command(timer(), T0, reply_to=RESULTS, reply_partition=P)
    value = orjson.loads(encode(command)) | {"body": {"n": 0}}
    huge = orjson.dumps(value).replace(b'"n":0', b'"n":18446744073709551621')
    reading = asyncio.Event()
    owner = asyncio.create_task(target_owner(log, reading))
    try:
        await asyncio.wait_for(reading.wait(), 5)
        await log.publisher().send(TOPICS.commands, TARGET.id.encode(), huge, Q)
        result = await asyncio.wait_for(waiting, 5)
    finally:
        owner.cancel()
        await asyncio.gather(owner, return_exceptions=True)
    assert (result.code, result.aggregate) == (ResultCode.ERROR, TARGET)
    assert result.message.startswith("not a valid CommandEnvelope: body")
    [letter] = log.records(ContextTopics("shop").dead_letters, 0)
    assert letter.value == huge
