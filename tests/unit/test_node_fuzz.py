"""A whole node on the in-memory log, fed records no partition may stop on (#17, item 4).

Arbitrary bytes, arbitrary JSON, and envelopes built valid with one field pushed to an
extreme (huge and negative integers, numbers past any float, huge strings and keys, deep
nesting, wrong types, a reply address elsewhere, a record keyed or partitioned wrongly),
on every input topic (the log, the commands, the operators' requests), mixed with valid
timers on every partition, and results on the context's results topic whose code (or
refusal) is a newer writer's (well-formed, unknown to this version) or just outside the
codes' shape (65 characters, lower case, a control character); records shaped like an
owner's answer to an operator's request (`timer-op-answer`) there, at their fields' bounds
or past them, or no JSON at all (`hostile_records`), and answers on the input topics; and
records shaped like an operator's request on the timer-ops topic alike (unknown fields
within a body's bounds and past them: `hostile_records.hostile_ops`). What must hold:
every partition keeps firing, every valid timer fires once, each bad record has exactly
one dead letter holding its bytes and headers, nothing valid is dead-lettered, no result
is, each result of a newer code is counted once (read as ERROR), none other, and the
node's "unreadable result" lines (bounded) name unreadable results alone, never an
answer.

Each bad record is checked to be bad before it is written (`refused`, the node's own
rules: an envelope one field of which is broken may still be valid, e.g. a `null` where
the field is optional); the node is then held to dead-lettering exactly those. A second
node then takes every partition afresh from the log: no second letter, no second firing.

Beside the fuzz test, deterministic ones: the records of the bug report, a restore that
meets changelog rows it cannot read, and what this file found (each a minimal
reproduction: integers beyond 64 bits in a body, a fold the state store cannot write met
by a restore, and a start longer than the session timeout; each fixed since).
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from collections import Counter as Tally
from collections.abc import Iterator, Sequence, Set
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from fakes import RunningNode, running, wait_until
from hostile_records import (
    MISSING,
    Hostile,
    HostileOp,
    Raw,
    answer_base,
    dump,
    hostile_answers,
    hostile_ops,
    nested,
    with_field,
)
from hostile_records import op_base as request_fields
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from app.commands.processor import misrouted
from app.errors import BadRecord
from app.kafka import Headers, OutRecord, Record
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.model.decide import CLOCK_SKEW_MS, fold
from app.node import node_topics
from app.protocol.dead_letters import HEADER_PREFIX, DeadLetter, Stage
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    SCHEDULE_PAUSED,
    SCHEDULE_RESUMED,
    SCHEDULE_SET,
    SYSTEM_EVENTS,
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    Refusal,
    ResultCode,
    ScheduleSet,
    TimerOp,
    decode,
    encode,
)
from app.service import Service
from app.timers.op_answers import answer_of
from app.timers.subscription import timer_op
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.bounds import MAX_DEPTH, MAX_INSTANT, MAX_INT64, MIN_INT64
from tables.keys import row_key
from tables.partitioner import partition_of
from tables.rules import MAX_JITTER

CONTEXT, AGGREGATE = "fz", "counter"
PARTITIONS = 3
TOPICS = AggregateTopics(CONTEXT, AGGREGATE)
CONTEXT_TOPICS = ContextTopics(CONTEXT)
HOUR = 3_600_000
BIG_KEY = b"k" * (300 * 1024)

Kind = Literal["events", "commands", "timer-ops"]
KINDS: tuple[Kind, ...] = ("events", "commands", "timer-ops")
Via = Literal["command", "event"]
VIAS: tuple[Via, ...] = ("command", "event")
NoiseKind = Literal["noted", "op", "not-due", "later"]
NOISES: tuple[NoiseKind, ...] = ("noted", "op", "not-due", "later")


def topic_of(kind: Kind) -> str:
    return {"events": TOPICS.events, "commands": TOPICS.commands, "timer-ops": TOPICS.timer_ops}[
        kind
    ]


# --- the aggregate: "Schedule" schedules a once-timer that fires "Fire", which emits "Fired"


class Counter(BaseModel):
    fired: int = 0
    total: int = 0


counter = AggregateType(CONTEXT, AGGREGATE, Counter)


@counter.command("Schedule")
def _schedule(state: Counter, cmd: Command, d: Decision) -> None:
    d.schedule("k", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Fire"))


@counter.command("Fire")
def _fire(state: Counter, cmd: Command, d: Decision) -> None:
    d.emit("Fired", {"n": state.fired + 1})


@counter.applies("Fired")
def _fired(state: Counter, e: Event) -> Counter:
    return state.model_copy(update={"fired": e.body["n"]})


@counter.applies("Added")
def _added(state: Counter, e: Event) -> Counter:
    """Another writer's amounts, summed: each within bounds, their sum need not be."""
    return state.model_copy(update={"total": state.total + int(e.body["n"])})


@counter.applies("Boom")
def _boom(state: Counter, e: Event) -> Counter:
    """Another writer's event its applier cannot fold: refused when followed."""
    raise ValueError("Boom cannot be folded")


SERVICE = Service(aggregates=(counter,))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def ref(id: str) -> dict[str, Any]:
    return {"context": CONTEXT, "aggregate": AGGREGATE, "id": id}


# --- what the node refuses: the oracle a generated "bad" record is checked against ---------

LIMITS = InputLimits()
APPLIED = SYSTEM_EVENTS | counter.appliers.keys()


def refused(kind: Kind, key: bytes | None, value: bytes | None, partition: int) -> bool:
    """Whether the node dead-letters this record (by the rules it documents); False for a
    record it takes. Only for records of aggregates of their own (no state to consult)."""
    record = Record(topic_of(kind), partition, 0, key, value, 0)
    try:
        LIMITS.check(key, value)
        if kind == "timer-ops":
            # As a node reads it: it names parked timers' target as stored (`new_names`).
            decode(TimerOp, value, new_names=False)
            return False
        if kind == "events":
            event = decode(EventEnvelope, value)
            if misrouted(record, event.aggregate, PARTITIONS) is not None:
                return True
            if event.type.startswith("wow.") and event.type not in APPLIED:
                return True
            if event.aggregate.type_name == TOPICS.type_name:
                fold(counter, None, [event])  # followed: its applier's error refuses it
            timer_op(event, partition)
            return False
        cmd = decode(CommandEnvelope, value)
        if cmd.aggregate.type_name != TOPICS.type_name:
            return True
        if misrouted(record, cmd.aggregate, PARTITIONS) is not None:
            return True
        if cmd.in_process:
            return False  # passed over
        if cmd.reply_to is not None and cmd.reply_to != CONTEXT_TOPICS.results:
            return True
        if cmd.reply_partition is not None and cmd.reply_partition >= PARTITIONS:
            return True
        if cmd.not_before is not None and cmd.not_before > now_ms():
            if cmd.reply_to is not None:
                return False  # SCHEDULE_NOT_DUE, its sender sends it again
            if cmd.not_before - now_ms() > CLOCK_SKEW_MS:
                return True  # SCHEDULE_NOT_DUE and dead-lettered: no sender waits
            # (Within the clocks' skew: decided as of its due time.)
        if cmd.type not in counter.handlers:
            return True  # answered ERROR, and dead-lettered
        if cmd.type == "Schedule":
            OnceRule(at=int(cmd.body["at"]))  # what its handler does
        return False
    except Exception:
        return True


# --- records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """A record the node must dead-letter: written as is to `kind`'s topic, `partition`."""

    kind: Kind
    key: bytes | None = field(repr=False)
    value: bytes | None = field(repr=False)
    partition: int
    why: str
    headers: Headers = ()

    def __repr__(self) -> str:
        def short(b: bytes | None) -> str:
            return "None" if b is None else f"{b[:60]!r}({len(b)} bytes)"

        return (
            f"Bad({self.kind}[{self.partition}] {self.why}: key={short(self.key)} "
            f"value={short(self.value)} headers={self.headers!r})"
        )

    def record(self) -> OutRecord:
        return (topic_of(self.kind), self.partition, self.key, self.value, self.headers)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints a failing example by this (not its 300 KiB values)."""
        printer.text(repr(self))


@dataclass(frozen=True)
class Valid:
    """A once-timer of `owner` due `delay` ms after it is written: by a "Schedule" command
    or by another writer's `wow.ScheduleSet` on the log; `payload`, anything valid, rides
    in the command's body (the timer's command's, by the log)."""

    owner: str
    via: Via
    delay: int = 0
    payload: Any = field(default=None, repr=False)

    def record(self, now: int) -> OutRecord:
        return valid_timer(self.owner, now + self.delay, self.via, now, self.payload)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        payload = repr(self.payload)
        printer.text(f"Valid({self.owner!r}, {self.via!r}, {self.delay}, payload={payload:.80})")


@dataclass(frozen=True)
class Noise:
    """A valid record that schedules nothing due in the test (and is no bad record)."""

    what: NoiseKind
    n: int

    def record(self, now: int) -> OutRecord:
        owner = f"noise-{self.n}"
        p = partition_of(owner, PARTITIONS)
        if self.what == "noted":
            event = EventEnvelope(
                id=f"noise-e{self.n}",
                type="Noted",
                aggregate=AggregateRef(**ref(owner)),
                version=1,
                created_at=now,
                body={"big": 2**62, "deep": [[[[{"a": None}]]]]},
            )
            return (TOPICS.events, p, owner.encode(), encode(event))
        if self.what == "op":
            op = TimerOp(
                request_id=f"noise-o{self.n}",
                action="retry" if self.n % 2 else "skip",
                target=AggregateRef(**ref(owner)),
                requested_at=now,
            )
            key = None if self.n % 3 == 0 else str(op.target).encode()
            return (TOPICS.timer_ops, self.n % PARTITIONS, key, encode(op))
        cmd = CommandEnvelope(
            request_id=f"noise-c{self.n}",
            type="Schedule",
            aggregate=AggregateRef(**ref(owner)),
            body={"at": now + HOUR},
            issued_at=now,
            not_before=MAX_INSTANT if self.what == "not-due" else None,
            reply_to=CONTEXT_TOPICS.results,
            reply_partition=PARTITIONS - 1,
        )
        return (TOPICS.commands, p, owner.encode(), encode(cmd))


# --- results: codes a newer writer may give, and codes just outside their shape ------------

KNOWN_CODES = [c.value for c in ResultCode]
CODE_SHAPE = r"[A-Z][A-Z0-9_]{0,63}"
"""A code's shape (`app.protocol.results`): a well-formed code this version does not know
is a newer writer's, read as ERROR; anything else is no code (the result is unreadable)."""

newer_codes = (
    st.sampled_from(["A" * 64, "Z", "THROTTLED", "RULE_ENDED_2"])
    | st.from_regex(CODE_SHAPE, fullmatch=True)
).filter(lambda code: code not in KNOWN_CODES and code != "RULE_ENDED")
"""Well-formed codes this version does not know (as a result's code or a refusal's)."""

well_formed = st.sampled_from(KNOWN_CODES) | newer_codes


@st.composite
def one_lowered(draw: st.DrawFn) -> str:
    code = draw(well_formed.filter(lambda c: any(ch.isalpha() for ch in c)))
    at = draw(st.sampled_from([i for i, ch in enumerate(code) if ch.isalpha()]))
    return code[:at] + code[at].lower() + code[at + 1 :]


@st.composite
def with_control(draw: st.DrawFn) -> str:
    """A well-formed code with a control character in it (a trailing newline too, which a
    pattern anchored by `$` rather than matched whole would take)."""
    code, c = draw(well_formed), draw(st.characters(categories=["Cc"]))
    at = draw(st.sampled_from([0, len(code)]) | st.integers(0, len(code)))
    return code[:at] + c + code[at:]


outside_codes = st.one_of(
    st.from_regex(r"[A-Z][A-Z0-9_]{64}", fullmatch=True),  # 65 characters
    st.sampled_from(KNOWN_CODES).map(str.lower),
    one_lowered(),
    st.from_regex(r"[a-z][a-z0-9_]{0,63}", fullmatch=True),
    with_control(),
    st.sampled_from(["", "_ERROR", "1ERROR", " ERROR", "ERROR ", "ERROR-2"]),
    st.sampled_from(["\u00c9RROR", "\uff25RROR", "COMMITTE\u0130"]),  # not ASCII
)
"""Codes just outside the shape: no code at all, as a result's or a refusal's."""

ReadAs = Literal["known", "newer", "unreadable"]


@dataclass(frozen=True)
class Answer:
    """A result on the context's results topic under `request_id` (no send of the node
    waits for it): its code and refusal (None: left out) `reads` as this version reads them.
    The node's results reader passes it over: dead-letters nothing, answers nothing, and
    counts it in `tickwheel_unknown_result_codes_total` when `reads` is "newer"."""

    request_id: str
    code: str
    refusal: str | None
    reads: ReadAs

    def record(self, now: int) -> OutRecord:
        value: dict[str, Any] = {
            "request_id": self.request_id,
            "code": self.code,
            "aggregate": ref("answered"),
            "message": "from a newer writer, or none",
            "decided_at": now,
        }
        if self.refusal is not None:
            value["refusal"] = self.refusal
        p = partition_of(self.request_id, PARTITIONS)
        return (CONTEXT_TOPICS.results, p, self.request_id.encode(), dump(value))


def read_as(value: bytes | None) -> ReadAs:
    """How this version reads a result record (the oracle of `Answer.reads`)."""
    try:
        result = decode(CommandResult, value)
    except BadRecord:
        return "unreadable"
    return "known" if result.unknown_code is None else "newer"


REFUSALS = ["none", "none", "none", "known", "newer", "outside"]
"""A result's refusal, mostly left out (a well-formed one unknown to this version reads as
none; a malformed one makes the result unreadable)."""


@st.composite
def answers(draw: st.DrawFn, request_ids: Sequence[str]) -> Answer:
    """A result of a known, newer or malformed code, with no refusal, a known, a newer or a
    malformed one, under one of `request_ids` (commands the node answers itself) or its own."""
    code_kind, refusal_kind = draw(
        st.tuples(st.sampled_from(["known", "newer", "outside"]), st.sampled_from(REFUSALS))
    )
    codes = {"known": st.sampled_from(KNOWN_CODES), "newer": newer_codes}
    refusals = {"known": st.sampled_from([r.value for r in Refusal]), "newer": newer_codes}
    code = draw(codes.get(code_kind, outside_codes))
    refusal = None if refusal_kind == "none" else draw(refusals.get(refusal_kind, outside_codes))
    reads: ReadAs = (
        "unreadable"
        if "outside" in (code_kind, refusal_kind)
        else ("newer" if code_kind == "newer" else "known")
    )
    request_id = draw(st.sampled_from([*request_ids, f"answer-{len(code)}"]))
    return Answer(request_id, code, refusal, reads)


# --- records shaped like an owner's answer to an operator's request (`timer-op-answer`) -----

OP_ANSWERS = hostile_answers(answer_base("op-answer", ref("answered"), 0, 0))
"""Answers at their fields' bounds, records just past them, and bytes no reader takes."""


@dataclass(frozen=True)
class OpAnswer:
    """A record of `OP_ANSWERS` on the context's results topic, partition `partition`: the
    node passes it over, in silence when it reads as an answer (`case.answer`), else as an
    unreadable result (a line, bounded); it dead-letters nothing, counts nothing."""

    case: Hostile
    partition: int

    def record(self, now: int) -> OutRecord:
        return (CONTEXT_TOPICS.results, self.partition, b"op-answer", self.case.value)


op_answers = st.builds(OpAnswer, st.sampled_from(OP_ANSWERS), st.integers(0, PARTITIONS - 1))


# --- records shaped like an operator's request on the timer-ops topic ------------------------

OP_REQUESTS = hostile_ops(request_fields("op-request", ref("requested")))
"""Requests at their fields' bounds (unknown ones too), records just past them, and bytes
no reader takes."""


@dataclass(frozen=True)
class OpRequest:
    """A record of `OP_REQUESTS` that reads as a request (`case.request`), on the timer-ops
    topic, partition `partition`: carried out (nothing of its target is parked) and answered,
    never dead-lettered. One that does not is a `Bad` (`op_item`)."""

    case: HostileOp
    partition: int

    def record(self, now: int) -> OutRecord:
        return (TOPICS.timer_ops, self.partition, None, self.case.value)


def op_item(case: HostileOp, partition: int) -> OpRequest | Bad:
    """`case` on the timer-ops topic: a request, or a bad record with its one letter."""
    if case.request:
        return OpRequest(case, partition)
    return Bad("timer-ops", None, case.value, partition, f"timer-op {case.why}")


op_requests = st.builds(op_item, st.sampled_from(OP_REQUESTS), st.integers(0, PARTITIONS - 1))

Item = Bad | Valid | Noise | Answer | OpAnswer | OpRequest


def valid_timer(
    owner: str, at: int, via: Via, now: int | None = None, payload: Any = None
) -> OutRecord:
    """The record that schedules `owner`'s once-timer "k" at `at` (its "Fire" emits one
    "Fired"): a "Schedule" command, or another writer's `wow.ScheduleSet` (version 1)."""
    now = now_ms() if now is None else now
    p = partition_of(owner, PARTITIONS)
    aggregate = AggregateRef(**ref(owner))
    extra = {} if payload is None else {"payload": payload}
    if via == "command":
        cmd = CommandEnvelope(
            request_id=f"valid-{owner}",
            type="Schedule",
            aggregate=aggregate,
            body={"at": at} | extra,
            issued_at=now,
        )
        return (TOPICS.commands, p, owner.encode(), encode(cmd))
    body = ScheduleSet(key="k", rule=OnceRule(at=at), command=CommandSpec(type="Fire", body=extra))
    event = EventEnvelope(
        id=f"valid-{owner}",
        type=SCHEDULE_SET,
        aggregate=aggregate,
        version=1,
        created_at=now,
        body=body.model_dump(mode="json"),
    )
    return (TOPICS.events, p, owner.encode(), encode(event))


def owners(p: int, count: int, prefix: str = "ok") -> list[str]:
    """`count` aggregate ids of partition p (murmur2, as Kafka's default partitioner)."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        name = f"{prefix}{i}"
        if partition_of(name, PARTITIONS) == p:
            out.append(name)
        i += 1
    return out


# --- the bases an envelope is broken from, and the extremes it is broken with ---------------


def event_base(n: int, now: int, type_: str = "Noted") -> dict[str, Any]:
    return {
        "id": f"bad-e{n}",
        "type": type_,
        "aggregate": ref(f"bad-{n}"),
        "version": 1,
        "request_id": f"bad-r{n}",
        "created_at": now,
        "body": {},
    }


def schedule_set_base(n: int, now: int, rule: dict[str, Any]) -> dict[str, Any]:
    base = event_base(n, now, SCHEDULE_SET)
    base["body"] = {"key": "k", "rule": rule, "command": {"type": "Fire", "body": {}}}
    return base


def key_event_base(n: int, now: int, type_: str) -> dict[str, Any]:
    """A `wow.SchedulePaused` or `wow.ScheduleResumed` of the timer "k"."""
    base = event_base(n, now, type_)
    base["body"] = {"key": "k"}
    return base


def command_base(n: int, now: int) -> dict[str, Any]:
    return {
        "request_id": f"bad-c{n}",
        "type": "Schedule",
        "aggregate": ref(f"bad-{n}"),
        "body": {"at": now + HOUR},
        "issued_at": now,
    }


def op_base(n: int, now: int) -> dict[str, Any]:
    return {
        "request_id": f"bad-o{n}",
        "action": "retry",
        "target": ref(f"bad-{n}"),
        "requested_at": now,
    }


AGGREGATE_FIELDS: list[tuple[str, ...]] = [
    ("aggregate",),
    ("aggregate", "context"),
    ("aggregate", "aggregate"),
    ("aggregate", "tenant"),
    ("aggregate", "id"),
    ("aggregate", "extra"),
]
EVENT_FIELDS: list[tuple[str, ...]] = [
    ("id",),
    ("type",),
    *AGGREGATE_FIELDS,
    ("version",),
    ("request_id",),
    ("created_at",),
    ("body",),
]
SCHEDULE_FIELDS: list[tuple[str, ...]] = [
    ("body",),
    ("body", "key"),
    ("body", "rule"),
    ("body", "rule", "kind"),
    ("body", "rule", "at"),
    ("body", "rule", "start"),
    ("body", "rule", "every"),
    ("body", "rule", "expr"),
    ("body", "rule", "zone"),
    ("body", "rule", "coalesce"),
    ("body", "rule", "until"),
    ("body", "rule", "count"),
    ("body", "rule", "jitter"),
    ("body", "rule", "extra"),
    ("body", "command"),
    ("body", "command", "type"),
    ("body", "command", "body"),
    ("body", "target"),
    ("body", "target", "id"),
    ("body", "target", "context"),
]
COMMAND_FIELDS: list[tuple[str, ...]] = [
    ("request_id",),
    ("type",),
    *AGGREGATE_FIELDS,
    ("body",),
    ("body", "at"),
    ("not_before",),
    ("issued_at",),
    ("reply_to",),
    ("reply_partition",),
    ("in_process",),
]
OP_FIELDS: list[tuple[str, ...]] = [
    ("request_id",),
    ("action",),
    ("target",),
    ("target", "context"),
    ("target", "id"),
    ("target", "tenant"),
    ("requested_at",),
    ("extra",),  # an unknown field: kept within a body's bounds
]

EXTREMES: list[Any] = [
    2**64 + 5,
    2**70,
    2**63,
    -1,
    -(2**63) - 1,
    0,
    MAX_INSTANT + 1,
    Raw(b"1" + b"0" * 400),
    Raw(b"1e400"),
    Raw(b"-1e400"),
    1.5,
    "",
    "x" * 201,
    "x" * 501,
    "x" * 5_000,
    "x" * 200_000,  # within the record limit
    "x" * 300_000,  # beyond it
    "not-a-number",
    "fz",
    [],
    {},
    [1, 2],
    {"a": 2**70},
    nested(300),
    nested(1_000),
    nested(300, "dict"),
    nested(20_000),
    None,
    MISSING,
    True,
]
"""Values any field is pushed to (some of them fit some fields: `refused` tells)."""

FIELD_EXTREMES: dict[str, list[Any]] = {
    "reply_to": [TOPICS.events, TOPICS.commands, "other.results", "x" * 250],
    "reply_partition": [PARTITIONS, 99, 65_535, 65_536],
    "kind": ["weird", "ONCE", "cron"],
    "action": ["explode", "RETRY", "retry "],
    "expr": ["* * *", "99 * * * *", "x" * 201],
    "zone": ["Mars/Olympus", "localtime", "America"],
    "every": [2**70, 0, -5, MAX_INSTANT * 2],
    "at": [2**64 + 5, MAX_INSTANT + 1, -1],
    "start": [MAX_INSTANT, MAX_INSTANT + 1, -1],
    "until": [0, MAX_INSTANT + 1, -1, 2**64 + 5],
    "count": [0, -1, MAX_INT64 + 1, 2**70],
    "jitter": [0, -1, MAX_JITTER + 1, 2**64 + 5],
    "type": ["wow.Unknown", "wow.", "Unknown"],
    "context": ["other", "a.b", "no spaces", "ü"],
}


def json_of(integers: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | integers
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=30)
    )
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=20,
    )


json_values = json_of(st.integers())
"""Any JSON value (integers of any size)."""


def deep_list(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


payloads: st.SearchStrategy[Any] = (
    st.none()
    | json_of(st.integers(MIN_INT64, MAX_INT64))
    | st.sampled_from(
        [
            # As deep as a body may nest (the event's body holds the command's two deeper).
            deep_list(MAX_DEPTH - 4),
            "ü" * 20_000,
            [MAX_INT64, MIN_INT64, 1e308, -0.0, 5e-324],
            {"": {}},
        ]
    )
)
"""What a valid record's body may hold: numbers within bounds (signed 64 bits, finite), JSON
nested as deep as bounds allow, long strings."""


def extremes_for(path: Sequence[str]) -> st.SearchStrategy[Any]:
    return st.sampled_from(FIELD_EXTREMES.get(path[-1], []) + EXTREMES) | json_values


header_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz._-", min_size=1, max_size=12).filter(
    lambda name: not name.startswith(HEADER_PREFIX)
)
headers_strategy: st.SearchStrategy[Headers] = st.lists(
    st.tuples(header_names, st.binary(max_size=16)), max_size=3
).map(tuple)


Shape = Literal[
    "noted", "boom", "once", "interval", "cron", "paused", "resumed", "command", "op", "answer"
]
How = Literal["field", "key", "partition", "as-is"]
Shapeless = Literal["bytes", "json", "deep", "tombstone", "huge"]


@dataclass(frozen=True)
class Way:
    """One way to break a record: which field of which envelope, or its key or partition,
    or a record of no envelope's shape at all."""

    kind: Kind
    shape: Shape | Shapeless
    how: How | None = None
    path: tuple[str, ...] = ()


WAYS: list[Way] = [
    *(Way("events", "noted", "field", path) for path in EVENT_FIELDS),
    Way("events", "boom", "as-is"),
    *(Way("events", "once", "field", path) for path in SCHEDULE_FIELDS),
    *(
        Way("events", shape, "field", path)
        for shape in ("interval", "cron")
        for path in SCHEDULE_FIELDS
        if path[:2] == ("body", "rule")
    ),
    *(
        Way("events", shape, "field", path)
        for shape in ("paused", "resumed")
        for path in [("body",), ("body", "key")]
    ),
    Way("events", "noted", "key"),
    Way("events", "once", "partition"),
    Way("events", "paused", "partition"),
    *(Way("commands", "command", "field", path) for path in COMMAND_FIELDS),
    Way("commands", "command", "key"),
    Way("commands", "command", "partition"),
    *(Way("timer-ops", "op", "field", path) for path in OP_FIELDS),
    Way("timer-ops", "op", "key"),
    # An owner's answer where no answer goes: no envelope of the topic.
    *(Way(kind, "answer", "as-is") for kind in KINDS),
    *(
        Way(kind, what)
        for kind in KINDS
        for what in ("bytes", "json", "json", "deep", "tombstone", "huge")
    ),
]
"""Each of them, in turn (a permutation of them per example): all are met in a run."""


def base_of(shape: Shape, n: int, now: int) -> dict[str, Any]:
    """The valid envelope (of aggregate "bad-<n>") a bad record is broken from."""
    if shape == "noted":
        return event_base(n, now)
    if shape == "boom":
        return event_base(n, now, "Boom")
    if shape == "once":
        return schedule_set_base(n, now, {"kind": "once", "at": now + HOUR})
    if shape == "interval":
        return schedule_set_base(n, now, {"kind": "interval", "start": now + HOUR, "every": 60_000})
    if shape == "cron":
        return schedule_set_base(n, now, {"kind": "cron", "expr": "0 0 1 1 *", "zone": "UTC"})
    if shape == "paused":
        return key_event_base(n, now, SCHEDULE_PAUSED)
    if shape == "resumed":
        return key_event_base(n, now, SCHEDULE_RESUMED)
    if shape == "command":
        return command_base(n, now)
    if shape == "answer":
        return answer_base(f"bad-a{n}", ref(f"bad-{n}"), 0, 0, answered_at=now)
    return op_base(n, now)


@st.composite
def broken(draw: st.DrawFn, way: Way, n: int, now: int) -> Bad:
    """A record broken `way`: `refused` checks that it really is bad."""
    kind, owner = way.kind, f"bad-{n}"
    right = partition_of(owner, PARTITIONS)
    partition = right if kind != "timer-ops" else draw(st.integers(0, PARTITIONS - 1))

    def bad(key: bytes | None, value: bytes | None, partition: int = partition) -> bool:
        return refused(kind, key, value, partition)

    if way.how is None:  # no envelope at all
        value: bytes | None
        if way.shape == "bytes":
            value = draw(st.binary(max_size=200))
        elif way.shape == "json":
            value = json.dumps(draw(json_values)).encode()
        elif way.shape == "deep":
            value = dump(
                draw(
                    st.sampled_from(
                        [nested(300), nested(1_000), nested(500, "dict"), nested(50_000)]
                    )
                )
            )
        elif way.shape == "tombstone":
            value = None
        else:
            value = draw(st.sampled_from([b"{}", b"x" * 300_000, b"[" * 300_000]))
        keys = st.sampled_from([None, owner.encode(), BIG_KEY]) | st.binary(max_size=20)
        key = draw(keys.filter(lambda k: bad(k, value)))
        return Bad(kind, key, value, partition, f"{kind} {way.shape}")
    assert way.shape in (
        "noted", "boom", "once", "interval", "cron", "paused", "resumed", "command", "op",
        "answer",
    )  # fmt: skip
    base = base_of(way.shape, n, now)
    key = owner.encode() if kind != "timer-ops" else None
    if way.how == "field":
        path = way.path
        extreme = draw(
            extremes_for(path).filter(lambda v: bad(key, dump(with_field(base, path, v))))
        )
        why = f"{way.shape} {'.'.join(path)}={extreme!r:.60}"
        return Bad(kind, key, dump(with_field(base, path, extreme)), partition, why)
    if way.how == "key":
        keys = st.sampled_from([None, b"", b"other", BIG_KEY, owner.encode() + b" "])
        key = draw(keys.filter(lambda k: bad(k, dump(base))))
        return Bad(kind, key, dump(base), partition, f"{way.shape} key={key!r:.40}")
    if way.how == "partition":
        partition = draw(st.sampled_from([q for q in range(PARTITIONS) if q != right]))
        assert bad(key, dump(base), partition)
        return Bad(kind, key, dump(base), partition, f"{way.shape} misrouted to {partition}")
    assert bad(key, dump(base))
    return Bad(kind, key, dump(base), partition, f"{way.shape} as it is")


@st.composite
def bad_records(draw: st.DrawFn, count: int, now: int) -> list[Bad]:
    """`count` bad records, each broken another way (as far as there are ways), each with
    headers of its own."""
    order = draw(st.permutations(range(len(WAYS))))
    out = []
    for n in range(count):
        bad = draw(broken(WAYS[order[n % len(WAYS)]], n, now))
        headers = draw(headers_strategy)
        out.append(Bad(bad.kind, bad.key, bad.value, bad.partition, bad.why, headers))
    return out


@dataclass
class Scenario:
    early: list[Bad]
    """Written before the node starts (read by its restore, then its subscription)."""
    items: list[Item]
    """Written once it runs, in this order (the valid timers' due times from then)."""

    @property
    def valid(self) -> list[Valid]:
        return [i for i in self.items if isinstance(i, Valid)]

    @property
    def newer_codes(self) -> int:
        """How many results of a newer writer's code it writes (each counted once)."""
        return sum(isinstance(i, Answer) and i.reads == "newer" for i in self.items)

    @property
    def unreadable_results(self) -> bool:
        """Whether it writes a record of the results topic that is neither a result nor an
        answer (the first one is logged)."""
        return any(
            (isinstance(i, Answer) and i.reads == "unreadable")
            or (isinstance(i, OpAnswer) and not i.case.answer)
            for i in self.items
        )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    now = now_ms()
    count = draw(st.integers(10, 40))
    bad = draw(bad_records(count, now))
    early_flags = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    mixed: list[Item] = [b for b, early in zip(bad, early_flags, strict=True) if not early]
    for p in range(PARTITIONS):
        vias = draw(st.lists(st.sampled_from(VIAS), min_size=1, max_size=3))
        pool = owners(p, len(vias) + 1)
        for owner, via in zip(pool, vias, strict=False):
            mixed.append(Valid(owner, via, draw(st.integers(0, 300)), draw(payloads)))
    noise = draw(st.lists(st.sampled_from(NOISES), max_size=4))
    mixed += [Noise(what, n) for n, what in enumerate(noise)]
    # Results under the request ids of commands the node answers itself, or of none.
    answered = [f"valid-{i.owner}" for i in mixed if isinstance(i, Valid)]
    answered += [f"noise-c{n}" for n, what in enumerate(noise) if what in ("not-due", "later")]
    mixed += draw(st.lists(answers(answered), max_size=6))
    mixed += draw(st.lists(op_answers, max_size=10))
    mixed += draw(st.lists(op_requests, max_size=10))
    items = draw(st.permutations(mixed))
    # After every bad record, one more timer in each partition: each partition goes on.
    for p in range(PARTITIONS):
        items.append(Valid(owners(p, 1, prefix="last")[0], "command", 100))
    early = [b for b, e in zip(bad, early_flags, strict=True) if e]
    return Scenario(early, items)


# --- a node on the memory log ---------------------------------------------------------------


def fuzz_node(
    log: MemoryLog, data: Path, name: str, session_timeout_ms: int = 10_000
) -> RunningNode:
    """A node of the service, not started. Its session timeout is the default (10 s), not a
    test's usual 1 s: a node whose start takes longer than it never says ready (see the last
    test), and a loaded machine may take a second to start one."""
    return RunningNode(log, data, name, SERVICE, PARTITIONS, session_timeout_ms=session_timeout_ms)


Position = tuple[str, int, int]


def letters(log: MemoryLog) -> dict[Position, list[DeadLetter]]:
    """The committed dead letters, by the (topic, partition, offset) of their record."""
    out: dict[Position, list[DeadLetter]] = {}
    for r in log.records(CONTEXT_TOPICS.dead_letters, 0):
        letter = DeadLetter.read(r.key, r.value, r.headers)
        out.setdefault((letter.topic, letter.partition, letter.offset), []).append(letter)
    return out


def fired(log: MemoryLog, skip: Set[Position] = frozenset()) -> Tally[str]:
    """How many "Fired" events each aggregate has on the log (bad records left out)."""
    out: Tally[str] = Tally()
    for p in range(PARTITIONS):
        for r in log.records(TOPICS.events, p):
            if (TOPICS.events, p, r.offset) in skip:
                continue
            event = decode(EventEnvelope, r.value)
            if event.type == "Fired":
                out[event.aggregate.id] += 1
    return out


async def write(log: MemoryLog, record: OutRecord) -> Position:
    (offset,) = await log.publisher().send_many([record])
    assert record[1] is not None
    return record[0], record[1], offset


@dataclass(frozen=True)
class Letter:
    """What a dead letter must hold: its record's bytes, and (when given) its stage."""

    key: bytes | None = field(repr=False)
    value: bytes | None = field(repr=False)
    headers: Headers = ()
    stage: Stage | None = None
    why: str = ""


def expect(written: dict[Position, Bad]) -> dict[Position, Letter]:
    return {pos: Letter(b.key, b.value, b.headers, None, repr(b)) for pos, b in written.items()}


def assert_letters(log: MemoryLog, expected: dict[Position, Letter]) -> None:
    """Each bad record has exactly one letter, holding its key, value and headers byte for
    byte; no other record has one."""
    got = letters(log)
    unexpected = {pos: [x.error for x in got[pos]] for pos in got.keys() - expected.keys()}
    assert not unexpected, f"records dead-lettered that are not bad: {unexpected}"
    missing = {pos: expected[pos].why for pos in expected.keys() - got.keys()}
    assert not missing, f"bad records without a dead letter: {missing}"
    for pos, want in expected.items():
        assert len(got[pos]) == 1, f"{want.why}: {len(got[pos])} letters"
        (letter,) = got[pos]
        assert letter.key == want.key, f"{want.why}: the letter's key differs"
        assert letter.value == want.value, f"{want.why}: the letter's value differs"
        assert letter.headers == want.headers, f"{want.why}: the letter's headers differ"
        assert letter.context.truncated is None, want.why
        if want.stage is not None:
            assert letter.context.stage is want.stage, f"{want.why}: {letter.context}"


def assert_healthy(node: RunningNode) -> None:
    health = node.node.health()
    assert health["ready"], health
    assert health["owned"] == list(range(PARTITIONS)), health
    assert health["stalled"] == {}, health
    assert "failing" not in health, health
    assert "failed" not in health, health


# --- the fuzz test ---------------------------------------------------------------------------


def newer_codes_counted(node: RunningNode) -> float:
    """The node's `tickwheel_unknown_result_codes_total` of the context."""
    sample = node.node.metrics.registry.get_sample_value(
        "tickwheel_unknown_result_codes_total", {"context": CONTEXT}
    )
    return sample or 0.0


class ResultLines(logging.Handler):
    """The positions the node's "unreadable result" lines name (`ResultsReader`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.named: list[Position] = []

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("unreadable result") and isinstance(record.args, tuple):
            topic, partition, offset = record.args[:3]
            assert isinstance(topic, str) and isinstance(partition, int), record.args
            assert isinstance(offset, int), record.args
            self.named.append((topic, partition, offset))


@contextmanager
def result_lines() -> Iterator[ResultLines]:
    lines = ResultLines()
    logger = logging.getLogger("app.timers.sender")
    level = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(lines)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)


async def play(scenario: Scenario, data: Path) -> MemoryLog:
    """Plays `scenario` to a node, then a second node takes every partition afresh: the
    log they wrote, for a test's own checks."""
    log = MemoryLog()
    written: dict[Position, Bad] = {}
    # The results topic's records of the scenario, and those of them that are answers.
    results: set[Position] = set()
    answers_at: dict[Position, OpAnswer] = {}
    log.ensure_topics(node_topics([TOPICS], PARTITIONS))
    for bad in scenario.early:
        written[await write(log, bad.record())] = bad
    with result_lines() as lines:
        async with running(fuzz_node(log, data, "a")) as node:
            for item in scenario.items:
                if isinstance(item, Bad):
                    written[await write(log, item.record())] = item
                    continue
                record = item.record(now_ms())
                if isinstance(item, Answer):  # each code is on the side of the shape meant
                    assert read_as(record[3]) == item.reads, item
                at = await write(log, record)
                if isinstance(item, Answer | OpAnswer):
                    results.add(at)
                if isinstance(item, OpAnswer) and item.case.answer:
                    answers_at[at] = item
            await played(scenario, log, node, written, lines)
        named = set(lines.named)
        assert named <= results, f"lines naming no unreadable result: {named - results}"
        logged = [answers_at[at] for at in named & answers_at.keys()]
        assert not logged, f"answers logged as unreadable results: {logged}"
        lines.named.clear()
        expected = {v.owner: 1 for v in scenario.valid}
        # Another node takes every partition afresh (a data dir of its own: it restores the
        # states and the timers from the log alone, the bad records on it): no record is
        # dead-lettered again, no timer fires again, and each partition fires a new one.
        async with running(fuzz_node(log, data, "b")) as node:
            now = now_ms()
            for p in range(PARTITIONS):
                owner = owners(p, 1, prefix="again")[0]
                await write(log, valid_timer(owner, now + 50, "event" if p % 2 else "command"))
                expected[owner] = 1
            skip = set(written)

            def why() -> str:
                return f"fired {dict(fired(log, skip))}, expected {expected}; {node.node.health()}"

            await wait_until(lambda: fired(log, skip) == expected, within=10, what=why)
            await asyncio.sleep(0.2)
            assert fired(log, skip) == expected, why()
            assert_letters(log, expect(written))
            assert newer_codes_counted(node) == 0, "results are read from their end: none again"
            assert_healthy(node)
        assert not lines.named, "results are read from their end: none logged again"
    return log


async def played(
    scenario: Scenario,
    log: MemoryLog,
    node: RunningNode,
    written: dict[Position, Bad],
    lines: ResultLines,
) -> None:
    """The first node has played `scenario` out: every valid timer fired once, each bad
    record has its letter, each newer code is counted, an unreadable result is logged."""
    expected = {v.owner: 1 for v in scenario.valid}
    skip = set(written)

    def done() -> bool:
        return (
            fired(log, skip) == expected
            and len(letters(log)) >= len(written)
            and newer_codes_counted(node) >= scenario.newer_codes
            and (bool(lines.named) or not scenario.unreadable_results)
        )

    def why() -> str:
        got = letters(log)
        return (
            f"fired {dict(fired(log, skip))}, expected {expected}; "
            f"{sum(map(len, got.values()))} letters of {len(written)} bad records; "
            f"missing {[b for pos, b in written.items() if pos not in got]}; "
            f"{newer_codes_counted(node)} newer codes of {scenario.newer_codes}; "
            f"{len(lines.named)} unreadable results logged; health {node.node.health()}"
        )

    await wait_until(done, within=10, what=why)
    await asyncio.sleep(0.2)  # anything fired, dead-lettered or counted twice would be by now
    assert fired(log, skip) == expected, why()
    assert_letters(log, expect(written))  # no result among the letters
    assert newer_codes_counted(node) == scenario.newer_codes, why()
    assert_healthy(node)


@settings(
    max_examples=15,
    deadline=None,
    database=None,
    # A failing example waits out its bounds (10 s a node): shrinking would take many
    # minutes. The example is printed as drawn (its reprs cut short) with its seed.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)
@given(scenario=scenarios())
def test_no_record_stops_a_partition_and_every_bad_one_has_exactly_one_letter(
    scenario: Scenario,
) -> None:
    with tempfile.TemporaryDirectory() as data:
        asyncio.run(play(scenario, Path(data)))


async def test_every_record_shaped_as_an_answer_stops_nothing(tmp_path: Path) -> None:
    """Each of `OP_ANSWERS` on the results topic (answers at their fields' bounds, records
    past them, bytes no reader takes), and a valid answer on each input topic, among valid
    timers of every partition: the fuzz test's invariants hold (each answer elsewhere has
    its one letter, nothing on the results topic has one, no answer is logged)."""
    now = now_ms()
    elsewhere = [
        Bad(kind, key, dump(base_of("answer", n, now)), p, f"an answer on {kind}")
        for n, kind in enumerate(KINDS)
        for key, p in [(f"bad-{n}".encode(), partition_of(f"bad-{n}", PARTITIONS))]
    ]
    for bad in elsewhere:
        assert refused(bad.kind, bad.key, bad.value, bad.partition), bad
    items: list[Item] = [OpAnswer(c, n % PARTITIONS) for n, c in enumerate(OP_ANSWERS)]
    for n, bad in enumerate(elsewhere):
        items.insert(n * 30, bad)
    for p in range(PARTITIONS):
        items.insert(0, Valid(owners(p, 1, prefix="first")[0], "event", 100))
        items.append(Valid(owners(p, 1, prefix="last")[0], "command", 100))
    await play(Scenario([], items), tmp_path)


async def test_every_record_shaped_as_a_request_stops_nothing(tmp_path: Path) -> None:
    """Each of `OP_REQUESTS` on the timer-ops topic (requests at their fields' bounds,
    unknown fields among them, records past them, bytes no reader takes), among valid
    timers of every partition: each that is no request has its one letter, read as no
    request (READ: never carried out), and the others none; every partition goes on."""
    items: list[Item] = [op_item(c, n % PARTITIONS) for n, c in enumerate(OP_REQUESTS)]
    for bad in items:
        if isinstance(bad, Bad):
            assert refused(bad.kind, bad.key, bad.value, bad.partition), bad
    for p in range(PARTITIONS):
        items.insert(0, Valid(owners(p, 1, prefix="first")[0], "event", 100))
        items.append(Valid(owners(p, 1, prefix="last")[0], "command", 100))
    log = await play(Scenario([], items), tmp_path)
    stages = {pos: got[0].context.stage for pos, got in letters(log).items()}
    assert set(stages.values()) == {Stage.READ}, stages
    # Each request answered once (DONE, or DUPLICATE of the first copy in its partition).
    answered = [
        answer
        for p in range(PARTITIONS)
        for r in log.records(CONTEXT_TOPICS.results, p)
        if (answer := answer_of(r)) is not None
    ]
    assert len(answered) == sum(isinstance(i, OpRequest) for i in items), answered


# --- the records of the bug report ----------------------------------------------------------


def bug_report_records(now: int) -> list[Bad]:
    """The two ScheduleSet events of the report (once `at` 2**64+5, interval `every`
    2**70), and a 300 KiB key on the log and on the commands topic: all of "bad-1"."""
    owner = "bad-1"
    p = partition_of(owner, PARTITIONS)
    once = schedule_set_base(1, now, {"kind": "once", "at": 2**64 + 5})
    every = with_field(
        schedule_set_base(2, now, {"kind": "interval", "start": now, "every": 2**70}),
        ("aggregate", "id"),
        owner,
    )
    return [
        Bad("events", owner.encode(), dump(once), p, "once at 2**64+5"),
        Bad("events", owner.encode(), dump(every), p, "interval every 2**70"),
        Bad("events", BIG_KEY, dump(event_base(1, now)), p, "300 KiB key on the log"),
        Bad("commands", BIG_KEY, dump(command_base(1, now)), p, "300 KiB key on commands"),
    ]


async def test_the_records_of_the_bug_report_are_dead_lettered_and_the_timers_around_fire(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    p = partition_of("bad-1", PARTITIONS)
    before = owners(p, 4, prefix="before")
    after = owners(p, 4, prefix="after")
    elsewhere = [owners(q, 1, prefix="other")[0] for q in range(PARTITIONS) if q != p]
    written: dict[Position, Bad] = {}
    async with running(fuzz_node(log, tmp_path, "a")) as node:
        now = now_ms()
        for i, owner in enumerate(before):
            await write(log, valid_timer(owner, now + 100, "command" if i % 2 else "event"))
        for bad in bug_report_records(now):
            written[await write(log, bad.record())] = bad
        for i, owner in enumerate(after + elsewhere):
            await write(log, valid_timer(owner, now + 100, "event" if i % 2 else "command"))
        expected = dict.fromkeys(before + after + elsewhere, 1)

        def why() -> str:
            return f"fired {dict(fired(log, set(written)))}; health {node.node.health()}"

        await wait_until(lambda: fired(log, set(written)) == expected, within=15, what=why)
        await wait_until(
            lambda: len(letters(log)) >= 4, within=15, what=lambda: f"letters {letters(log)}"
        )
        await asyncio.sleep(0.2)
        assert fired(log, set(written)) == expected
        assert_letters(log, expect(written))
        stages = {written[pos].why: got[0].context.stage for pos, got in letters(log).items()}
        assert stages["300 KiB key on the log"] is stages["300 KiB key on commands"] is Stage.READ
        # Refused reading its envelope's bounds, or applying its rule: either is the record's.
        assert {stages["once at 2**64+5"], stages["interval every 2**70"]} <= {
            Stage.READ,
            Stage.APPLY,
        }
        assert_healthy(node)


# --- a restore that meets a changelog row it cannot read ------------------------------------


def unreadable_rows(p: int, at: int) -> list[tuple[bytes, bytes]]:
    """Rows of the timer changelog's partition p no restore can take: garbage under a
    row's key, and a whole Timer (due `at`) whose version is 2**70."""
    owner = AggregateRef(**ref(owners(p, 1, prefix="row")[0]))
    timer = Timer(
        id="row-1",
        owner=owner,
        key="k",
        version=1,
        partition=p,
        rule=OnceRule(at=at),
        target=owner,
        command=CommandSpec(type="Fire"),
        slot_due_at=at,
        due_at=at,
    )
    row = timer.model_dump(mode="json") | {"version": 2**70}
    return [
        (row_key(owner, "garbage"), b"\x00\xffnot a timer"),
        (row_key(owner, "k"), dump(row)),
    ]


def tombstoned(log: MemoryLog, p: int, key: bytes) -> bool:
    """Whether the changelog's last record of `key` (committed) is a tombstone."""
    latest = [r.value for r in log.records(TOPICS.timers_changelog, p) if r.key == key]
    return bool(latest) and latest[-1] is None


async def fires_in_every_partition(log: MemoryLog, node: RunningNode, prefix: str) -> None:
    """Two valid timers in each partition (by a command, by another writer's event) fire."""
    names = [o for q in range(PARTITIONS) for o in owners(q, 2, prefix=prefix)]
    now = now_ms()
    for i, owner in enumerate(names):
        await write(log, valid_timer(owner, now + 50, "event" if i % 2 else "command"))

    def all_fired() -> bool:
        got = fired(log)
        return all(got[o] == 1 for o in names)

    await wait_until(all_fired, within=15, what=lambda: f"fired {fired(log)}; {node.node.health()}")


async def test_a_restore_letters_an_unreadable_row_once_and_takes_the_partition(
    tmp_path: Path,
) -> None:
    """A row of the changelog no restore can read: the node still takes its partition and
    fires its timers; the row has one letter (stage "restore") and a tombstone after it,
    so no later owner letters it again. One written between two owners is the next one's."""
    log = MemoryLog()
    log.ensure_topics(node_topics([TOPICS], PARTITIONS))
    p = 1
    publisher = log.publisher()
    expected: dict[Position, Letter] = {}

    async def put_row(key: bytes, value: bytes) -> None:
        (offset,) = await publisher.send_many([(TOPICS.timers_changelog, p, key, value)])
        expected[(TOPICS.timers_changelog, p, offset)] = Letter(
            key, value, (), Stage.RESTORE, f"changelog row at {offset}: {value[:40]!r}"
        )

    # A timer of the same partition, due soon, restored beside them: it fires.
    due = now_ms() + 500
    survivor = owners(p, 1, prefix="survivor")[0]
    good = Timer(
        id="survivor-1",
        owner=AggregateRef(**ref(survivor)),
        key="k",
        version=1,
        partition=p,
        rule=OnceRule(at=due),
        target=AggregateRef(**ref(survivor)),
        command=CommandSpec(type="Fire"),
        slot_due_at=due,
        due_at=due,
    )
    await publisher.send_many(
        [(TOPICS.timers_changelog, p, row_key(good.owner, good.key), encode(good))]
    )
    for key, value in unreadable_rows(p, now_ms() + HOUR):
        await put_row(key, value)

    async with running(fuzz_node(log, tmp_path, "a")) as a:
        await fires_in_every_partition(log, a, "a")
        await wait_until(lambda: fired(log)[survivor] == 1, within=15, what=lambda: f"{fired(log)}")
        await wait_until(
            lambda: len(letters(log)) == len(expected), within=15, what=lambda: f"{letters(log)}"
        )
        assert_letters(log, expected)
        assert_healthy(a)
    for key, _ in unreadable_rows(p, 0):
        assert tombstoned(log, p, key), "no tombstone after the unreadable row"

    # Garbage again between two owners: the next one letters it (and only it).
    key, value = unreadable_rows(p, 0)[0]
    await put_row(key, value + b"!")
    async with running(fuzz_node(log, tmp_path, "b")) as b:  # a data dir of its own: a full restore
        await fires_in_every_partition(log, b, "b")
        await wait_until(
            lambda: len(letters(log)) == len(expected), within=15, what=lambda: f"{letters(log)}"
        )
        await asyncio.sleep(0.2)
        assert_letters(log, expected)
        assert_healthy(b)
    assert tombstoned(log, p, key)
    async with running(fuzz_node(log, tmp_path, "a")) as a2:  # its own copy again, marked clean
        await fires_in_every_partition(log, a2, "c")
        await asyncio.sleep(0.2)
        assert_letters(log, expected)
        assert_healthy(a2)
    assert fired(log)[survivor] == 1


@pytest.mark.parametrize("overdue", [False, True], ids=["later", "overdue"])
async def test_garbage_under_a_live_timers_key_leaves_the_timer(
    tmp_path: Path, overdue: bool
) -> None:
    """Another writer's unreadable record under the changelog key of a live timer: the
    next owner's restore keeps the row it held before, letters the record, and writes that
    row again after it (a tombstone there deleted the timer for every owner after it).
    Overdue at the takeover, the timer fires at once: the row written again comes before
    its FIRED row in the changelog (staged after it, it came last, and the next owner
    fired the timer again)."""
    log = MemoryLog()
    log.ensure_topics(node_topics([TOPICS], PARTITIONS))
    p = 1
    owner, later = owners(p, 2, prefix="victim")
    key = row_key(AggregateRef(**ref(owner)), "k")
    due = now_ms() + (1_000 if overdue else 3_000)

    def rows() -> list[bytes | None]:
        return [r.value for r in log.records(TOPICS.timers_changelog, p) if r.key == key]

    def sends() -> int:
        return sum(r.key == owner.encode() for r in log.records(TOPICS.commands, p))

    async with running(fuzz_node(log, tmp_path, "a")):
        await write(log, valid_timer(owner, due, "event"))
        await wait_until(lambda: any(rows()), within=10, what=lambda: "the timer's row")
    await log.publisher().send_many([(TOPICS.timers_changelog, p, key, b"garbage")])
    if overdue:
        await wait_until(lambda: now_ms() > due, within=5, what=lambda: "its due time")
    async with running(fuzz_node(log, tmp_path, "b")) as b:  # a full restore
        await wait_until(lambda: len(letters(log)) == 1, within=10, what=lambda: f"{letters(log)}")
        if overdue:
            await wait_until(lambda: fired(log)[owner] == 1, within=15, what=lambda: f"{rows()}")
            await wait_until(
                lambda: b"FIRED" in (rows()[-1] or b""), within=10, what=lambda: f"{rows()}"
            )
        else:
            await wait_until(
                lambda: rows()[-1] not in (None, b"garbage"), within=10, what=lambda: f"{rows()}"
            )
            store = b.node.types[TOPICS.type_name].store
            found = await store.find(AggregateRef(**ref(owner)), "k")
            assert found is not None and found.status is TimerStatus.PENDING
        assert_healthy(b)
    async with running(fuzz_node(log, tmp_path, "c")):  # and the owner after it
        await wait_until(lambda: fired(log)[owner] == 1, within=15, what=lambda: f"{fired(log)}")
        # A timer due now fires after the victim would have fired again, if it were to.
        await write(log, valid_timer(later, now_ms(), "event"))
        await wait_until(lambda: fired(log)[later] == 1, within=15, what=lambda: f"{fired(log)}")
    assert b"FIRED" in (rows()[-1] or b"")
    assert sends() == 1, "the victim's command was sent again"
    assert len(letters(log)) == 1


# --- integers beyond 64 bits inside a body: found by this file (fixed since) -----------------

BEYOND_64_BITS = ["in-process", "sent", "followed", "restored"]


def beyond_64_bits(case: str, now: int) -> Bad:
    """A record of aggregate "bad-1" that holds an integer beyond signed 64 bits where no
    field bounds it (a body is any JSON object):

    - in-process: a `wow.ScheduleSet` whose command's body is {"x": 2**70}, sent to its
      owner, so fired in-process;
    - sent: the same with {"x": -2**70}, sent to an aggregate of another partition;
    - followed: another writer's "Fired" {"n": 2**70}, which the applier folds into the
      aggregate's state;
    - restored: the same, on the log before the node starts (its restore folds it)."""
    owner = "bad-1"
    p = partition_of(owner, PARTITIONS)
    once = {"kind": "once", "at": now + 100}
    if case == "in-process":
        envelope = with_field(schedule_set_base(1, now, once), ("body", "command", "body"), {})
        envelope = with_field(envelope, ("body", "command", "body", "x"), 2**70)
    elif case == "sent":
        target = owners((p + 1) % PARTITIONS, 1, prefix="target")[0]
        envelope = with_field(schedule_set_base(1, now, once), ("body", "target"), ref(target))
        envelope = with_field(envelope, ("body", "command", "body", "x"), -(2**70))
    else:
        envelope = with_field(event_base(1, now, "Fired"), ("body", "n"), 2**70)
    return Bad("events", owner.encode(), dump(envelope), p, f"2**70 {case}")


@pytest.mark.parametrize("case", BEYOND_64_BITS)
async def test_an_integer_beyond_64_bits_in_a_body_stops_no_partition(
    case: str, tmp_path: Path
) -> None:
    """A body's integer beyond signed 64 bits is bad input at the edge (bounds: "never a
    row"). Found by this file before `tables.bounds.check_json` (e326f1e), each stopped its
    partition or had no letter: in-process, orjson raised encoding the timer's command in
    the cycle, over and over (a retake loop, no other timer of the partition fired, and
    health said ready); sent, every send raised (retried, then parked); followed, the
    state's encoding raised in the commit's callback and the retake's restore raised out
    of the take task (the partition unowned for good, the node running on); restored, that
    restore at the first take. Each has its one letter now, and its partition goes on."""
    log = MemoryLog()
    log.ensure_topics(node_topics([TOPICS], PARTITIONS))
    bad = beyond_64_bits(case, now_ms())
    p = bad.partition
    written: dict[Position, Bad] = {}
    if case == "restored":
        written[await write(log, bad.record())] = bad
    async with running(fuzz_node(log, tmp_path, "a"), within=5) as node:
        now = now_ms()
        before, after = owners(p, 2, prefix="before"), owners(p, 2, prefix="after")
        for i, owner in enumerate(before):
            await write(log, valid_timer(owner, now + 100, "command" if i % 2 else "event"))
        if case != "restored":
            written[await write(log, bad.record())] = bad
        await asyncio.sleep(0.3)
        for i, owner in enumerate(after):
            await write(log, valid_timer(owner, now_ms() + 100, "event" if i % 2 else "command"))
        expected = dict.fromkeys(before + after, 1)

        def why() -> str:
            return f"fired {dict(fired(log, set(written)))}; health {node.node.health()}"

        await wait_until(lambda: fired(log, set(written)) == expected, within=5, what=why)
        await wait_until(lambda: len(letters(log)) >= 1, within=5, what=lambda: "no letter")
        await asyncio.sleep(0.2)
        assert_letters(log, expect(written))
        assert_healthy(node)


# --- a fold that cannot be written, met by a restore: found by this file, failing ----------


def additions(owner: str, count: int, now: int) -> list[OutRecord]:
    """`count` "Added" events of `owner` by another writer (versions 1…count), each adding
    MAX_INT64: each valid, but from the third on the sum is past what orjson writes (2**64)."""
    p = partition_of(owner, PARTITIONS)
    out: list[OutRecord] = []
    for v in range(1, count + 1):
        event = with_field(event_base(v, now, "Added"), ("aggregate",), ref(owner))
        event = with_field(event | {"version": v}, ("body", "n"), MAX_INT64)
        out.append((TOPICS.events, p, owner.encode(), dump(event)))
    return out


async def test_a_fold_the_state_store_cannot_hold_is_passed_over_by_a_restore_too(
    tmp_path: Path,
) -> None:
    """Three valid "Added" events whose sum (3 * MAX_INT64) orjson cannot write. Live, the
    third is dead-lettered where it is followed (`CommandProcessor.follow` encodes the fold
    first) and its partition goes on. But it stays on the log, and a restore folds it:
    `CommandProcessor._fold_records` encodes each aggregate's fold (`encode(folded[0])`)
    outside `_fold_each`'s per-event guard, so the TypeError ends the take; the take is
    tried 10 times and then the node stops (NodeFailed) - any restart or rebalance after
    such a record kills every node that takes its partition. The restore must pass over an
    event whose fold cannot be written, as the live node did (no second letter: the one
    the subscription wrote stands), and the partition must be taken and fire."""
    log = MemoryLog()
    log.ensure_topics(node_topics([TOPICS], PARTITIONS))
    owner = "sum-1"
    p = partition_of(owner, PARTITIONS)
    written: dict[Position, Letter] = {}
    async with running(fuzz_node(log, tmp_path, "a")) as a:
        for i, record in enumerate(additions(owner, 3, now_ms())):
            pos = await write(log, record)
            if i == 2:
                written[pos] = Letter(record[2], record[3], (), Stage.FOLLOW, "the third sum")
        await fires_in_every_partition(log, a, "a")
        await wait_until(
            lambda: len(letters(log)) == 1, within=15, what=lambda: f"letters {letters(log)}"
        )
        assert_letters(log, written)
        assert_healthy(a)
    # A node taking the partition afresh (a data dir of its own: it folds the whole log).
    async with running(fuzz_node(log, tmp_path, "b"), within=8) as b:
        await fires_in_every_partition(log, b, "b")
        await asyncio.sleep(0.2)
        assert_letters(log, written)
        assert_healthy(b)
        assert p in b.node.owned


# --- a start longer than the session timeout: found by this file, failing until fixed ------


async def test_a_node_whose_start_takes_longer_than_the_session_timeout_becomes_ready(
    tmp_path: Path,
) -> None:
    """`SuspensionWatch` measures its first gap from when the node was made (`Node.
    __init__`), not from when its watch started (`Node.run`): a start that takes longer
    than the session timeout (here a 1 s timeout and 1.2 s between making the node and
    starting it, as a slow broker, ledger read or store open would take) is taken for a
    suspension of the process. The node owns every partition and works, but `/healthz`
    says every partition "the process was stopped for 1.2 s: waiting for the group", and
    nothing clears it until a rebalance that may never come. The fix belongs in
    `app/node/suspension.py` (start the clock when `run` starts) or `Node.run`."""
    log = MemoryLog()
    node = fuzz_node(log, tmp_path, "slow", session_timeout_ms=1_000)
    await asyncio.sleep(1.2)  # a slow start
    await node.start()
    try:
        await wait_until(node.runs, within=5, what=lambda: f"never ready: {node.node.health()}")
        await fires_in_every_partition(log, node, "slow")
    finally:
        await node.stop()
