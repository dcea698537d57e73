"""Whether a timer's records can be written and read back (`oversized`): a `wow.ScheduleSet`
is taken only if they can (`app.timers.subscription.timer_op` refuses it otherwise, its
record dead-lettered with why, no timer stored).

A timer writes two records the event that set it is not: the command it sends, on its
target's command topic (in-process, the node's own record of it, written in the partition's
transaction and read back by the processor; else a send to the target, read by its node),
and its row, on the timer table's changelog, in the partition's transaction. Each holds the
timer's command body and more than the event does (a command its request id, reply address
and times; a row the owner and the target both, its slot, status and outcome), so an event
within `TICKWHEEL_MAX_RECORD_BYTES` may make either larger: a command over the bound is
refused at every firing (an in-process one by the node that fires it, before its handler
runs: `CommandProcessor.decide_local`; a sent one by the node that reads it: either answered
ERROR, the timer parked in the end), and a row over what the changelog takes fails the
partition's transaction at every retake.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import orjson

from app.kafka.records import TOPIC_RECORD_BYTES, topic_takes
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import MAX_EVENT_ID, MAX_PARTITION, encode
from app.timers.sender import timer_command
from tables import Timer
from tables.bounds import MAX_INSTANT
from tables.keys import encode_timer, row_key
from tables.timer import MAX_ERROR_TEXT

__all__ = ["DEFAULT_TOPICS", "NOT_BODY", "ROW_GROWTH", "oversized"]

DEFAULT_TOPICS: Final[Mapping[str, int]] = MappingProxyType({})
"""No topic named: each takes what a topic of the broker's defaults does."""

ROW_GROWTH: Final = 8 * 1024
"""What a row may grow by after it is set: an attempt's error code and text (100 and
`MAX_ERROR_TEXT` characters) and a cancel's event id (`Timer.cancel_id`, `MAX_EVENT_ID`),
6 bytes each at most in JSON, an outcome, a longer status, and its numbers (version, slot,
times, counts, an operator's retry's horizon) at 19 digits (measured: well under 256 bytes
with their names, `tests/unit/test_timer_sizes.py`)."""

NOT_BODY: Final = 64 * 1024
"""A bound on the bytes of a timer's row with its key, and of any command it sends with
its key, besides its command's body: every other field is bounded (its ids, names and
rule), the widest timer's well under it (`tests/unit/test_timer_sizes.py`). A timer whose
body leaves this much room under each limit is taken without encoding either record."""

if ROW_GROWTH < 6 * (100 + MAX_ERROR_TEXT + MAX_EVENT_ID) + 256:
    raise TypeError("ROW_GROWTH leaves no room for an attempt's error text and a cancel's id")


def oversized(
    timer: Timer, max_record_bytes: int, topic_bytes: Mapping[str, int] = DEFAULT_TOPICS
) -> str | None:
    """Why `timer`'s records cannot be written and read back, or None when they can: the
    command it sends (in its largest form: with a reply address, issued at the latest
    instant) must be within `max_record_bytes` (what every node reads) and, with its key,
    what its target's command topic takes; its changelog row, with its key and room to
    grow (`ROW_GROWTH`), what its owner's changelog takes. What a topic takes:
    `topic_bytes` (`InputLimits.topic_record_bytes`: the node's own topics that take less),
    else what a topic of the broker's defaults does (`TOPIC_RECORD_BYTES`)."""
    try:
        body = len(orjson.dumps(timer.command.body))
    except orjson.JSONEncodeError:
        body = max_record_bytes  # encoded below, as it will be written (and refused so)
    commands = changelog = TOPIC_RECORD_BYTES
    target = owner = ""
    if topic_bytes:  # some topics of the node's own take less
        target = AggregateTopics(timer.target.context, timer.target.aggregate).commands
        owner = AggregateTopics(timer.owner.context, timer.owner.aggregate).timers_changelog
        commands = topic_bytes.get(target, TOPIC_RECORD_BYTES)
        changelog = topic_bytes.get(owner, TOPIC_RECORD_BYTES)
    if body + NOT_BODY <= min(max_record_bytes, commands, changelog - ROW_GROWTH):
        return None  # most timers: nothing more encoded (the keys are within `NOT_BODY`)
    command_limit = min(max_record_bytes, commands - len(timer.target.id.encode()))
    row_limit = changelog - ROW_GROWTH - len(row_key(timer.owner, timer.key))
    # Longer than each form sent: a reply address (an in-process one writes nulls, no
    # shorter than a partition's five digits) and `"in_process":false`.
    widest = timer_command(
        timer,
        MAX_INSTANT,
        reply_to=ContextTopics(timer.target.context).results,
        reply_partition=MAX_PARTITION,
    )
    if (command := len(encode(widest))) > command_limit:
        return (
            f"the command its timer sends would be a record of up to {command} bytes, over "
            f"{command_limit} (TICKWHEEL_MAX_RECORD_BYTES {max_record_bytes}, or "
            f"{topic_takes(commands, target)} with its key): its target would refuse it; "
            "send a smaller command body"
        )
    if (row := len(encode_timer(timer))) > row_limit:
        return (
            f"its row in the timer table's changelog would be {row} bytes, over {row_limit} "
            f"({topic_takes(changelog, owner)}, less its key and room for what its firings add to "
            "it): send a smaller command body"
        )
    return None
