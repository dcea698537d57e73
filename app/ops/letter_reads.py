"""Reading a context's dead letters back, bounded however long their topic: the newest of
them (`read_letters`, read back from each partition's end, `SCAN_RECORDS` at most), the
last few for the operator page (`recent_letters`), or one letter with its replay
(`find_letter`, read from the letter on). Anyone who may write to the dead-letter topic
can fill it with millions of records: a listing or a replay must not then run its process
out of memory. What a replay mark is (`ReplayMark`, `REPLAY_HEADER`): `app.ops.letters`,
which writes them, re-exports all of this. May import `app.kafka`'s ports and records,
`app.errors` and `app.protocol`."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.errors import BadRecord, TickwheelError
from app.kafka.ports import LogReader
from app.kafka.records import Record
from app.protocol.dead_letters import DeadLetter, DeadLetterContext

__all__ = [
    "LIST_LIMIT",
    "MAX_LIST_LIMIT",
    "REPLAY_HEADER",
    "SCAN_RECORDS",
    "Letter",
    "LetterBook",
    "NoLetter",
    "ReplayMark",
    "Want",
    "find_letter",
    "is_mark",
    "mark_of",
    "read_letters",
    "recent_letters",
]

REPLAY_HEADER = "__tickwheel.replay.of"
"""On a replay mark: the offset of the letter it marks, in the mark's own partition."""

Want = Callable[[DeadLetterContext], bool] | None
"""Which letters a listing takes (None: every one)."""


class NoLetter(TickwheelError):
    """No dead letter at the coordinates asked for (or one that cannot be replayed)."""


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


LIST_LIMIT: Final = 100
"""The newest letters `dead-letters list` shows unless told (`--limit`)."""

MAX_LIST_LIMIT: Final = 10_000
"""The most letters a listing holds (their errors only, up to 4,096 characters each)."""

SCAN_RECORDS: Final = 100_000
"""Records a listing reads at most per partition, back from its end: a topic another
writer filled with records that are no letters (or none that a filter takes) costs a
listing this much, not the whole topic."""


@dataclass(slots=True)
class LetterBook:
    """Letters of a dead-letter topic in log order, how many records read were none, and
    how many older than those were left out (`older`: letters read past the limit, and
    offsets not read, which older letters may hold)."""

    letters: list[Letter] = field(default_factory=list)
    unreadable: int = 0
    older: int = 0


def is_mark(r: Record) -> bool:
    # A mark carries this header alone. Every letter ends with its own nine or ten headers,
    # so the letter of a record that carried this header is still read as a letter.
    return len(r.headers) == 1 and r.headers[0][0] == REPLAY_HEADER


def mark_of(r: Record) -> ReplayMark | None:
    """The replay mark `r` is, else None: as a replay writes one, beside its letter and
    after it, its header the letter's offset."""
    if not is_mark(r) or r.value is None:
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


async def _scan(
    reader: LogReader, topic: str, p: int, start: int, stop: int, take: Callable[[Record], bool]
) -> None:
    """Hands `take` the committed records of `topic`[p] from `start` until one at `stop` or
    after, or until `take` says no more (False): no record past what is needed is kept."""
    async with contextlib.aclosing(reader.read(topic, p, start)) as batches:
        async for batch in batches:
            for r in batch:
                if r.offset >= stop or not take(r):
                    return


class _Page:
    """What one read of a partition keeps: up to `room` of the newest letters `want`
    takes (a deque: older ones fall off as newer are read), and the replay marks seen."""

    def __init__(self, room: int, want: Want, whole: bool) -> None:
        self.letters: deque[Letter] = deque(maxlen=max(room, 0))
        self.marks: dict[int, ReplayMark] = {}
        self.unreadable = 0
        self.passed = 0  # letters that fell off: older than the `room` newest
        self._want = want
        self._whole = whole

    def take(self, r: Record) -> bool:
        if is_mark(r):
            mark = mark_of(r)
            if mark is None:
                self.unreadable += 1
            else:  # the first replay of a letter is the one that counts
                self.marks.setdefault(mark.letter_offset, mark)
            return True
        try:
            letter = DeadLetter.read(r.key, r.value, r.headers)
        except BadRecord:
            self.unreadable += 1
            return True
        if self._want is None or self._want(letter.context):
            # A listing shows the errors alone: the record's bytes (up to 4 MiB a letter)
            # are not held for it.
            kept = letter if self._whole else DeadLetter(letter.context, None, None)
            self.passed += len(self.letters) == self.letters.maxlen
            self.letters.append(Letter(r.partition, r.offset, r.timestamp, kept))
        return True


async def _newest(
    reader: LogReader, topic: str, p: int, limit: int, want: Want, whole: bool, book: LetterBook
) -> list[Letter]:
    """The newest `limit` letters of `topic`[p] that `want` takes, in log order, with their
    replays: read back from the end in windows twice as long each time (marks, markers and
    other records take offsets too), `SCAN_RECORDS` at most."""
    begin, end = await reader.offsets(topic, p)
    found: deque[Letter] = deque()
    marks: dict[int, ReplayMark] = {}
    stop, size = end, max(2 * limit, 64)
    while stop > begin and len(found) < limit and end - stop < SCAN_RECORDS:
        start = max(begin, stop - size, end - SCAN_RECORDS)
        page = _Page(limit - len(found), want, whole)
        await _scan(reader, topic, p, start, stop, page.take)
        found.extendleft(reversed(page.letters))
        book.unreadable += page.unreadable
        book.older += page.passed
        # A mark follows its letter, so this window's marks are earlier than those read
        # before: theirs win (the first replay counts). Only the marks of letters kept, or
        # of letters older than the window (not read yet), are held on.
        marks |= page.marks
        kept = {x.offset for x in found}
        marks = {at: m for at, m in marks.items() if at < start or at in kept}
        stop, size = start, size * 2
    book.older += stop - begin
    return [
        Letter(x.partition, x.offset, x.timestamp, x.letter, marks.get(x.offset)) for x in found
    ]


async def read_letters(
    reader: LogReader,
    topic: str,
    partitions: Iterable[int],
    limit: int = LIST_LIMIT,
    *,
    want: Want = None,
    whole: bool = True,
) -> LetterBook:
    """The newest `limit` letters of `partitions` of the dead-letter `topic` that `want`
    takes (all: None), in log order, with their replays; `whole`: with their records'
    key, value and headers, else their errors alone. Bounded however long the topic:
    each partition is read back from its end (`_newest`), and `older` says what was not."""
    book = LetterBook()
    for p in partitions:
        book.letters += await _newest(reader, topic, p, limit, want, whole, book)
    if len(book.letters) > limit:  # several partitions: the newest of them all
        newest = sorted(book.letters, key=lambda x: (x.timestamp, x.partition, x.offset))
        kept = {(x.partition, x.offset) for x in newest[-limit:]}
        book.older += len(book.letters) - limit
        book.letters = [x for x in book.letters if (x.partition, x.offset) in kept]
    return book


async def recent_letters(reader: LogReader, topic: str, limit: int) -> LetterBook:
    """The letters among the last `limit` records of the dead-letter `topic` (one
    partition), newest first, with the replays marked among them, their errors alone: a
    bounded read for the operator page, however long the topic."""
    begin, end = await reader.offsets(topic, 0)
    start = max(begin, end - limit)
    page = _Page(limit, None, whole=False)
    await _scan(reader, topic, 0, start, end, page.take)
    letters = [
        Letter(x.partition, x.offset, x.timestamp, x.letter, page.marks.get(x.offset))
        for x in reversed(page.letters)
    ]
    return LetterBook(letters, page.unreadable, older=start - begin)


async def find_letter(reader: LogReader, topic: str, partition: int, offset: int) -> Letter:
    """The letter at (`partition`, `offset`) of the dead-letter `topic`, whole, with its
    replay if any; `NoLetter` when there is none. Read from the letter on (its marks
    follow it), holding only the letter and its first mark; the read stops there."""
    _, end = await reader.offsets(topic, partition)
    found: list[Letter] = []

    def take(r: Record) -> bool:
        if not found:  # the first record read is the letter, or there is none
            if r.offset != offset or is_mark(r):
                return False
            with contextlib.suppress(BadRecord):
                letter = DeadLetter.read(r.key, r.value, r.headers)
                found.append(Letter(r.partition, r.offset, r.timestamp, letter))
            return bool(found)
        mark = mark_of(r)
        if mark is not None and mark.letter_offset == offset:
            x = found[0]
            found[0] = Letter(x.partition, x.offset, x.timestamp, x.letter, mark)
            return False
        return True

    await _scan(reader, topic, partition, offset, end, take)
    if not found:
        raise NoLetter(f"no dead letter at partition {partition}, offset {offset}")
    return found[0]
