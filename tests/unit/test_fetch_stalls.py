"""Whether a partition read has stood still for too long (`app.kafka.fetch_stalls`), the
decision alone: a poll that hands a record of it out, moves it, or sees a fetch of it
answered starts its time over, and so does a pause; `STALL_S` of none, it is looked at,
and stalled only with records waiting behind its position (its end as read_committed sees
it). The readers over aiokafka: `test_fetch_stalled_readers`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.kafka.fetch_stalls import STALL_S, FetchStalled, FetchStalls, Key
from app.kafka.in_log_refusals import FetchRefused
from app.kafka.ports import POLL_FAILING_S

TOPIC = "t"
KEY: Key = (TOPIC, 0)

_EVENTS = st.sampled_from(["nothing", "handed", "moved", "answered", "paused"])


@given(st.lists(st.tuples(st.floats(0, 40, allow_nan=False), _EVENTS), max_size=60))
def test_a_partition_is_due_only_after_the_bound_with_no_progress(
    steps: list[tuple[float, str]],
) -> None:
    """Polls `gap` apart: one that hands a record of it out, moves it (a seek, an
    assignment) or sees a fetch of it answered starts its time over, and so does one that
    finds it paused (not fetched: forgotten); due at the first poll `STALL_S` after that."""
    stalls, now = FetchStalls(), 0.0
    moves, answered, since = 0, 0, None
    for gap, event in steps:
        now += gap
        moves += event == "moved"
        answered += event == "answered"
        if event == "paused":
            assert stalls.seen({}, (), now) == []
            since = None
            continue
        due = stalls.seen({KEY: (moves, answered)}, {KEY} if event == "handed" else (), now)
        if since is None or event != "nothing":
            since = now
        assert due == ([KEY] if now - since >= STALL_S else [])


def test_a_due_partition_behind_its_end_is_stalled_else_watched_anew() -> None:
    stalls = FetchStalls()
    assert stalls.stall_s == POLL_FAILING_S
    assert stalls.seen({KEY: 1}, (), 0.0) == []
    assert stalls.seen({KEY: 1}, (), STALL_S) == [KEY]
    # Read to its end (or held there by an open transaction), or either not known.
    for position, end in ((7, 7), (8, 7), (None, 7), (7, None)):
        assert stalls.looked(KEY, 1, position, end, STALL_S) is None
        assert stalls.seen({KEY: 1}, (), 2 * STALL_S - 1) == [], "a bound anew"
        assert stalls.seen({KEY: 1}, (), 2 * STALL_S) == [KEY]
        stalls = FetchStalls()
        stalls.seen({KEY: 1}, (), 0.0)
        stalls.seen({KEY: 1}, (), STALL_S)
    assert stalls.looked(KEY, 2, 6, 7, STALL_S) is None, "moved or answered while asked"
    assert stalls.seen({KEY: 2}, (), 2 * STALL_S - 1) == [], "a bound anew from the look"
    assert stalls.seen({KEY: 2}, (), 2 * STALL_S) == [KEY]
    stalled = stalls.looked(KEY, 2, 6, 7, 2 * STALL_S + 1)
    assert isinstance(stalled, FetchStalled) and isinstance(stalled, FetchRefused)
    assert str(stalled).startswith(
        f"{TOPIC}[0]: no fetch of it was answered for 61 s while records wait (its "
        "position 6, its end 7)"
    )
    assert "leader" in str(stalled) and "CorruptRecordException" in str(stalled)
    assert stalls.looked((TOPIC, 9), 1, 0, 1, 0.0) is None, "not watched: nothing to say"


def test_a_clock_gone_back_stalls_nothing_and_a_partition_let_go_is_forgotten() -> None:
    stalls = FetchStalls()
    stalls.seen({KEY: 1}, (), 1_000.0)
    assert stalls.seen({KEY: 1}, (), 10.0) == [], "watched anew from 10"
    assert stalls.seen({KEY: 1}, (), 10.0 + STALL_S - 1) == []
    assert stalls.seen({KEY: 1, (TOPIC, 1): 1}, (), 10.0 + STALL_S) == [KEY]
    assert stalls.seen({(TOPIC, 1): 1}, (), 10.0 + 3 * STALL_S) == [(TOPIC, 1)]
    assert stalls.seen({KEY: 1}, (), 10.0 + 3 * STALL_S) == [], "revoked, given back: anew"
