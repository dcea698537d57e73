"""Records on the timer-ops topic shaped like an operator's request, hostile: a field past
its bound or of the wrong type, an unknown field past a body's bounds (an integer past 64
bits, NaN, JSON nested deeper than `MAX_DEPTH`), a key given twice, bytes not UTF-8
(`hostile_records.hostile_ops`).

Every reader of the topic reads a request as `decode(TimerOp, ..., new_names=False)`: a
partition's cycle (`app.node.cycle_timers`: carried out and answered, or dead-lettered at
READ, unanswered) and a take's reading of the request ids carried out
(`app.timers.applied_ops`: passed over). Before, a request's unknown fields were not held
to a body's bounds (`TimerOp` was no `Envelope`): one past 64 bits or nested past any
bound was carried out, and what was read could not be written again (orjson writes no
integer past 64 bits)."""

from __future__ import annotations

from typing import Any

import pytest
from hostile_records import HostileOp, dump, hostile_ops, op_base, with_field
from pydantic import ValidationError

from app.errors import BadRecord
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics
from app.protocol.wire import TimerOp, decode, encode
from app.timers.applied_ops import read_applied_ops

ORDERS = AggregateTopics("shop", "order")
TARGET = {"context": "shop", "aggregate": "order", "id": "o-1"}
BASE = op_base("r-1", TARGET)
CASES = hostile_ops(BASE)
T0 = BASE["requested_at"]


@pytest.mark.parametrize("case", CASES, ids=[c.why[:50] for c in CASES])
def test_a_record_shaped_as_a_request_is_one_only_within_its_bounds(case: HostileOp) -> None:
    try:
        op = decode(TimerOp, case.value, new_names=False)
    except BadRecord:
        assert not case.request, f"{case.why}: a request, refused"
        return
    assert case.request, f"{case.why}: read as a request: {op.model_extra!r:.200}"
    # What was read is written again as it was read (by every encoder).
    assert decode(TimerOp, encode(op), new_names=False) == op


@pytest.mark.parametrize(
    "extra",
    [{"note": 2**70}, {"note": float("nan")}, {"note": {1: "a"}}],
    ids=["past 64 bits", "NaN", "an int key"],
)
def test_a_request_made_in_process_is_held_to_the_same_bounds(extra: dict[Any, Any]) -> None:
    """A request made by a caller (`new_op`, a client library's own) with such a field is
    refused where it is made, not sent to stop a writer (orjson's TypeError) or be read as
    another than the one made (NaN written as null, 1 as "1")."""
    with pytest.raises(ValidationError):
        TimerOp.model_validate({**BASE, **extra})


async def test_a_take_passes_over_a_request_no_cycle_carries_out() -> None:
    """A copy under the request id that holds an unknown field past a body's bounds is
    dead-lettered when a cycle reads it: a take reading the topic again does not count it
    carried out, so the request's valid copy after it is carried out, not its DUPLICATE."""
    log = MemoryLog([TopicSpec(ORDERS.timer_ops, 1)])
    hostile = dump(with_field(BASE, ["note"], 2**70))
    await log.publisher().send_many(
        [(ORDERS.timer_ops, 0, None, hostile), (ORDERS.timer_ops, 0, None, dump(BASE))]
    )
    applied = await read_applied_ops(
        log.reader(), ORDERS.timer_ops, 0, now=T0, window_ms=60_000, limits=InputLimits()
    )
    valid = decode(TimerOp, dump(BASE), new_names=False)
    assert len(applied) == 1
    assert applied.duplicate_of(valid, 2, T0) == 1, "the valid copy, at offset 1, is the first"


def test_a_request_as_0_2_0_wrote_it_still_reads() -> None:
    """`tickwheel timers retry` of 0.2.0 wrote these fields alone (no unknown field)."""
    written = (
        b'{"request_id":"9f1c","action":"skip","target":{"context":"shop","aggregate":"order",'
        b'"tenant":"(0)","id":"o-1"},"requested_at":1764547200000}'
    )
    op = decode(TimerOp, written, new_names=False)
    assert (op.request_id, op.action, op.target.id, op.model_extra) == ("9f1c", "skip", "o-1", {})
    assert encode(op) == written
