"""The commands a timer book's timers fire into a faust app, without faust (only
`app.clients.faust_client` imports it): read from a record as faust delivers it (its
`Message`, by its fields), refused as Tickwheel's own processors refuse one (`BadRecord`,
dead-lettered), and answered as a node answers.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from app.clients.book_commands import Delivered
from app.commands.intake import read_command
from app.kafka import Record
from app.protocol.dead_letters import Stage, dead_letter
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope
from tables.partitioner import partition_of

__all__ = ["Received", "command_in", "letter_of", "record_of", "reply_partition"]

FAUST_REQUEST_BYTES: Final = 1_000_000
"""The largest request faust's producer sends (its max_request_size, 1 MiB)."""


class Received(Delivered, Protocol):
    """A record as faust delivers it (a faust `Message`)."""

    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp(self) -> float: ...  # epoch seconds
    @property
    def headers(self) -> Any: ...  # a mapping or pairs


def record_of(message: Received) -> Record:
    """`message` as Tickwheel's own readers deliver a record."""
    return Record(
        topic=message.topic or "",
        partition=message.partition,
        offset=message.offset,
        key=message.key,
        value=message.value,
        timestamp=int(message.timestamp * 1000),
        headers=_headers(message.headers),
    )


def _headers(headers: Any) -> tuple[tuple[str, bytes], ...]:
    pairs = headers.items() if isinstance(headers, dict) else (headers or ())
    return tuple((str(k), bytes(v or b"")) for k, v in pairs)


def command_in(
    message: Received, target: AggregateTopics, partitions: int, limits: InputLimits
) -> CommandEnvelope:
    """The command `message` carries; `BadRecord` saying why it is not one of `target`'s,
    keyed and partitioned as its aggregate (murmur2 of the id), within `limits` (the
    workers' `TICKWHEEL_MAX_RECORD_BYTES`, …): read as a node's processor reads it."""
    # The node's own intake: a command the workers took and fired (up to their record
    # bound, not the default) reads here too.
    return read_command(record_of(message), target.type_name, limits, partitions)


def letter_of(
    message: Received, error: Exception, now: int
) -> tuple[str, int | None, bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """The dead letter of `message`: (topic, partition, key, value, headers) as faust sends
    one (no null header value), within a faust request."""
    topic, partition, key, value, headers = dead_letter(
        record_of(message), error, Stage.READ, now, limit=FAUST_REQUEST_BYTES
    )
    return topic, partition, key, value, [(k, v or b"") for k, v in headers]


def reply_partition(cmd: CommandEnvelope, results: str, partitions: int) -> int | None:
    """The partition of `results` (the context's results topic, of `partitions`) that the
    answer to `cmd` goes to; None: no answer is expected (a command sent from another
    context is fire-and-forget)."""
    if cmd.reply_to is None:
        return None
    # Answered on the context's own results topic only, in a partition it has: a
    # command's reply address is its writer's word, and another writer's would have
    # this app write results into any topic (or fail its commit on a partition the
    # topic lacks, the same command answered again after each restart).
    reply = cmd.reply_partition
    if reply is not None and cmd.reply_to == results and 0 <= reply < partitions:
        return reply
    return partition_of(cmd.request_id, partitions)
