"""Restoring the aggregate states of one partition of one aggregate type
(`PartitionStates.restore`): the events of its log after the state store's offset folded
into the store, each aggregate's events at once or, when one of them fails, one at a time,
those that fail passed over for the subscription to dead-letter. Folded as the live follow
folds them (`app.commands.folds`): an event the live node passed over (another writer's
behind the aggregate, an unknown `wow.` type) is passed over here too, its request id not
taken as applied, so that an aggregate's state is the same whichever node's copy holds
it."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.commands.folds import Mark, check_followed_version, continues, folds, marked, remember
from app.commands.records import Misplaced, applied_id, misrouted, state_key
from app.errors import BadRecord, node_fault
from app.kafka import LogReader, Record
from app.kafka.records import RestoreProgress
from app.model.decide import StoredAggregate, fold
from app.model.user_code import UserCodeTimeout
from app.protocol.wire import EventEnvelope, decode_event, encode, unknown_system_event

if TYPE_CHECKING:
    from app.commands.states import PartitionStates

__all__ = ["restore_states"]

# The states' own logger, as before the restore had a module of its own: operators filter
# its records by that name.
logger = logging.getLogger("app.commands.states")


async def restore_states(
    states: PartitionStates,
    reader: LogReader,
    progress: RestoreProgress | None = None,
    *,
    misplaced: Callable[[int], None] | None = None,
) -> int:
    """Folds the events after the state store's offset into it; how many were read.
    `progress` hears the log offsets read and to read as it goes.

    The local states are a cache of the log: a copy that is not a prefix of the log the
    broker holds (ahead of its end: a recreated topic, another cluster), or that an
    earlier take found damaged (marked bad), is dropped and folded again from the start.

    An event outside its aggregate's partition (`misrouted`) is not folded: folded, the
    aggregate would have two states in two partitions. Not quietly: once the restore is
    done an error names how many and the first, and `misplaced` is told how many. A
    whole log of them is what partitions added to the topics leave (the aggregates moved,
    their earlier events did not); one now and then, another producer's mistake, which
    the subscription dead-letters as it reads it.
    """
    if states.store.is_bad(states.partition):
        # Dropped here, not where it was found: the earlier take's commits are
        # abandoned by now, so none of them writes into the copy folded afresh.
        logger.warning(
            "%s[%d]: local states found damaged by the last take: folding them again",
            states.events_topic,
            states.partition,
        )
        states.store.drop(states.partition)
    held = states.store.offset(states.partition)
    begin, end = await reader.offsets(states.events_topic, states.partition)
    if held is not None and held >= end:
        logger.warning(
            "%s[%d]: local states at offset %d, but the log ends at %d: "
            "not this log's copy, folding it again",
            states.events_topic,
            states.partition,
            held,
            end,
        )
        states.store.drop(states.partition)
        held = None
    start = 0 if held is None else held + 1
    if begin > start:
        # Deleted after they were folded (a retention, a DeleteRecords): the states fold
        # from what is left, not quietly (live, the follow never misses one unread).
        logger.error(
            "%s[%d]: the log starts at offset %d, past offset %d the states fold from: "
            "up to %d records were deleted unfolded (transaction markers count); if events "
            "were among them, its aggregates' states are folded from what is left and "
            "their versions may go back (a decision on one numbers its events below "
            "versions the timer table holds, and such timers never fire); keep every "
            "record of an events log (retention.ms=-1)",
            states.events_topic,
            states.partition,
            begin,
            start,
            begin - start,
        )
    began = time.monotonic()
    count = 0
    to_read = max(end - start, 0)
    if progress is not None:
        progress(0, to_read)
    # Not forgotten before the log is read: a copy taken back after a while holds ids past
    # the window at the restore's time, yet within that of an event after them (another
    # writer's request decided twice: live passed the second over). Each is judged by
    # the event's date (`_Folding`), and those past the window forgotten once it is done.
    found = Misplaced()
    marks: OrderedDict[str, Mark] = OrderedDict()  # the request folded last
    seen = _Seen()
    async with aclosing(reader.read(states.events_topic, states.partition, start)) as batches:
        async for batch in batches:
            if batch:
                _fold_records(states, batch, states.now(), found, marks, seen)
                count += len(batch)
                if progress is not None:
                    progress(min(batch[-1].offset + 1 - start, to_read), to_read)
    if progress is not None:
        progress(to_read, to_read)
    if found.count:
        found.log(states.events_topic, states.partition, states.partitions)
        if misplaced is not None:
            misplaced(found.count)
    forgotten = await states.forget_expired(states.now())
    logger.info(
        "restored %s[%d] states: %d events in %.3f s, %d request ids past the window forgotten",
        states.events_topic,
        states.partition,
        count,
        time.monotonic() - began,
        forgotten,
    )
    return count


def _fold_records(
    into: PartitionStates,
    batch: list[Record],
    now: int,
    misplaced: Misplaced,
    marks: OrderedDict[str, Mark],
    seen: _Seen,
) -> None:
    by_id: dict[str, list[tuple[EventEnvelope, int]]] = {}
    logged_at: dict[int, int] = {}  # by offset, the record's timestamp
    appliers = into.agg.appliers.keys()
    for r in batch:
        try:
            into.limits.check(r.key, r.value)
            # As the live path folds it (`decode_event`): an earlier version's event
            # included, though a strict read refuses it now.
            event, _ = decode_event(r.value, into.limits.max_record_bytes)
        except BadRecord:
            continue  # the timers subscription dead-letters it; nothing to fold
        if event.aggregate.type_name != into.agg.type_name:
            continue
        if (why := misrouted(r, event.aggregate, into.partitions)) is not None:
            misplaced.add(r, why)
            continue
        if unknown_system_event(event.type, appliers) is not None:
            continue  # refused live before it is followed (dead-lettered): never folded
        by_id.setdefault(state_key(event.aggregate), []).append((event, r.offset))
        logged_at[r.offset] = r.timestamp
    states: dict[str, bytes] = {}
    requests: list[tuple[str, str]] = []
    passed: list[tuple[str, str]] = []
    dates: dict[tuple[str, str], int] = {}
    floor = seen.newest - into.request_id_window

    def dated(e: EventEnvelope, offset: int) -> int:
        # As the live path dates it: when a node decided it (its own events' date) or
        # followed it, read once logged (another writer's, whose date is its word: 0,
        # say, and its id, kept a window live, was forgotten here, the request then
        # applied again if sent again). Never after now: a date in the future (year
        # 9999) would keep the id past any sweep, and with it every id of its batch.
        return min(max(e.created_at, logged_at[offset]), now)

    for aggregate_id, events in by_id.items():
        stored = into.stored(aggregate_id)
        state, taken, failed = _fold_each(into, aggregate_id, stored, events, marks, dated)
        if state is not None:
            states[aggregate_id] = state
            into.warn_over(aggregate_id, len(state))
        for e, offset in taken:
            # An event passed over is the log's all the same: its request was applied
            # (sent again, a duplicate), but not folded: the subscription dead-letters
            # it when it reads it (`passed_over`). One the rule does not fold marks
            # nothing, as live.
            if (failure := failed.get(id(e))) is not None:
                into.note_passed(offset, failure)
            # Kept whatever the restore's clock: within the window of a later event's
            # date, it is judged folded for it (`_Folding`); the restore's last sweep
            # forgets those past the window at its end. Not one past the window of the
            # newest date read before its batch: live, following the log, had forgotten
            # it by then (a rebuild of a long log writes no id of its old part).
            at = dated(e, offset)
            if at <= floor:
                continue
            applied = (aggregate_id, applied_id(e))
            if failure is None:
                requests.append(applied)
                dates[applied] = at  # its latest folded, as `_Folding.ids`
            else:
                passed.append(applied)
                dates.setdefault(applied, at)
    seen.newest = max(seen.newest, max(dates.values(), default=0))
    # Each id from its own event's date, as live keeps it: the batch's newest kept one
    # up to the batch's span past its window.
    into.store.write(into.partition, states, requests, batch[-1].offset, 0, passed, dates)


@dataclass(slots=True)
class _Seen:
    """What a restore has read so far: the newest date of an event of it."""

    newest: int = 0


class _Folding:
    """One aggregate's fold rule as the restore goes (`app.commands.folds`): its version,
    the request folded last and the request ids folded in this batch, each with its date
    (`dated`). One counts as folded for an event only while within the window of that
    event's date, as live kept it when it followed the event: a request decided again
    once the window forgot it (its event ids the same) folds, whatever the batch holds
    besides; one sent again within it (another writer's) does not."""

    def __init__(
        self,
        into: PartitionStates,
        aggregate_id: str,
        at: int,
        last: Mark | None,
        dated: Callable[[EventEnvelope, int], int],
    ) -> None:
        self.into, self.aggregate_id, self.at, self.last = into, aggregate_id, at, last
        self.dated = dated
        self.ids: dict[str, int] = {}

    def folds(self, event: EventEnvelope, offset: int) -> bool:
        rid = applied_id(event)
        following = continues(self.last, rid, offset, event.id, event.version)
        if following or event.version > self.at:
            into = self.into
            since = self.dated(event, offset) - into.request_id_window
            # Its latest date, in this batch or (written at it) an earlier one's.
            held = self.ids.get(rid)
            folded = (
                held > since
                if held is not None
                else into.store.folded(into.partition, self.aggregate_id, rid, since)
            )
        else:
            folded = False  # at or behind, not the next of a request: no either way
        # As live: the next of the request folded last only while its id is kept (past
        # the window, an event at the aggregate's version is passed over).
        return folds(event.version, self.at, folded=folded, continues=following and folded)

    def folded(self, event: EventEnvelope, offset: int) -> None:
        rid = applied_id(event)
        self.at = max(self.at, event.version)  # as `fold` sets it
        self.last = marked(self.last, rid, offset, event.id, event.version)
        self.ids[rid] = self.dated(event, offset)


def _fold_each(
    into: PartitionStates,
    aggregate_id: str,
    stored: StoredAggregate | None,
    events: list[tuple[EventEnvelope, int]],
    marks: OrderedDict[str, Mark],
    dated: Callable[[EventEnvelope, int], int],
) -> tuple[bytes | None, list[tuple[EventEnvelope, int]], dict[int, Exception]]:
    """The aggregate's bytes after those of `events` (with their offsets) the rule folds,
    its appliers take and whose result can be written (None: nothing to write); the
    events the rule folds, with their offsets; and why each of those passed over was, by
    its `id()`: one an applier raises on, or that makes an aggregate no encoder writes
    (the subscription dead-letters it when it follows it; a restore reads it again each
    time). `marks`: the request folded last into each aggregate, updated; `dated`: the date
    an event's request id is kept from (`_Folding`)."""
    agg, at = into.agg, 0 if stored is None else stored.version
    rule = _Folding(into, aggregate_id, at, marks.get(aggregate_id), dated)
    taken: list[tuple[EventEnvelope, int]] = []
    for e, offset in events:  # as if each folds: the rule's inputs follow from versions
        if rule.folds(e, offset):
            rule.folded(e, offset)
            taken.append((e, offset))
    if not taken:
        return None, [], {}
    try:
        version = at
        for e, _ in taken:
            check_followed_version(e.version, version)
            version = max(version, e.version)
        whole = encode(fold(agg, stored, [e for e, _ in taken]))
        remember(marks, aggregate_id, rule.last)
        return whole, taken, {}
    except Exception as exc:
        if node_fault(exc):
            raise
    # One failed: each alone, the rule told what each one that fails leaves unchanged.
    rule = _Folding(into, aggregate_id, at, marks.get(aggregate_id), dated)
    current: StoredAggregate | None = stored
    passed: dict[int, Exception] = {}
    state: bytes | None = None
    taken = []
    for e, offset in events:
        if not rule.folds(e, offset):
            continue
        taken.append((e, offset))
        try:
            check_followed_version(e.version, 0 if current is None else current.version)
            after = fold(agg, current, [e])
            state, current = encode(after), after
        except UserCodeTimeout:
            # The machine's load or the timeout, not the event's: passed over, the
            # restored state would differ from the live one. The restore fails (taken
            # again; the node stops loudly if it never passes: raise the timeout).
            raise
        except Exception as exc:
            if node_fault(exc):
                raise
            logger.warning("restore passes over event %s (%s): %r", e.id, e.type, exc)
            passed[id(e)] = exc.with_traceback(None)  # its frames let go
            continue  # as live: its request id passed over, the aggregate as it was
        rule.folded(e, offset)
    remember(marks, aggregate_id, rule.last)
    return state, taken, passed
