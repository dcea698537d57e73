"""Dead letters: a record that could not be used, kept whole on its context's dead-letter
topic, as Kafka Connect's dead-letter queues keep theirs.

The letter's key, value and headers are the bad record's own bytes, unchanged (no decoding,
no cut); where it came from and why is in headers of its own, named as Connect names them
under `__tickwheel.errors.`: the source topic, partition, offset and timestamp, the stage
that refused it, the exception's class and message, the node and the time. A letter larger
than the dead-letter topic takes (only a record larger than the topics it serves accept)
is cut to fit, and says so in `__tickwheel.errors.truncated` (its original size).

Ours are always the letter's last headers, in that order, after the record's own. A record
may carry headers of any name, ours included: a letter is read from its end, so nothing
the record carries is taken for why it was refused, and all of it goes back on a replay.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.errors import BadRecord
from app.protocol.topics import ContextTopics
from tables.timer import writable_text

__all__ = [
    "DEAD_LETTER_TOPIC_BYTES",
    "HEADER_PREFIX",
    "MAX_ERROR_CHARS",
    "DeadLetter",
    "DeadLetterContext",
    "Headers",
    "LetterRecord",
    "SourceRecord",
    "Stage",
    "dead_letter",
    "error_message",
]

Headers = tuple[tuple[str, bytes | None], ...]
"""A record's headers, in order (Kafka allows a key more than once, and a null value)."""

LetterRecord = tuple[str, int | None, bytes | None, bytes | None, Headers]
"""A dead letter as the Kafka edge writes it: (topic, partition, key, value, headers)."""

HEADER_PREFIX: Final = "__tickwheel.errors."

DEAD_LETTER_TOPIC_BYTES: Final = 4 * 1024 * 1024
"""`max.message.bytes` of a dead-letter topic: four times what a topic of the broker's
defaults accepts (1 MiB), so that any record of the topics it serves fits whole, with its
headers and ours."""

MAX_ERROR_CHARS: Final = 4096
"""The error message kept in a letter's headers, at most."""

NODE: Final = f"{socket.gethostname()}:{os.getpid()}"
"""Which process wrote a letter: host and process id."""


_NAMES: Final = {
    "topic": "topic",
    "partition": "partition",
    "offset": "offset",
    "timestamp": "timestamp",
    "stage": "stage",
    "exception_class": "exception.class.name",
    "exception_message": "exception.message",
    "node": "node",
    "time": "time",
}
"""A letter's fields and their headers, in the order written: `truncated` follows when set."""

_TRUNCATED: Final = HEADER_PREFIX + "truncated"


class Stage(StrEnum):
    """Where a record was refused."""

    READ = "read"
    """Its bytes: size, JSON, the envelope's fields and bounds, its key and partition."""
    DECIDE = "decide"
    """A command: its handler, or the aggregate it was decided on."""
    FOLLOW = "follow"
    """Another writer's event: folding it into its aggregate."""
    APPLY = "apply"
    """An event: what it does to the timer table."""
    OPERATE = "operate"
    """An operator's request on parked timers."""
    RESTORE = "restore"
    """A row of the timer changelog that a restore cannot read, or that the changelog
    takes no more (`app.node.row_limit`)."""


class SourceRecord(Protocol):
    """What a letter needs of the bad record (`app.kafka.Record` is one)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def headers(self) -> Headers: ...


class DeadLetterContext(BaseModel):
    """Where a dead letter came from and why: its `__tickwheel.errors.*` headers, the
    letter's last, in this order (the record's own come before them, whatever their names)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str = Field(min_length=1, max_length=249, description="the bad record's topic")
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)
    timestamp: int = Field(description="the bad record's own timestamp (epoch ms)")
    stage: Stage
    exception_class: str = Field(description="the error's class, e.g. BadRecord")
    exception_message: str = Field(max_length=MAX_ERROR_CHARS)
    node: str = Field(description="host:pid of the node that wrote the letter")
    time: int = Field(description="when the letter was written (epoch ms)")
    truncated: int | None = Field(
        default=None, ge=0, description="set only when cut: the letter's original size"
    )

    def headers(self) -> Headers:
        fields = {h: str(getattr(self, f)) for f, h in _NAMES.items()}
        if self.truncated is not None:
            fields["truncated"] = str(self.truncated)
        return tuple((HEADER_PREFIX + k, v.encode()) for k, v in fields.items())

    @classmethod
    def from_headers(cls, headers: Sequence[tuple[str, bytes | None]]) -> DeadLetterContext:
        """The context of a letter read back (its last headers); `BadRecord` for a record
        that is none."""
        return _split(headers)[1]


def _split(headers: Sequence[tuple[str, bytes | None]]) -> tuple[Headers, DeadLetterContext]:
    """The record's own headers and the letter's context: the context is read from the
    last headers alone, which the record's cannot reach whatever their names."""
    names = dict(_NAMES)
    if headers and headers[-1][0] == _TRUNCATED:
        names["truncated"] = "truncated"
    n = len(names)
    tail = list(headers[-n:])
    if len(headers) < n or [k for k, _ in tail] != [HEADER_PREFIX + h for h in names.values()]:
        raise BadRecord(f"not a dead letter: its last headers are not {HEADER_PREFIX}*")
    raw = [(v or b"").decode("utf-8", "replace") for _, v in tail]
    try:
        context = DeadLetterContext.model_validate(dict(zip(names, raw, strict=True)))
    except ValidationError as exc:
        raise BadRecord(f"not a dead letter: {exc.errors()[0]['msg']}") from exc
    return tuple(headers[:-n]), context


def _size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    # Each record and header takes a few bytes of framing (varints) besides its bytes.
    framing = 32 + 8 * len(headers)
    return (
        len(key or b"")
        + len(value or b"")
        + sum(len(k.encode()) + len(v or b"") for k, v in headers)
        + framing
    )


def error_message(error: BaseException) -> str:
    """What `error` says (its `str`, else its `repr`), writable (`writable_text`), or that
    it cannot be read: a handler's exception whose text read once may fail when read again
    (it reads a response closed since), and the dead letter of its record must still be
    written."""
    try:
        return writable_text(str(error) or repr(error))
    except Exception:
        return f"{type(error).__name__} (its text cannot be read)"


def dead_letter(
    record: SourceRecord,
    error: BaseException | str,
    stage: Stage,
    now: int,
    *,
    limit: int = DEAD_LETTER_TOPIC_BYTES,
) -> LetterRecord:
    """The dead letter of `record`: its key, value and headers unchanged, with where it came
    from and why. Cut to `limit` bytes (and marked so) only when it could not fit whole."""
    if isinstance(error, BaseException):
        kind, message = type(error).__name__, error_message(error)
    else:
        kind, message = BadRecord.__name__, writable_text(error)
    context = DeadLetterContext(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        timestamp=record.timestamp,
        stage=stage,
        exception_class=writable_text(kind),
        exception_message=message[:MAX_ERROR_CHARS],
        node=NODE,
        time=now,
    )
    key, value, original = record.key, record.value, tuple(record.headers)
    headers = original + context.headers()
    size = _size(key, value, headers)
    # The record batch around it takes some bytes too: leave room for them.
    room = max(limit - 1024, 1024)
    if size > room:
        headers = context.model_copy(update={"truncated": size}).headers()
        left = max(room - _size(None, None, headers), 0)
        key = None if key is None else key[: left // 2]
        value = None if value is None else value[: left - len(key or b"")]
    topic = ContextTopics(record.topic.split(".", 1)[0]).dead_letters
    return (topic, 0, key, value, headers)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead letter read back: the bad record's own key, value and headers, and why."""

    context: DeadLetterContext
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    """The bad record's own headers, all of them (ours, the last, taken off)."""

    @classmethod
    def read(
        cls,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
    ) -> DeadLetter:
        """A letter from a record of a dead-letter topic; `BadRecord` if it is none."""
        own, context = _split(headers)
        return cls(context, key, value, own)

    @property
    def topic(self) -> str:
        return self.context.topic

    @property
    def partition(self) -> int:
        return self.context.partition

    @property
    def offset(self) -> int:
        return self.context.offset

    @property
    def error(self) -> str:
        return self.context.exception_message
