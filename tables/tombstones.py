"""The rows a cancel or an owner's deletion leaves where it found no timer: pure decisions.

A change older than the row the store holds does nothing (`tables.writes.put_row`), so a
later version supersedes an earlier one whatever the order the log is read in, as long
as the later change leaves a row. A cancel read before the set it cancels (a producer
whose retries reorder two sends, or who writes out of order) found no row, wrote none,
and the older set then wrote its timer, which fired. Now:

- a cancel of a key that holds no row writes a *tombstone*: a CANCELLED row at the
  cancel's version (`tombstone`), which an older set meets as any cancelled row;
- an owner's deletion (`wow.AggregateDeleted`) writes its *deletion mark* (`deletion_mark`)
  under `DELETED_KEY`, a key no new timer can have: a set of the owner at the deletion's
  version or earlier is passed over, whatever its key (`deleted_through`).

Both are CANCELLED rows a store of an older version reads as any (its `ACTIVE` set leaves
them alone), finished at the time of the event that wrote them (`CancelMark.at`): the
retention sweep deletes them `finished_retention` after it, with the other finished rows.
A set read later than that after its cancel finds nothing, as a set replayed past a fired
timer's retention does.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from tables.copies import copied
from tables.refs import AggregateRef
from tables.rules import OnceRule
from tables.timer import CommandSpec, Outcome, Timer, TimerStatus

__all__ = [
    "DELETED_KEY",
    "OWNER_DELETED",
    "UNSET",
    "CancelMark",
    "deleted_through",
    "deletion_mark",
    "is_deletion_mark",
    "tombstone",
]

DELETED_KEY: Final = "\x00deleted"
"""The key of an owner's deletion mark: a new timer's key holds no control character
(`tables.refs.Identifier`), so no timer set since keys its row so."""

UNSET: Final = "wow.ScheduleCancelled"
"""A tombstone's command type: it was never set, only cancelled (it sends nothing)."""

OWNER_DELETED: Final = "wow.AggregateDeleted"
"""A deletion mark's command type (it sends nothing)."""


class CancelMark(NamedTuple):
    """Where and when a cancel (or a deletion) was read, for the row it may leave: its
    owner's partition, the event's id and its own time (epoch ms, so that a replay writes
    the same row)."""

    partition: int
    id: str
    at: int


def _stand_in(owner: AggregateRef, key: str, version: int, mark: CancelMark, kind: str) -> Timer:
    timer: Timer = Timer.model_validate(
        {
            "id": mark.id,
            "owner": owner,
            "key": key,
            "version": version,
            "partition": mark.partition,
            "status": TimerStatus.CANCELLED,
            "rule": OnceRule(at=mark.at),
            "target": owner,
            "command": CommandSpec(type=kind),
            "slot_due_at": mark.at,
            "due_at": mark.at,
            "outcome": Outcome.CANCELLED,
        }
    )
    return timer


def tombstone(
    held: Timer | None, owner: AggregateRef, key: str, version: int, mark: CancelMark
) -> Timer | None:
    """What a cancel at `version` leaves where `cancel_row` cancels nothing: a tombstone
    when `held` is None; `held` CANCELLED at `version` when it is finished (CANCELLED or
    FIRED) at an earlier one, so that a set between the two, read after, is passed over
    too (a key set again after it fired, then cancelled); None otherwise (the deletion
    mark's key is never cancelled). A row moved so is finished when the cancel was read
    (`CancelMark.at`), as a tombstone: the retention sweep counts from its `due_at`, and
    kept from its old one it could go at once, and the set with it. Either notes the
    cancel's id (`Timer.cancel_id`), as `tables.writes.cancel_row` does, for a set after
    it in its command to keep."""
    if key == DELETED_KEY:
        return None
    if held is None:
        return copied(_stand_in(owner, key, version, mark, UNSET), {"cancel_id": mark.id})
    if held.status in _FINISHED and held.version < version:
        # CANCELLED, not FIRED at the later version: a set of the same command after the
        # cancel (at its version) replaces a cancelled row, never one that sent.
        update = {"status": TimerStatus.CANCELLED, "outcome": Outcome.CANCELLED}
        moved = {"version": version, "due_at": max(held.due_at, mark.at), "cancel_id": mark.id}
        return copied(held, {**update, **moved})
    return None


_FINISHED: Final = frozenset({TimerStatus.CANCELLED, TimerStatus.FIRED})


def deletion_mark(
    held: Timer | None, owner: AggregateRef, version: int, mark: CancelMark
) -> Timer | None:
    """The deletion mark of `owner` at `version`, unless `held` (its mark, or None) is at
    `version` or later."""
    if held is not None and held.version >= version:
        return None
    return _stand_in(owner, DELETED_KEY, version, mark, OWNER_DELETED)


def deleted_through(mark: Timer | None) -> int | None:
    """The version up to which the owner of deletion mark `mark` is deleted (None: no
    mark): its sets at that version or earlier are passed over."""
    return None if mark is None else mark.version


def is_deletion_mark(timer: Timer) -> bool:
    """Whether `timer` is an owner's deletion mark, not a timer (an operator's view leaves
    it out)."""
    return timer.key == DELETED_KEY
