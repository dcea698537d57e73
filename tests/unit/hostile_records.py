"""Hostile records for the tests that feed them to a node or a client: JSON with what the
stdlib's encoder cannot write (`Raw`, `dump`, `nested`), envelopes with one field replaced
(`with_field`), records shaped like an owner's `timer-op-answer` on the results topic
with a field pushed past its bound, or bytes no reader can take (`hostile_answers`): each
says how a reader of that topic reads it (`Hostile.answer`); and records shaped like an
operator's request on the timer-ops topic alike (`hostile_ops`, `HostileOp.request`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tables.bounds import MAX_DEPTH, MAX_INSTANT, MAX_INT64, MIN_INT64

__all__ = [
    "MISSING",
    "Hostile",
    "HostileOp",
    "Raw",
    "answer_base",
    "dump",
    "hostile_answers",
    "hostile_ops",
    "nested",
    "op_base",
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

    def twice(name: str, first: Any, last: Any, answer: bool) -> Hostile:
        return Hostile(_twice_why(name, first, last), _twice(base, name, first, last), answer)

    out += [
        twice("offset", -1, base["offset"], True),
        twice("offset", base["offset"], -1, False),
        twice("offset", base["offset"], 2**70, False),
        twice("kind", "result", "timer-op-answer", True),
        twice("kind", "timer-op-answer", "result", False),
        twice("request_id", "r" * 201, base["request_id"], True),
        Hostile("its kind alone", b'"timer-op-answer"', False),
    ]
    out += [Hostile(why, value, taken) for why, value, taken in _around(dump(base))]
    return out


def _twice(base: dict[str, Any], name: str, first: Any, last: Any) -> bytes:
    """`base` with `name` given twice, `first` then `last`: a JSON reader keeps the last."""
    return b"{" + dump(name) + b":" + dump(first) + b"," + dump(with_field(base, [name], last))[1:]


def _twice_why(name: str, first: Any, last: Any) -> str:
    return f"{name} twice: {first!r:.30} then {last!r:.30}"


def _around(whole: bytes) -> list[tuple[str, bytes | None, bool]]:
    """The valid record `whole` cut, wrapped or preceded by what no JSON reader takes (and
    what it does), and bytes of no record at all: whether each is still read as it."""
    return [
        ("a tombstone", None, False),
        ("empty", b"", False),
        ("not JSON", b"{not json", False),
        ("cut short", whole[:-1], False),
        ("trailing garbage", whole + b"}", False),
        ("trailing whitespace", whole + b"\n", True),
        ("a BOM before it", b"\xef\xbb\xbf" + whole, False),
        ("a byte not UTF-8 before it", b"\xff" + whole, False),
        ("in a list", b"[" + whole + b"]", False),
        ("null", b"null", False),
        ("nested 20,000 deep", dump(nested(20_000)), False),
        ("nested 300 deep", dump(nested(300, "dict")), False),
        ("past a record's bound", b" " * (300 * 1024) + whole, False),
    ]


# --- records shaped like an operator's request (a timer op) -----------------------------------


def op_base(
    request_id: str, target: dict[str, Any], *, requested_at: int = 1_800_000_000_000
) -> dict[str, Any]:
    """A valid timer op's fields (as `app.timers.operator.new_op` makes them)."""
    return {
        "request_id": request_id,
        "action": "retry",
        "target": target,
        "requested_at": requested_at,
    }


@dataclass(frozen=True)
class HostileOp:
    """A record value shaped like an operator's request (or not even JSON): `request`,
    whether a reader of the timer-ops topic (a node, as it reads it: `new_names=False`)
    reads it as a request, carried out and answered; else it is a bad record,
    dead-lettered unanswered."""

    why: str
    value: bytes | None = field(repr=False)
    request: bool

    def __repr__(self) -> str:
        size = "None" if self.value is None else f"{len(self.value)} bytes"
        return f"HostileOp({self.why!r:.80}, {size}, request={self.request})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


OP_FIELD_CASES: list[tuple[tuple[str, ...], Any, bool]] = [
    (("request_id",), "r" * 200, True),
    (("request_id",), "r" * 201, False),
    (("request_id",), "", False),
    (("request_id",), 7, False),
    (("action",), "skip", True),
    (("action",), "RETRY", False),
    (("action",), "explode", False),
    (("action",), MISSING, False),
    (("requested_at",), MAX_INSTANT, True),
    (("requested_at",), MAX_INSTANT + 1, False),
    (("requested_at",), -1, False),
    (("requested_at",), 2**70, False),
    (("requested_at",), Raw(b"NaN"), False),
    (("target",), "fz.counter/x", False),
    (("target", "id"), "x" * 501, False),
    (("target", "id"), "a\x00b", True),  # names what is stored: no new name's check
    (("target", "extra"), 1, False),  # a nested part refuses a field it does not know
    # Unknown fields: kept within a body's bounds (`tables.bounds.check_json`), no further.
    (("extra",), {"note": "a newer writer's", "n": [MAX_INT64, MIN_INT64, 1e308]}, True),
    (("extra",), nested(MAX_DEPTH - 1), True),
    (("extra",), nested(MAX_DEPTH - 1, "dict"), True),
    (("extra",), "x" * 200_000, True),  # within a record's bound: a string has no other
    (("extra",), MAX_INT64 + 1, False),
    (("extra",), MIN_INT64 - 1, False),
    (("extra",), 2**70, False),
    (("extra",), {"a": [-(2**64)]}, False),
    (("extra",), Raw(b"1" + b"0" * 400), False),
    (("extra",), Raw(b"NaN"), False),
    (("extra",), Raw(b"-Infinity"), False),
    (("extra",), Raw(b"1e400"), False),
    (("extra",), nested(MAX_DEPTH), False),
    (("extra",), nested(MAX_DEPTH, "dict"), False),
    (("extra",), nested(300), False),
    (("extra",), nested(20_000), False),
    (("extra",), "x" * 300_000, False),  # past a record's bound
    (("extra",), Raw(b'"\\ud800"'), False),  # a lone surrogate
]
"""One field of a valid request replaced: whether the record still reads as a request."""


def hostile_ops(base: dict[str, Any]) -> list[HostileOp]:
    """Records made from the valid request `base` (its fields, `op_base`): one field pushed
    past its bound or to the wrong type (or just within its bound), an unknown field given
    twice (the last one is read: JSON has no key but a string, and the reader keeps one
    value a key), an unknown key no UTF-8, and bytes no reader takes as JSON of a request."""
    out = [
        HostileOp(f"{'.'.join(path)}={value!r:.60}", dump(with_field(base, path, value)), taken)
        for path, value, taken in OP_FIELD_CASES
    ]

    def twice(name: str, first: Any, last: Any, taken: bool) -> HostileOp:
        return HostileOp(_twice_why(name, first, last), _twice(base, name, first, last), taken)

    whole = dump(base)
    out += [
        twice("extra", 2**70, 1, True),
        twice("extra", 1, 2**70, False),
        twice("extra", nested(300), "ok", False),  # past the parser's depth, read or not
        twice("requested_at", -1, base["requested_at"], True),
        twice("requested_at", base["requested_at"], -1, False),
        HostileOp("an unknown key not UTF-8", whole[:-1] + b',"\xff":1}', False),
        HostileOp("an unknown key a lone surrogate", whole[:-1] + b',"\\ud800":1}', False),
        HostileOp("an empty unknown key", whole[:-1] + b',"":1}', True),
    ]
    out += [HostileOp(why, value, taken) for why, value, taken in _around(whole)]
    return out
