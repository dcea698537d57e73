"""`jitter` on rules: each slot of a timer fires at an offset in [0, jitter) after its due
time, a pure function of the slot's request id (`tables.slots.jitter_offset`), so every
node, replay and rebuild fires it at the same instant. The row's `due_at` is the slot's
due time plus it, where the table sets it from a `wow.ScheduleSet` (`subscription`) and
where the runner moves to the next slot (`decisions`); `slot_due_at` stays unjittered, so
slot arithmetic and catch-up are as without; expiry counts from the jittered time. A rule
without it reads and writes exactly as before it existed."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from fakes import OWNER, TARGET, slot_timer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from app.cli import cli
from app.protocol.wire import SCHEDULE_SET, EventEnvelope
from app.timers.runner.decision_types import Action
from app.timers.runner.decisions import SendResult, expire_or_claim, on_outcome
from app.timers.runner.options import TimerOptions
from app.timers.subscription import PutTimer, timer_op
from tables.exceptions import InvalidRule
from tables.rules import MAX_JITTER, CronRule, IntervalRule, OnceRule, parse_rule
from tables.slots import Slot, first_slot, jitter_offset, jittered_due, next_slot
from tables.timer import Timer, TimerStatus

Y2026 = 1_767_225_600_000
MINUTE = 60_000
OPTIONS = TimerOptions()

ids = st.text(min_size=1, max_size=60)
jitters = st.integers(1, MAX_JITTER)


@settings(max_examples=300, deadline=None)
@given(request_id=ids, jitter=jitters)
def test_the_offset_is_in_range_and_the_same_every_time(request_id: str, jitter: int) -> None:
    offset = jitter_offset(request_id, jitter)
    assert 0 <= offset < jitter
    assert offset == jitter_offset(request_id, jitter)
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    assert offset == int.from_bytes(digest, "big") % jitter  # any other reader computes it


@given(request_id=ids)
def test_no_jitter_is_no_offset(request_id: str) -> None:
    assert jitter_offset(request_id, None) == jitter_offset(request_id, 1) == 0


def test_the_offsets_spread_over_the_range() -> None:
    offsets = [jitter_offset(f"evt-{i}#0", 10_000) for i in range(2_000)]
    assert len(set(offsets)) > 1_500
    assert min(offsets) < 500 and max(offsets) > 9_500


rules = st.one_of(
    st.builds(
        IntervalRule,
        start=st.integers(Y2026, Y2026 + 10 * MINUTE),
        every=st.integers(1_000, 5 * MINUTE),
        jitter=st.integers(1, 1_000),
    ),
    st.builds(
        CronRule,
        expr=st.sampled_from(["* * * * *", "*/7 * * * *", "30 2 * * *"]),
        zone=st.sampled_from(["UTC", "Europe/Berlin"]),
        start=st.integers(Y2026, Y2026 + 10 * MINUTE),
        jitter=st.integers(1, 30_000),
    ),
)


def schedule_set(rule: IntervalRule | CronRule | OnceRule, event_id: str, at: int) -> EventEnvelope:
    return EventEnvelope(
        id=event_id,
        type=SCHEDULE_SET,
        aggregate=OWNER,
        version=1,
        created_at=at,
        body={
            "key": "remind",
            "rule": rule.model_dump(mode="json"),
            "target": TARGET.model_dump(mode="json"),
            "command": {"type": "Remind"},
        },
    )


@settings(max_examples=100, deadline=None)
@given(rule=rules, event_id=ids, after=st.integers(0, 30 * MINUTE))
def test_a_timer_set_is_due_at_its_slot_plus_its_offset_on_every_replay(
    rule: IntervalRule | CronRule, event_id: str, after: int
) -> None:
    event = schedule_set(rule, event_id, rule.start + after)
    op = timer_op(event, 0)
    assert isinstance(op, PutTimer)
    slot = first_slot(rule, event.created_at)
    assert slot is not None
    row = op.timer
    assert row.slot_due_at == slot.due_at  # unjittered
    assert row.due_at == slot.due_at + jitter_offset(f"{event_id}#{slot.index}", rule.jitter)
    assert row.due_at == jittered_due(rule, row.id, slot)
    replayed = timer_op(schedule_set(rule, event_id, rule.start + after), 0)
    assert isinstance(replayed, PutTimer) and replayed.timer == row


@settings(max_examples=100, deadline=None)
@given(rule=rules, lag=st.integers(0, 500))
def test_the_runners_next_slot_is_due_at_the_slot_plus_its_offset(
    rule: IntervalRule | CronRule, lag: int
) -> None:
    """Each slot fired when its jittered time came: the next row is due at the next slot
    plus that slot's offset, its slot_due_at the slot's own; not claimed a moment before."""
    first = first_slot(rule, rule.start)
    assert first is not None
    timer = slot_timer(rule, first, due_at=jittered_due(rule, "t-1", first))
    for _ in range(5):
        if timer.due_at > timer.slot_due_at:
            assert expire_or_claim(timer, timer.due_at - 1, OPTIONS).action is Action.NOTHING
        now = timer.due_at + lag
        claim = expire_or_claim(timer, now, OPTIONS)
        assert claim.action is Action.CLAIM and claim.change is not None
        firing = claim.change.next
        following = next_slot(rule, Slot(timer.slot, timer.slot_due_at))
        if following is None or following.due_at > now:
            assert firing.slot == timer.slot
        else:  # jittered (and late) past the next slot's due time: caught up as without
            assert firing.slot > timer.slot
        after = on_outcome(firing, SendResult("COMMITTED"), now + 1, OPTIONS)
        assert after.change is not None
        nxt = next_slot(rule, Slot(firing.slot, firing.slot_due_at))
        assert nxt is not None
        timer = after.change.next
        assert (timer.status, timer.slot, timer.slot_due_at) == (
            TimerStatus.PENDING,
            nxt.index,
            nxt.due_at,
        )
        assert timer.due_at == nxt.due_at + jitter_offset(f"t-1#{nxt.index}", rule.jitter)


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "once", "at": Y2026},
        {"kind": "interval", "start": Y2026, "every": MINUTE, "coalesce": False},
        {"kind": "cron", "expr": "0 9 * * *", "zone": "Europe/Berlin", "start": 0, "count": 3},
    ],
)
def test_a_rule_without_jitter_reads_and_writes_as_before(data: dict[str, object]) -> None:
    rule = parse_rule(data)
    assert rule.jitter is None
    assert "jitter" not in orjson.loads(rule.model_dump_json())
    row = slot_timer(rule, first_slot(rule, Y2026))
    raw = row.model_dump_json().encode()
    assert b"jitter" not in raw
    assert Timer.model_validate_json(raw).model_dump_json().encode() == raw


def test_a_jittered_rule_round_trips() -> None:
    rule = parse_rule({"kind": "once", "at": Y2026, "jitter": 5_000})
    assert isinstance(rule, OnceRule) and rule.jitter == 5_000
    assert parse_rule(orjson.loads(rule.model_dump_json())) == rule


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"kind": "once", "at": 0, "jitter": 0},
            "jitter: Input should be greater than or equal to 1",
        ),
        ({"kind": "once", "at": 0, "jitter": MAX_JITTER + 1}, "jitter: Input should be less"),
        (
            {"kind": "interval", "start": 0, "every": 1_000, "jitter": 1_001},
            "jitter 1001 is more than every 1000",
        ),
    ],
)
def test_a_bad_jitter_is_refused_naming_it(data: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRule, match=message):
        parse_rule(data)


def test_rules_next_shows_a_timers_jittered_instants_or_says_it_is_per_timer() -> None:
    args = [
        "rules",
        "next",
        "interval:1m@2026-12-24T00:00:00Z",
        "--jitter",
        "30s",
        "-n",
        "2",
        "--from",
        "2026-12-24T00:00:00Z",
    ]
    plain = CliRunner().invoke(cli, args)
    assert plain.exit_code == 0, plain.output
    assert "fires" not in plain.stdout
    assert "jitter 30000 ms: each timer fires each slot at its own offset" in plain.stderr
    one = CliRunner().invoke(cli, [*args, "--timer-id", "evt-1", "--json"])
    assert one.exit_code == 0, one.output
    lines = [orjson.loads(line) for line in one.stdout.splitlines()]
    assert [x["fires_at"] - x["due_at"] for x in lines] == [
        jitter_offset(f"evt-1#{x['index']}", 30_000) for x in lines
    ]
    assert one.stderr == ""
    bad = CliRunner().invoke(cli, [*args[:3], "--jitter", "soon"])
    assert bad.exit_code == 2 and "--jitter 'soon' is neither milliseconds" in bad.stderr


def test_a_slot_jittered_past_expires_after_is_sent_when_its_time_comes() -> None:
    """Expiry counts from when a slot fires, its due time plus its offset: counted from
    the unjittered due time, a slot whose offset is more than `expires_after` expired the
    moment it became due and was never sent."""
    hour = 60 * MINUTE
    options = TimerOptions(expires_after=hour)
    rule = OnceRule(at=Y2026, jitter=2 * hour)
    slot = Slot(0, Y2026)
    timer_id = next(f"t-{n}" for n in range(1000) if jitter_offset(f"t-{n}#0", 2 * hour) > hour)
    timer = slot_timer(rule, slot, id=timer_id, due_at=jittered_due(rule, timer_id, slot))
    assert timer.due_at - timer.slot_due_at > options.expires_after
    assert expire_or_claim(timer, timer.due_at - 1, options).action is Action.NOTHING
    claim = expire_or_claim(timer, timer.due_at, options)
    assert claim.action is Action.CLAIM and claim.send
    late = expire_or_claim(timer, timer.due_at + hour + 1, options)
    assert late.action is Action.EXPIRE and not late.send
