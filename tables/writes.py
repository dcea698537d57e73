"""What each write does to the row the store holds: pure decisions both backends share.

Each function takes the row the store holds (or None) and the request, and returns the
row to write, or None when the request does nothing. The backends only read rows, call
these, and apply what they return, so the memory and RocksDB stores cannot drift apart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Final, NamedTuple

from tables.copies import copied
from tables.slots import Slot, caught_up, jittered_due
from tables.timer import ACTIVE, Outcome, Timer, TimerChange, TimerStatus

__all__ = [
    "Write",
    "alike",
    "cancel_row",
    "check_change",
    "pause_row",
    "plan_cancel",
    "plan_settle",
    "put_row",
    "resume_row",
    "rewritten",
    "sent_at_its_version",
    "settle_row",
    "slot_left",
]

logger = logging.getLogger(__name__)


class Write(NamedTuple):
    """One row to write: `old` is the row the store held when the write was decided; `new`
    None deletes it (a tombstone in the changelog)."""

    partition: int
    row: bytes
    old: Timer | None
    new: Timer | None


def put_row(held: Timer | None, timer: Timer, deleted: int | None = None) -> Timer | None:
    """`timer`, PENDING, unless `held` is at a later version, is this very timer (its id),
    or is at `timer`'s version and has sent a command at it (`sent_at_its_version`), or
    its owner is deleted at its version or later (`deleted`: the version of the owner's
    deletion mark, `tables.tombstones`).

    A set at the held version with another id is what one command's events do (the key set
    twice, or cancelled and set again: the last one wins). After the held timer fired,
    though, it is the set read again under another id (a producer's retry that wrote the
    event anew; a command's earlier set of the key read back after its later one fired):
    written, it would revive a timer that fired and send its command again. Before it
    fired, such a retry (`rewritten`: the same rule, target and command) is passed over
    too: the held timer keeps its id, so its request id is the one a timer that did fire
    sent (a rebuild replays both sets before anything fires: the retry written, its timer
    would send the command under a new request id, and the target apply it again).

    Written at `held`'s version, the timer keeps `held`'s `cancel_id`: the cancel before
    it in its command, which read again (`cancel_row`) must not cancel it."""
    if held is not None and (held.version > timer.version or held.id == timer.id):
        return None
    if deleted is not None and deleted >= timer.version:
        return None
    if (
        held is not None
        and held.version == timer.version
        and (sent_at_its_version(held) or rewritten(held, timer))
    ):
        return None
    update: dict[str, object] = {}
    if timer.status is not TimerStatus.PENDING:
        update["status"] = TimerStatus.PENDING
    if held is not None and held.version == timer.version and held.cancel_id is not None:
        update["cancel_id"] = held.cancel_id
    return copied(timer, update) if update else timer


def rewritten(held: Timer, timer: Timer) -> bool:
    """Whether `timer`, a set at `held`'s version under another id, is `held`'s set written
    again: `held` is PENDING (not cancelled, nor paused: a set after a cancel or a pause in
    one command replaces it) with the same rule, target and command (its key is the row's).
    Nothing else tells a producer's retry from the key set twice alike in one command, and
    there keeping the first changes only what its id and its event's time pick (its
    request ids, a jittered due time, a recurring rule's first slot)."""
    return held.status is TimerStatus.PENDING and alike(held, timer)


def alike(held: Timer, timer: Timer) -> bool:
    """Whether `held` and `timer` set the same: the same rule, target and command, whatever
    became of `held` since (a read-back finds a row its set stored, fired or parked
    since)."""
    return held.rule == timer.rule and held.target == timer.target and held.command == timer.command


_HAS_SENT: Final = frozenset({TimerStatus.FIRING, TimerStatus.FIRED, TimerStatus.PARKED})
"""The statuses of a timer that sent its command (or is sending it)."""


def sent_at_its_version(held: Timer) -> bool:
    """Whether `held` sent a command (or is sending one) at its version: in flight, fired,
    parked, or PENDING with a slot attempted or passed over (an outcome). Not a cancelled
    one (a set after its cancel is a new timer), nor a paused one: a pause gives the row
    its own version and keeps the outcome of an earlier one's slots, and a set after it in
    one command must replace it. (A resume does the same, and a set after a resume of its
    key in one command is passed over when the timer had sent a slot before its pause: a
    set alone replaces a paused timer, no resume needed.)"""
    return held.status in _HAS_SENT or (
        held.status is TimerStatus.PENDING and held.outcome is not None
    )


def cancel_row(
    held: Timer | None, version: int, at: int | None = None, by: str | None = None
) -> Timer | None:
    """`held` CANCELLED at `version`, when it is still active and held at `version` or
    earlier, unless `by` (the cancel's event id) is `held`'s `cancel_id` at `version`.

    The row takes the cancel's version, so that no change older than the cancel (a
    replayed put of the timer, whatever its id) can write over it. With `at`, when the
    cancel was read (`tables.tombstones.CancelMark.at`), it is finished no earlier than
    then: its `due_at` becomes the later of its own and `at`, from which the retention
    sweep counts (`tables.keys.finished_at`), as `tables.tombstones.tombstone` moves a
    FIRED row. Kept at the old due time of a timer overdue, paused or parked for longer
    than the retention, the row would be swept at once, and an older set read after the
    cancel (reordered by its producer) would find no row and write the timer again.
    Without `at` (a caller's own cancel, no event read) the due time is kept.

    The row notes `by` (`Timer.cancel_id`), and a set after the cancel in its command
    keeps it (`put_row`): the same cancel read again (a producer's retry appending the
    command's events twice) finds its id at its version and leaves the set's timer alone.
    Else it would cancel it, and the set's own copy, the same id, would not write it again.
    """
    if held is None or held.status not in ACTIVE or held.version > version:
        return None
    if by is not None and held.version == version and held.cancel_id == by:
        return None
    update: dict[str, object] = {
        "status": TimerStatus.CANCELLED,
        "outcome": Outcome.CANCELLED,
        "version": version,
    }
    if by is not None or held.cancel_id is not None:
        update["cancel_id"] = by
    if at is not None and at > held.due_at:
        update["due_at"] = at
    if held.parked_when_paused:
        update["parked_when_paused"] = False  # a PAUSED row's alone
    return copied(held, update)


PAUSABLE = frozenset({TimerStatus.PENDING, TimerStatus.FIRING, TimerStatus.PARKED})
"""What a pause holds: a running timer, or a PARKED one (which an operator's retry would
otherwise send while its owner holds it paused); a FIRED or CANCELLED one is done."""


def pause_row(held: Timer | None, version: int) -> Timer | None:
    """`held` PAUSED at `version`, when it is PENDING, FIRING or PARKED and held at
    `version` or earlier; its rule, slot, attempts and outcome kept.

    A FIRING row's claim is given up: its `due_at` (the claim's deadline) becomes its
    slot's own firing time, so that a resume sends the slot again (with its request id:
    a send that did reach the target is answered DUPLICATE). A PARKED row is marked
    `parked_when_paused`: an operator's retry or skip passes over it while it is paused
    (they act on PARKED rows), and its resume parks it again. The row takes the pause's
    version, so that no older change (a replayed put) writes over it.
    """
    if held is None or held.status not in PAUSABLE or held.version > version:
        return None
    update: dict[str, object] = {"status": TimerStatus.PAUSED, "version": version}
    if held.status is TimerStatus.FIRING:
        update["due_at"] = jittered_due(held.rule, held.id, Slot(held.slot, held.slot_due_at))
    elif held.status is TimerStatus.PARKED:
        update["parked_when_paused"] = True
    return copied(held, update)


def resume_row(held: Timer | None, version: int, now: int) -> Timer | None:
    """`held` running again (PENDING) at `version`, when it is PAUSED and held at
    `version` or earlier; None otherwise (a running timer's resume does nothing).

    It catches up at `now` (the resume's own time, so that a replay decides the same) by
    its rule's policy: a coalescing rule whose later slots came due while it was paused
    moves to the latest one due, the ones passed over counted as skipped; a rule that
    does not coalesce keeps its slot and the runner sends each slot in turn. A slot still
    to come keeps its due time. Expiry is the runner's, as for any late slot.

    A timer that was PARKED when paused (`parked_when_paused`) is PARKED again, as it
    was: its resume sends nothing, an operator's retry does (or a skip drops it), and
    neither catch-up nor expiry applies to it before then, as to any parked timer.
    """
    if held is None or held.status is not TimerStatus.PAUSED or held.version > version:
        return None
    if held.parked_when_paused:
        return copied(
            held,
            {"status": TimerStatus.PARKED, "version": version, "parked_when_paused": False},
        )
    catch = caught_up(held.rule, Slot(held.slot, held.slot_due_at), now)
    if catch.slot.index <= held.slot:
        return copied(held, {"status": TimerStatus.PENDING, "version": version})
    moved: dict[str, object] = {
        "status": TimerStatus.PENDING,
        "version": version,
        "slot": catch.slot.index,
        "slot_due_at": catch.slot.due_at,
        "due_at": jittered_due(held.rule, held.id, catch.slot),
        "attempts": 0,
        "skipped": held.skipped + catch.skipped,
    }
    return copied(held, {**moved, **slot_left(held)})


def slot_left(timer: Timer) -> dict[str, object]:
    """What a move of `timer` to another slot clears besides the slot's own fields: an
    operator's retry's horizon (`retry_until`) was its slot's alone. Nothing when there is
    none, so the row is as before the field existed."""
    return {} if timer.retry_until is None else {"retry_until": None}


def settle_row(held: Timer | None, change: TimerChange) -> Timer | None:
    """`change.next`'s status, slot, slot due time, skipped, due time, attempts, outcome,
    last error and `retry_until` written over `held`, while `held` is still
    `change.loaded` as it was loaded."""
    if held is None or not held.same_as_loaded(change.loaded):
        return None
    new = change.next
    return copied(
        held,
        {
            "status": new.status,
            "slot": new.slot,
            "slot_due_at": new.slot_due_at,
            "skipped": new.skipped,
            "due_at": new.due_at,
            "attempts": new.attempts,
            "outcome": new.outcome,
            "error_code": new.error_code,
            "error_text": new.error_text,
            "retry_until": new.retry_until,
        },
    )


def check_change(change: TimerChange) -> None:
    """`ValueError` unless `change.next` is the same row (owner, key, partition) as `loaded`."""
    loaded, new = change.loaded, change.next
    # The owner compared by identity first: a change's next is a copy of its loaded row.
    owner_moved = new.owner is not loaded.owner and new.owner != loaded.owner
    if owner_moved or new.key != loaded.key or new.partition != loaded.partition:
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


def plan_cancel(
    held: Iterable[tuple[int, bytes, Timer]],
    version: int,
    at: int | None = None,
    by: str | None = None,
) -> list[Write]:
    """The cancels of `(partition, row key, row)`s at `version`, read at `at`, by event `by`
    (`cancel_row`), that write."""
    writes = []
    for partition, row, timer in held:
        new = cancel_row(timer, version, at, by)
        if new is not None:
            writes.append(Write(partition, row, timer, new))
    return writes
