"""Which operators' retry/skip requests a partition carried out, by request id
(`AppliedOps`): what makes a request sent again under its request id (`tickwheel timers
retry --request-id`, after a send that failed or timed out) a DUPLICATE in each partition,
as a command sent again is, for the node's de-duplication window
(`TICKWHEEL_REQUEST_ID_WINDOW_MS`). Without it, a retry sent twice retried the timers that
parked again in between (firing them once more than asked), and a skip sent twice skipped
timers parked since.

The timer-ops topic is their log: a take reads its partition of it again
(`read_applied_ops`), as the aggregates' states are folded again from theirs, so whichever
node owns the partition knows them; the partition's cycles then note each request they
carry out (`note`). A request's copy read at or after the partition's committed offset is
delivered again to its cycle, at its own offset: never a duplicate of itself."""

from __future__ import annotations

import logging
from collections import OrderedDict
from contextlib import aclosing
from typing import Final

from app.errors import BadRecord
from app.kafka import LogReader, Record
from app.protocol.limits import InputLimits
from app.protocol.request_window import ahead_of_clock, written_ago
from app.protocol.wire import TimerOp, decode

__all__ = ["MAX_APPLIED_OPS", "AppliedOps", "read_applied_ops"]

logger = logging.getLogger(__name__)

MAX_APPLIED_OPS: Final = 10_000
"""The request ids a partition keeps at most (the newest): anyone who may write to the
timer-ops topic could otherwise grow a node's memory without bound. Requests are an
operator's, a few a day; a request past it is carried out again if sent again."""


class AppliedOps:
    """The request ids one partition carried out within `window_ms`, each with the offset
    of the copy carried out and when it was carried out (epoch ms, never after the
    node's now)."""

    def __init__(self, window_ms: int, limit: int = MAX_APPLIED_OPS, skew_ms: int = 0) -> None:
        self.window_ms = window_ms
        # The hosts' clock skew allowed (`TICKWHEEL_CLOCK_SKEW_MS`): `past_window`'s margin.
        self.skew_ms = skew_ms
        self.limit = limit
        # Oldest noted first: what the window and the limit forget first.
        self._ids: OrderedDict[str, tuple[int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def duplicate_of(self, op: TimerOp, offset: int, now: int) -> int | None:
        """The offset of an earlier copy of `op`'s request carried out within the window;
        None: `op`, read at `offset`, is to be carried out."""
        held = self._ids.get(op.request_id)
        if held is None:
            return None
        first, at = held
        if first >= offset or at <= now - self.window_ms:
            return None  # itself (read back by the take), or past the window: again
        return first

    def past_window(self, op: TimerOp, record: Record, now: int) -> str | None:
        """Why `op`, read in `record`, is not carried out for being older than the window,
        or None (`app.protocol.request_window`): carried out again, it could be twice."""
        ago = written_ago(record.timestamp, op.requested_at, now, self.window_ms, self.skew_ms)
        if ago is None:
            return None
        if ago < 0:
            return ahead_of_clock(-ago, self.window_ms, self.skew_ms)
        return (
            f"asked {ago} ms ago, longer than the request-id window ({self.window_ms} ms, "
            "TICKWHEEL_REQUEST_ID_WINDOW_MS, less a margin for the clocks): whether it was "
            "carried out is forgotten, so it is not; send it again under a new request id "
            "if it was not"
        )

    def note(self, op: TimerOp, offset: int, now: int, at: int | None = None) -> None:
        """`op`, read at `offset`, was carried out at `at` (None: `now`, the node's clock as
        it carried it out). Never the sender's `requested_at` alone: one in seconds, or
        from a clock behind by the window, had its id forgotten as it was noted, and a
        copy read a moment later carried out again."""
        self._ids.pop(op.request_id, None)
        self._ids[op.request_id] = (offset, now if at is None else min(at, now))
        floor = now - self.window_ms
        while self._ids:
            _, (_, at) = next(iter(self._ids.items()))
            if at > floor and len(self._ids) <= self.limit:
                break
            self._ids.popitem(last=False)


async def read_applied_ops(
    reader: LogReader,
    topic: str,
    partition: int,
    *,
    now: int,
    window_ms: int,
    limits: InputLimits,
    skew_ms: int = 0,
) -> AppliedOps:
    """The requests of `topic[partition]` (a type's timer-ops topic, read whole: a few
    records a day) asked within the window, as its cycles would have noted them: the first
    copy of each, later copies within the window its duplicates. A record no cycle reads
    (dead-lettered when read live) is passed over; one read beyond the committed offset is
    delivered again, and carried out, as itself."""
    applied = AppliedOps(window_ms, skew_ms=skew_ms)
    async with aclosing(reader.read(topic, partition, 0)) as batches:
        async for batch in batches:
            for record in batch:
                op = _op(record, limits)
                if op is not None and applied.duplicate_of(op, record.offset, now) is None:
                    # Carried out when it was read, after it was written: the later of
                    # its record's time and its own.
                    at = max(op.requested_at, record.timestamp)
                    applied.note(op, record.offset, now, at)
    logger.debug("%s[%d]: %d operator request(s) in the window", topic, partition, len(applied))
    return applied


def _op(record: Record, limits: InputLimits) -> TimerOp | None:
    try:
        # As the cycle reads it (`TimerTableCycles._operate`).
        limits.check(record.key, record.value)
        return decode(TimerOp, record.value, limits.max_record_bytes, new_names=False)
    except BadRecord:
        return None
