"""The wire protocol: envelopes on the events, commands and results topics (dead letters
are the bad records themselves, `dead_letters`). Their base is `envelope.Envelope`; a
command's result (`CommandResult`, `ResultCode`, `Refusal`) is in `results`, named here too.

Every record value is JSON (orjson) of one of these pydantic models; their JSON Schemas are
published under `docs/schemas/` so that a service in another language (or `kcat`) can write
`wow.ScheduleSet` events and read commands. Times are epoch milliseconds (UTC); every number
has a bound (`tables.bounds`). Unknown fields are kept at the top of an envelope (and of a
system event's body): a record read and written again loses nothing a newer writer added.
The parts inside (a rule, an aggregate's address, a timer's command) refuse them on purpose:
an older node must not silently ignore what a newer writer's rule says.
"""

from __future__ import annotations

import logging
from collections.abc import Container
from typing import Annotated, Final, TypeVar, cast

import orjson
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
)
from pydantic_core import PydanticSerializationError

from app.errors import BadRecord
from app.protocol.envelope import Envelope
from app.protocol.reasons import error_reason
from app.protocol.results import CommandResult, Refusal, ResultCode
from app.protocol.timer_ops import (
    TIMER_OP_ANSWER,
    OpOutcome,
    TimerAction,
    TimerOp,
    TimerOpAnswer,
)
from tables import AggregateRef, CommandSpec, ScheduleRule
from tables.bounds import (
    MAX_INT64,
    STORED_BODIES,
    STORED_INPUT,
    Instant,
    JsonObject,
)
from tables.refs import NEW_INPUT, Identifier

__all__ = [
    "AGGREGATE_DELETED",
    "IN_PROCESS_HEADER",
    "IN_PROCESS_HEADERS",
    "MAX_EVENT_ID",
    "MAX_PARTITION",
    "MAX_RECORD_BYTES",
    "MAX_REQUEST_ID",
    "SCHEDULE_CANCELLED",
    "SCHEDULE_PAUSED",
    "SCHEDULE_RESUMED",
    "SCHEDULE_SET",
    "SCHEDULE_TRIGGERED",
    "SYSTEM_EVENTS",
    "TIMER_OP_ANSWER",
    "AggregateDeleted",
    "CommandEnvelope",
    "CommandResult",
    "EventEnvelope",
    "OpOutcome",
    "Refusal",
    "ResultCode",
    "ScheduleCancelled",
    "SchedulePaused",
    "ScheduleResumed",
    "ScheduleSet",
    "ScheduleTriggered",
    "TimerAction",
    "TimerOp",
    "TimerOpAnswer",
    "decode",
    "decode_event",
    "encode",
    "error_reason",
    "sent_unanswered",
    "unknown_system_event",
]

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

IN_PROCESS_HEADER: Final = "__tickwheel.in-process"
"""The header of a command record a node wrote as the record of a timer's command it
decided in-process (`in_process: true`): read back, such a record is passed over. One
with `in_process: true` and without it was not written by a node (another producer's): it
is answered ERROR and dead-lettered, never passed over in silence."""

IN_PROCESS_HEADERS: Final = ((IN_PROCESS_HEADER, b"1"),)
"""The headers of a node's in-process command record."""

SCHEDULE_SET: Final = "wow.ScheduleSet"
SCHEDULE_CANCELLED: Final = "wow.ScheduleCancelled"
AGGREGATE_DELETED: Final = "wow.AggregateDeleted"
SCHEDULE_PAUSED: Final = "wow.SchedulePaused"
SCHEDULE_RESUMED: Final = "wow.ScheduleResumed"
SCHEDULE_TRIGGERED: Final = "wow.ScheduleTriggered"
"""A timer book's record of a trigger-now (`app.clients.timer_book`): the book's own event
(known by its applier), not a system event, as the command it sent went in its decision."""
SYSTEM_EVENTS: Final = frozenset(
    {SCHEDULE_SET, SCHEDULE_CANCELLED, SCHEDULE_PAUSED, SCHEDULE_RESUMED, AGGREGATE_DELETED}
)
"""The `wow.` events any aggregate's log may hold (a schedule's own are its appliers')."""


def unknown_system_event(type_: str, appliers: Container[str]) -> str | None:
    """Why an event of `type_` has no place in the log of an aggregate whose appliers are
    `appliers`: a `wow.` type neither a system event nor one of its own (a schedule's);
    None when it has one."""
    if type_.startswith("wow.") and type_ not in SYSTEM_EVENTS and type_ not in appliers:
        return f"unknown system event type {type_!r}"
    return None


MAX_RECORD_BYTES: Final = 256 * 1024
"""Larger records are refused (dead-lettered) unless `TICKWHEEL_MAX_RECORD_BYTES` says
otherwise: a timer's command is not a blob store."""

MAX_REQUEST_ID: Final = 300
"""A command's request id is at most this long (`CommandEnvelope.request_id`)."""

MAX_EVENT_ID: Final = 200
"""An event's id is at most this long (`EventEnvelope.id`)."""

MAX_PARTITION: Final = 65_535
"""No topic of Tickwheel's has more partitions (the node takes at most 1,024)."""

_Version = Annotated[int, Field(ge=1, le=MAX_INT64)]


class ScheduleSet(Envelope):
    """Body of `wow.ScheduleSet`: send `command` to `target` by `rule`, unique by `key`."""

    # A new timer's name: no control character (`tables.refs`). The keys of a cancel, pause,
    # resume or trigger only point at a timer, maybe one an older version took with one.
    key: Identifier = Field(min_length=1, max_length=200)
    rule: ScheduleRule
    target: AggregateRef | None = Field(
        default=None, description="where the command goes; the owner itself when absent"
    )
    command: CommandSpec


class ScheduleCancelled(Envelope):
    """Body of `wow.ScheduleCancelled`: the owner's timer under `key` is cancelled."""

    key: str = Field(min_length=1, max_length=200)


class SchedulePaused(Envelope):
    """Body of `wow.SchedulePaused`: the owner's timer under `key` is held (PAUSED): it
    keeps its rule and slot and fires nothing until resumed. A PENDING, FIRING or PARKED
    timer pauses (a PARKED one is parked again by its resume); a FIRED or CANCELLED one
    stays as it is."""

    key: str = Field(min_length=1, max_length=200)


class ScheduleResumed(Envelope):
    """Body of `wow.ScheduleResumed`: the owner's PAUSED timer under `key` runs again,
    caught up at the event's time by its rule's catch-up policy (`coalesce`), or, PARKED
    when it was paused, is PARKED again for an operator's retry or skip."""

    key: str = Field(min_length=1, max_length=200)


class ScheduleTriggered(Envelope):
    """Body of `wow.ScheduleTriggered`: a timer book sent its timer `key`'s command once
    now, as `request_id`, beside the rule (which, and whose next slot, it left as they
    were)."""

    key: str = Field(min_length=1, max_length=200)
    request_id: str = Field(
        min_length=1, max_length=MAX_REQUEST_ID, description="the request id of the command it sent"
    )


class AggregateDeleted(Envelope):
    """Body of `wow.AggregateDeleted`: the aggregate is gone, and so are all its timers."""


class EventEnvelope(Envelope):
    """One event on `<context>.<aggregate>.events`, keyed by the aggregate id."""

    id: str = Field(min_length=1, max_length=MAX_EVENT_ID, description="unique event id")
    type: str = Field(min_length=1, max_length=200)
    aggregate: AggregateRef
    version: _Version = Field(description="the aggregate's version after the command")
    request_id: str | None = Field(
        default=None, max_length=MAX_REQUEST_ID, description="the command that caused it"
    )
    created_at: Instant
    body: JsonObject = Field(default_factory=dict)


class CommandEnvelope(Envelope):
    """One command on `<context>.<aggregate>.commands`, keyed by the target aggregate id."""

    request_id: str = Field(min_length=1, max_length=MAX_REQUEST_ID, description="idempotency key")
    type: str = Field(min_length=1, max_length=200)
    aggregate: AggregateRef
    body: JsonObject = Field(default_factory=dict)
    not_before: Instant | None = Field(
        default=None,
        description=(
            "the target refuses (SCHEDULE_NOT_DUE) before this time; one without reply_to "
            "(another context's timer: its sender waits for no answer) it decides up to its "
            "clock skew allowance early, as of this time, and dead-letters when earlier"
        ),
    )
    issued_at: Instant
    reply_to: str | None = Field(
        default=None,
        max_length=249,
        description="results topic: only the target context's own is answered on; another "
        "is answered on that one's default partition with ERROR",
    )
    reply_partition: int | None = Field(
        default=None,
        ge=0,
        le=MAX_PARTITION,
        description="results partition (one the topic has); the request id's by default",
    )
    in_process: bool = Field(
        default=False,
        description="a timer's command its owner decided in the same transaction that wrote "
        "it here: a record of what was sent, passed over by the processor when it carries "
        "the node's __tickwheel.in-process header (else answered ERROR, dead-lettered)",
    )


def sent_unanswered(cmd: CommandEnvelope) -> bool:
    """Whether `cmd` is a timer's send whose sender waits for no answer: one from another
    context (its timer `SENT` once the broker had it) carries a `not_before` and no
    `reply_to`. Nothing sends it again, so an answer that refuses it for now (early, BUSY)
    would lose it: its target decides it, or dead-letters it."""
    return cmd.reply_to is None and cmd.not_before is not None and not cmd.in_process


def encode(model: BaseModel) -> bytes:
    """JSON bytes of an envelope, unknown fields included.

    An envelope (a timer op and its answer are ones too) is written by pydantic's own
    serializer straight to JSON, at less than half the cost of a dict for orjson (every
    fired timer writes three or more; #20): the same bytes, as everything in it is bounded
    JSON (`check_json`), which both write alike (`tests/unit/test_wire_encode.py`). Any
    other model, whose fields may hold what orjson refuses (an integer past 64 bits in an
    aggregate's state), an envelope pydantic cannot write, and one whose dicts (the only
    parts of a frozen envelope that can change after its validation) orjson refuses, such as
    an integer past 64 bits put in its body since, which pydantic would write, go through
    orjson: refused as they always were.
    """
    if isinstance(model, Envelope):
        try:
            written = model.__pydantic_serializer__.to_json(model)
        except PydanticSerializationError:
            pass  # orjson below raises what it always raised for it
        else:
            # Its dicts alone, most often small or empty: a fraction of what orjson takes
            # for the whole envelope (#20).
            d = model.__dict__
            try:
                if body := d.get("body"):
                    orjson.dumps(body)
                if (command := d.get("command")) is not None and command.body:
                    orjson.dumps(command.body)
                if model.__pydantic_extra__:
                    orjson.dumps(model.__pydantic_extra__)
            except orjson.JSONEncodeError:
                pass  # orjson below raises the same for the whole envelope
            else:
                return written
    # The serializer itself: `model_dump`'s wrapper adds ~10 % to every record.
    return orjson.dumps(model.__pydantic_serializer__.to_python(model, mode="json"))


def decode(
    model: type[M], data: bytes | None, max_bytes: int = MAX_RECORD_BYTES, *, new_names: bool = True
) -> M:
    """An envelope from JSON bytes; `BadRecord` with a clear reason otherwise.

    Strict, as the published schemas are: an integer is a JSON integer (not `"3"`, `3.0`
    or `true`), a boolean a JSON boolean (not `"true"` or `1`), a string a JSON string;
    a number field takes an integer too, and an enum its value's string. Lax coercion
    would write back a record other than the one read, and take a producer's bug for
    data. A system event's body and a command's are checked alike where they are read
    (`validate_python(..., strict=True, context=NEW_INPUT)`). The timer table's rows stay
    lax (`tables.keys.decode_timer`): a node wrote them, and one an older version stored
    must still load.

    `new_names`: a tenant, an aggregate id or a timer key holding a control character is
    refused (`tables.refs.control_character`). False for a record that only names what
    is stored (an operator's timer op names the target of parked timers, which an older
    version may have taken with one: they must stay retryable and skippable).

    Bodies and unknown fields are new input, held to `tables.bounds.check_json`, but in
    one record: a command with `in_process: true` that only the stored bounds take
    (`check_stored`), which is a node's record of a stored timer's command it decided
    in-process (an older version's row may hold a body past 64 bits): it is returned,
    for the processor to pass over (with the node's header) or refuse (without)."""
    if data is None or len(data) > max_bytes:
        raise BadRecord(_unread(data, max_bytes))
    try:
        # The validator itself: `model_validate_json`'s wrapper adds ~10 % to every record.
        decoded: M = model.__pydantic_validator__.validate_json(
            data, strict=True, context=NEW_INPUT if new_names else None
        )
        return decoded
    except ValidationError as exc:
        if model is CommandEnvelope and (sent := _sent_in_process(data, new_names)) is not None:
            return cast(M, sent)
        raise BadRecord(f"not a valid {model.__name__}: {_errors(exc)}") from exc


def _unread(data: bytes | None, max_bytes: int) -> str:
    """Why `data`, a tombstone or over `max_bytes`, is read by no version at all."""
    if data is None:
        return "empty record (tombstone) where an envelope was expected"
    return f"record of {len(data)} bytes exceeds {max_bytes}"


_IN_PROCESS_READ: Final = {**NEW_INPUT, STORED_BODIES: True}


def _sent_in_process(data: bytes, new_names: bool) -> CommandEnvelope | None:
    """`data` as a command with `in_process: true` read strictly, but its body and unknown
    fields held to the stored bounds only (`decode`); None if it is no such command."""
    try:
        sent: CommandEnvelope = CommandEnvelope.__pydantic_validator__.validate_json(
            data, strict=True, context=_IN_PROCESS_READ if new_names else STORED_INPUT
        )
    except ValidationError:
        return None
    return sent if sent.in_process else None


def decode_event(
    data: bytes | None, max_bytes: int = MAX_RECORD_BYTES
) -> tuple[EventEnvelope, str | None]:
    """An event of an aggregate's log, to fold into its state: read strictly (`decode`),
    or else as an earlier version read it (pydantic's coercion, any names), with why the
    strict read refused it. An event an earlier version took is the aggregate's history:
    a state folded again from the log (a restore, a rebuild) must take it as that version
    did, and a node following the log live alike; what only a strict read refuses is kept
    from the timers (dead-lettered there). `BadRecord` for what no version took.

    The lenient read holds its body and unknown fields to the stored bounds only
    (`tables.bounds.check_stored`): 0.2.0 took and wrote events past 64 bits or nested
    deeper than `check_json` lets new input, and they are the aggregate's history. No
    version took a tombstone or a record over `max_bytes`: refused before either read."""
    if data is None or len(data) > max_bytes:
        raise BadRecord(_unread(data, max_bytes))
    try:
        return decode(EventEnvelope, data, max_bytes), None
    except BadRecord as exc:
        try:
            lax = EventEnvelope.__pydantic_validator__.validate_json(data, context=STORED_INPUT)
        except ValidationError:
            raise exc from None
        return lax, str(exc)


def _errors(exc: ValidationError) -> str:
    return "; ".join(error_reason(err, "record") for err in exc.errors()[:5])
