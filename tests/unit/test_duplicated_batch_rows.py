"""A command's events on a key appended twice (another service's producer retrying a batch
without idempotence: the same events, the same ids, the copy after the original) change
nothing: the row is the one the events read once leave (`tables.writes.cancel_row`,
`put_row`, `tables.tombstones.tombstone`, as the store applies them). Before, a key
cancelled and set again in one command ([cancel, set] at one version) ended CANCELLED
when the cancel was read again: it cancelled the set's timer, at its own version, and the
set read again, the same id, did not write it back. Pure, so hypothesis holds the rules to
every row held before, every order of the command's cancel and set, and every run of them
appended again anywhere after itself."""

from __future__ import annotations

from dataclasses import dataclass

from fakes import OWNER, T0, slot_timer
from hypothesis import given
from hypothesis import strategies as st

from tables.copies import copied
from tables.timer import ACTIVE, Outcome, Timer, TimerStatus
from tables.tombstones import CancelMark, tombstone
from tables.writes import cancel_row, put_row

KEY = "remind"
V = 4  # the command's version
MADE = T0 - 1_000  # every event's own time


@dataclass(frozen=True)
class Cancel:
    id: str
    version: int = V


@dataclass(frozen=True)
class Set:
    timer: Timer


Event = Cancel | Set


def read(held: Timer | None, events: list[Event]) -> Timer | None:
    """The row after `events`, applied as the store applies them: a cancel that cancels
    nothing leaves its tombstone (`PartitionedStore.cancel`)."""
    for event in events:
        if isinstance(event, Cancel):
            new = cancel_row(held, event.version, MADE, event.id)
            if new is None:
                mark = CancelMark(0, event.id, MADE)
                new = tombstone(held, OWNER, KEY, event.version, mark)
        else:
            new = put_row(held, event.timer)
        if new is not None:
            held = new
    return held


EARLIER = slot_timer(id="set-3", key=KEY, version=3)
BEFORE: list[Timer | None] = [
    None,
    EARLIER,
    copied(EARLIER, {"status": TimerStatus.FIRED, "outcome": Outcome.COMMITTED}),
    copied(EARLIER, {"status": TimerStatus.PAUSED}),
    tombstone(None, OWNER, KEY, 3, CancelMark(0, "cancel-3", MADE)),
]
CANCEL = Cancel("cancel-4")
SET = Set(slot_timer(id="set-4", key=KEY, version=V, command=EARLIER.command))
COMMANDS: list[list[Event]] = [[CANCEL], [SET], [CANCEL, SET], [SET, CANCEL]]


@st.composite
def appended_again(draw: st.DrawFn) -> tuple[list[Event], list[Event]]:
    """A command's events, and the log holding them with a run of them appended again
    somewhere after that run."""
    events = draw(st.sampled_from(COMMANDS))
    start = draw(st.integers(0, len(events) - 1))
    end = draw(st.integers(start + 1, len(events)))
    at = draw(st.integers(end, len(events)))
    return events, events[:at] + events[start:end] + events[at:]


@given(st.sampled_from(BEFORE), appended_again())
def test_a_run_of_a_commands_events_read_again_changes_nothing(
    before: Timer | None, logged: tuple[list[Event], list[Event]]
) -> None:
    events, log = logged
    once = read(before, events)
    assert read(before, log) == once
    # A later command's cancel still cancels the timer.
    later = read(read(before, log), [Cancel("cancel-5", V + 1)])
    assert later is not None
    assert later.status not in ACTIVE and later.version == V + 1


def test_a_reschedule_appended_twice_keeps_the_timer_it_set() -> None:
    """The bug report's log: cancel k@4, set k@4 (id set-4), then both again."""
    row = read(EARLIER, [CANCEL, SET, CANCEL, SET])
    assert row is not None
    assert (row.id, row.status, row.version) == ("set-4", TimerStatus.PENDING, V)


def test_another_cancel_of_the_command_after_its_set_still_cancels_it() -> None:
    """[cancel, set, cancel] in one command (two cancel events, two ids): cancelled, as the
    last event says; only the same cancel read again is passed over."""
    row = read(EARLIER, [CANCEL, SET, Cancel("cancel-4b")])
    assert row is not None
    assert (row.id, row.status) == ("set-4", TimerStatus.CANCELLED)
