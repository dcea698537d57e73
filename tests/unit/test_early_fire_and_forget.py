"""A timer's send from another context carries its slot's `not_before` and no reply
address (`reply_to`): its sender takes it as SENT once the broker has it and waits for no
answer (`sent_unanswered`). Early by the target's clock, it was answered SCHEDULE_NOT_DUE
on a topic nobody reads and never sent again: a target node whose clock trailed the
sender's by more than the send's trip (ordinary skew between hosts) lost the timer's
command, silently; so did one answered BUSY. Now one early by at most
`TICKWHEEL_CLOCK_SKEW_MS` is decided as of its due time, one earlier still is
dead-lettered, to be replayed once due, and a backlog does not shed it. A command whose
sender waits for the answer is refused early, or BUSY, as before: its sender sends it
again."""

from __future__ import annotations

import orjson
import pytest
from fakes import T0
from pydantic import ValidationError
from test_processor import command, make, record

from app.model.decide import CLOCK_SKEW_MS
from app.node.settings import Settings
from app.protocol.dead_letters import DeadLetterContext, Stage
from app.protocol.wire import CommandEnvelope


def early(ms: int, request_id: str = "t-1#0", **fields: object) -> CommandEnvelope:
    return command(request_id, **fields).model_copy(update={"not_before": T0 + ms})


async def test_one_early_within_the_skew_is_decided_as_of_its_due_time() -> None:
    processor, txn, _ = make()
    await processor.handle([record(early(CLOCK_SKEW_MS))])
    records = txn.commits[-1][0]
    assert [r[0] for r in records] == ["shop.order.events", "shop.results"]
    event = orjson.loads(records[0][3] or b"")
    assert event["created_at"] == T0 + CLOCK_SKEW_MS, "as of its due time, never before"
    assert orjson.loads(records[1][3] or b"")["code"] == "COMMITTED"


async def test_one_earlier_than_the_skew_is_dead_lettered_to_be_replayed() -> None:
    processor, txn, _ = make()
    await processor.handle([record(early(CLOCK_SKEW_MS + 1))])
    records = txn.commits[-1][0]
    assert [r[0] for r in records] == ["shop.results", "shop.dead-letters"]
    assert orjson.loads(records[0][3] or b"")["code"] == "SCHEDULE_NOT_DUE"
    context = DeadLetterContext.from_headers(records[1][4])  # type: ignore[misc]
    assert context.stage is Stage.DECIDE
    assert "no sender waits for its answer" in context.exception_message
    # Replayed once due (by this clock): decided.
    later, txn, _ = make(now=T0 + 1)
    await later.handle([record(early(CLOCK_SKEW_MS + 1))])
    assert [r[0] for r in txn.commits[-1][0]] == ["shop.order.events", "shop.results"]


async def test_one_whose_sender_waits_is_refused_early_and_not_lettered() -> None:
    processor, txn, _ = make()
    waited = early(1, reply_to="shop.results", reply_partition=0)
    await processor.handle([record(waited)])
    records = txn.commits[-1][0]
    assert [r[0] for r in records] == ["shop.results"]
    assert orjson.loads(records[0][3] or b"")["code"] == "SCHEDULE_NOT_DUE"


async def test_one_no_sender_waits_for_is_decided_past_the_busy_backlog() -> None:
    """Answered BUSY, such a send was lost the same way: nothing sends it again. One whose
    sender waits is answered BUSY as before, and sent again."""
    processor, txn, _ = make()
    await processor.handle([record(early(0))], backlog=processor.busy_backlog)
    assert [r[0] for r in txn.commits[-1][0]] == ["shop.order.events", "shop.results"]
    waited = early(0, "t-2#0", reply_to="shop.results", reply_partition=0)
    await processor.handle([record(waited, 1)], backlog=processor.busy_backlog)
    records = txn.commits[-1][0]
    assert [orjson.loads(r[3] or b"")["code"] for r in records] == ["BUSY"]


def test_the_skew_setting_is_bounded_to_a_minute() -> None:
    """A decision is dated as of its `not_before`, ahead of the node's clock by the skew at
    most: no more than a cancel's mark may be (`MARK_AHEAD_MS`)."""
    assert Settings(clock_skew_ms=60_000).clock_skew_ms == 60_000
    with pytest.raises(ValidationError):
        Settings(clock_skew_ms=60_001)
    with pytest.raises(ValidationError):
        Settings(clock_skew_ms=-1)
