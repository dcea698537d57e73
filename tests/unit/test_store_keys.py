"""The store's byte encodings: orders and prefixes the RocksDB scans rely on."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tables import AggregateRef, CommandSpec, CronRule, IntervalRule, OnceRule, Outcome, Timer
from tables.bounds import MAX_INSTANT, MAX_INT64
from tables.keys import (
    DUE,
    FINISHED,
    HELD,
    OFFSET_KEY,
    PARKED,
    ROW,
    decode_timer,
    due_key,
    due_upper_bound,
    encode_timer,
    finished_at,
    finished_upper_bound,
    index_key,
    index_key_of,
    order_key,
    owner_prefix,
    parked_key,
    parked_prefix,
    ref_bytes,
    ref_bytes_of,
    row_key,
    row_key_of,
)
from tables.rowload import load_timer
from tables.timer import TimerStatus

text = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12)
names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,8}", fullmatch=True)
refs = st.builds(AggregateRef, context=names, aggregate=names, tenant=text, id=text)
due_ats = st.one_of(st.integers(0, 2), st.integers(0, MAX_INT64))
"""Mostly ties, so that ids decide."""
instants = st.one_of(st.integers(0, 2), st.integers(0, MAX_INSTANT))
ids = st.one_of(st.sampled_from(["a", "a\x00", "a\x00b", "a\x01", "ab", "é"]), text)
jitters = st.none() | st.integers(1, 1000)  # left out of the row's JSON while None
rules = st.one_of(
    st.builds(OnceRule, at=st.integers(0, 2**40), jitter=jitters),
    st.builds(
        IntervalRule,
        start=st.integers(0, 2**40),
        every=st.integers(1000, 10**9),
        until=st.none() | st.integers(2**40, 2**41),
        count=st.none() | st.integers(1, 10**6),
        jitter=jitters,
    ),
    st.just(CronRule(expr="*/5 * * * *", zone="Europe/Berlin")),
    st.just(CronRule(expr="0 9 * * *", until=2**41, count=3, jitter=500)),
)
bodies = st.dictionaries(
    text, st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), text), max_size=3
)
timers = st.builds(
    Timer,
    id=text,
    owner=refs,
    key=text,
    version=st.integers(0, 2**40),
    partition=st.integers(0, 100),
    status=st.sampled_from(list(TimerStatus)),
    rule=rules,
    target=refs,
    command=st.builds(CommandSpec, type=text, body=bodies),
    slot=st.integers(0, 10**6),
    slot_due_at=instants,
    due_at=due_ats,
    attempts=st.integers(0, 50),
    skipped=st.integers(0, 50),
    outcome=st.one_of(st.none(), st.sampled_from(list(Outcome))),
    # Left out of the row's JSON while None: rows with and without them.
    error_code=st.none() | st.sampled_from(["ERROR", "BUSY", "TIMEOUT", "RULE_ERROR"]),
    error_text=st.none() | text,
    # Left out of the row's JSON while False: rows with and without it.
    parked_when_paused=st.booleans(),
    # Left out of the row's JSON while None: rows with and without it.
    retry_until=st.none() | due_ats,
    # Left out of the row's JSON while None: rows with and without it.
    cancel_id=st.none() | ids,
)


@given(st.tuples(due_ats, ids), st.tuples(due_ats, ids))
def test_order_keys_sort_as_due_at_then_id(a: tuple[int, str], b: tuple[int, str]) -> None:
    assert (order_key(*a) < order_key(*b)) == (a < b)
    assert (order_key(*a) == order_key(*b)) == (a == b)


@given(st.tuples(due_ats, ids, ids), st.tuples(due_ats, ids, ids))
def test_due_keys_sort_as_due_at_id_then_row(
    a: tuple[int, str, str], b: tuple[int, str, str]
) -> None:
    key_a = due_key(a[0], a[1], a[2].encode())
    key_b = due_key(b[0], b[1], b[2].encode())
    assert (key_a < key_b) == ((a[0], a[1], a[2].encode()) < (b[0], b[1], b[2].encode()))


@given(st.integers(-1, 2**64), due_ats, text)
def test_due_upper_bound_parts_due_and_not_yet_due(until: int, due_at: int, id: str) -> None:
    assert (due_key(due_at, id, b"row") < due_upper_bound(until)) == (due_at <= until)


@given(refs, refs, text, text)
def test_row_keys_are_prefix_free_by_owner(
    a: AggregateRef, b: AggregateRef, ka: str, kb: str
) -> None:
    assert (row_key(a, ka) == row_key(b, kb)) == ((a, ka) == (b, kb))
    assert row_key(b, kb).startswith(owner_prefix(a)) == (a == b)


@given(refs, refs)
def test_parked_prefixes_keep_targets_apart(a: AggregateRef, b: AggregateRef) -> None:
    key = parked_key(ref_bytes(a), 5, "id", b"row")
    assert key.startswith(parked_prefix(b)) == (a == b)


def test_the_key_spaces_do_not_meet() -> None:
    assert len({ROW, DUE, PARKED, FINISHED, OFFSET_KEY[:1]}) == 5
    assert not OFFSET_KEY.startswith((ROW, DUE, PARKED, FINISHED))
    assert due_upper_bound(2**64) == b"e"
    assert finished_upper_bound(2**64) == b"g"
    assert finished_upper_bound(-5) == FINISHED + bytes(8)


def test_an_out_of_range_due_at_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="due_at"):
        order_key(2**64, "id")


@given(timers)
def test_a_value_is_the_timers_json_dict_and_decodes_back(timer: Timer) -> None:
    raw = encode_timer(timer)
    assert raw == orjson.dumps(timer.model_dump(mode="json"))
    assert decode_timer(raw) == timer


@given(timers)
def test_keys_from_a_value_match_keys_from_its_timer(timer: Timer) -> None:
    row = row_key(timer.owner, timer.key)
    value = orjson.loads(encode_timer(timer))
    assert row_key_of(value) == row
    assert ref_bytes_of(value["target"]) == ref_bytes(timer.target)
    assert index_key_of(value, row) == index_key(timer, row)
    expected = {
        TimerStatus.PENDING: DUE,
        TimerStatus.FIRING: DUE,
        TimerStatus.PARKED: PARKED,
        TimerStatus.FIRED: FINISHED,
        TimerStatus.CANCELLED: FINISHED,
        TimerStatus.PAUSED: HELD,
    }[timer.status]
    key = index_key(timer, row)
    assert key[:1] == expected
    if expected == FINISHED:
        assert key[1:9] == finished_at(timer.due_at, timer.slot_due_at).to_bytes(8, "big")


@given(timers)
def test_a_stored_row_loads_back_as_the_timer_it_was(timer: Timer) -> None:
    raw = encode_timer(timer)
    # An unset error field is not written: such a row is byte for byte as before it existed.
    written = orjson.loads(raw)
    assert ("error_code" in written, "error_text" in written) == (
        timer.error_code is not None,
        timer.error_text is not None,
    )
    assert ("parked_when_paused" in written) == timer.parked_when_paused
    assert ("retry_until" in written) == (timer.retry_until is not None)
    assert ("cancel_id" in written) == (timer.cancel_id is not None)
    loaded = load_timer(raw)
    assert loaded == timer == decode_timer(raw)
    assert type(loaded.rule) is type(timer.rule)
    assert loaded.model_fields_set == decode_timer(raw).model_fields_set
    assert encode_timer(loaded) == raw
    # A copy changes itself only (the loaded rows share their field-name sets).
    copied = loaded.model_copy(update={"version": timer.version + 1})
    assert copied.version == timer.version + 1
    assert loaded.version == timer.version
    # (and left the shared set of the fields a row names as it was)
    unset = ("error_code", "error_text", "parked_when_paused", "retry_until", "cancel_id")
    named = set(Timer.model_fields) - {k for k in unset if k not in written}
    assert load_timer(raw).model_fields_set == named


def test_a_row_that_does_not_name_every_field_is_decoded_in_full() -> None:
    """One written by another version, leaning on defaults: pydantic fills them in."""
    owner = AggregateRef(context="shop", aggregate="order", id="o-1")
    timer = Timer(
        id="t-1",
        owner=owner,
        key="k",
        version=1,
        partition=0,
        rule=OnceRule(at=5),
        target=owner,
        command=CommandSpec(type="Go", body={"a": 1}),
        slot_due_at=5,
        due_at=5,
    )
    value = orjson.loads(encode_timer(timer))
    del value["attempts"], value["owner"]["tenant"], value["command"]["body"]
    loaded = load_timer(orjson.dumps(value))
    assert loaded == decode_timer(orjson.dumps(value))
    assert loaded.attempts == 0 and loaded.owner.tenant == "(0)" and loaded.command.body == {}
