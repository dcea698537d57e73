"""A restore's fast row check gives pydantic's verdict on every row, valid or mangled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tables import (
    AggregateRef,
    CommandSpec,
    CronRule,
    IntervalRule,
    OnceRule,
    Outcome,
    Timer,
    open_timer_store,
)
from tables.bounds import MAX_INSTANT, MAX_INT64
from tables.keys import encode_timer, index_key, restored_row, row_key
from tables.rowcheck import _command_ok, _fast_index, _rule_bytes_ok, restored_index
from tables.rowload import load_timer
from tables.rules import MAX_JITTER
from tables.timer import MAX_ERROR_TEXT, TimerStatus

text = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=8)
names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,6}", fullmatch=True)
refs = st.builds(AggregateRef, context=names, aggregate=names, tenant=text, id=text)
jitters = st.none() | st.integers(1, MAX_JITTER)
counts = st.none() | st.integers(1, MAX_INT64)


@st.composite
def _interval(draw: st.DrawFn) -> IntervalRule:
    start, every = draw(st.integers(0, MAX_INSTANT)), draw(st.integers(1, MAX_INT64))
    jitter = draw(st.none() | st.integers(1, min(every, MAX_JITTER)))
    until = draw(st.none() | st.integers(start, MAX_INSTANT))
    return IntervalRule(start=start, every=every, jitter=jitter, until=until, count=draw(counts))


@st.composite
def _cron(draw: st.DrawFn) -> CronRule:
    start = draw(st.integers(0, MAX_INSTANT))
    return CronRule(
        expr=draw(st.sampled_from(["*/5 * * * *", "0 3 * * 1", "*/10 * * * * *"])),
        zone=draw(st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"])),
        start=start,
        jitter=draw(jitters),
        until=draw(st.none() | st.integers(start, MAX_INSTANT)),
        count=draw(counts),
    )


# With and without the ends and jitter of #22 (absent, they are left out of the JSON).
rules = st.one_of(
    st.builds(OnceRule, at=st.integers(0, MAX_INSTANT), coalesce=st.booleans(), jitter=jitters),
    _interval(),
    _cron(),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | text | st.floats(-1e9, 1e9),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
_timers = st.builds(
    Timer,
    id=text,
    owner=refs,
    key=text,
    version=st.integers(0, MAX_INT64),
    partition=st.integers(0, 3),
    status=st.sampled_from(list(TimerStatus)),
    rule=rules,
    target=refs,
    command=st.builds(CommandSpec, type=text, body=st.dictionaries(text, json_values, max_size=3)),
    slot=st.integers(0, MAX_INT64),
    slot_due_at=st.integers(0, MAX_INSTANT),
    due_at=st.integers(0, MAX_INT64),
    attempts=st.integers(0, 50),
    skipped=st.integers(0, 50),
    outcome=st.one_of(st.none(), st.sampled_from(list(Outcome))),
    # Left out of the row's JSON while None.
    error_code=st.none() | st.sampled_from(["ERROR", "TIMEOUT", "x" * 100]),
    error_text=st.none() | text | st.just("é" * MAX_ERROR_TEXT),
    # Left out of the row's JSON while False.
    parked_when_paused=st.booleans(),
    # Left out of the row's JSON while None.
    retry_until=st.none() | st.integers(0, MAX_INT64),
    # Left out of the row's JSON while None.
    cancel_id=st.none() | text,
)
timers = _timers | _timers.map(lambda t: t.model_copy(update={"target": t.owner}))

# What a mangled field may hold instead: each next to a bound, or a type pydantic's lax
# mode takes and msgspec does not.
TRICKY: list[Any] = [
    None, True, False, 0, -1, 1, 65_535, 65_536, MAX_INSTANT, MAX_INSTANT + 1, MAX_INT64,
        MAX_INT64 + 1, 2**64, 2**70, -(2**63) - 1, 1.0, 1.5, 1e400, "", "1", "true", "a",
        "a\n", "shop\n", "\nshop", "a b", "x" * 100, "x" * 101, "x" * 200, "x" * 201,
        "x" * 500, "x" * 501, "x" * 1000, "x" * 1001, [], {}, {"a": 1}, {"a": 2**64},
        {"a": [1e400]},
        {"kind": "once", "at": 5}, {"kind": "cron", "expr": "61 * * * *"},
        {"kind": "cron", "expr": "* * * * *", "zone": "Mars/Olympus"},
        {"kind": "cron", "expr": "* * * * *", "zone": "America"},
        {"kind": "cron", "expr": "* * * * *", "zone": "localtime"},
        {"kind": "interval", "start": 0, "every": 0}, {"kind": "nope"},
        {"kind": "interval", "start": 9, "every": 5, "until": 8},
        {"kind": "interval", "start": 9, "every": 5, "until": 9, "count": 1, "jitter": 5},
        {"kind": "interval", "start": 0, "every": 5, "jitter": 6},
        {"kind": "interval", "start": 0, "every": 5, "count": 0},
        {"kind": "interval", "start": 0, "every": 5, "until": None, "jitter": None},
        {"kind": "cron", "expr": "* * * * *", "start": 9, "until": 8},
        {"kind": "cron", "expr": "* * * * *", "jitter": MAX_JITTER + 1},
        {"kind": "cron", "expr": "* * * * *", "jitter": MAX_JITTER, "count": MAX_INT64},
        {"kind": "once", "at": 5, "jitter": 0}, {"kind": "once", "at": 5, "until": 9},
        {"kind": "once", "at": 5, "count": 1}, MAX_JITTER, MAX_JITTER + 1,
        "PENDING", "FIRED", "pending", "EXPIRED", "BUSY",
        {"context": "a", "aggregate": "b", "id": "c"},
        {"context": "a\n", "aggregate": "b", "id": "c"},
        {"context": "a", "aggregate": "b", "id": "c", "tenant": ""},
        {"type": "T"}, {"type": "T", "body": []}, {"type": "T", "body": {"d": 2**63}},
]  # fmt: skip
# A copy each draw: a later mangle may change what an earlier one put in.
tricky = st.sampled_from(TRICKY).map(lambda value: json.loads(json.dumps(value)))


def _paths(value: Any, at: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of a JSON object, parents before children."""
    if not isinstance(value, dict):
        return []
    out = []
    for key, item in value.items():
        out.append((*at, key))
        out += _paths(item, (*at, key))
    return out


@st.composite
def mangled(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A row's key and a value: the row's JSON, with up to three fields replaced, removed
    or added."""
    timer = draw(timers)
    value = timer.model_dump(mode="json")
    for _ in range(draw(st.integers(0, 3))):
        paths = _paths(value)
        path = draw(st.sampled_from(paths))
        parent = value
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["set", "del", "add"]))
        if action == "set":
            parent[path[-1]] = draw(tricky)
        elif action == "del":
            del parent[path[-1]]
        else:
            parent[draw(st.sampled_from(["extra", "kind", "status", "zone"]))] = draw(tricky)
    key = row_key(timer.owner, timer.key)
    return key, json.dumps(value).encode()


def _pydantic(partition: int, key: bytes, value: bytes) -> bytes | str:
    try:
        return index_key(restored_row(partition, key, value), key)
    except ValueError:
        return "refused"


def _fast(partition: int, key: bytes, value: bytes) -> bytes | str:
    try:
        index, stored = restored_index(partition, key, value)
    except ValueError:
        return "refused"
    # What is stored reads back as the row pydantic reads.
    assert load_timer(stored) == restored_row(partition, key, value)
    return index


@settings(max_examples=600)
@given(mangled(), st.integers(0, 3))
def test_the_fast_check_gives_pydantics_verdict(row: tuple[bytes, bytes], partition: int) -> None:
    key, value = row
    assert _fast(partition, key, value) == _pydantic(partition, key, value)


def _base(rule: OnceRule | IntervalRule | CronRule, target: AggregateRef | None) -> Timer:
    owner = AggregateRef(context="shop", aggregate="order", tenant="acme", id="o-1")
    return Timer(
        id="t-1", owner=owner, key="k", version=3, partition=1, rule=rule,
        target=target or owner, command=CommandSpec(type="Go", body={"n": [1, "a"]}),
        slot_due_at=5, due_at=7, outcome=Outcome.FAILED,
    )  # fmt: skip


BASES = [
    _base(OnceRule(at=5), None),
    _base(OnceRule(at=5), None).model_copy(
        update={"error_code": "ERROR", "error_text": "out of stock"}
    ),
    _base(IntervalRule(start=5, every=60_000), AggregateRef(context="c", aggregate="a", id="x")),
    _base(OnceRule(at=5), None).model_copy(
        update={"status": TimerStatus.PAUSED, "parked_when_paused": True}
    ),
    _base(CronRule(expr="*/5 * * * *", zone="Europe/Berlin", start=5), None),
    # Each field the rules gained in #22 set, so each is mangled in turn too.
    _base(OnceRule(at=5, jitter=3), None),
    _base(IntervalRule(start=5, every=60_000, until=5, count=2, jitter=60_000), None),
    _base(CronRule(expr="*/5 * * * *", start=5, until=5, count=1, jitter=MAX_JITTER), None),
]


@pytest.mark.parametrize(
    "timer",
    BASES,
    ids=[
        "once",
        "once-error",
        "interval",
        "paused-parked",
        "cron",
        "once-ends",
        "interval-ends",
        "cron-ends",
    ],
)
def test_every_field_set_to_every_tricky_value_gets_pydantics_verdict(timer: Timer) -> None:
    """Each field of a valid row (nested ones too) replaced by each of `TRICKY` in turn,
    removed, or joined by an unknown field: the fast check answers as pydantic does."""
    key = row_key(timer.owner, timer.key)
    base = timer.model_dump(mode="json")
    checked = 0
    for path in _paths(base):
        for change in [*TRICKY, "<del>", "<add>"]:
            value = json.loads(json.dumps(base))
            parent = value
            for part in path[:-1]:
                parent = parent[part]
            if change == "<del>":
                del parent[path[-1]]
            elif change == "<add>":
                parent[path[-1] + "_"] = 1
            else:
                parent[path[-1]] = change
            raw = json.dumps(value).encode()
            assert _fast(1, key, raw) == _pydantic(1, key, raw), (path, change)
            checked += 1
    assert checked > 1000


@settings(max_examples=300)
@given(timers)
def test_a_row_the_store_wrote_takes_the_fast_path(timer: Timer) -> None:
    """Not a test that pydantic alone passes: every row a Tickwheel writes is decided
    without it, with the same index entry."""
    key = row_key(timer.owner, timer.key)
    value = encode_timer(timer)
    assert _fast_index(timer.partition, key, value) == index_key(timer, key)


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"[]",
        b"null",
        b"{",
        b'{"id": "\xff"}',
        b'{"id": "\\ud800"}',
    ],
)
def test_no_row_at_all_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError):
        restored_index(0, b"k", value)


def test_a_rule_or_command_nested_past_the_recursion_limit_is_refused() -> None:
    """msgspec's decoders recurse to Python's limit: a RecursionError is a refusal, as
    pydantic's ValueError is, never an error out of a restore."""
    deep = b"[" * 2_000 + b"]" * 2_000
    assert not _rule_bytes_ok(b'{"kind":"once","at":5,"x":' + deep + b"}")
    assert not _command_ok(b'{"type":"Go","body":{"x":' + deep + b"}}")
    with pytest.raises(ValueError):
        restored_index(0, b"k", b'{"id":' + deep + b"}")


def test_a_row_under_another_key_or_partition_is_refused() -> None:
    owner = AggregateRef(context="shop", aggregate="order", id="o-1")
    timer = Timer(
        id="t", owner=owner, key="k", version=1, partition=2, rule=OnceRule(at=5),
        target=owner, command=CommandSpec(type="Go"), slot_due_at=5, due_at=5,
    )  # fmt: skip
    value = encode_timer(timer)
    key = row_key(owner, "k")
    assert restored_index(2, key, value) == (index_key(timer, key), value)
    with pytest.raises(ValueError, match="partition 2"):
        restored_index(1, key, value)
    with pytest.raises(ValueError, match="under another key"):
        restored_index(2, row_key(owner, "other"), value)


def test_a_row_only_the_lax_mode_takes_is_stored_as_the_timers_own_json() -> None:
    """Reads trust the stored bytes: a `"3"` for an int must not reach them."""
    timer = BASES[0]
    key = row_key(timer.owner, timer.key)
    lax = json.loads(encode_timer(timer))
    lax["version"], lax["rule"]["coalesce"], lax["slot"] = "3", "true", 0.0
    raw = json.dumps(lax).encode()
    index, stored = restored_index(1, key, raw)
    assert stored == encode_timer(timer) != raw
    assert load_timer(stored).version == 3 and index == index_key(timer, key)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
async def test_a_store_restoring_a_lax_row_reads_the_timer_back(
    backend: str, tmp_path: Path
) -> None:
    timer = BASES[0]
    lax = json.loads(encode_timer(timer))
    lax["version"] = "3"
    url = "memory://" if backend == "memory" else f"rocksdb://{tmp_path / 's'}"
    store = open_timer_store(url, partitions=2)
    try:
        key = row_key(timer.owner, timer.key)
        assert await store.apply_changelog(1, [(0, key, json.dumps(lax).encode())]) == []
        found = await store.find(timer.owner, timer.key)
        assert found == timer and isinstance(found.version, int)
    finally:
        await store.close()
