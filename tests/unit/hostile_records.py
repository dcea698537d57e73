"""Hostile records for the tests that feed them to a node or a client: JSON with what the
stdlib's encoder cannot write (`Raw`, `dump`, `nested`), envelopes with one field replaced
(`with_field`), and records shaped like an owner's `timer-op-answer` on the results topic
with a field pushed past its bound, or bytes no reader can take (`hostile_answers`): each
says how a reader of that topic reads it (`Hostile.answer`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tables.bounds import MAX_INSTANT, MAX_INT64, MIN_INT64

__all__ = [
    "MISSING",
    "Hostile",
    "Raw",
    "answer_base",
    "dump",
    "hostile_answers",
    "nested",
    "with_field",
]


@dataclass(frozen=True)
class Raw:
    """A JSON literal written as is (`1` and 400 zeros, `1e400`, 1,000 nested lists)."""

    text: bytes

    def __repr__(self) -> str:
        return f"Raw({self.text[:40]!r}…{len(self.text)} bytes)"


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()
"""A field taken out of its envelope."""


def dump(value: Any) -> bytes:
    """JSON bytes of `value`, `Raw` literals spliced in (big integers kept whole)."""
    raws: list[bytes] = []

    def swap(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"@@raw{len(raws) - 1}@@"
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items() if x is not MISSING}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    out = json.dumps(swap(value), separators=(",", ":")).encode()
    for i, text in enumerate(raws):
        out = out.replace(f'"@@raw{i}@@"'.encode(), text, 1)
    return out


def nested(depth: int, kind: Literal["list", "dict"] = "list") -> Raw:
    if kind == "list":
        return Raw(b"[" * depth + b"]" * depth)
    return Raw(b'{"a":' * depth + b"1" + b"}" * depth)


def with_field(base: dict[str, Any], path: Sequence[str], value: Any) -> dict[str, Any]:
    """`base` with the field at `path` replaced by `value` (taken out: `MISSING`)."""
    head, *rest = path
    out = dict(base)
    if rest:
        inner = out.get(head)
        out[head] = with_field(inner if isinstance(inner, dict) else {}, rest, value)
    else:
        out[head] = value
    return out


# --- records shaped like an owner's answer to a timer op --------------------------------------


def answer_base(
    request_id: str,
    target: dict[str, Any],
    partition: int,
    offset: int,
    *,
    action: str = "retry",
    outcome: str = "DONE",
    changed: int = 1,
    answered_at: int = 1_800_000_000_000,
) -> dict[str, Any]:
    """A valid `timer-op-answer`'s fields (as `app.timers.op_answers.answer_record` writes)."""
    retry = action == "retry"
    return {
        "kind": "timer-op-answer",
        "request_id": request_id,
        "action": action,
        "target": target,
        "partition": partition,
        "offset": offset,
        "outcome": outcome,
        "retried": changed if retry else 0,
        "skipped": 0 if retry else changed,
        "message": "",
        "answered_at": answered_at,
    }


@dataclass(frozen=True)
class Hostile:
    """A record value shaped like an answer (or not even JSON): `answer`, whether a reader of
    the results topic reads it as an answer (passed over in silence by a node), else it is
    an unreadable result (logged, bounded, and passed over); never a command's result."""

    why: str
    value: bytes | None = field(repr=False)
    answer: bool

    def __repr__(self) -> str:
        size = "None" if self.value is None else f"{len(self.value)} bytes"
        return f"Hostile({self.why!r:.80}, {size}, answer={self.answer})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


FIELD_CASES: list[tuple[tuple[str, ...], Any, bool]] = [
    (("offset",), MAX_INT64, True),
    (("offset",), MAX_INT64 + 1, False),
    (("offset",), -1, False),
    (("offset",), MIN_INT64, False),
    (("offset",), MIN_INT64 - 1, False),
    (("offset",), 2**70, False),
    (("offset",), Raw(b"1" + b"0" * 400), False),
    (("offset",), Raw(b"1e400"), False),
    (("offset",), Raw(b"NaN"), False),
    (("offset",), Raw(b"Infinity"), False),
    (("offset",), Raw(b"5.0"), False),
    (("offset",), "5", False),
    (("offset",), True, False),
    (("offset",), None, False),
    (("offset",), MISSING, False),
    (("retried",), MAX_INT64, True),
    (("retried",), MAX_INT64 + 1, False),
    (("retried",), -1, False),
    (("retried",), Raw(b"-Infinity"), False),
    (("skipped",), MAX_INT64, True),
    (("skipped",), 2**64, False),
    (("skipped",), MISSING, True),  # 0 by default
    (("partition",), 65_535, True),
    (("partition",), 65_536, False),
    (("partition",), -1, False),
    (("partition",), 2**31, False),
    (("partition",), "0", False),
    (("message",), "x" * 2_000, True),
    (("message",), "ü" * 2_000, True),
    (("message",), "x" * 2_001, False),
    (("message",), "x" * 300_000, False),  # past a record's bound too
    (("message",), "\x1b[2J\x00\u202e", True),  # a printer's to escape, not a reader's
    (("message",), Raw(b'"\xff\xfe"'), False),  # not UTF-8
    (("message",), Raw(b'"\\ud800"'), False),  # a lone surrogate
    (("message",), 5, False),
    (("request_id",), "r" * 200, True),
    (("request_id",), "r" * 201, False),
    (("request_id",), "", False),
    (("request_id",), 7, False),
    (("kind",), MISSING, False),
    (("kind",), None, False),
    (("kind",), "TIMER-OP-ANSWER", False),
    (("kind",), "timer-op-answer ", False),
    (("action",), "RETRY", False),
    (("action",), "explode", False),
    (("outcome",), "done", False),
    (("outcome",), "LATER", False),
    (("answered_at",), MAX_INSTANT, True),
    (("answered_at",), MAX_INSTANT + 1, False),
    (("answered_at",), -1, False),
    (("target",), "fz.counter/x", False),
    (("target", "id"), "x" * 501, False),
    (("target", "id"), "a\x00b", True),  # names what is stored: no new name's check
    (("target", "extra"), 1, False),  # a nested part refuses a field it does not know
    (("extra",), {"note": "a newer writer's", "n": [MAX_INT64, MIN_INT64, 1e308]}, True),
    (("extra",), nested(10), True),
    (("extra",), 2**70, False),  # unknown fields are held to a body's bounds
    (("extra",), {"a": -(2**64)}, False),
    (("extra",), Raw(b"NaN"), False),
    (("extra",), Raw(b"Infinity"), False),
    (("extra",), Raw(b"1e400"), False),
    (("extra",), nested(300), False),
    (("extra",), nested(20_000), False),
]
"""One field of a valid answer replaced: whether the record still reads as an answer."""


def hostile_answers(base: dict[str, Any]) -> list[Hostile]:
    """Records made from the valid answer `base` (its fields, `answer_base`): one field
    pushed past its bound or to the wrong type (or just within its bound), a key given
    twice (the last one is read), and bytes no reader takes as JSON of an answer."""
    out = [
        Hostile(f"{'.'.join(path)}={value!r:.60}", dump(with_field(base, path, value)), answer)
        for path, value, answer in FIELD_CASES
    ]
    whole = dump(base)

    def twice(name: str, first: Any, last: Any, answer: bool) -> Hostile:
        # `name` given twice, `first` then `last`: a JSON reader keeps the last one.
        value = (
            b"{" + dump(name) + b":" + dump(first) + b"," + dump(with_field(base, [name], last))[1:]
        )
        return Hostile(f"{name} twice: {first!r:.30} then {last!r:.30}", value, answer)

    out += [
        twice("offset", -1, base["offset"], True),
        twice("offset", base["offset"], -1, False),
        twice("offset", base["offset"], 2**70, False),
        twice("kind", "result", "timer-op-answer", True),
        twice("kind", "timer-op-answer", "result", False),
        twice("request_id", "r" * 201, base["request_id"], True),
        Hostile("a tombstone", None, False),
        Hostile("empty", b"", False),
        Hostile("not JSON", b"{not json", False),
        Hostile("cut short", whole[:-1], False),
        Hostile("trailing garbage", whole + b"}", False),
        Hostile("trailing whitespace", whole + b"\n", True),
        Hostile("a BOM before it", b"\xef\xbb\xbf" + whole, False),
        Hostile("a byte not UTF-8 before it", b"\xff" + whole, False),
        Hostile("in a list", b"[" + whole + b"]", False),
        Hostile("null", b"null", False),
        Hostile("its kind alone", b'"timer-op-answer"', False),
        Hostile("nested 20,000 deep", dump(nested(20_000)), False),
        Hostile("nested 300 deep", dump(nested(300, "dict")), False),
        Hostile("past a record's bound", b" " * (300 * 1024) + whole, False),
    ]
    return out
