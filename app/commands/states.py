"""The aggregate states of one partition of one aggregate type: a fold of its events log,
kept in the local state store, restored from the log (`app.commands.restore`), with the
batches staged in the partition's transaction (decided, not committed yet) laid over it."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from app.commands.batch import CommandBatch
from app.commands.folds import Mark, remember
from app.commands.records import Misplaced
from app.commands.restore import restore_states
from app.kafka import LogReader
from app.kafka.records import RestoreProgress
from app.model.aggregate import AggregateType
from app.model.decide import StoredAggregate
from app.protocol.limits import InputLimits, StateTooLarge
from app.protocol.wire import encode
from tables import StoreError
from tables.aggregate_store import AggregateStateStore

__all__ = ["Misplaced", "PartitionStates"]

logger = logging.getLogger(__name__)

_REQUEST_SWEEP = 250
"""Request ids a commit forgets at most, once past the window, when it writes fewer than
half as many (it forgets up to twice those it writes: `committed`)."""

_WARNED_MAX = 10_000
"""Aggregates remembered as warned of past the state bound (then forgotten, warned anew)."""

_PASSED_MAX = 10_000
"""Events a restore passed over remembered until the subscription reads them."""


class PartitionStates:
    """The aggregates of `agg` in `partition` and the request ids they applied: the state
    store's, under the batches staged and not committed yet (a later batch's decisions see
    an earlier one's aggregates and request ids)."""

    def __init__(
        self,
        agg: AggregateType[Any],
        partition: int,
        *,
        partitions: int,
        store: AggregateStateStore,
        limits: InputLimits,
        events_topic: str,
        request_id_window: int,
        now: Callable[[], int],
    ) -> None:
        self.agg = agg
        self.partition = partition
        self.partitions = partitions
        self.limits = limits
        self.events_topic = events_topic
        # How long an applied request id is kept to de-duplicate a command sent again.
        self.request_id_window = request_id_window
        # The node's clock (epoch ms), which a restore dates the request ids it writes by:
        # an event's `created_at` is its writer's word.
        self.now = now
        self.store = store
        # Of the batches staged and not committed yet, the latest aggregate and every applied
        # request id, each with the batch that wrote it (removed when that one commits).
        self._pending_states: dict[str, tuple[StoredAggregate, CommandBatch]] = {}
        self._pending_applied: dict[tuple[str, str], CommandBatch] = {}
        self._pending_passed: dict[tuple[str, str], CommandBatch] = {}
        # The aggregates the log grew past `max_state_bytes`, warned of once each.
        self._warned: set[str] = set()
        # Per aggregate, the request of another writer's events last followed: its id, the
        # offset of the last of them folded and their ids (`following`), oldest first.
        self._following: OrderedDict[str, Mark] = OrderedDict()
        # The events the last restore passed over, by offset, and why (`passed_over`).
        self._passed_at: OrderedDict[int, Exception] = OrderedDict()

    async def restore(
        self,
        reader: LogReader,
        progress: RestoreProgress | None = None,
        *,
        misplaced: Callable[[int], None] | None = None,
    ) -> int:
        """Folds the events after the state store's offset into it; how many were read.
        `progress` hears the log offsets read and to read as it goes; `misplaced` is told
        how many events it did not fold for being outside their aggregate's partition
        (`app.commands.restore` says how)."""
        return await restore_states(self, reader, progress, misplaced=misplaced)

    async def forget_expired(self, now: int) -> int:
        """Forgets every request id past the window; how many. Only commits sweep them
        otherwise, so a partition that decides no command would keep a local copy's ids
        for good; a take, which waits for its restore anyway, clears them."""
        forgotten = 0
        while True:
            n = self.store.expire_requests(
                self.partition, now - self.request_id_window, _REQUEST_SWEEP
            )
            forgotten += n
            if n < _REQUEST_SWEEP:
                return forgotten
            await asyncio.sleep(0)  # in bounded steps: the other partitions' tasks run between

    def encode(
        self,
        aggregate_id: str,
        before: StoredAggregate | None,
        after: StoredAggregate,
        *,
        logged: bool = False,
    ) -> bytes:
        """`after`'s bytes as the store keeps them. Past `max_state_bytes`, a decision's is
        refused (`StateTooLarge`) unless it does not grow the aggregate (one grown past the
        bound by the log, or under a larger bound before, must take what shrinks it); the
        log's (`logged`: another writer's events followed) never is: the log is the truth,
        refused here it would be lost, so it is folded and warned of."""
        state = encode(after)
        size, bound = len(state), self.limits.max_state_bytes
        if size <= bound:
            return state
        if logged:
            self.warn_over(aggregate_id, size)
        elif size > (0 if before is None else len(encode(before))):
            raise StateTooLarge(
                f"the decision would grow the aggregate's state to {size} bytes, over "
                f"{bound} (TICKWHEEL_MAX_STATE_BYTES): nothing of it is written"
            )
        return state

    def warn_over(self, aggregate_id: str, size: int) -> None:
        bound = self.limits.max_state_bytes
        if size <= bound or aggregate_id in self._warned:
            return
        if len(self._warned) >= _WARNED_MAX:
            self._warned.clear()  # bounded memory; a few warnings again at worst
        self._warned.add(aggregate_id)
        logger.warning(
            "%s[%d]: the log grew %s's state to %d bytes, over %d (TICKWHEEL_MAX_STATE_BYTES):"
            " folded all the same; commands that grow it further are refused",
            self.events_topic,
            self.partition,
            aggregate_id,
            size,
            bound,
        )

    def stored(self, aggregate_id: str) -> StoredAggregate | None:
        """The aggregate as the last batch staged left it, or as the store keeps it; None
        when it has no events yet."""
        pending = self._pending_states.get(aggregate_id)
        if pending is not None:
            return pending[0]
        raw = self.store.get(self.partition, aggregate_id)
        if raw is None:
            return None
        try:
            # Its validator, as `model_validate_json` calls it without its keywords (#20).
            loaded: StoredAggregate = StoredAggregate.__pydantic_validator__.validate_json(raw)
            return loaded
        except ValidationError as exc:
            # The local copy is damaged, not the log. Marked bad (it reads as empty and
            # takes no write), not dropped now: a commit of this take still in flight would
            # write its batch and a recent offset into a copy opened afresh, and the retake
            # would fold only the events after it (the other aggregates lost). The retake
            # this node fault causes drops it.
            logger.error(
                "%s[%d]: local state of %s unreadable (%s): the partition's states are "
                "folded again from the log by its next take",
                self.events_topic,
                self.partition,
                aggregate_id,
                exc.errors()[0]["msg"],
            )
            self.store.mark_bad(self.partition)
            raise StoreError(
                f"local state of {aggregate_id} unreadable; states to fold again",
                partition=self.partition,
            ) from exc

    def applied(self, batch: CommandBatch, applied: tuple[str, str]) -> bool:
        """Whether the aggregate `applied[0]` applied the request id `applied[1]`: in
        `batch`, in a batch staged, or committed and still within the window (folded or
        passed over: a command sent again is a duplicate)."""
        return (
            applied in batch.applied
            or applied in self._pending_applied
            or applied in batch.passed
            or applied in self._pending_passed
            or self.store.seen(self.partition, *applied)
        )

    def folded(self, batch: CommandBatch, applied: tuple[str, str]) -> bool:
        """Whether an event of the request id `applied[1]` was folded into the aggregate
        `applied[0]` (or decided here): as `applied`, less those only passed over."""
        return (
            applied in batch.applied
            or applied in self._pending_applied
            or self.store.folded(self.partition, *applied)
        )

    def following(self, batch: CommandBatch, aggregate_id: str) -> Mark | None:
        """The request of another writer's events the live follow last folded into the
        aggregate: its id, the offset of the last of them and their ids (its later events
        are folded too, not those folded already); None once this node decided for it
        since."""
        if aggregate_id in batch.following:
            return batch.following[aggregate_id]
        return self._following.get(aggregate_id)

    def note_passed(self, offset: int, why: Exception) -> None:
        if len(self._passed_at) >= _PASSED_MAX:
            self._passed_at.popitem(last=False)  # its event is folded by the follow, or not
        self._passed_at[offset] = why

    def passed_over(self, offset: int) -> Exception | None:
        """Why the restore passed over the event at `offset` (forgotten once asked): the
        subscription dead-letters it for that, neither folding it after the events the
        restore folded beyond it, nor taking it for folded by its request id (another
        event of its request may have been)."""
        return self._passed_at.pop(offset, None) if self._passed_at else None

    def staged(self, batch: CommandBatch) -> None:
        """The batch waits for the partition's next commit: what it decided counts for the
        batches decided after it."""
        for aid, stored in batch.staged.items():
            self._pending_states[aid] = (stored, batch)
        for applied in batch.applied:
            self._pending_applied[applied] = batch
        for applied in batch.passed:
            self._pending_passed[applied] = batch
        for aid, mark in batch.following.items():
            remember(self._following, aid, mark)

    def committed(self, batch: CommandBatch, written: Sequence[int]) -> None:
        """Writes the batch's aggregate states once its transaction committed; `written`:
        the offsets its records were written at."""
        for aid in batch.staged:
            if (pending := self._pending_states.get(aid)) is not None and pending[1] is batch:
                del self._pending_states[aid]
        for applied in batch.applied:
            if self._pending_applied.get(applied) is batch:
                del self._pending_applied[applied]
        for applied in batch.passed:
            if self._pending_passed.get(applied) is batch:
                del self._pending_passed[applied]
        last_event = max(
            (o for rec, o in zip(batch.out, written, strict=True) if rec[0] == self.events_topic),
            default=None,
        )
        # Never back: the log read may trail this node's own events committed before.
        marks = (last_event, batch.log_offset, self.store.offset(self.partition))
        known = [o for o in marks if o is not None]
        self.store.write(
            self.partition,
            {a: batch.encoded.get(a) or encode(s) for a, s in batch.staged.items()},
            batch.applied,
            max(known) if known else None,
            batch.now,
            batch.passed,
        )
        # Bounded, so that a commit never waits long for it; the next commits go on. Yet no
        # fewer than twice the ids it wrote: a fixed bound below what each batch writes
        # left the ids expiring past it on disk for good under a steady load (only a take
        # sweeps them all), and twice drains a backlog (a burst's) as the load goes on.
        written_ids = len(batch.applied) + len(batch.passed)
        self.store.expire_requests(
            self.partition,
            batch.now - self.request_id_window,
            max(_REQUEST_SWEEP, 2 * written_ids),
        )
