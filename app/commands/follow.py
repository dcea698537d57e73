"""The live follow: an event of a partition's log that it did not decide (another writer's
append) folded into its aggregate when ahead of it (`follow_event`, which
`CommandProcessor.follow` runs), by the rule a restore folds the log by
(`app.commands.folds`)."""

from __future__ import annotations

from typing import Any

from app.commands.batch import CommandBatch
from app.commands.folds import check_followed_version, continues, folds, marked
from app.commands.records import applied_id, state_key
from app.commands.states import PartitionStates
from app.model.aggregate import AggregateType
from app.model.decide import fold
from app.protocol.wire import EventEnvelope

__all__ = ["follow_event"]


def follow_event(
    agg: AggregateType[Any],
    states: PartitionStates,
    batch: CommandBatch,
    event: EventEnvelope,
    offset: int,
) -> bool:
    """Folds an event of the log that this partition did not decide (another writer's
    append) into its aggregate when it is ahead of it, so that the versions this node
    appends never go back; whether it did. Its own events, read back, and another
    writer's events at or behind the aggregate's version, change nothing here (their
    timers are ordered by their own versions in the timer table). The events after the
    first of another writer's decision share its request id: folded too, but not one
    folded already (appended again). One whose fold raises (the caller dead-letters
    it) leaves its request id applied."""
    if event.aggregate.type_name != agg.type_name:
        return False
    batch.log_offset = max(offset, batch.log_offset or 0)
    aid = state_key(event.aggregate)
    applied = (aid, applied_id(event))
    if (why := states.passed_over(offset)) is not None:
        batch.passed.add(applied)
        raise why  # as the restore met it: the caller dead-letters the event
    # The restore's rule (`app.commands.folds`): the aggregate unread when it says no
    # whatever the version (its own event read back).
    last = states.following(batch, aid)
    sibling = states.folded(batch, applied)
    nxt = sibling and continues(last, applied[1], offset, event.id, event.version)
    if sibling and not nxt:
        return False
    stored = batch.staged.get(aid) or states.stored(aid)
    at = stored.version if stored is not None else 0
    if not folds(event.version, at, folded=sibling, continues=nxt):
        return False
    try:
        check_followed_version(event.version, at)
        folded = fold(agg, stored, [event])  # before the batch changes: it may raise
        batch.encoded[aid] = states.encode(aid, stored, folded, logged=True)
    except Exception:
        batch.passed.add(applied)  # the log holds it: sent again, a duplicate
        raise
    batch.staged[aid] = folded
    batch.applied.add(applied)
    batch.following[aid] = marked(last, applied[1], offset, event.id, event.version)
    return True
