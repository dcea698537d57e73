"""Records on the results topic shaped like an owner's `timer-op-answer`, hostile: a field
past its bound or of the wrong type, a key given twice, NaN and Infinity, JSON nested past
any bound, bytes not UTF-8, an unknown field no encoder writes back (`hostile_records`).

A node's results reader passes a valid answer over in silence and logs any other as an
unreadable result; the wait of `timers retry|skip` (`request_answered`) counts only an
answer to its own send (its request id, action, partition and copy's offset), and what it
counted is written out again by `--json`. Before, an answer's unknown fields were not held
to a body's bounds: one past 64 bits was read as the owner's answer, and `--json` stopped
with a TypeError writing it out (orjson writes no integer past 64 bits)."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
from fakes import T0, wait_until
from hostile_records import Hostile, answer_base, dump, hostile_answers, with_field

from app.cli.timer_op_answers import say_answered
from app.errors import BadRecord
from app.kafka import OutRecord, Record, TopicSpec
from app.kafka.memory import MemoryLog
from app.log_limit import LogLimit
from app.node.kept import node_topics
from app.ops.op_answers import request_answered
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandResult, ResultCode, TimerAction, decode, encode
from app.timers.op_answers import answer_of, answers_partition, is_answer
from app.timers.operator import new_op
from app.timers.sender import ResultsReader
from tables import AggregateRef
from tables.bounds import MAX_INT64

P = 2
ORDERS = AggregateTopics("shop", "order")
RESULTS = ContextTopics("shop").results
OWNER = AggregateRef(context="shop", aggregate="order", id="o-1")
TARGET = OWNER.model_dump(mode="json")
CASES = hostile_answers(answer_base("r-1", TARGET, 1, 7))


@pytest.mark.parametrize("case", CASES, ids=[c.why[:50] for c in CASES])
def test_a_record_shaped_as_an_answer_is_one_only_within_its_bounds(case: Hostile) -> None:
    record = Record(RESULTS, 0, 0, b"r-1", case.value, 0)
    assert is_answer(record) is case.answer
    with pytest.raises(BadRecord):  # never a command's result, whatever it holds
        decode(CommandResult, case.value)


async def test_a_nodes_results_reader_logs_all_but_answers_and_reads_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every line let through (no bound): each record that is no answer is named once, no
    answer is, no send waiting under the answers' request id is settled, and a result
    after them all still settles its send."""
    log = MemoryLog([TopicSpec(RESULTS, 1)])
    reader = ResultsReader(log.follower, "shop", log_limit=LogLimit(0))
    await reader.start()
    await reader.add_partition(0)
    publisher = log.publisher()
    try:
        waiting = reader.expect("r-1", OWNER)
        last = reader.expect("last", OWNER)
        with caplog.at_level(logging.WARNING, "app.timers.sender"):
            offsets = await publisher.send_many([(RESULTS, 0, b"r-1", c.value) for c in CASES])
            result = CommandResult(
                request_id="last", code=ResultCode.COMMITTED, aggregate=OWNER, decided_at=T0
            )
            await publisher.send(RESULTS, b"last", encode(result), 0)
            assert (await asyncio.wait_for(last, 5)).code is ResultCode.COMMITTED
        assert reader.task is not None and not reader.task.done()
    finally:
        await reader.stop()
    assert not waiting.done() or waiting.cancelled()
    logged = lines_by_offset(caplog.records)
    unreadable = {o: c.why for o, c in zip(offsets, CASES, strict=True) if not c.answer}
    assert logged == dict.fromkeys(unreadable, 1), {
        "not logged": [unreadable[o] for o in unreadable.keys() - logged.keys()],
        "answers logged": [CASES[offsets.index(o)].why for o in logged.keys() - unreadable],
    }


def lines_by_offset(records: list[logging.LogRecord]) -> dict[int, int]:
    """How many "unreadable result" lines named each offset of the results' partition 0."""
    out: dict[int, int] = {}
    for r in records:
        if "unreadable result" in r.msg:
            assert isinstance(r.args, tuple) and r.args[:2] == (RESULTS, 0), r.args
            offset = r.args[2]
            assert isinstance(offset, int)
            out[offset] = out.get(offset, 0) + 1
    return out


# --- the wait of `timers retry|skip` ------------------------------------------------------------


def forged(op_id: str, p: int, at: int) -> list[tuple[str, bytes | None]]:
    """What another writer may put on the answers' partition before partition p's owner
    answers its copy at offset `at`: records of the catalogue that are no answer (made from
    that very answer), answers to another copy, action, partition or request, and a
    command's result under the request id."""
    base = answer_base(op_id, TARGET, p, at, outcome="FAILED", changed=0)
    out = [(c.why, c.value) for c in hostile_answers(base) if not c.answer]
    out += [
        ("another copy's offset", dump(with_field(base, ["offset"], at + 1))),
        ("another action", dump(with_field(base, ["action"], "skip"))),
        ("a partition past the topic's", dump(with_field(base, ["partition"], P + p))),
        ("the last partition there may be", dump(with_field(base, ["partition"], 65_535))),
        ("another request", dump(with_field(base, ["request_id"], op_id + "x"))),
    ]
    result = CommandResult(
        request_id=op_id, code=ResultCode.ERROR, aggregate=OWNER, decided_at=T0, message="x"
    )
    return [*out, ("a command's result", encode(result))]


async def test_the_wait_counts_its_own_answers_alone_and_says_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Hostile records before each owner's answer: none is counted, none stops the wait,
    and the owners' answers (each retried MAX_INT64 timers) are summed and written out."""
    log = MemoryLog(node_topics([ORDERS], P))
    op = new_op(TimerAction.RETRY, OWNER, now=T0, request_id="r-7")
    at = answers_partition(op.request_id, P)
    owners: dict[int, bytes] = {}

    async def answer() -> None:
        await wait_until(lambda: all(log.records(ORDERS.timer_ops, p) for p in range(P)))
        publisher = log.publisher()
        for p in range(P):
            copy = log.records(ORDERS.timer_ops, p)[0].offset
            records: list[OutRecord] = [
                (RESULTS, at, op.request_id.encode(), value) for _, value in forged("r-7", p, copy)
            ]
            await publisher.send_many(records)
            owners[p] = dump(answer_base("r-7", TARGET, p, copy, changed=MAX_INT64))
            await publisher.send(RESULTS, b"r-7", owners[p], at)

    answering = asyncio.create_task(answer())
    answered = await asyncio.wait_for(request_answered(log, "shop.order", op, P, 5), 10)
    await answering
    read = {p: answer_of(Record(RESULTS, at, 0, None, v, 0)) for p, v in owners.items()}
    assert answered.answers == read
    assert answered.summary("shop.order", "o-1", "r-7").startswith(
        f"retried {2 * MAX_INT64} timers of shop.order parked on o-1 in 2 of 2 partitions"
    )
    capsys.readouterr()
    say_answered("shop.order", answered, 5, as_json=True)
    (line,) = capsys.readouterr().out.splitlines()
    assert orjson.loads(line)["answers"] == [orjson.loads(owners[p]) for p in range(P)]
