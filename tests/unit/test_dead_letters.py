"""Dead letters keep the bad record whole (key, value, headers) with why in headers of their
own; a letter cut to fit its topic says so; the failing partitions' bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import BadRecord
from app.node.failing import FailingPartitions
from app.protocol.dead_letters import HEADER_PREFIX, DeadLetter, Stage, dead_letter


@dataclass(frozen=True)
class Bad:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = 1_700_000_000_000
    headers: tuple[tuple[str, bytes | None], ...] = ()


OURS = [
    f"{HEADER_PREFIX}{n}"
    for n in (
        "topic",
        "partition",
        "offset",
        "timestamp",
        "stage",
        "exception.class.name",
        "exception.message",
        "node",
        "time",
        "truncated",
        "trace",
    )
]
# A producer may name its headers as ours: the names a letter's reading must not take.
names = st.one_of(st.text(max_size=20), st.sampled_from([*OURS, "__tickwheel.replay.of"]))
values = st.one_of(st.none(), st.binary(max_size=50), st.sampled_from([b"1", b"abc", b"read"]))
headers = st.lists(st.tuples(names, values), max_size=6)


@given(
    key=st.one_of(st.none(), st.binary(max_size=2000)),
    value=st.one_of(st.none(), st.binary(max_size=5000)),
    own=headers,
    message=st.text(max_size=5000),
)
def test_a_letter_holds_the_records_bytes_unchanged_and_says_why(
    key: bytes | None, value: bytes | None, own: list[tuple[str, bytes | None]], message: str
) -> None:
    record = Bad("shop.order.events", 3, 41, key, value, headers=tuple(own))
    topic, partition, k, v, h = dead_letter(record, ValueError(message), Stage.APPLY, 5)
    assert (topic, partition, k, v) == ("shop.dead-letters", 0, key, value)
    assert h[: len(own)] == tuple(own), "the record's own headers first, unchanged"
    letter = DeadLetter.read(k, v, h)
    assert (letter.topic, letter.partition, letter.offset) == ("shop.order.events", 3, 41)
    assert letter.context.stage is Stage.APPLY
    assert letter.context.exception_class == "ValueError"
    assert letter.context.time == 5 and letter.context.truncated is None
    assert letter.error == (message or repr(ValueError(message)))[:4096]
    assert letter.headers == tuple(own)


def test_invalid_utf8_and_a_record_near_the_broker_limit_are_kept_whole() -> None:
    value = b"\xff\xfe\x00" + b"x" * (1024 * 1024)
    record = Bad("shop.order.commands", 0, 7, b"\xc3\x28", value)
    _, _, key, kept, _ = dead_letter(record, "not UTF-8", Stage.READ, 0)
    assert (key, kept) == (b"\xc3\x28", value)


def test_a_letter_larger_than_its_topic_takes_is_cut_to_fit_and_says_so() -> None:
    record = Bad("shop.order.events", 0, 1, b"k" * 10_000, b"v" * 100_000)
    _, _, key, value, h = dead_letter(record, "too big", Stage.READ, 0, limit=50_000)
    size = len(key or b"") + len(value or b"") + sum(len(a) + len(b or b"") for a, b in h)
    assert size <= 50_000
    letter = DeadLetter.read(key, value, h)
    assert letter.context.truncated is not None and letter.context.truncated > 110_000
    assert (key or b"").startswith(b"k") and (value or b"").startswith(b"v")


def test_a_record_that_is_no_letter_is_bad_input() -> None:
    *_, ours = dead_letter(Bad("shop.order.events", 0, 1, b"k", b"v"), "x", Stage.READ, 0)
    not_letters: list[list[tuple[str, bytes | None]]] = [
        [("other", b"1")],
        [*ours, ("other", b"1")],  # ours not last
        [*ours[1:], ours[0]],  # nor in their order
        list(ours[1:]),  # nor all there
    ]
    for h in not_letters:
        with pytest.raises(BadRecord, match="not a dead letter"):
            DeadLetter.read(b"k", b"v", h)


def test_headers_of_the_record_named_as_ours_are_its_own_not_the_letters() -> None:
    """A producer's record carrying `__tickwheel.errors.*` headers: its letter reads as
    any other (not cut, from where it came), and keeps those headers as the record's."""
    own = (
        (f"{HEADER_PREFIX}truncated", b"1"),
        (f"{HEADER_PREFIX}topic", b"shop.forged.events"),
        ("app", b"x"),
        (f"{HEADER_PREFIX}trace", b"abc"),
        (f"{HEADER_PREFIX}truncated", b"abc"),
    )
    record = Bad("shop.order.commands", 1, 7, b"o1", b"not json", headers=own)
    *_, h = dead_letter(record, BadRecord("not json"), Stage.READ, 1)
    letter = DeadLetter.read(b"o1", b"not json", h)
    assert letter.context.truncated is None
    assert (letter.topic, letter.partition, letter.offset) == ("shop.order.commands", 1, 7)
    assert letter.headers == own


def test_a_letter_as_written_before_reads_the_same() -> None:
    """The layout letters already on topics have: the record's headers, then ours."""
    ours = [
        ("topic", b"shop.order.events"),
        ("partition", b"6"),
        ("offset", b"1"),
        ("timestamp", b"1767225601000"),
        ("stage", b"read"),
        ("exception.class.name", b"BadRecord"),
        ("exception.message", b"not JSON"),
        ("node", b"worker-1:7"),
        ("time", b"1767225601042"),
    ]
    h = [("trace", b"t"), *((HEADER_PREFIX + k, v) for k, v in ours)]
    letter = DeadLetter.read(b"o-42", b"{", h)
    assert (letter.topic, letter.partition, letter.offset, letter.error) == (
        "shop.order.events",
        6,
        1,
        "not JSON",
    )
    assert letter.context.node == "worker-1:7" and letter.context.truncated is None
    assert letter.headers == (("trace", b"t"),)
    cut = DeadLetter.read(None, b"{", [*h[1:], (f"{HEADER_PREFIX}truncated", b"5000000")])
    assert cut.context.truncated == 5_000_000 and cut.headers == ()


def test_a_partition_is_held_only_when_its_failed_cycle_read_records() -> None:
    failing = FailingPartitions()
    failing.failed(1, {}, "a commit: timed out")
    assert not failing.held(1)
    assert failing.failed(2, {"t.events": 5}, "a cycle: disk").failures == 1
    assert failing.failed(2, {"t.events": 5}, "a cycle: disk").failures == 2
    assert failing.held(2)
    assert "t.events@5" in failing.stalled()[2]
    assert failing.report()["2"] == {
        "at": {"t.events": 5},
        "error": "a cycle: disk",
        "failures": 2,
        "held": True,
    }
    assert not failing.read(2, {"t.events": 4}), "not past where it failed"
    assert failing.held(2)
    assert failing.read(2, {"t.events": 5, "t.commands": 1})
    assert not failing.held(2) and "2" not in failing.report()


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.dictionaries(st.sampled_from("abc"), st.integers(0, 9))),
        max_size=20,
    )
)
def test_failures_in_a_row_count_at_the_same_offsets_and_a_hold_keeps_the_furthest(
    failures: list[tuple[int, dict[str, int]]],
) -> None:
    """A model of it: a held partition's offsets only grow (each topic's furthest), so
    the hold is released past every one; the count goes up while they stay the same."""
    failing = FailingPartitions()
    model: dict[int, tuple[dict[str, int], int, bool]] = {}
    for p, at in failures:
        got = failing.failed(p, at, "x")
        before = model.get(p)
        merged = dict(at)
        if before is not None and before[2]:
            merged = {t: max(o, before[0].get(t, -1)) for t, o in at.items()}
            merged |= {t: o for t, o in before[0].items() if t not in at}
        count = before[1] + 1 if before is not None and before[0] == merged else 1
        held = bool(merged) or (before is not None and before[2])
        model[p] = (merged, count, held)
        assert (got.at, got.failures, failing.held(p)) == (merged, count, held)
    for p, (merged, _, held) in model.items():
        short = {t: o - 1 for t, o in merged.items()}
        if merged and any(o >= 0 for o in merged.values()):
            assert not failing.read(p, short) or not held
        assert failing.read(p, merged) == held


def test_a_header_with_a_null_value_is_kept_as_it_was() -> None:
    record = Bad("shop.order.events", 0, 1, b"k", b"{", headers=(("trace", None),))
    *_, h = dead_letter(record, "not JSON", Stage.READ, 0)
    assert h[0] == ("trace", None)
    assert DeadLetter.read(b"k", b"{", h).headers == (("trace", None),)
