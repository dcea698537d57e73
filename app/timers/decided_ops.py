"""What a node's own new decision does to its timers, checked as it is decided
(`decided_timer_op`): the command path refuses a decision whose timer event the node's
subscription would refuse (`app.timers.subscription.timer_op`), so that its sender is never
told COMMITTED of a timer that is then dead-lettered and never set.

For new decisions only: an event already in the log (a restore, another writer's, an older
version's) is the subscription's to take or dead-letter, as ever.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.errors import BadRecord
from app.protocol.wire import EventEnvelope
from app.timers.subscription import CancelTimer, TimerOp, timer_op
from app.timers.timer_sizes import DEFAULT_TOPICS

__all__ = ["decided_timer_op"]


def decided_timer_op(
    event: EventEnvelope,
    now: int,
    *,
    partition: int,
    max_record_bytes: int,
    topic_bytes: Mapping[str, int] = DEFAULT_TOPICS,
) -> TimerOp | None:
    """What `event`, decided now (`now`) on `partition`, does to the timers, as the
    subscription will take it; `BadRecord` for what it would refuse: a body it cannot read
    (strict, as new input), a rule with no slot, and a set whose timer's records could not
    be written (`timer_sizes.oversized`, of the node's bound and what its topics take,
    `topic_bytes`: the subscription would cancel the timer it replaces and dead-letter the
    set; refused here, the old timer stays as it was, and the sender hears why). A set
    whose rule has ended is taken: it cancels its key's timer."""
    op = timer_op(event, partition, max_record_bytes, now, topic_bytes=topic_bytes)
    if isinstance(op, CancelTimer) and op.refused is not None:
        raise BadRecord(op.refused)
    return op
