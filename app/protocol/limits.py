"""The bounds a record must keep to be read at all: its key's and value's sizes, and how
large a dead letter may be; and how large an aggregate's stored state may grow. Each is a
setting (`TICKWHEEL_MAX_KEY_BYTES`, `TICKWHEEL_MAX_RECORD_BYTES`,
`TICKWHEEL_MAX_STATE_BYTES`); the dead-letter size, and what each of the node's own
topics takes of a record, are what the topics accept (read at the node's start)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from app.errors import BadRecord, RecordTooLarge
from app.protocol.dead_letters import DEAD_LETTER_TOPIC_BYTES

__all__ = [
    "DEFAULT_MAX_KEY_BYTES",
    "DEFAULT_MAX_RECORD_BYTES",
    "DEFAULT_MAX_STATE_BYTES",
    "MAX_STATE_BYTES",
    "InputLimits",
    "StateTooLarge",
]

DEFAULT_MAX_KEY_BYTES = 4096
"""An aggregate id is at most 500 characters (2,000 bytes of UTF-8): twice that is room."""

DEFAULT_MAX_RECORD_BYTES = 256 * 1024
"""A timer's command is not a blob store."""

DEFAULT_MAX_STATE_BYTES = 4 * 1024 * 1024
"""An aggregate's stored state (its JSON) at most: each command folds it whole, copied
several times, so a state grown without bound (a timer book of endless timers under one
key) makes each command dearer until the worker runs out of memory."""

MAX_STATE_BYTES = 64 * 1024 * 1024
"""The largest `TICKWHEEL_MAX_STATE_BYTES` may be set to."""


class StateTooLarge(RecordTooLarge):
    """A decision would store its aggregate's state past `TICKWHEEL_MAX_STATE_BYTES`:
    answered ERROR and dead-lettered as a too large record is (a bound of the node, which
    an operator may raise and replay the letter, not the aggregate's own refusal), nothing
    of the decision written."""


@dataclass(frozen=True, slots=True)
class InputLimits:
    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    dead_letter_bytes: int = DEAD_LETTER_TOPIC_BYTES
    """The largest dead letter its topic accepts: a larger one is cut to fit."""
    dead_letter_topic_bytes: Mapping[str, int] = field(default_factory=dict, hash=False)
    """Each dead-letter topic's `max.message.bytes` as last read (at the node's start, and
    again after a refusal as too large): a letter is cut to it when it takes less than
    `dead_letter_bytes` (`app.commands.records.letter_bytes`)."""
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES
    """An aggregate's stored state at most: a command growing it past is refused (the
    log's events are folded whatever the size: `app.commands.states`)."""
    topic_record_bytes: Mapping[str, int] = field(default_factory=dict, hash=False)
    """What each of the node's own topics takes of a record (its key and value together),
    for those that take less than a topic of the broker's defaults (made beforehand with a
    smaller `max.message.bytes`); a topic not named takes that (`app.kafka.records.
    TOPIC_RECORD_BYTES`). A decision or a timer whose record one would refuse is refused
    as too large: written, it would fail its partition's transaction at every retake."""

    def check(self, key: bytes | None, value: bytes | None) -> None:
        """`BadRecord` unless the record's key and value are within bounds."""
        if key is not None and len(key) > self.max_key_bytes:
            raise BadRecord(
                f"key of {len(key)} bytes exceeds {self.max_key_bytes} (TICKWHEEL_MAX_KEY_BYTES)"
            )
        if value is not None and len(value) > self.max_record_bytes:
            raise BadRecord(
                f"record of {len(value)} bytes exceeds {self.max_record_bytes} "
                "(TICKWHEEL_MAX_RECORD_BYTES)"
            )
