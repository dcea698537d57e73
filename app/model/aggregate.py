"""What a service author writes: aggregate types with a state, command handlers and appliers.

A handler looks at the state and the command and decides: it emits events, schedules or
cancels timers, deletes the aggregate, or rejects the command (the state guard). Appliers
fold events into the state; the state is a pure function of the aggregate's events.

    orders = AggregateType("shop", "order", OrderState)

    @orders.command("shop.PlaceOrder")
    def place(state: OrderState, cmd: Command, d: Decision) -> None:
        if state.placed:
            d.reject("already placed")
        d.emit("shop.OrderPlaced", {"amount": cmd.body["amount"]})
        d.schedule("payment-deadline", OnceRule(at=cmd.issued_at + 60_000),
                   CommandSpec(type="shop.CancelUnpaid"))

    @orders.applies("shop.OrderPlaced")
    def placed(state: OrderState, event: Event) -> OrderState:
        return state.model_copy(update={"placed": True})
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, NoReturn, TypeVar

from pydantic import BaseModel

from app.errors import NoTarget
from app.model.user_code import plain_function
from app.protocol.wire import (
    AGGREGATE_DELETED,
    MAX_REQUEST_ID,
    SCHEDULE_CANCELLED,
    SCHEDULE_PAUSED,
    SCHEDULE_RESUMED,
    SCHEDULE_SET,
    CommandEnvelope,
    Refusal,
    ResultCode,
    ScheduleCancelled,
    SchedulePaused,
    ScheduleResumed,
    ScheduleSet,
)
from tables import AggregateRef, CommandSpec, CronRule, IntervalRule, OnceRule

__all__ = [
    "MAX_DECISION_RECORDS",
    "MAX_TRIGGER_REQUEST_ID",
    "AggregateType",
    "Command",
    "Decision",
    "DecisionTooLarge",
    "Event",
    "Rejected",
    "aggregate_digest",
    "json_copy",
    "send_fits",
    "sent_request_id",
    "sent_suffix_length",
]

S = TypeVar("S", bound=BaseModel)


DIGEST_CHARS: Final = 16
"""The hex digits of an aggregate's digest (`aggregate_digest`)."""


def aggregate_digest(aggregate: AggregateRef) -> str:
    """`DIGEST_CHARS` hex digits of a hash of the aggregate's whole address (context, type,
    tenant, id; each length-prefixed, so no two addresses are written alike): what makes
    an id derived from a request id, which is unique per aggregate alone, unique in the
    log (`sent_request_id`, `app.model.decide.event_id`)."""
    c, a, t, i = aggregate.context, aggregate.aggregate, aggregate.tenant, aggregate.id
    # One f-string, not a join over a generator: a third of the call (made for every event
    # decided and command sent).
    text = f"{len(c)}:{c}{len(a)}:{a}{len(t)}:{t}{len(i)}:{i}"
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=DIGEST_CHARS // 2)
    return digest.hexdigest()


def sent_request_id(sender: AggregateRef, request_id: str, n: int) -> str:
    """The request id of the `n`-th command a decision of `sender` on `request_id` sends,
    `<request id>>n@<sender's digest>`, or `sha256:<hex of the request id>>n@<the digest>`
    when that is longer than a request id may be: derived, so a retried decision sends the
    same one and its target de-duplicates it; the sender's digest, so two aggregates'
    commands of one request id (a request id is unique per aggregate alone) sending to one
    target are two requests there, not a DUPLICATE of the first. Hashed rather than
    refused, so a chain of sends (a sent command's handler sending again) never runs out
    of room."""
    digest = aggregate_digest(sender)
    made = f"{request_id}>{n}@{digest}"
    if len(made) <= MAX_REQUEST_ID:
        return made
    hashed = hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256:{hashed}>{n}@{digest}"


def sent_suffix_length(n: int = 0) -> int:
    """The room a request id leaves for its decision's `n`-th send (`send_fits`)."""
    return len(f">{n}")


MAX_TRIGGER_REQUEST_ID: Final = MAX_REQUEST_ID - sent_suffix_length(0)
"""A trigger's request id at most (a timer book's; a job's per instance keeps room for its
run's sends): the room `<request id>>0` left, kept since sent ids carry their sender's
digest (`send_fits`)."""


def send_fits(request_id: str, n: int = 0) -> bool:
    """Whether `<request id>>n` fits a request id: the bound a trigger's request id keeps
    (a timer book's, a job's), as it did before sent ids carried their sender's digest. A
    decision sends whatever its request id's length (`sent_request_id` hashes a long one)."""
    return len(request_id) + sent_suffix_length(n) <= MAX_REQUEST_ID


class Rejected(Exception):
    """Raised by `Decision.reject`: the state guard refused the command.

    `code` is the result the command gets: REJECTED unless the refusal has a code of its
    own (SCHEDULE_JOB_INVALID), or ERROR for a failure the timer should retry. `refusal`:
    with REJECTED, the code a client acts on (`CommandResult.refusal`), beside the text.
    """

    def __init__(
        self,
        reason: str,
        code: ResultCode = ResultCode.REJECTED,
        *,
        refusal: Refusal | None = None,
    ) -> None:
        # Read here, in the handler's own call: a code given as a plain string ("ERROR"),
        # or one that is none ("NOPE"), is the handler's error (answered ERROR), never a
        # value that fails the partition's cycle once it is answered.
        code = _one_of(ResultCode, code, "code")
        refusal = None if refusal is None else _one_of(Refusal, refusal, "refusal")
        if not isinstance(reason, str):
            raise TypeError(f"a rejection's reason is a str, not {type(reason).__name__}")
        if refusal is not None and code is not ResultCode.REJECTED:
            raise ValueError(f"a refusal code ({refusal}) goes with REJECTED, not {code}")
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.refusal = refusal


E = TypeVar("E", ResultCode, Refusal)


def _one_of(kind: type[E], value: object, what: str) -> E:
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    known = ", ".join(kind)
    raise ValueError(f"a rejection's {what} is one of {known}, not {value!r:.100}")


@dataclass(frozen=True, slots=True)
class Event:
    """An event as an applier sees it."""

    type: str
    body: Mapping[str, Any]
    version: int
    created_at: int
    id: str = ""
    """The event's id; a `wow.ScheduleSet`'s id is the id of the timer it sets."""


Command = CommandEnvelope

MAX_DECISION_RECORDS: Final = 10_000
"""The events and commands one decision may make (each is a record of its partition's one
transaction)."""


class DecisionTooLarge(ValueError):
    """A handler made more than `MAX_DECISION_RECORDS` events and commands in one decision."""


@dataclass(slots=True)
class Decision:
    """What a handler decided; collected by the runtime and appended to the log in order."""

    aggregate: AggregateRef
    now: int
    request_id: str = ""
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    commands: list[CommandEnvelope] = field(default_factory=list)
    unreachable: Callable[[AggregateRef], str | None] | None = None
    """Why a command to a target cannot be sent (its topic missing), or None: given by the
    runtime, so that `send` fails in the handler, where a job's run counts it as failed."""

    def emit(self, type_: str, body: Mapping[str, Any] | BaseModel | None = None) -> None:
        self._room()
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        self.events.append((type_, dict(body or {})))

    def _room(self) -> None:
        """`DecisionTooLarge` once the decision holds `MAX_DECISION_RECORDS` events and
        commands: raised in the handler, so its command is answered ERROR, nothing of it
        written, before a loop in it grows one transaction (and the node's memory) without
        bound."""
        if len(self.events) + len(self.commands) >= MAX_DECISION_RECORDS:
            raise DecisionTooLarge(
                f"a decision makes at most {MAX_DECISION_RECORDS} events and commands"
            )

    def schedule(
        self,
        key: str,
        rule: OnceRule | IntervalRule | CronRule,
        command: CommandSpec,
        target: AggregateRef | None = None,
    ) -> None:
        """Sends `command` to `target` (this aggregate by default) by `rule`, under `key`."""
        self.emit(SCHEDULE_SET, ScheduleSet(key=key, rule=rule, target=target, command=command))

    def cancel_schedule(self, key: str) -> None:
        self.emit(SCHEDULE_CANCELLED, ScheduleCancelled(key=key))

    def pause_schedule(self, key: str) -> None:
        """Holds the timer under `key`: it keeps its rule and fires nothing until resumed."""
        self.emit(SCHEDULE_PAUSED, SchedulePaused(key=key))

    def resume_schedule(self, key: str) -> None:
        """Runs the paused timer under `key` again, caught up by its rule's policy."""
        self.emit(SCHEDULE_RESUMED, ScheduleResumed(key=key))

    def delete(self) -> None:
        """Deletes this aggregate: all its timers are cancelled; later commands are rejected."""
        self.emit(AGGREGATE_DELETED, {})

    def send(self, target: AggregateRef, type_: str, body: Mapping[str, Any] | None = None) -> None:
        """Sends a command to `target`, in the same transaction as this decision's events.

        Its request id is derived from this command's, so a retried decision sends the
        same command again and its target de-duplicates it. `NoTarget` when the target's
        command topic does not exist (a handler need not catch it: the command is answered
        ERROR, and a retry once the topic exists goes through).
        """
        self._room()
        if self.unreachable is not None and (why := self.unreachable(target)) is not None:
            raise NoTarget(why)
        self.commands.append(
            CommandEnvelope(
                request_id=sent_request_id(self.aggregate, self.request_id, len(self.commands)),
                type=type_,
                aggregate=target,
                # Copied to its depth: a nested part the handler changed after the send
                # (checked here) changed the record written past its checks, and a value
                # no record holds then failed every retry of the decision (a job's tick).
                body=_plain_copy(body) if body else {},
                issued_at=self.now,
            )
        )

    def reject(
        self,
        reason: str,
        code: ResultCode = ResultCode.REJECTED,
        *,
        refusal: Refusal | None = None,
    ) -> NoReturn:
        raise Rejected(reason, code, refusal=refusal)


def json_copy(value: Any) -> Any:
    """`value` with every dict and list in it copied (what JSON holds; anything else is
    kept as it is): cheaper than `copy.deepcopy` for the small bodies and states here."""
    kind = type(value)
    if kind is dict:
        # Copied whole, then its containers alone copied in turn (assigning to an existing
        # key while iterating is allowed): no call for each string or number (#20).
        copied = value.copy()
        for k, v in copied.items():
            if type(v) is dict or type(v) is list:
                copied[k] = json_copy(v)
        return copied
    if kind is list:
        return [json_copy(v) if type(v) is dict or type(v) is list else v for v in value]
    return value


def _plain_copy(value: Any) -> Any:
    """`value` with every mapping and list in it copied as a plain dict and list (a
    handler's `defaultdict` or list subclass too, which `json_copy` keeps as they are)."""
    if isinstance(value, Mapping):
        return {k: _plain_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_copy(v) for v in value]
    return value


Handler = Callable[[S, Command, Decision], None]
Applier = Callable[[S, Event], S]


class AggregateType(Generic[S]):
    """An aggregate type of a context: its state model, handlers and appliers."""

    def __init__(self, context: str, name: str, state: type[S]) -> None:
        self.context = context
        self.name = name
        self.state_type = state
        self.handlers: dict[str, Handler[S]] = {}
        self.appliers: dict[str, Applier[S]] = {}

    @property
    def type_name(self) -> str:
        return f"{self.context}.{self.name}"

    def initial(self) -> S:
        return self.state_type()

    def command(self, type_: str) -> Callable[[Handler[S]], Handler[S]]:
        def register(fn: Handler[S]) -> Handler[S]:
            plain_function(fn, f"the handler of {type_}")
            if type_ in self.handlers:
                raise ValueError(f"{self.type_name} already handles {type_}")
            self.handlers[type_] = fn
            return fn

        return register

    def applies(self, type_: str) -> Callable[[Applier[S]], Applier[S]]:
        def register(fn: Applier[S]) -> Applier[S]:
            plain_function(fn, f"the applier of {type_}")
            self.appliers[type_] = fn
            return fn

        return register

    def apply(self, state: S, event: Event) -> S:
        """The state after `event`; events without an applier leave it as it is."""
        applier = self.appliers.get(event.type)
        return state if applier is None else applier(state, event)
