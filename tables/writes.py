"""What each write does to the row the store holds: pure decisions both backends share.

Each function takes the row the store holds (or None) and the request, and returns the
row to write, or None when the request does nothing. The backends only read rows, call
these, and apply what they return, so the memory and RocksDB stores cannot drift apart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from tables.timer import ACTIVE, Outcome, Timer, TimerChange, TimerStatus

__all__ = [
    "Write",
    "cancel_row",
    "check_change",
    "plan_cancel",
    "plan_settle",
    "put_row",
    "settle_row",
]

logger = logging.getLogger(__name__)


class Write(NamedTuple):
    """One row to write: `old` is the row the store held when the write was decided; `new`
    None deletes it (a tombstone in the changelog)."""

    partition: int
    row: bytes
    old: Timer | None
    new: Timer | None


def put_row(held: Timer | None, timer: Timer) -> Timer | None:
    """`timer`, PENDING, unless `held` is at a later version or is this very timer (its id)."""
    if held is not None and (held.version > timer.version or held.id == timer.id):
        return None
    if timer.status is TimerStatus.PENDING:
        return timer
    return timer.model_copy(update={"status": TimerStatus.PENDING})


def cancel_row(held: Timer | None, version: int) -> Timer | None:
    """`held` CANCELLED at `version`, when it is still active and held at `version` or earlier.

    The row takes the cancel's version, so that no change older than the cancel (a
    replayed put of the timer, whatever its id) can write over it.
    """
    if held is None or held.status not in ACTIVE or held.version > version:
        return None
    return held.model_copy(
        update={"status": TimerStatus.CANCELLED, "outcome": Outcome.CANCELLED, "version": version}
    )


def settle_row(held: Timer | None, change: TimerChange) -> Timer | None:
    """`change.next`'s status, slot, slot due time, skipped, due time, attempts, outcome and
    last error written over `held`, while `held` is still `change.loaded` as it was loaded."""
    if held is None or not held.same_as_loaded(change.loaded):
        return None
    new = change.next
    return held.model_copy(
        update={
            "status": new.status,
            "slot": new.slot,
            "slot_due_at": new.slot_due_at,
            "skipped": new.skipped,
            "due_at": new.due_at,
            "attempts": new.attempts,
            "outcome": new.outcome,
            "error_code": new.error_code,
            "error_text": new.error_text,
        }
    )


def check_change(change: TimerChange) -> None:
    """`ValueError` unless `change.next` is the same row (owner, key, partition) as `loaded`."""
    loaded, new = change.loaded, change.next
    if new.owner != loaded.owner or new.key != loaded.key or new.partition != loaded.partition:
        raise ValueError(
            "a TimerChange must keep its row: next is "
            f"({new.owner}, {new.key!r}, partition {new.partition}), loaded is "
            f"({loaded.owner}, {loaded.key!r}, partition {loaded.partition})"
        )


LoadAsLoaded = Callable[[int, bytes, Timer], Timer | None]
"""Reads the row the store holds, `(partition, row key, loaded) -> Timer | None`; it may
answer None for a row that is there but cannot be as `loaded` (a backend's shortcut)."""


def plan_settle(
    changes: Sequence[TimerChange], rows: Sequence[bytes], load: LoadAsLoaded
) -> tuple[int, list[Write]]:
    """How many of `changes` write, and the rows to write (one per row key, in order).

    `rows[i]` is the row key of `changes[i]`. Two changes of the same row apply in order,
    the second against what the first wrote; a row no change has written yet is loaded
    for each change, against that change's `loaded`.
    """
    written: dict[tuple[int, bytes], tuple[Timer, Timer]] = {}
    count = 0
    for change, row in zip(changes, rows, strict=True):
        at = (change.loaded.partition, row)
        if at in written:
            old, held = written[at]
        else:
            loaded = load(at[0], row, change.loaded)
            if loaded is None:
                continue
            old = held = loaded
        new = settle_row(held, change)
        if new is not None:
            count += 1
            written[at] = (old, new)
    writes = [Write(partition, row, old, new) for (partition, row), (old, new) in written.items()]
    return count, writes


def plan_cancel(held: Iterable[tuple[int, bytes, Timer]], version: int) -> list[Write]:
    """The cancels of `(partition, row key, row)`s at `version` that write."""
    writes = []
    for partition, row, timer in held:
        new = cancel_row(timer, version)
        if new is not None:
            writes.append(Write(partition, row, timer, new))
    return writes
