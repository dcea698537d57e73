"""A command record's intake checks: what a partition's processor makes sure of before it
decides anything of a record read from its command topic.

A record is read only within the input limits, decoded, of the processor's aggregate type
and of its partition (`read_command`), and it is answered only where this node answers
(`bad_reply`). One refused as it is read is answered too when its reply address reads
(`reply_address`): its sender learns why at once instead of waiting out its timeout.
These checks depend on nothing a batch has decided, only on the record and the
partition's settings, so they are apart from `processor`, which holds the deciding; they
take those settings at each call (the processor's attributes as they are then).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.commands.records import Reply, misrouted, written_in_process
from app.errors import BadRecord
from app.kafka import Record
from app.protocol.limits import InputLimits
from app.protocol.request_window import ahead_of_clock, written_ago
from app.protocol.wire import MAX_PARTITION, MAX_REQUEST_ID, CommandEnvelope, decode
from tables import AggregateRef
from tables.refs import NEW_INPUT

__all__ = ["ReplyAddress", "bad_reply", "past_window", "read_command", "reply_address"]


def read_command(
    r: Record, type_name: str, limits: InputLimits, partitions: int
) -> CommandEnvelope:
    """A command record of `type_name`'s partition, read and checked; `BadRecord` otherwise."""
    limits.check(r.key, r.value)
    cmd = decode(CommandEnvelope, r.value, limits.max_record_bytes)
    if cmd.aggregate.type_name != type_name:
        raise BadRecord(f"command for {cmd.aggregate.type_name} on {r.topic}")
    if (why := misrouted(r, cmd.aggregate, partitions)) is not None:
        raise BadRecord(why)
    return cmd


class _Answerable(BaseModel):
    """What an answer needs of a command record at least: its request id and aggregate."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    request_id: str = Field(min_length=1, max_length=MAX_REQUEST_ID)
    aggregate: AggregateRef


class ReplyAddress(_Answerable):
    """What an answer takes of a command record that does not read as a command: its
    request id, its aggregate and its reply address, read as `CommandEnvelope` reads them,
    the rest of the record passed over."""

    reply_to: str | None = Field(default=None, max_length=249)
    reply_partition: int | None = Field(default=None, ge=0, le=MAX_PARTITION)


def past_window(r: Record, cmd: CommandEnvelope, now: int, window: int, skew_ms: int) -> str | None:
    """Why `cmd`, read in `r`, is not decided for being older than the request-id
    `window`, or None (`app.protocol.request_window`)."""
    ago = written_ago(r.timestamp, cmd.issued_at, now, window, skew_ms)
    if ago is None:
        return None
    if ago < 0:
        return ahead_of_clock(-ago, window, skew_ms)
    return (
        f"written {ago} ms ago, longer than the request-id window ({window} ms, "
        "TICKWHEEL_REQUEST_ID_WINDOW_MS, less a margin for the clocks): whether it was "
        "applied is forgotten, so it is not decided; if it was not applied, send it again "
        "under a new request id"
    )


def reply_address(r: Record, limits: InputLimits) -> ReplyAddress | None:
    """Where the answer to `r`, a command record refused as it is read, goes, when that
    reads; None for a record over the input limits (never parsed), a node's own record of a
    command it decided in-process (never answered), or one whose JSON has no request id and
    aggregate that read strictly (an aggregate is what a sender matches its answer by). A
    reply address that does not read (a partition below 0 or past any topic's, a topic name
    longer than Kafka's) is none: answered on the context's own results topic, in the
    request id's partition, as one elsewhere is (`bad_reply`)."""
    try:
        limits.check(r.key, r.value)
    except BadRecord:
        return None
    if r.value is None or written_in_process(r):
        return None
    try:
        address: ReplyAddress = ReplyAddress.__pydantic_validator__.validate_json(
            r.value, strict=True, context=NEW_INPUT
        )
    except ValidationError:
        try:
            answerable = _Answerable.model_validate_json(r.value, strict=True, context=NEW_INPUT)
        except ValidationError:
            return None
        return ReplyAddress(request_id=answerable.request_id, aggregate=answerable.aggregate)
    return address


def bad_reply(cmd: Reply, results_topic: str, partitions: int) -> str | None:
    """Why the command's reply address is not one this node answers on, or None: only
    its context's results topic, in a partition that topic has."""
    if cmd.reply_to is not None and cmd.reply_to != results_topic:
        return (
            f"reply_to {cmd.reply_to[:300]!r} is not {results_topic}: commands are "
            "answered on their context's results topic only"
        )
    if cmd.reply_partition is not None and cmd.reply_partition >= partitions:
        return (
            f"reply_partition {cmd.reply_partition} does not exist: "
            f"{results_topic} has {partitions} partitions"
        )
    return None
