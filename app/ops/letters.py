"""Reading a context's dead letters back, and replaying one to its topic once.

A dead letter (`app.protocol.dead_letters`) holds the refused record's own key, value and
headers, and why in `__tickwheel.errors.*` headers. `read_letters` reads the newest
letters of the dead-letter topic (committed records), each with its coordinates there
(partition, offset) and whether it was replayed; `find_letter` one letter. Neither reads
the topic whole (`app.ops.letter_reads`, re-exported here).

A replay writes the letter's original key, value and headers back to the topic and
partition they came from, and, in the same transaction, a replay mark on the dead-letter
topic: a record beside the letter (its partition, after it) whose only header,
`__tickwheel.replay.of`, names the letter's offset and whose value says where the record
went. Only that shape is a mark: a record refused with that header among its own is a
letter like any other, and its replay writes the header back. The transaction's id
is the letter's own (`<group>.<context>.dead-letters.replay.<partition>.<offset>`), and the
mark is looked for only after that id's writer started: starting fences any other replay
of the same letter still under way (its transaction is aborted), and waits for one that is
committing, so two replays, however close, write the record once. A second replay finds
the mark and writes nothing.

A letter cut to fit its topic (`truncated`) has lost bytes: it is never replayed. A
record of the dead-letter topic that is neither a letter nor a mark (another writer's) is
counted and passed over.

Where a letter says its record came from is only its headers, and anyone who may write to
the dead-letter topic may write those. A replay writes with the operator's rights, so it
writes only where a letter of that dead-letter topic can come from (`replay_refusal`): an
input topic of the same context that a node reads and dead-letters (an aggregate type's
events, commands or timer-ops), with a stage that topic's records are refused at (not
a timer-ops request that failed as it was carried out: its request id was used, a copy is
its DUPLICATE), and a partition the topic has. Never the timer changelog (a restore's
letters are of records that are no timer rows: written back, they would only be refused
again, and a forged one would be loaded as a timer), the results, ledger or nodes
topics, nor another context's topics. Anything else is `ReplayRefused`, and nothing is written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.errors import ConfigError
from app.kafka.cluster import require_topic
from app.kafka.ports import Clients, LogReader, TransactionalWriter
from app.ops.letter_reads import (
    LIST_LIMIT,
    MAX_LIST_LIMIT,
    REPLAY_HEADER,
    SCAN_RECORDS,
    Letter,
    LetterBook,
    NoLetter,
    ReplayMark,
    Want,
    find_letter,
    read_letters,
    recent_letters,
)
from app.protocol.dead_letters import DeadLetterContext, Headers, Stage
from app.protocol.topics import AggregateTopics, ContextTopics, parse_aggregate_type

__all__ = [
    "LIST_LIMIT",
    "MAX_LIST_LIMIT",
    "REPLAY_HEADER",
    "SCAN_RECORDS",
    "Letter",
    "LetterBook",
    "NoLetter",
    "ReplayMark",
    "ReplayRefused",
    "Replayed",
    "Want",
    "find_letter",
    "list_letters",
    "read_letters",
    "recent_letters",
    "replay",
    "replay_letter",
    "replay_refusal",
    "replay_transactional_id",
    "show_letter",
]


class ReplayRefused(NoLetter):
    """A letter whose record may not be written where its headers say it came from: not an
    input topic a letter of its dead-letter topic comes from, or a partition it has not."""


def _stages(t: AggregateTopics) -> dict[str, frozenset[Stage]]:
    """The topics of an aggregate type that a node reads and dead-letters, each with the
    stages its records are refused at (`app.node.cycle_timers`, `app.commands.processor`;
    a faust client's command topic: `read`). Not its timer changelog: a restore's letters
    (`restore`) are never replayed."""
    return {
        t.events: frozenset({Stage.READ, Stage.FOLLOW, Stage.APPLY}),
        t.commands: frozenset({Stage.READ, Stage.DECIDE}),
        t.timer_ops: frozenset({Stage.READ, Stage.OPERATE}),
    }


def replay_refusal(dead_letters: str, letter: DeadLetterContext) -> str | None:
    """Why the record of a letter read on the dead-letter topic `dead_letters` may not be
    written back where the letter says it came from, or None when it may: that topic is
    an events, commands or timer-ops topic of an aggregate type of the context whose dead
    letters `dead_letters` holds, and the letter's stage one its records are refused at.
    (The partition is checked against the topic's own count by `replay_letter`.)"""
    topic = letter.topic
    context, _, rest = topic.partition(".")
    if ContextTopics(context).dead_letters != dead_letters:
        return (
            f"{topic!r} is not a topic of the context whose dead letters {dead_letters} "
            "holds: no letter there comes from it"
        )
    try:
        types = parse_aggregate_type(f"{context}.{rest.partition('.')[0]}")
    except ConfigError:
        types = None
    if types is not None and topic == types.timers_changelog:
        return (
            f"{topic} is a timer changelog: its only letters are a restore's, of records "
            "that are no timer rows, and none is ever written back into it (replaying one "
            "is never useful, and a forged one would be loaded as a timer)"
        )
    stages = {} if types is None else _stages(types)
    if topic not in stages:
        return (
            f"{topic!r} is not a topic a node reads records from and dead-letters: only an "
            "aggregate type's events, commands and timer-ops topics are replayed to"
        )
    if letter.stage not in stages[topic]:
        allowed = ", ".join(sorted(stages[topic]))
        return (
            f"no letter of {topic} is refused at stage {letter.stage} (only {allowed}): "
            "not one a node wrote"
        )
    if types is not None and topic == types.timer_ops and letter.stage == Stage.OPERATE:
        # Its request id counts as used (perhaps half carried out): a copy is answered
        # DUPLICATE for the de-duplication window, nothing done, though written.
        return (
            f"a request of {topic} that failed as it was carried out ({letter.stage}) used "
            "its request id: its owner answers a copy DUPLICATE and does nothing for "
            "TICKWHEEL_REQUEST_ID_WINDOW_MS; send it again under a new request id "
            "(`tickwheel timers retry|skip --request-id <new>`)"
        )
    return None


def replay_transactional_id(group_id: str, topic: str, partition: int, offset: int) -> str:
    """The transactional id of a letter's replay: the same for every replay of it (under the
    group's prefix, as the workers' are)."""
    return f"{group_id}.{topic}.replay.{partition}.{offset}"


@dataclass(frozen=True, slots=True)
class Replayed:
    """What a replay did: `written`, the record's offset on its topic, None when the letter
    had been replayed before (and nothing was written)."""

    letter: Letter
    mark: ReplayMark
    written: int | None


async def replay_letter(
    reader: LogReader,
    writer: TransactionalWriter,
    topic: str,
    partition: int,
    offset: int,
    now: int,
    check_topic: Callable[[str], Awaitable[int]] | None = None,
) -> Replayed:
    """Replays the letter at (`partition`, `offset`) of the dead-letter `topic` with
    `writer` (of `replay_transactional_id`, not started), unless it was replayed before.

    `NoLetter` when there is no letter there or it was cut; `ReplayRefused` when its record
    may not be written where the letter says it came from (`replay_refusal`, or a partition
    the topic has not); `KafkaUnavailable` (`Fenced`: another replay of it started
    meanwhile) when the write failed. Nothing is written then, not even the mark.
    `check_topic` is awaited with the record's topic before it is written, and returns its
    partition count (a broker may create a topic a record is sent to: a replay must not).
    """
    try:
        await writer.start()  # fences another replay of this letter still under way
        found = await find_letter(reader, topic, partition, offset)
        if found.replayed is not None:
            return Replayed(found, found.replayed, written=None)
        if found.letter.context.truncated is not None:
            raise NoLetter(
                f"the dead letter at partition {partition}, offset {offset} was cut to fit its "
                f"topic ({found.letter.context.truncated} bytes originally): its record is not "
                "whole and cannot be replayed"
            )
        ctx = found.letter.context
        if (why := replay_refusal(topic, ctx)) is not None:
            raise ReplayRefused(
                f"the dead letter at partition {partition}, offset {offset} is not replayed: "
                f"{why}; nothing was written"
            )
        if check_topic is not None:
            have = await check_topic(ctx.topic)
            if not 0 <= ctx.partition < have:
                raise ReplayRefused(
                    f"the dead letter at partition {partition}, offset {offset} is not "
                    f"replayed: topic {ctx.topic} has no partition {ctx.partition} ({have} "
                    "partition(s)); nothing was written"
                )
        headers: Headers = found.letter.headers
        original = (ctx.topic, ctx.partition, found.letter.key, found.letter.value, headers)
        mark = ReplayMark(
            letter_partition=partition,
            letter_offset=offset,
            topic=ctx.topic,
            partition=ctx.partition,
            time=now,
        )
        # One transaction: the record and its mark are written together or not at all.
        written = await writer.commit([original, _mark_record(topic, mark)], {}, "")
        return Replayed(found, mark, written=written[0])
    finally:
        await writer.stop()


def _mark_record(topic: str, mark: ReplayMark) -> tuple[str, int, bytes, bytes, Headers]:
    key = f"replayed:{mark.letter_partition}:{mark.letter_offset}".encode()
    header = ((REPLAY_HEADER, str(mark.letter_offset).encode()),)
    return (topic, mark.letter_partition, key, mark.model_dump_json().encode(), header)


_WHY = "no node of this context has written a dead letter to this cluster"


async def list_letters(
    clients: Clients, context: str, limit: int = LIST_LIMIT, want: Want = None
) -> tuple[str, LetterBook]:
    """The dead-letter topic of `context` and its newest `limit` letters that `want` takes
    (their errors alone, `read_letters`). Creates nothing: `MissingTopic` when the topic is
    not there."""
    topic = ContextTopics(context).dead_letters
    have = await require_topic(clients.admin(), topic, _WHY)
    async with clients.reader() as reader:
        book = await read_letters(reader, topic, range(have), limit, want=want, whole=False)
        return topic, book


async def show_letter(clients: Clients, context: str, partition: int, offset: int) -> Letter:
    """One letter of `context`, whole (`find_letter`). Creates nothing."""
    topic = ContextTopics(context).dead_letters
    have = await require_topic(clients.admin(), topic, _WHY)
    if not 0 <= partition < have:
        raise NoLetter(f"no dead letter at partition {partition}, offset {offset}")
    async with clients.reader() as reader:
        return await find_letter(reader, topic, partition, offset)


async def replay(
    clients: Clients, group_id: str, context: str, partition: int, offset: int, now: int
) -> Replayed:
    """Replays one letter of `context` (`replay_letter` on the cluster). Creates no topic:
    the dead-letter topic and the record's own must be there."""
    topic = ContextTopics(context).dead_letters
    admin = clients.admin()
    have = await require_topic(admin, topic, _WHY)
    if not 0 <= partition < have:
        raise NoLetter(f"topic {topic} has no partition {partition} ({have} partition(s))")
    writer = clients.transactional_writer(
        replay_transactional_id(group_id, topic, partition, offset)
    )

    async def check(name: str) -> int:
        return await require_topic(admin, name, "the record's topic is gone: nothing was replayed")

    async with clients.reader() as reader:
        return await replay_letter(reader, writer, topic, partition, offset, now, check)
