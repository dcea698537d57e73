"""Timer, its status and outcome, and TimerChange: the records the TimerStore keeps."""

from __future__ import annotations

import functools
import operator
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from tables.bounds import (
    STORED_BODIES,
    STORED_INPUT,
    CommandBody,
    Count,
    Deadline,
    Instant,
    Version,
)
from tables.refs import AggregateRef
from tables.rules import ScheduleRule

__all__ = [
    "ACTIVE",
    "CUT_MARKER",
    "MAX_ERROR_TEXT",
    "CommandSpec",
    "Outcome",
    "StoredCommand",
    "Timer",
    "TimerChange",
    "TimerStatus",
    "error_text",
    "writable_text",
]

MAX_ERROR_TEXT: Final = 1_000
"""The most characters of an attempt's error text a row keeps (`error_text`)."""
CUT_MARKER: Final = " …[cut]"
"""What ends an error text cut to `MAX_ERROR_TEXT` characters."""


def writable_text(text: str) -> str:
    """`text` as UTF-8 can hold it: a lone surrogate (text decoded with errors=
    "surrogateescape", as `os.fsdecode` does) written as its escape, `\\udce9`. Any text a
    service's code gives (an exception's, a rejection's reason) may hold one, and a record
    holding it cannot be encoded: the partition writing it would fail again at each retake."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def error_text(message: str) -> str | None:
    """An attempt's error message as a row keeps it: None if empty, else at most
    `MAX_ERROR_TEXT` characters, a longer one cut and ending in `CUT_MARKER`; writable
    (`writable_text`)."""
    if not message:
        return None
    message = writable_text(message)
    if len(message) <= MAX_ERROR_TEXT:
        return message
    return message[: MAX_ERROR_TEXT - len(CUT_MARKER)] + CUT_MARKER


_absent: Final = functools.partial(operator.is_, None)
"""Whether a field's value is None: `exclude_if`'s test, called by the serializer for every
row and record written. A C callable, not a Python function: no frame per call."""
_false: Final = functools.partial(operator.is_, False)
"""Whether a flag is False: `exclude_if`'s test, a C callable as `_absent`."""


class TimerStatus(StrEnum):
    PENDING = "PENDING"
    FIRING = "FIRING"
    FIRED = "FIRED"
    CANCELLED = "CANCELLED"
    PARKED = "PARKED"
    PAUSED = "PAUSED"
    """Held by its owner (`wow.SchedulePaused`): keeps its rule and slot, fires nothing, and
    is in no index the firing loop reads until `wow.ScheduleResumed`, which runs it again,
    or parks it again if it was PARKED when paused (`Timer.parked_when_paused`)."""


ACTIVE = frozenset(
    {TimerStatus.PENDING, TimerStatus.FIRING, TimerStatus.PARKED, TimerStatus.PAUSED}
)
"""What a cancel still cancels."""


class Outcome(StrEnum):
    """What became of a timer's last slot (or of the timer)."""

    COMMITTED = "COMMITTED"
    DUPLICATE = "DUPLICATE"
    UNCHANGED = "UNCHANGED"
    REJECTED = "REJECTED"
    SENT = "SENT"
    EXPIRED = "EXPIRED"
    SKIPPED = "SKIPPED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    """A technical failure: the slot is retried (or the timer parked)."""
    BUSY = "BUSY"
    """The target refused it as busy: backpressure, retried."""


class CommandSpec(BaseModel):
    """The command a timer sends: its type and body, as the target's handler takes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str = Field(min_length=1, max_length=200)
    body: CommandBody = Field(default_factory=dict)


_validate_command = CommandSpec.__pydantic_validator__.validate_python


def _stored_command(
    value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
) -> CommandSpec:
    # A row is stored: its body is held to `check_stored` unless the validation says
    # otherwise (`NEW_INPUT` without `STORED_BODIES`). A model is taken as it is.
    context = info.context
    said = context is not None and (
        context.get("new_input") is True or context.get(STORED_BODIES) is True
    )
    if said or isinstance(value, CommandSpec):
        command: CommandSpec = handler(value)
    else:
        command = _validate_command(value, context=STORED_INPUT)
    return command


StoredCommand = Annotated[CommandSpec, WrapValidator(_stored_command)]
"""A stored timer's command (a `Timer`'s, a timer book's): its body validated as read back
as stored (`tables.bounds.check_stored`), not as new input, unless the validation's
context says it is (`tables.refs.NEW_INPUT`)."""


class Timer(BaseModel):
    """One timer, unique by `(owner, key)`; `id` changes with each reschedule.

    Times are epoch milliseconds (UTC). `slot` counts the rule's firings from 0;
    `slot_due_at` is that slot's own due time, `due_at` when the store next hands the
    timer out (a FIRING timer's `due_at` is its claim's deadline).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=200)
    owner: AggregateRef
    key: str = Field(min_length=1, max_length=200)
    version: Version
    partition: int = Field(ge=0, le=65_535)
    status: TimerStatus = TimerStatus.PENDING
    rule: ScheduleRule
    target: AggregateRef
    command: StoredCommand
    slot: Version = 0
    slot_due_at: Instant
    due_at: Deadline
    attempts: Count = 0
    skipped: Count = 0
    outcome: Outcome | None = None
    error_code: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        exclude_if=_absent,
        description="why the last attempt's command was not taken: the target's result code "
        "(ERROR, BUSY, REJECTED, SCHEDULE_NOT_DUE, ...) or the runner's (TIMEOUT, "
        "TRANSPORT_ERROR, RULE_ERROR); kept through retries, parks, expiry and an "
        "operator's retry or skip, cleared by an attempt the target takes (COMMITTED, "
        "DUPLICATE, UNCHANGED, SENT); absent: none (left out of the JSON, as before it "
        "existed)",
    )
    error_text: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ERROR_TEXT,
        exclude_if=_absent,
        description="that attempt's error message, at most 1,000 characters (a longer one "
        "cut, ending in ' …[cut]'); absent when the result had none",
    )
    parked_when_paused: bool = Field(
        default=False,
        exclude_if=_false,
        description="a PAUSED row's: the timer was PARKED when it was paused, so its resume "
        "parks it again (an operator's retry sends it, as any parked timer); absent: false "
        "(left out of the JSON, as before it existed)",
    )
    retry_until: Deadline | None = Field(
        default=None,
        exclude_if=_absent,
        description="an operator's retry's (the runner's `retry_parked`): the slot is sent "
        "until then and not after (then it expires as any slot does): the retry's time plus "
        "`expires_after`, at most the slot's due time (jitter included) plus the request-id "
        "window less `expires_after` (at most a day) unless the operator asked past the "
        "window; cleared when the timer "
        "moves to another slot. Absent: the slot is sent until `expires_after` past its due "
        "time, however often it is retried (left out of the JSON, as before it existed)",
    )
    cancel_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        exclude_if=_absent,
        description="the event id of the last `wow.ScheduleCancelled` applied to the key at "
        "the row's version: the one that cancelled it, or, on a row set after it in the same "
        "command, the one before that set (`tables.writes.put_row` carries it over); a "
        "cancel of that id at that version read again (a producer's retry that appended its "
        "batch twice) is passed over, the timer set after it kept. Absent: none (left out "
        "of the JSON, as before it existed)",
    )

    def same_as_loaded(self, loaded: Timer) -> bool:
        """Whether this row is still `loaded`, as a conditional write compares them."""
        return self is loaded or (  # the very row (`recent_rows` gives back the row built)
            self.id == loaded.id
            and self.status == loaded.status
            and self.slot == loaded.slot
            and self.slot_due_at == loaded.slot_due_at
            and self.attempts == loaded.attempts
            and self.due_at == loaded.due_at
        )

    @property
    def request_id(self) -> str:
        """The idempotent request id of this slot's send: `<timer id>#<slot>`."""
        return f"{self.id}#{self.slot}"


class TimerChange(BaseModel):
    """A conditional write: `next` replaces the row only while the store holds `loaded`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    loaded: Timer
    next: Timer
