"""Timers set, cancelled, paused, resumed, triggered and shown by an operator or a service
without Kafka: the requests `tickwheel timers set|cancel|pause|resume|trigger` and the web
edge's `PUT|DELETE /timers/{type}/{owner}/{key}` and `POST .../{key}/{action}` make of a
timer book (`app.clients.timer_book`).

A request is a `wow.SetTimer`, `wow.CancelTimer`, `wow.PauseTimer`, `wow.ResumeTimer` or
`wow.TriggerTimer` command sent to the book's command topic, in its owner's partition, and
its answer is the command's result, read from its context's results topic (in the request
id's partition). The node owning the book's partition appends the book's events,
de-duplicated by request id: a request sent again with the same request id (a client's retry
after a timeout) is answered DUPLICATE and writes nothing, and no version of the book is
ever written twice.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.clients.book_commands import (
    command_body_reason,
    scoped_request_id,
    seconds_reason,
    unreadable,
    unscoped_request_id,
)
from app.clients.timer_book import (
    CANCEL_TIMER,
    PAUSE_TIMER,
    RESUME_TIMER,
    SET_TIMER,
    TRIGGER_TIMER,
    TimerKey,
    book_reason,
)
from app.errors import BadRecord
from app.kafka.ports import LogReader, Publisher
from app.model.aggregate import AggregateType
from app.ops.deadline import by
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    CommandEnvelope,
    CommandResult,
    ResultCode,
    ScheduleCancelled,
    ScheduleSet,
    decode,
    encode,
)
from tables import AggregateRef, CommandSpec, ScheduleRule
from tables.partitioner import partition_of
from tables.refs import NEW_INPUT, unusable_request_id

__all__ = [
    "ACTIONS",
    "DEFAULT_WAIT_S",
    "DONE",
    "ApiError",
    "BadRequest",
    "TargetSpec",
    "TimerAnswer",
    "TimerPut",
    "answer_of",
    "asked_id",
    "cancel_command",
    "field_of",
    "is_book",
    "key_command",
    "new_request_id",
    "owner_ref",
    "put_of",
    "set_command",
    "submit",
]


DEFAULT_WAIT_S = 30.0
"""How long a request waits for its answer by default."""

_TYPE = r"^[A-Za-z0-9_][A-Za-z0-9_\-]*\.[A-Za-z0-9_][A-Za-z0-9_.\-]*$"

DONE = frozenset({ResultCode.COMMITTED, ResultCode.DUPLICATE, ResultCode.UNCHANGED})
"""Answers meaning the timer is as asked (UNCHANGED: it was already: a pause of a paused
timer, a resume of a running one)."""

ACTIONS: dict[str, str] = {
    "pause": PAUSE_TIMER,
    "resume": RESUME_TIMER,
    "trigger": TRIGGER_TIMER,
}
"""The actions on one timer (`POST .../{key}/{action}`, `tickwheel timers <action>`): the
book's command each sends."""


class BadRequest(ValueError):
    """A request that cannot be sent; `field` names what is wrong (a path in its JSON)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class TargetSpec(BaseModel):
    """Where the timer's command goes: an aggregate of another type than the book."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str = Field(
        min_length=3, max_length=201, pattern=_TYPE, description="<context>.<aggregate>"
    )
    id: str | None = Field(
        None, min_length=1, max_length=500, description="the target's id; the owner's by default"
    )


class TimerPut(BaseModel):
    """`PUT /timers/{type}/{owner}/{key}`'s body: the timer that key is to be (created, or
    replacing the one set before)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: ScheduleRule
    target: TargetSpec
    command: CommandSpec
    request_id: str | None = Field(
        None,
        min_length=1,
        max_length=300,
        description="names this change: sent again with it, the request changes nothing "
        "and is answered DUPLICATE (a new one is made when absent)",
    )


class TimerAnswer(BaseModel):
    """What became of a set or cancel request: its command's result."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    code: ResultCode = Field(
        description="COMMITTED: done now; DUPLICATE: done before by this request id"
    )
    duplicate: bool = Field(description="the request id was used before: nothing written")
    owner: AggregateRef
    key: str
    version: int | None = Field(None, description="the book's version after it")
    message: str = ""


class ApiError(BaseModel):
    """Any 4xx/5xx answer of the web edge's JSON routes."""

    model_config = ConfigDict(frozen=True)

    error: str
    field: str | None = Field(None, description="the wrong part of the request, when one is")
    request_id: str | None = Field(
        None, description="the request's id, to send it again with when it was not answered"
    )


def given_request_id(op: str, timer: str, given: str | None) -> str:
    """The request id of `op` on `timer` asked under `given` (`scoped_request_id`: an id a
    caller reuses for another change is no DUPLICATE of the first), or under a new one when
    none is (`None`). `BadRequest` for one blank, with surrounding spaces or a control
    character (`control_character`): a blank `Idempotency-Key` was taken for none, so the
    same request sent again made a second change; the others garble the logs and pages
    that print it. And for one longer than a request id may be (a trigger's keeps room for
    its send, `send_fits`), as the envelope and the book refused it before ids were
    scoped."""
    if given is None:
        return scoped_request_id(op, timer, new_request_id())
    if unusable_request_id(given):
        raise BadRequest(
            "request_id",
            f"{given[:80]!r}: give 1 or more characters, no surrounding spaces or control "
            "characters",
        )
    try:
        return scoped_request_id(op, timer, given)
    except ValueError as exc:  # its bound, said as `scoped_request_id` says it
        raise BadRequest("request_id", str(exc)) from exc


def new_request_id() -> str:
    return uuid.uuid4().hex


def field_of(exc: ValidationError, prefix: str = "") -> BadRequest:
    """The first error of a pydantic validation as a `BadRequest` naming its field."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    return BadRequest(".".join(p for p in (prefix, where) if p) or "body", err["msg"])


def is_book(agg: AggregateType[Any] | None) -> bool:
    """Whether an aggregate type is a timer book (takes `wow.SetTimer`)."""
    return agg is not None and SET_TIMER in agg.handlers and CANCEL_TIMER in agg.handlers


def owner_ref(type_name: str, owner: str, tenant: str) -> AggregateRef:
    """The book `type_name`'s aggregate `owner`; `BadRequest` naming the part that is wrong."""
    context, _, aggregate = type_name.partition(".")
    try:
        fields = {"context": context, "aggregate": aggregate, "tenant": tenant, "id": owner}
        return AggregateRef.model_validate(fields, context=NEW_INPUT)
    except ValidationError as exc:
        bad = field_of(exc)
        names = {"context": "type", "aggregate": "type", "id": "owner"}
        raise BadRequest(names.get(bad.field, bad.field), bad.message) from exc


def put_of(data: dict[str, Any]) -> TimerPut:
    """`PUT /timers/...`'s JSON body as a `TimerPut`, strictly, as records are read
    (`"at": "1"` is refused, not read as 1); `BadRequest` naming what is wrong. A command
    body nested deeper than a set carries it is named before the command's own bound, a
    looser one, so that one bound is said (`command_body_reason`)."""
    command = data.get("command")
    if isinstance(command, dict) and (why := command_body_reason(command.get("body"))):
        raise BadRequest("command.body", why)
    try:
        return TimerPut.model_validate(data, strict=True)
    except ValidationError as exc:
        raise field_of(exc) from exc


def set_command(
    book: AggregateType[Any],
    owner: AggregateRef,
    key: str,
    put: TimerPut,
    now: int,
    *,
    limits: InputLimits,
) -> CommandEnvelope:
    """The `wow.SetTimer` of `put` to `owner`'s book; `BadRequest` naming what the book
    would refuse (its target, a rule with no slot left), what is plainly a caller's unit
    mistake (a once rule's `at` in epoch seconds, `seconds_reason`) or what the node would
    not read (a command body nested deeper than the set carries it, `command_body_reason`;
    a record larger than its `limits`: the owner's id, or the command the timer sends)."""
    context, _, aggregate = put.target.type.partition(".")
    try:
        parts = {"context": context, "aggregate": aggregate, "tenant": owner.tenant}
        target = AggregateRef.model_validate(
            {**parts, "id": put.target.id or owner.id}, context=NEW_INPUT
        )
        fields = {"key": key, "rule": put.rule, "target": target, "command": put.command}
        body = ScheduleSet.model_validate(fields, context=NEW_INPUT)
    except ValidationError as exc:
        bad = field_of(exc)
        where = "key" if bad.field == "key" else f"target.{bad.field}"
        raise BadRequest(where, bad.message) from exc
    if (why := book_reason(book, body, now)) is not None:
        raise BadRequest("rule" if why.startswith("the rule") else "target", why)
    if (why := seconds_reason(body.rule)) is not None:
        # Named as a validation error names the field (`rule.once.at`).
        raise BadRequest("rule.once.at", why)
    if (why := command_body_reason(put.command.body)) is not None:
        # Refused here: the envelope's own check would fail (a ValidationError, no 400).
        raise BadRequest("command.body", why)
    cmd = CommandEnvelope(
        request_id=given_request_id("set", key, put.request_id),
        type=SET_TIMER,
        aggregate=owner,
        body=body.model_dump(mode="json"),
        issued_at=now,
    )
    if (unread := unreadable(cmd, limits)) is not None:
        # Refused here: the node would drop it unanswered, and every retry with it. Its
        # value is over mostly by the timer's command (the rest of it is bounded).
        part, why = unread
        raise BadRequest("owner" if part == "key" else "command", why)
    return cmd


def cancel_command(
    owner: AggregateRef, key: str, request_id: str | None, now: int
) -> CommandEnvelope:
    """The `wow.CancelTimer` of `owner`'s timer `key`."""
    try:
        body = ScheduleCancelled(key=key)
        return CommandEnvelope(
            request_id=given_request_id("cancel", key, request_id),
            type=CANCEL_TIMER,
            aggregate=owner,
            body=body.model_dump(mode="json"),
            issued_at=now,
        )
    except ValidationError as exc:
        raise field_of(exc) from exc


def key_command(
    action: str, owner: AggregateRef, key: str, request_id: str | None, now: int
) -> CommandEnvelope:
    """The book command of `action` (`ACTIONS`) on `owner`'s timer `key`; `BadRequest`
    naming what is wrong."""
    if action not in ACTIONS:
        raise BadRequest("action", f"not one of {', '.join(sorted(ACTIONS))}: {action!r}")
    try:
        body = TimerKey(key=key)
        return CommandEnvelope(
            request_id=given_request_id(action, key, request_id),
            type=ACTIONS[action],
            aggregate=owner,
            body=body.model_dump(mode="json"),
            issued_at=now,
        )
    except ValidationError as exc:
        raise field_of(exc) from exc


async def submit(
    publisher: Publisher,
    reader: LogReader,
    cmd: CommandEnvelope,
    partitions: int,
    wait_s: float = DEFAULT_WAIT_S,
    *,
    poll_s: float = 0.1,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> CommandResult | None:
    """Sends `cmd` to its aggregate's command topic and waits up to `wait_s` seconds for
    its result; None when none came in time (it may still come: send it again with its
    request id to learn it, which changes nothing more).

    `wait_s` bounds the reads as a whole: each of the reader's requests may wait far
    longer (a `Reader`'s 40 s) for a partition's leader that is gone. The send is not
    bounded by it: cut short, it would be as ambiguous as a send that failed."""
    owner = cmd.aggregate
    topics = AggregateTopics(owner.context, owner.aggregate)
    results = ContextTopics(owner.context).results
    at = partition_of(cmd.request_id, partitions)
    deadline = asyncio.get_running_loop().time() + wait_s
    # The results partition's end before the send: the answer is written after it. Not
    # known in time, the change is sent all the same (a `--wait 0` sends and waits not).
    ends = await by(deadline, reader.offsets(results, at))
    await publisher.send(
        topics.commands, owner.id.encode(), encode(cmd), partition_of(owner.id, partitions)
    )
    if ends is None:
        return None
    return await by(deadline, _result_of(reader, cmd, results, at, ends[1], poll_s, sleep))


async def _result_of(
    reader: LogReader,
    cmd: CommandEnvelope,
    results: str,
    at: int,
    start: int,
    poll_s: float,
    sleep: Callable[[float], Awaitable[None]],
) -> CommandResult:
    """`cmd`'s result, read from partition `at` of `results` from `start` (waited for: the
    caller bounds it)."""
    while True:
        async with aclosing(reader.read(results, at, start)) as batches:
            async for batch in batches:
                for r in batch:
                    start = r.offset + 1
                    try:
                        result = decode(CommandResult, r.value)
                    except BadRecord:
                        continue
                    if result.request_id == cmd.request_id and result.aggregate == cmd.aggregate:
                        return result
        await sleep(poll_s)


def asked_id(cmd: CommandEnvelope) -> str:
    """The request id to send `cmd` again with: the caller's, not the one scoped to its
    change (`scoped_request_id`), which scopes it again alike."""
    return unscoped_request_id(cmd.request_id)


def answer_of(cmd: CommandEnvelope, result: CommandResult) -> TimerAnswer:
    return TimerAnswer(
        request_id=unscoped_request_id(result.request_id),
        code=result.code,
        duplicate=result.code is ResultCode.DUPLICATE,
        owner=cmd.aggregate,
        key=str(cmd.body["key"]),
        version=result.version,
        message=result.reason,  # a code this version does not know named in it
    )
