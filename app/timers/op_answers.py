"""The answer of a partition's owner to an operator's retry/skip request (`TimerOpAnswer`):
what it did with the request's copy in its partition, on the owner type's context's
results topic (`answer_record`), written in the partition's transaction that commits the
request's offset (`app.node.cycle_timers`), so once with it: DONE with its counts,
DUPLICATE, or FAILED (dead-lettered). A copy that is not a request (a record that does not
decode) names no request: it is dead-lettered unanswered.

Also what a reader of the results topic makes of them: `is_answer` tells a reader of
commands' results to pass one over in silence (it is no unreadable result), and
`answer_of` reads one for the command line's wait (`app.ops.op_answers`)."""

from __future__ import annotations

from app.errors import BadRecord
from app.kafka import OutRecord, Record
from app.protocol.topics import ContextTopics, parse_aggregate_type
from app.protocol.wire import (
    TIMER_OP_ANSWER,
    OpOutcome,
    TimerAction,
    TimerOp,
    TimerOpAnswer,
    decode,
    encode,
)
from tables.partitioner import partition_of
from tables.timer import writable_text

__all__ = ["MAX_MESSAGE", "answer_of", "answer_record", "answers_partition", "is_answer"]

MAX_MESSAGE = 2_000
"""An answer's message at most (`TimerOpAnswer.message`): a FAILED one's error is cut."""


def answers_partition(request_id: str, partitions: int) -> int:
    """The results partition every answer to `request_id` goes to (murmur2, as a command's
    result's by default): one partition for a client to read."""
    return partition_of(request_id, partitions)


def answer_record(
    type_name: str,
    op: TimerOp,
    partition: int,
    offset: int,
    outcome: OpOutcome,
    *,
    partitions: int,
    now: int,
    changed: int = 0,
    refused: int = 0,
    message: str = "",
) -> OutRecord:
    """The answer to `op`, read at `offset` of the timer-ops partition `partition` of
    `type_name`, on its context's results topic (of `partitions` partitions); `changed`:
    the PARKED timers it retried or skipped (by its action); `refused`: those a retry left
    PARKED (`TimerOpAnswer.refused`)."""
    # Writable: a FAILED one's error text may hold a lone surrogate (`writable_text`).
    message = writable_text(message)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    retry = op.action is TimerAction.RETRY
    answer = TimerOpAnswer(
        kind=TIMER_OP_ANSWER,
        request_id=op.request_id,
        action=op.action,
        target=op.target,
        partition=partition,
        offset=offset,
        outcome=outcome,
        retried=changed if retry else 0,
        skipped=0 if retry else changed,
        refused=refused,
        message=message,
        answered_at=now,
    )
    topic = ContextTopics(parse_aggregate_type(type_name).context).results
    at = answers_partition(op.request_id, partitions)
    return (topic, at, op.request_id.encode(), encode(answer))


def answer_of(record: Record) -> TimerOpAnswer | None:
    """The answer `record` of the results topic holds; None for anything else (a command's
    result, garbage)."""
    try:
        # It names the target as the request did, as stored: not refused for its characters.
        return decode(TimerOpAnswer, record.value, new_names=False)
    except BadRecord:
        return None


def is_answer(record: Record) -> bool:
    """Whether a record of the results topic that is no command's result is an answer to a
    timer-op, which a reader of results passes over without a word."""
    return answer_of(record) is not None
