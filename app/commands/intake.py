"""A command record's intake checks: what a partition's processor makes sure of before it
decides anything of a record read from its command topic.

A record is read only within the input limits, decoded, of the processor's aggregate type
and of its partition (`read_command`), and it is answered only where this node answers
(`bad_reply`). These checks depend on nothing a batch has decided, only on the record and
the partition's settings, so they are apart from `processor`, which holds the deciding;
they take those settings at each call (the processor's attributes as they are then).
"""

from __future__ import annotations

from app.commands.records import misrouted
from app.errors import BadRecord
from app.kafka import Record
from app.protocol.limits import InputLimits
from app.protocol.wire import CommandEnvelope, decode

__all__ = ["bad_reply", "read_command"]


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


def bad_reply(cmd: CommandEnvelope, results_topic: str, partitions: int) -> str | None:
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
