"""The command path of one partition without a broker: commands read from the topic and
timers fired in-process are decided by the same code into one transaction's records."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

import orjson
import pytest
from fakes import T0, order_type

from app.commands.processor import CommandProcessor, misrouted, state_key
from app.kafka import OutRecord, Record
from app.kafka.records import Headers, headers_of
from app.protocol.dead_letters import DeadLetterContext, Stage
from app.protocol.wire import (
    IN_PROCESS_HEADER,
    IN_PROCESS_HEADERS,
    CommandEnvelope,
    EventEnvelope,
    ResultCode,
    encode,
)
from tables import AggregateRef, StoreError
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

ORDER = AggregateRef(context="shop", aggregate="order", id="o-1")
P = partition_of(ORDER.id, 4)  # the order's partition, where its records belong


orders = order_type()


class FakeTransaction:
    """The partition's one transaction: keeps each commit's records and offsets."""

    def __init__(self) -> None:
        self.commits: list[tuple[list[OutRecord], dict[tuple[str, int], int]]] = []
        self._next = 0

    async def __call__(
        self, records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]
    ) -> list[int]:
        self.commits.append((list(records), dict(offsets)))
        start, self._next = self._next, self._next + len(records)
        return list(range(start, self._next))

    def topics(self, commit: int = -1) -> list[str]:
        return [r[0] for r in self.commits[commit][0]]


def make(now: int = T0) -> tuple[CommandProcessor, FakeTransaction, MemoryAggregateStore]:
    txn = FakeTransaction()
    states = MemoryAggregateStore()
    processor = CommandProcessor(
        orders, P, partitions=4, states=states, commit=txn, now=lambda: now
    )
    return processor, txn, states


def command(request_id: str = "t-1#0", **fields: Any) -> CommandEnvelope:
    fields.setdefault("type", "shop.Remind")
    return CommandEnvelope(
        request_id=request_id,
        aggregate=ORDER,
        not_before=T0,
        issued_at=T0,
        **fields,
    )


def record(cmd: CommandEnvelope, offset: int = 0, headers: Headers = ()) -> Record:
    return Record("shop.order.commands", P, offset, ORDER.id.encode(), encode(cmd), T0, headers)


async def test_a_timer_fired_in_process_commits_its_events_and_the_command_sent() -> None:
    processor, txn, states = make()
    batch = processor.begin()
    decided = processor.decide_local(batch, [command(in_process=True)])
    assert [(c.request_id, code) for c, code, _ in decided] == [("t-1#0", ResultCode.COMMITTED)]
    processor.committed(batch, await txn(batch.out, batch.offsets))
    # Its event, and the command itself as the record of what was sent: no result record.
    assert txn.topics() == ["shop.order.events", "shop.order.commands"]
    sent = orjson.loads(txn.commits[0][0][1][3] or b"")
    assert sent["in_process"] is True and sent["request_id"] == "t-1#0"
    assert headers_of(txn.commits[0][0][1]) == IN_PROCESS_HEADERS, "a node's own record"
    assert states.seen(P, state_key(ORDER), "t-1#0")
    assert states.offset(P) == 0, "the last event's offset: the fold's position in the log"


async def test_a_timer_fired_again_in_process_is_a_duplicate_with_no_event() -> None:
    processor, _, _ = make()
    await processor.handle([], local=[command(in_process=True)])
    batch = processor.begin()
    decided = processor.decide_local(batch, [command(in_process=True)])
    assert [code for _, code, _ in decided] == [ResultCode.DUPLICATE]
    assert [r[0] for r in batch.out] == ["shop.order.commands"]


async def test_the_command_read_back_from_the_topic_is_passed_over() -> None:
    processor, txn, _ = make()
    await processor.handle([], local=[command(in_process=True)])
    own = record(command(in_process=True), offset=7, headers=IN_PROCESS_HEADERS)
    stats = await processor.handle([own])
    assert txn.topics() == [], "no result, no event: it was decided in its own transaction"
    assert txn.commits[-1][1] == {("shop.order.commands", P): 8}, "its offset passes it"
    assert stats.codes == {}


async def test_an_in_process_command_is_never_decided_again_whatever_its_outcome() -> None:
    """Its decision (even a rejection, which applies nothing) committed in the transaction
    that wrote it: read back with the node's header, it is passed over, so a final outcome
    stays final."""
    processor, txn, _ = make()
    await processor.handle([record(command(in_process=True), headers=IN_PROCESS_HEADERS)])
    assert txn.topics() == []


async def test_an_in_process_command_another_producer_wrote_is_answered_and_dead_lettered() -> None:
    """`in_process: true` without the node's header, its request id not applied: not a
    node's record of what it decided. Passed over, it would vanish without an answer; it is
    answered ERROR and dead-lettered with why, and nothing is decided."""
    processor, txn, states = make()
    stats = await processor.handle([record(command(in_process=True), offset=3)])
    assert txn.topics() == ["shop.results", "shop.dead-letters"]
    result = orjson.loads(txn.commits[-1][0][0][3] or b"")
    assert result["code"] == "ERROR" and result["request_id"] == "t-1#0"
    assert IN_PROCESS_HEADER in result["message"]
    letter = txn.commits[-1][0][1]
    reason = dict(headers_of(letter))["__tickwheel.errors.exception.message"] or b""
    assert IN_PROCESS_HEADER.encode() in reason
    assert stats.codes == {ResultCode.ERROR: 1}
    assert not states.seen(P, state_key(ORDER), "t-1#0"), "not decided"
    assert txn.commits[-1][1] == {("shop.order.commands", P): 4}, "and read past"


async def test_an_in_process_record_without_the_header_but_applied_is_a_duplicate() -> None:
    """Written before the header existed and read back after an upgrade, or a request
    applied and sent again with `in_process: true`: decided as any command, it is answered
    DUPLICATE, nothing applied twice, no dead letter."""
    processor, txn, _ = make()
    await processor.handle([], local=[command(in_process=True)])
    stats = await processor.handle([record(command(in_process=True), offset=7)])
    assert txn.topics() == ["shop.results"]
    result = orjson.loads(txn.commits[-1][0][0][3] or b"")
    assert result["code"] == "DUPLICATE" and result["request_id"] == "t-1#0"
    assert stats.codes == {ResultCode.DUPLICATE: 1}


async def test_a_remote_send_of_a_slot_fired_in_process_is_answered_duplicate() -> None:
    processor, txn, _ = make()
    await processor.handle([], local=[command(in_process=True)])
    await processor.handle([record(command())])
    result = orjson.loads(txn.commits[-1][0][0][3] or b"")
    assert result["code"] == "DUPLICATE"


async def test_an_early_local_command_is_not_due_and_writes_nothing_but_the_record() -> None:
    processor, _, _ = make(now=T0 - 1)
    batch = processor.begin()
    decided = processor.decide_local(batch, [command(in_process=True)])
    assert [code for _, code, _ in decided] == [ResultCode.SCHEDULE_NOT_DUE]
    assert batch.staged == {}


async def test_on_local_hears_the_codes_before_the_commit() -> None:
    processor, txn, _ = make()
    heard: list[tuple[str, ResultCode, int]] = []

    async def on_local(decided: list[tuple[CommandEnvelope, ResultCode, str]]) -> None:
        heard.extend((c.request_id, code, len(txn.commits)) for c, code, _ in decided)

    await processor.handle([], local=[command(in_process=True)], on_local=on_local)
    assert heard == [("t-1#0", ResultCode.COMMITTED, 0)], "before the transaction committed"


class FakeReader:
    """The log's offsets and records, for restore."""

    def __init__(self, end: int, records: list[Record]) -> None:
        self.end = end
        self.records = records

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, self.end

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        yield [r for r in self.records if r.offset >= start]


async def test_local_states_ahead_of_the_log_are_dropped_and_folded_again() -> None:
    """A new, empty broker (or another cluster) with the old local states: they are not a
    copy of this log, so they are dropped, and the request ids with them."""
    processor, _, states = make()
    await processor.handle([], local=[command(in_process=True)])
    assert states.seen(P, state_key(ORDER), "t-1#0") and states.offset(P) == 0
    assert await processor.restore(FakeReader(end=0, records=[])) == 0
    assert states.offset(P) is None
    assert not states.seen(P, state_key(ORDER), "t-1#0")


def external(version: int, id: str = "ext-1") -> EventEnvelope:
    return EventEnvelope(
        id=id, type="shop.Reminded", aggregate=ORDER, version=version, created_at=T0, body={}
    )


async def test_another_writers_event_is_followed_so_the_version_never_goes_back() -> None:
    processor, _, _ = make()
    batch = processor.begin()
    assert processor.follow(batch, external(5), 7)
    processor.decide_local(batch, [command(in_process=True)])
    event = orjson.loads(batch.out[0][3] or b"")
    assert event["version"] == 6, "decided after the other writer's v5"
    assert not processor.follow(batch, external(5), 7), "followed already: passed over"


async def test_a_followed_event_is_not_folded_again_by_a_restore() -> None:
    """The state store's offset moves past another writer's events with the batch that
    followed them: a restore starts after them, and the aggregate is not folded twice."""
    processor, txn, states = make()
    await processor.handle([], local=[command(in_process=True)])  # own event at offset 0
    batch = processor.begin()
    assert processor.follow(batch, external(5), 7)
    processor.staged(batch)
    processor.committed(batch, await txn(batch.out, batch.offsets))
    assert states.offset(P) == 7
    log = [
        Record("shop.order.events", P, 7, ORDER.id.encode(), encode(external(5)), T0),
    ]
    assert await processor.restore(FakeReader(end=8, records=log)) == 0
    stored = states.get(P, state_key(ORDER))
    assert stored is not None and orjson.loads(stored)["version"] == 5


async def test_the_state_stores_offset_never_goes_back() -> None:
    """A batch that read the log up to offset 3 commits after this node's own events at
    a later offset were folded: the offset stays at theirs."""
    processor, txn, states = make()
    txn._next = 20
    await processor.handle([], local=[command(in_process=True)])
    assert states.offset(P) == 20
    batch = processor.begin()
    assert processor.follow(batch, external(9), 3)
    processor.staged(batch)
    processor.committed(batch, await txn(batch.out, batch.offsets))
    assert states.offset(P) == 20


async def test_another_writers_event_behind_the_aggregate_changes_nothing() -> None:
    processor, _, _ = make()
    await processor.handle([], local=[command(in_process=True)])
    batch = processor.begin()
    assert not processor.follow(batch, external(1, id="late"), 9)
    assert batch.empty


async def test_its_own_events_read_back_are_passed_over() -> None:
    processor, txn, _ = make()
    await processor.handle([], local=[command(in_process=True)])
    own = EventEnvelope.model_validate_json(txn.commits[0][0][0][3] or b"")
    batch = processor.begin()
    assert not processor.follow(batch, own, 11) and batch.empty


def test_a_record_outside_its_aggregates_partition_is_misrouted() -> None:
    cmd = encode(command())
    assert misrouted(record(command()), ORDER, 4) is None
    other = (P + 1) % 4
    wrong = Record("shop.order.commands", other, 0, ORDER.id.encode(), cmd, T0)
    assert f"belongs in partition {P}" in (misrouted(wrong, ORDER, 4) or "")
    keyless = Record("shop.order.commands", P, 0, None, cmd, T0)
    assert "no key" in (misrouted(keyless, ORDER, 4) or "")
    other_key = Record("shop.order.commands", P, 0, b"o-2", cmd, T0)
    assert "not the aggregate id" in (misrouted(other_key, ORDER, 4) or "")


async def test_a_misrouted_command_is_answered_and_dead_lettered_not_decided() -> None:
    processor, txn, states = make()
    wrong = Record("shop.order.commands", P, 0, b"o-2", encode(command()), T0)
    stats = await processor.handle([wrong])
    assert txn.topics() == ["shop.results", "shop.dead-letters"] and stats.dead_letters == 1
    answered = orjson.loads(txn.commits[0][0][0][3] or b"")
    assert answered["code"] == "ERROR" and "not the aggregate id" in answered["message"]
    assert states.get(P, state_key(ORDER)) is None


async def test_an_unknown_command_type_is_answered_error_and_dead_lettered_whole() -> None:
    processor, txn, _ = make()
    big = command(type="shop.Unknown", body={"pad": "x" * 10_000})
    await processor.handle([record(big)])
    assert txn.topics() == ["shop.results", "shop.dead-letters"]
    result, letter = txn.commits[0][0]
    assert orjson.loads(result[3] or b"")["code"] == "ERROR"
    assert letter[3] == encode(big), "not cut, not changed"
    context = DeadLetterContext.from_headers(letter[4])  # type: ignore[misc]
    assert (context.stage, context.offset) == (Stage.DECIDE, 0)
    assert "no handler for shop.Unknown" in context.exception_message


async def test_an_unknown_type_duplicate_or_early_is_answered_so_and_lettered_once_due() -> None:
    """A type with no handler reusing an applied request id is its DUPLICATE (the request
    was applied), one early is SCHEDULE_NOT_DUE: neither is a dead letter (once, each was,
    saying "request already applied" or "not before", and the early one's retry once due
    wrote a second); the one due is, naming the handler missing."""
    processor, txn, _ = make()
    await processor.handle([record(command("r-1"))])  # applied by shop.Remind
    # Its sender waits for the answer (`reply_to`): one that waits for none is lettered
    # early (`test_early_fire_and_forget`).
    early = command("r-2", type="shop.Typo", reply_to="shop.results").model_copy(
        update={"not_before": T0 + 60_000}
    )
    await processor.handle([record(command("r-1", type="shop.Typo"), 1), record(early, 2)])
    assert txn.topics() == ["shop.results", "shop.results"], "no letter"
    codes = [orjson.loads(r[3] or b"")["code"] for r in txn.commits[-1][0]]
    assert codes == ["DUPLICATE", "SCHEDULE_NOT_DUE"]
    due = command("r-2", type="shop.Typo")
    await processor.handle([record(due, 3)])
    assert txn.topics() == ["shop.results", "shop.dead-letters"]
    context = DeadLetterContext.from_headers(txn.commits[-1][0][1][4])  # type: ignore[misc]
    assert "has no handler for shop.Typo" in context.exception_message


async def test_an_unreadable_local_state_is_a_node_fault_that_drops_the_states() -> None:
    """The local copy is damaged, not the command: the partition is retaken (a node fault)
    and its states folded again from the log, instead of every command on the aggregate
    answered ERROR for ever."""
    processor, _, states = make()
    states.write(P, {state_key(ORDER): b'{"version": "not a number"}'}, [], 5)
    with pytest.raises(StoreError, match="unreadable"):
        processor.decide_records(processor.begin(), [record(command())])
    assert states.offset(P) is None and states.get(P, state_key(ORDER)) is None


async def test_a_handler_that_raises_anything_is_answered_error_and_dead_lettered() -> None:
    kaput = order_type()

    @kaput.command("shop.Explode")
    def explode(state: Any, cmd: Any, d: Any) -> None:
        raise ZeroDivisionError("the handler's own bug")

    txn = FakeTransaction()
    processor = CommandProcessor(
        kaput, P, partitions=4, states=MemoryAggregateStore(), commit=txn, now=lambda: T0
    )
    await processor.handle([record(command(type="shop.Explode"))])
    result, letter = txn.commits[0][0]
    assert orjson.loads(result[3] or b"")["code"] == "ERROR"
    context = DeadLetterContext.from_headers(letter[4])  # type: ignore[misc]
    assert (context.stage, context.exception_class) == (Stage.DECIDE, "ZeroDivisionError")


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"reply_to": "shop.order.events"}, "is not shop.results"),
        ({"reply_to": "other.results"}, "is not shop.results"),
        ({"reply_partition": 4}, "does not exist"),
    ],
)
async def test_a_command_with_a_reply_address_elsewhere_is_answered_on_its_own_and_not_run(
    fields: dict[str, Any], why: str
) -> None:
    processor, txn, states = make()
    cmd = command(**fields)
    await processor.handle([record(cmd)])
    result, letter = txn.commits[0][0]
    assert result[:2] == ("shop.results", partition_of(cmd.request_id, 4))
    answered = orjson.loads(result[3] or b"")
    assert answered["code"] == "ERROR" and why in answered["message"]
    assert letter[0] == "shop.dead-letters" and letter[3] == encode(cmd)
    assert states.get(P, state_key(ORDER)) is None, "never decided"


async def test_a_decision_that_cannot_be_written_leaves_the_batch_as_it_was() -> None:
    """A handler emits an integer no 64-bit reader holds: the command is answered ERROR and
    dead-lettered, and nothing of it is staged (no applied request id, no state, no event),
    so a retry is decided again, not answered DUPLICATE."""
    huge = order_type()

    @huge.command("shop.Huge")
    def emit_huge(state: Any, cmd: Any, d: Any) -> None:
        d.emit("shop.Counted", {"n": 2**70})

    txn = FakeTransaction()
    states = MemoryAggregateStore()
    processor = CommandProcessor(huge, P, partitions=4, states=states, commit=txn, now=lambda: T0)
    await processor.handle([record(command(type="shop.Huge"))])
    assert txn.topics() == ["shop.results", "shop.dead-letters"]
    assert orjson.loads(txn.commits[0][0][0][3] or b"")["code"] == "ERROR"
    assert not states.seen(P, state_key(ORDER), "t-1#0")
    assert states.get(P, state_key(ORDER)) is None


def raw(value: dict[str, Any] | bytes, key: bytes = ORDER.id.encode(), **kw: Any) -> Record:
    """A command record as any producer may write it: `value` as JSON (bytes as they are)."""
    data = value if isinstance(value, bytes) else orjson.dumps(value)
    return Record("shop.order.commands", P, 0, key, data, T0, kw.get("headers", ()))


def unreadable(**fields: Any) -> dict[str, Any]:
    """A command whose envelope reads but whose body does not (an integer past 64 bits),
    answered on partition 2 of its context's results topic unless `fields` say otherwise."""
    value: dict[str, Any] = orjson.loads(
        encode(command(reply_to="shop.results", reply_partition=2))
    )
    value["body"] = {"n": 0}
    return value | fields


def with_huge_body(value: dict[str, Any]) -> bytes:
    # orjson writes no integer past 64 bits: put it in by hand.
    return orjson.dumps(value).replace(b'"n":0', b'"n":18446744073709551621')


async def test_an_unreadable_command_whose_reply_address_reads_is_answered_and_dead_lettered() -> (
    None
):
    """Dead-lettered with no answer, its sender (a timer) waited out its timeout at each
    attempt and parked as TIMEOUT: it is answered ERROR with why, on its reply address, and
    still dead-lettered, never decided."""
    processor, txn, states = make()
    bad = raw(with_huge_body(unreadable()))
    stats = await processor.handle([bad])
    assert txn.topics() == ["shop.results", "shop.dead-letters"]
    result, letter = txn.commits[0][0]
    assert result[:3] == ("shop.results", 2, b"t-1#0")
    answered = orjson.loads(result[3] or b"")
    assert (answered["code"], answered["request_id"]) == ("ERROR", "t-1#0")
    assert answered["aggregate"] == ORDER.model_dump()
    assert "body" in answered["message"] and "outside signed 64 bits" in answered["message"]
    assert letter[3] == bad.value, "the record whole"
    context = DeadLetterContext.from_headers(letter[4])  # type: ignore[misc]
    assert (context.stage, context.exception_class) == (Stage.READ, "BadRecord")
    assert context.exception_message == answered["message"]
    assert (stats.dead_letters, stats.codes) == (1, {ResultCode.ERROR: 1})
    assert states.get(P, state_key(ORDER)) is None, "never decided"
    assert txn.commits[0][1] == {("shop.order.commands", P): 1}


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (raw(b'{"request_id": "t-1#0", "aggregate"'), "not JSON"),
        (raw(b"\xff\xfe"), "not UTF-8"),
        (raw(with_huge_body(unreadable(request_id=None))), "no request id"),
        (raw(with_huge_body(unreadable(request_id="x" * 301))), "a request id too long"),
        (raw(with_huge_body(unreadable(request_id=7))), "a request id of the wrong type"),
        (raw(with_huge_body(unreadable(aggregate=None))), "no aggregate"),
        (
            raw(with_huge_body(unreadable(aggregate=ORDER.model_dump() | {"shard": 1}))),
            "an aggregate with a field it does not know",
        ),
        (
            raw(with_huge_body(unreadable(aggregate=ORDER.model_dump() | {"id": "o\n1"}))),
            "an aggregate id with a control character",
        ),
        (raw(unreadable(body={"pad": "x" * 300_000})), "over the record bound: never parsed"),
        (
            raw(with_huge_body(unreadable(in_process=True)), headers=IN_PROCESS_HEADERS),
            "a node's own record of an in-process command",
        ),
    ],
)
async def test_an_unreadable_command_without_a_readable_reply_address_is_only_dead_lettered(
    bad: Record, why: str
) -> None:
    processor, txn, _ = make()
    stats = await processor.handle([bad])
    assert txn.topics() == ["shop.dead-letters"], why
    assert (stats.dead_letters, stats.codes) == (1, {})


async def test_an_unreadable_command_answered_elsewhere_is_answered_on_its_own_topic() -> None:
    """A reply address this node does not answer on, as for a command that reads: on its
    context's results topic, in the request id's partition; nothing written where it asks."""
    processor, txn, _ = make()
    for elsewhere in ({"reply_to": "shop.order.events"}, {"reply_partition": 4}):
        await processor.handle([raw(with_huge_body(unreadable(**elsewhere)))])
        result, letter = txn.commits[-1][0]
        assert result[:2] == ("shop.results", partition_of("t-1#0", 4))
        assert orjson.loads(result[3] or b"")["code"] == "ERROR"
        assert letter[0] == "shop.dead-letters"


@pytest.mark.parametrize(
    "address",
    [
        {"reply_partition": -1},
        {"reply_partition": 70_000},
        {"reply_partition": "2"},
        {"reply_to": "x" * 300},
        {"reply_to": 7},
    ],
)
async def test_an_unreadable_command_whose_reply_address_does_not_read_is_answered_on_its_own(
    address: dict[str, Any],
) -> None:
    """A reply address outside a command's bounds (or of the wrong type) is answered where
    one elsewhere is, on its context's results topic in the request id's partition, as long
    as the request id and aggregate read: once, only dead-lettered, its sender waited out
    its timeout while one asking a partition past the topic's was answered at once."""
    processor, txn, _ = make()
    stats = await processor.handle([raw(with_huge_body(unreadable(**address)))])
    result, letter = txn.commits[-1][0]
    assert result[:3] == ("shop.results", partition_of("t-1#0", 4), b"t-1#0")
    answered = orjson.loads(result[3] or b"")
    assert (answered["code"], answered["aggregate"]) == ("ERROR", ORDER.model_dump())
    assert letter[0] == "shop.dead-letters"
    assert (stats.dead_letters, stats.codes) == (1, {ResultCode.ERROR: 1})
