"""Reading a context's dead letters back, and replaying one to its topic once.

A dead letter (`app.protocol.dead_letters`) holds the refused record's own key, value and
headers, and why in `__tickwheel.errors.*` headers. `read_letters` reads the dead-letter
topic whole (committed records) into letters, each with its coordinates there (partition,
offset) and whether it was replayed.

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
events, commands or timer-ops), with a stage that topic's records are refused at, and a
partition the topic has. Never the timer changelog (a restore's letters are of records
that are no timer rows: written back, they would only be refused again, and a forged one
would be loaded as a timer), the results, ledger or nodes topics, nor another context's
topics. Anything else is `ReplayRefused`, and nothing is written.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.errors import BadRecord, ConfigError, TickwheelError
from app.kafka.cluster import require_topic
from app.kafka.ports import Clients, LogReader, TransactionalWriter
from app.kafka.records import Record
from app.protocol.dead_letters import DeadLetter, DeadLetterContext, Headers, Stage
from app.protocol.topics import AggregateTopics, ContextTopics, parse_aggregate_type

__all__ = [
    "REPLAY_HEADER",
    "Letter",
    "LetterBook",
    "NoLetter",
    "ReplayMark",
    "ReplayRefused",
    "Replayed",
    "letter_json",
    "list_letters",
    "read_letters",
    "recent_letters",
    "replay",
    "replay_letter",
    "replay_refusal",
    "replay_transactional_id",
]

REPLAY_HEADER = "__tickwheel.replay.of"
"""On a replay mark: the offset of the letter it marks, in the mark's own partition."""


class NoLetter(TickwheelError):
    """No dead letter at the coordinates asked for (or one that cannot be replayed)."""


class ReplayRefused(NoLetter):
    """A letter whose record may not be written where its headers say it came from: not an
    input topic a letter of its dead-letter topic comes from, or a partition it has not."""


class ReplayMark(BaseModel):
    """The value of a replay mark: which letter, where its record went, and when."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    letter_partition: int = Field(ge=0)
    letter_offset: int = Field(ge=0)
    topic: str = Field(min_length=1, max_length=249, description="where the record went")
    partition: int = Field(ge=0)
    time: int = Field(description="when it was replayed (epoch ms)")


@dataclass(frozen=True, slots=True)
class Letter:
    """A dead letter where it sits on the dead-letter topic, and its replay if any."""

    partition: int
    offset: int
    timestamp: int
    letter: DeadLetter
    replayed: ReplayMark | None = None


@dataclass(slots=True)
class LetterBook:
    """A dead-letter topic read: its letters in log order, and what was not one."""

    letters: list[Letter] = field(default_factory=list)
    unreadable: int = 0

    def find(self, partition: int, offset: int) -> Letter:
        for letter in self.letters:
            if (letter.partition, letter.offset) == (partition, offset):
                return letter
        raise NoLetter(f"no dead letter at partition {partition}, offset {offset}")


def _is_mark(r: Record) -> bool:
    # A mark carries this header alone. Every letter ends with its own nine or ten headers,
    # so the letter of a record that carried this header is still read as a letter.
    return len(r.headers) == 1 and r.headers[0][0] == REPLAY_HEADER


def _mark_of(r: Record) -> ReplayMark | None:
    """The replay mark `r` is, else None: as a replay writes one, beside its letter and
    after it, its header the letter's offset."""
    if not _is_mark(r) or r.value is None:
        return None
    try:
        mark = ReplayMark.model_validate_json(r.value)
    except ValidationError:
        return None
    if (
        mark.letter_partition != r.partition
        or mark.letter_offset >= r.offset
        or r.headers[0][1] != str(mark.letter_offset).encode()
    ):
        return None
    return mark


async def read_letters(reader: LogReader, topic: str, partitions: Iterable[int]) -> LetterBook:
    """The letters and replay marks of `partitions` of the dead-letter `topic`."""
    book = LetterBook()
    marks: dict[tuple[int, int], ReplayMark] = {}
    for p in partitions:
        async for batch in reader.read(topic, p, 0):
            for r in batch:
                if _is_mark(r):
                    mark = _mark_of(r)
                    if mark is None:
                        book.unreadable += 1
                    else:  # the first replay of a letter is the one that counts
                        marks.setdefault((mark.letter_partition, mark.letter_offset), mark)
                    continue
                try:
                    letter = DeadLetter.read(r.key, r.value, r.headers)
                except BadRecord:
                    book.unreadable += 1
                    continue
                book.letters.append(Letter(r.partition, r.offset, r.timestamp, letter))
    book.letters = [
        Letter(x.partition, x.offset, x.timestamp, x.letter, marks.get((x.partition, x.offset)))
        for x in book.letters
    ]
    return book


async def recent_letters(reader: LogReader, topic: str, limit: int) -> LetterBook:
    """The letters among the last `limit` records of the dead-letter `topic` (one
    partition), newest first, with the replays marked among them: a bounded read for the
    operator page, however long the topic."""
    begin, end = await reader.offsets(topic, 0)
    book = LetterBook()
    marks: dict[int, ReplayMark] = {}
    async for batch in reader.read(topic, 0, max(begin, end - limit)):
        for r in batch:
            if _is_mark(r):
                if (mark := _mark_of(r)) is not None:
                    marks.setdefault(mark.letter_offset, mark)
                continue
            try:
                book.letters.append(
                    Letter(
                        r.partition,
                        r.offset,
                        r.timestamp,
                        DeadLetter.read(r.key, r.value, r.headers),
                    )
                )
            except BadRecord:
                book.unreadable += 1
    book.letters = [
        Letter(x.partition, x.offset, x.timestamp, x.letter, marks.get(x.offset))
        for x in reversed(book.letters)
    ]
    return book


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
        book = await read_letters(reader, topic, [partition])
        found = book.find(partition, offset)
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


def _bytes(data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {"text": None, "base64": None}
    try:
        text: str | None = data.decode()
    except UnicodeDecodeError:
        text = None
    return {"text": text, "base64": base64.b64encode(data).decode()}


def letter_json(x: Letter, *, whole: bool = False) -> dict[str, Any]:
    """A letter as `dead-letters list|show --json` print it (`whole`: with its bytes)."""
    data: dict[str, Any] = {
        "partition": x.partition,
        "offset": x.offset,
        "timestamp": x.timestamp,
        "error": x.letter.context.model_dump(mode="json"),
        "replayed": None if x.replayed is None else x.replayed.model_dump(mode="json"),
    }
    if whole:
        data["key"] = _bytes(x.letter.key)
        data["value"] = _bytes(x.letter.value)
        data["headers"] = [[k, _bytes(v)] for k, v in x.letter.headers]
    return data


_WHY = "no node of this context has written a dead letter to this cluster"


async def list_letters(clients: Clients, context: str) -> tuple[str, LetterBook]:
    """The dead-letter topic of `context` and what it holds. Creates nothing: `MissingTopic`
    when the topic is not there."""
    topic = ContextTopics(context).dead_letters
    have = await require_topic(clients.admin(), topic, _WHY)
    async with clients.reader() as reader:
        return topic, await read_letters(reader, topic, range(have))


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
