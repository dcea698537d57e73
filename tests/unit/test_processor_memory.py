"""The command path on the in-memory log: commands read from the topic are decided into a
real transaction of the partition (events, results and the commands' offset together),
read back by a reader; the aggregate states are folded from the log by a restore; a
fenced commit writes neither the log nor the states."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import pytest
from pydantic import BaseModel

from app.commands.processor import CommandProcessor, Commit, state_key
from app.errors import Fenced
from app.kafka import OutRecord, Record, TopicSpec
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.node.type_transactions import TypeTransactions as TransactionalChangelog
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, CommandResult, EventEnvelope, decode, encode
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

T0 = 1_800_000_000_000
PARTITIONS = 4
GROUP = "g"
ORDER = AggregateRef(context="shop", aggregate="order", id="o-1")
P = partition_of(ORDER.id, PARTITIONS)
TOPICS = AggregateTopics("shop", "order")
RESULTS = ContextTopics("shop").results


class Order(BaseModel):
    reminded: int = 0


orders = AggregateType("shop", "order", Order)


@orders.command("shop.Remind")
def remind(state: Order, cmd: Command, d: Decision) -> None:
    d.emit("shop.Reminded", {"n": state.reminded + 1})


def memory_log() -> MemoryLog:
    names = [TOPICS.commands, TOPICS.events, TOPICS.timers_changelog, RESULTS]
    dead = ContextTopics("shop").dead_letters
    return MemoryLog(
        [*(TopicSpec(n, PARTITIONS) for n in names), TopicSpec(dead, 1)], now=lambda: T0
    )


def committer(changelog: TransactionalChangelog, p: int) -> Commit:
    """The node's wiring: the command path commits in the partition's one transaction."""

    async def commit(
        records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]
    ) -> list[int]:
        return await changelog.of(p).commit(offsets, records)

    return commit


def processor_on(states: MemoryAggregateStore, commit: Commit) -> CommandProcessor:
    return CommandProcessor(
        orders, P, partitions=PARTITIONS, states=states, commit=commit, now=lambda: T0
    )


async def never(records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]) -> list[int]:
    raise AssertionError("a restore commits nothing")


async def owner(
    log: MemoryLog, states: MemoryAggregateStore | None = None
) -> tuple[CommandProcessor, TransactionalChangelog, MemoryAggregateStore]:
    """A node taking partition P: its transaction opened (fencing), its states restored."""
    changelog = TransactionalChangelog(log.transactional_writer, TOPICS.timers_changelog, GROUP)
    await changelog.open(P)
    states = states or MemoryAggregateStore()
    processor = processor_on(states, committer(changelog, P))
    await processor.restore(log.reader())
    return processor, changelog, states


def command(n: int) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=f"r-{n}", type="shop.Remind", aggregate=ORDER, not_before=None, issued_at=T0
    )


async def send_commands(log: MemoryLog, *ns: int) -> list[Record]:
    """Commands sent by a client (keyed, the default partitioner), read back from the topic."""
    publisher = log.publisher()
    await publisher.send_many(
        [(TOPICS.commands, None, ORDER.id.encode(), encode(command(n))) for n in ns]
    )
    return log.records(TOPICS.commands, P)


def results(log: MemoryLog) -> list[CommandResult]:
    """The results committed, in every partition of the results topic."""
    return [
        decode(CommandResult, r.value) for p in range(PARTITIONS) for r in log.records(RESULTS, p)
    ]


def reminded(states: MemoryAggregateStore) -> int:
    """The order's version in the states: how many reminders were folded into it."""
    raw = states.get(P, state_key(ORDER))
    assert raw is not None
    return int(orjson.loads(raw)["version"])


async def test_commands_are_decided_into_one_transaction_read_back_from_the_log() -> None:
    log = memory_log()
    processor, _, states = await owner(log)
    records = await send_commands(log, 1, 2)
    assert [r.partition for r in records] == [P, P]
    stats = await processor.handle(records)
    assert stats.committed == 2 and stats.events == 2
    events = [decode(EventEnvelope, r.value) for r in log.records(TOPICS.events, P)]
    assert [(e.request_id, e.version) for e in events] == [("r-1", 1), ("r-2", 2)]
    assert sorted((r.request_id, r.code.value) for r in results(log)) == [
        ("r-1", "COMMITTED"),
        ("r-2", "COMMITTED"),
    ]
    assert log.committed(GROUP, TOPICS.commands, P) == 2, "the commands' offset, committed"
    assert reminded(states) == 2
    assert states.offset(P) == 1, "the last event's offset: where a restore goes on from"


async def test_a_command_read_again_after_its_commit_is_a_duplicate() -> None:
    log = memory_log()
    processor, _, _ = await owner(log)
    records = await send_commands(log, 1)
    await processor.handle(records)
    await processor.handle(records)  # read again (a rebalance before the offset moved on)
    assert len(log.records(TOPICS.events, P)) == 1
    codes = [
        decode(CommandResult, r.value).code.value
        for p in range(PARTITIONS)
        for r in log.records(RESULTS, p)
    ]
    assert sorted(codes) == ["COMMITTED", "DUPLICATE"]


async def test_a_new_owner_restores_the_states_folded_from_the_log() -> None:
    log = memory_log()
    processor, _, _ = await owner(log)
    await processor.handle(await send_commands(log, 1, 2, 3))
    _, _, states = await owner(log)  # another node takes P over: an empty local copy
    assert reminded(states) == 3
    assert states.seen(P, state_key(ORDER), "r-2")
    assert states.offset(P) == 2


async def test_a_restore_goes_on_after_a_clean_copys_offset() -> None:
    log = memory_log()
    processor, _, _ = await owner(log)
    await processor.handle(await send_commands(log, 1))
    copy = MemoryAggregateStore()
    assert await processor_on(copy, never).restore(log.reader()) == 1
    await processor.handle(await send_commands(log, 2))
    # After the copy's offset (0): the marker, the second event, its marker.
    seen: list[tuple[int, int]] = []
    restore = processor_on(copy, never).restore(log.reader(), lambda *got: seen.append(got))
    assert await restore == 1
    assert seen == [(0, 3), (2, 3), (3, 3)]
    assert reminded(copy) == 2 and copy.offset(P) == 2


async def test_a_local_copy_ahead_of_the_log_is_dropped_and_folded_again() -> None:
    log = memory_log()
    processor, _, states = await owner(log)
    await processor.handle(await send_commands(log, 1))
    stray = MemoryAggregateStore()
    stray.write(
        P,
        {state_key(ORDER): states.get(P, state_key(ORDER)) or b""},
        [(state_key(ORDER), "r-9")],
        40,
    )
    await owner(log, stray)
    assert stray.offset(P) == 0
    assert not stray.seen(P, state_key(ORDER), "r-9"), "the copy's request ids went with it"
    assert reminded(stray) == 1


async def test_a_fenced_owners_decisions_reach_neither_the_log_nor_its_states() -> None:
    log = memory_log()
    old, old_changelog, old_states = await owner(log)
    await old.handle(await send_commands(log, 1))
    new, _, new_states = await owner(log)  # fences the old owner
    records = await send_commands(log, 2)
    with pytest.raises(Fenced):
        await old.handle(records)
    assert isinstance(old_changelog.of(P).broken, Fenced)
    assert reminded(old_states) == 1, "the states are written only after a commit"
    assert len(log.records(TOPICS.events, P)) == 1
    assert log.committed(GROUP, TOPICS.commands, P) == 1
    await new.handle(records)
    assert reminded(new_states) == 2
    assert [decode(EventEnvelope, r.value).request_id for r in log.records(TOPICS.events, P)] == [
        "r-1",
        "r-2",
    ]


async def test_a_restore_folds_an_event_an_earlier_version_took() -> None:
    """An event whose version a strict read refuses (`"2"`, written by another producer
    before this version read strictly) was folded by the nodes of then: a restore folds it
    as they did, or the state folded again would not be the state they decided on."""
    log = memory_log()
    processor, _, _ = await owner(log)
    await processor.handle(await send_commands(log, 1))
    lax = orjson.loads(log.records(TOPICS.events, P)[0].value or b"")
    lax.update(id="e-lax", version="2", request_id="r-lax")
    await log.publisher().send(TOPICS.events, ORDER.id.encode(), orjson.dumps(lax), P)
    _, _, states = await owner(log)  # a new owner: its states folded from the log
    assert reminded(states) == 2
