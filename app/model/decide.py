"""What one command does to one aggregate: a pure function of the stored aggregate and time.

The node runs it for each command in partition order; the transaction around it (events,
result, offsets) is the node's business, not this module's.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from app.errors import NoTarget, node_fault
from app.model.aggregate import (
    DIGEST_CHARS,
    AggregateType,
    Decision,
    Event,
    Rejected,
    aggregate_digest,
    json_copy,
)
from app.model.user_code import not_awaitable, user_code
from app.protocol.wire import (
    AGGREGATE_DELETED,
    MAX_EVENT_ID,
    CommandEnvelope,
    EventEnvelope,
    Refusal,
    ResultCode,
    sent_unanswered,
)
from tables import AggregateRef
from tables.bounds import check_finite
from tables.timer import error_text

__all__ = [
    "CLOCK_SKEW_MS",
    "Decided",
    "StoredAggregate",
    "command_of_event",
    "cut_message",
    "decide",
    "event_id",
    "fold",
]

logger = logging.getLogger(__name__)

CLOCK_SKEW_MS: Final = 2_000
"""How far a target's clock may trail the clock of a node of another context that sends it
a timer's command (`TICKWHEEL_CLOCK_SKEW_MS`): such a send waits for no answer, so a
refusal as early would lose it; one early by at most this is decided as of its due time."""


class StoredAggregate(BaseModel):
    """An aggregate as the state store keeps it: its state folded from its events."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(default=0, ge=0)
    deleted: bool = False
    state: dict[str, Any] = Field(default_factory=dict)


_NO_EVENTS: Final = StoredAggregate()
"""An aggregate without events yet (frozen: one for all)."""

# Each decided command loads its state twice and back once, dumps it once and builds an
# event and the stored aggregate: through the models' validators and serializer (public
# attributes of a pydantic model) rather than `model_validate`, `model_dump` and
# `__init__`, whose wrappers' keywords cost more than the work on a small state (#20).
# The same validation and output: pydantic's wrappers pass their defaults on.
_STORED: Final = StoredAggregate.__pydantic_validator__
_EVENT: Final = EventEnvelope.__pydantic_validator__
_MODEL_VALIDATE: Final = vars(BaseModel)["model_validate"].__func__
_MODEL_DUMP: Final = BaseModel.model_dump


def _load(state_type: type[BaseModel], data: Any) -> BaseModel:
    """`state_type.model_validate(data)`: through its validator unless the state's model
    has a `model_validate` of its own."""
    if getattr(state_type.model_validate, "__func__", None) is _MODEL_VALIDATE:
        loaded: BaseModel = state_type.__pydantic_validator__.validate_python(data)
        return loaded
    return state_type.model_validate(data)


def _dump(state: BaseModel) -> dict[str, Any]:
    """`state.model_dump(mode="json", warnings=False)`: through its serializer unless its
    model has a `model_dump` of its own."""
    kind = type(state)
    if kind.model_dump is _MODEL_DUMP:
        dumped: dict[str, Any] = kind.__pydantic_serializer__.to_python(
            state, mode="json", warnings=False
        )
        return dumped
    return state.model_dump(mode="json", warnings=False)


@dataclass(frozen=True, slots=True)
class Decided:
    code: ResultCode
    message: str
    events: list[EventEnvelope]
    stored: StoredAggregate | None
    """The aggregate after the events; None when nothing changed."""
    commands: list[CommandEnvelope] = field(default_factory=list)
    """Commands the decision sends, committed with its events."""
    error: Exception | None = None
    """What the handler raised (the command is answered ERROR, and dead-lettered)."""
    refusal: Refusal | None = None
    """With REJECTED: the refusal's code, as the handler gave it (`Decision.reject`)."""


def decide(
    agg: AggregateType[Any],
    stored: StoredAggregate | None,
    cmd: CommandEnvelope,
    *,
    now: int,
    seen: bool,
    unreachable: Callable[[AggregateRef], str | None] | None = None,
    skew_ms: int = 0,
) -> Decided:
    """The outcome of `cmd` on the aggregate as `stored` (None: it has no events yet).

    `seen`: the aggregate applied this request id already. `unreachable`: why a target
    cannot be sent to, or None (`Decision.unreachable`). Order of the checks: a
    duplicate is answered as such even when it is early, so a retry never looks undecided.
    `skew_ms`: how early a timer's send no sender waits for an answer to
    (`sent_unanswered`: from another context) may come and be decided, as of its
    `not_before` (`CLOCK_SKEW_MS`); any other early command is refused, its sender sends
    it again.
    """
    current = stored or _NO_EVENTS
    if seen:
        return Decided(ResultCode.DUPLICATE, "request already applied", [], None)
    if cmd.not_before is not None and cmd.not_before > now:
        early = cmd.not_before - now
        if not sent_unanswered(cmd) or early > skew_ms:
            return Decided(
                ResultCode.SCHEDULE_NOT_DUE,
                f"not before {cmd.not_before}, clock at {now} ({early} ms early)",
                [],
                None,
            )
        # Its sender's clock leads this one by no more than clocks may differ, and it
        # waits for no answer (a refusal would lose the command): decided as of its due
        # time, never before it by the time that sent it.
        now = cmd.not_before
    handler = agg.handlers.get(cmd.type)
    if handler is None:
        return Decided(ResultCode.ERROR, f"{agg.type_name} has no handler for {cmd.type}", [], None)
    if current.deleted:
        return Decided(ResultCode.REJECTED, f"{cmd.aggregate} was deleted", [], None)
    try:
        with user_code("the handler of", cmd.type):
            # From a copy: a handler that changes what it is given (a nested dict of the
            # state, then a refusal) never changes the aggregate as the batch holds it.
            state = _load(agg.state_type, json_copy(current.state)) if stored else agg.initial()
            decision = Decision(
                aggregate=cmd.aggregate,
                now=now,
                request_id=cmd.request_id,
                unreachable=unreachable,
            )
            # The command's body a copy too: an in-process timer's command shares its
            # row's, from which its next slot's command is made.
            given = cmd.model_copy(update={"body": json_copy(cmd.body)})
            if (result := handler(state, given, decision)) is not None:
                not_awaitable(result, f"the handler of {cmd.type}")
    except Rejected as exc:
        return Decided(exc.code, cut_message(exc.reason), [], None, refusal=exc.refusal)
    except NoTarget as exc:
        logger.warning("%s %s: %s", cmd.type, cmd.request_id, exc)
        return Decided(ResultCode.ERROR, cut_message(str(exc)), [], None, error=exc)
    except Exception as exc:
        if node_fault(exc):
            raise
        # Whatever the handler raises is the command's (it cannot be read, or the handler
        # fails on it), not the node's: answered, and the partition goes on.
        message = cut_message(f"{type(exc).__name__}: {exc}")
        logger.warning("%s %s failed: %s", cmd.type, cmd.request_id, message)
        return Decided(ResultCode.ERROR, message, [], None, error=exc)
    if not decision.events:
        # Commands without events would be sent again by every retry: they need a fact.
        # Said in the answer, not dropped in silence (a forwarding handler's author).
        unsent = len(decision.commands)
        message = f"no event: its {unsent} command(s) not sent (a send needs an event)"
        return Decided(ResultCode.UNCHANGED, message if unsent else "", [], None)
    version = current.version + 1
    # Validated as `EventEnvelope(...)` validates them: the handler's types and bodies.
    events: list[EventEnvelope] = [
        _EVENT.validate_python(
            {
                "id": event_id(cmd.aggregate, cmd.request_id, i),
                "type": type_,
                "aggregate": cmd.aggregate,
                "version": version,
                "request_id": cmd.request_id,
                "created_at": now,
                "body": body,
            }
        )
        for i, (type_, body) in enumerate(decision.events)
    ]
    return Decided(ResultCode.COMMITTED, "", events, fold(agg, current, events), decision.commands)


def cut_message(message: str) -> str:
    """`message` as a result or an event keeps it: at most `MAX_ERROR_TEXT` characters, a
    longer one cut, ending in ' …[cut]' (`tables.timer.error_text`). A handler's exception
    text has no bound: uncut, it could outgrow a record and fail the partition's commit."""
    return error_text(message) or ""


def event_id(aggregate: AggregateRef, request_id: str, i: int) -> str:
    """The id of the `i`-th event of the command `request_id` on `aggregate`:
    `<request id>/<i>@<aggregate's digest>`, or, when that is longer than an event id may be
    (a request id may be longer than an event id), `sha256:<hex of the request id>/<i>@<the
    digest>`, the same on every retry.

    The digest (`aggregate_digest`) makes it unique in the log: a request id is unique per
    aggregate alone (two aggregates may each take a command `req-42`), and a timer's id is
    the id of the event that set it, the request id of its slots `<timer id>#<slot>`. Two
    owners' timers of one id, sent to one target, would share their request ids there: the
    second answered DUPLICATE, never applied."""
    digest = aggregate_digest(aggregate)
    made = f"{request_id}/{i}@{digest}"
    if len(made) <= MAX_EVENT_ID:
        return made
    return f"sha256:{hashlib.sha256(request_id.encode()).hexdigest()}/{i}@{digest}"


def command_of_event(event_id: str) -> tuple[str, int] | None:
    """Of an id `event_id` made (`<request id>/<i>@<digest>`, or its hashed form), the part
    naming its command (the request id and the aggregate's digest) and `i`, its place among
    the command's events; None for any other id (another writer's, or one made before the
    digest). One command's events share one version: their ids alone tell their order."""
    left, at, digest = event_id.rpartition("@")
    if not at or len(digest) != DIGEST_CHARS or digest.strip("0123456789abcdef"):
        return None
    command, slash, index = left.rpartition("/")
    if not slash or not index.isascii() or not index.isdigit() or len(index) > 6:
        return None
    return f"{command}@{digest}", int(index)


def fold(
    agg: AggregateType[Any], stored: StoredAggregate | None, events: list[EventEnvelope]
) -> StoredAggregate:
    """The aggregate after `events` (of one aggregate, in log order)."""
    current = stored or _NO_EVENTS
    deleted = current.deleted
    version = current.version
    with user_code("the appliers of", agg.type_name):
        # Copies of the state and of each event's body: an applier that changes what it is
        # given in place never changes the aggregate as stored or staged, nor an event
        # still to be written or read for its timer.
        state: BaseModel = (
            _load(agg.state_type, json_copy(current.state)) if stored is not None else agg.initial()
        )
        for e in events:
            event = Event(e.type, json_copy(e.body), e.version, e.created_at, e.id)
            state = agg.apply(state, event)
            if not isinstance(state, agg.state_type):
                not_awaitable(state, f"the applier of {e.type}")
                raise TypeError(
                    f"the applier of {e.type} returned {type(state).__name__}, "
                    f"not {agg.state_type.__name__}"
                )
            deleted = deleted or e.type == AGGREGATE_DELETED
            version = max(version, e.version)
        # Loaded back as the next command will load it (from a copy: a validator may
        # change what it is given): a field holding what its type cannot (an applier's
        # `model_copy` validates nothing), or a state its own model refuses (a constraint,
        # a validator), is refused here, not stored as what no later load could read.
        # Without pydantic's warnings: a list in a tuple field, an int in a Decimal one,
        # dump and load back as they should.
        dumped = _dump(state)
        _load(agg.state_type, json_copy(dumped))
    # A float field takes "nan" and "inf", which JSON cannot hold: written as null, the
    # stored aggregate would fail every later command on it. Refused here, the command
    # that made it is answered ERROR (a followed event dead-lettered) instead.
    check_finite(dumped, "state")
    # Validated, not `model_construct`ed: pydantic's validator builds it faster (#20).
    folded: StoredAggregate = _STORED.validate_python(
        {"version": version, "deleted": deleted, "state": dumped}
    )
    return folded
