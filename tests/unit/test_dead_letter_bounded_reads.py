"""Dead-letter reads are bounded however long the topic (`app.ops.letters`): a listing
reads the newest letters back from the topic's end (and says when older ones were left
unread), a replay or a `show` reads from its letter on, and the page and the listing hold
the letters' errors, not their records' bytes. A topic another writer filled with
thousands of records costs each of them what it shows, not the whole topic."""

from __future__ import annotations

import asyncio
import tracemalloc
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

import app.cli.dead_letters
import app.ops.letter_reads
from app.cli import cli
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog, MemoryReader
from app.kafka.records import Record
from app.ops.letters import (
    LIST_LIMIT,
    REPLAY_HEADER,
    find_letter,
    read_letters,
    recent_letters,
    replay,
    show_letter,
)
from app.protocol.dead_letters import LetterRecord, Stage, dead_letter

DLT = "shop.dead-letters"
EVENTS = "shop.order.events"
COMMANDS = "shop.order.commands"
T = 1_800_000_000_000


class CountingLog(MemoryLog):
    """A memory log whose readers hand out small batches and count the records they
    hand out: what a read costs."""

    handed = 0

    def reader(self, *, read_committed: bool = True, batch: int = 5_000) -> MemoryReader:
        return MemoryReader(self, read_committed=read_committed, batch=16)

    def visible(
        self,
        topic: str,
        partition: int,
        position: int,
        end: int,
        committed: bool,
        limit: int | None,
    ) -> tuple[list[Record], int]:
        got, position = super().visible(topic, partition, position, end, committed, limit)
        if limit is not None:  # a reader's, not the test's own look (`records`)
            self.handed += len(got)
        return got, position


def new_log() -> CountingLog:
    return CountingLog(
        [TopicSpec(DLT, 1), TopicSpec(EVENTS, 3), TopicSpec(COMMANDS, 3)], now=lambda: T
    )


def letter(n: int, topic: str = EVENTS, value: bytes | None = None) -> LetterRecord:
    bad = Record(topic, 2, n, b"o-42", value or f"bad {n}".encode(), T - 5, ())
    return dead_letter(bad, f"not JSON {n}", Stage.READ, T + n)


async def fill(log: MemoryLog, records: list[Any]) -> None:
    for i in range(0, len(records), 500):
        await log.publisher().send_many(records[i : i + 500])


def mark(letter_offset: int, time: int) -> tuple[str, int, bytes, bytes, Any]:
    value = {
        "letter_partition": 0,
        "letter_offset": letter_offset,
        "topic": COMMANDS,
        "partition": 2,
        "time": time,
    }
    headers = ((REPLAY_HEADER, str(letter_offset).encode()),)
    return (DLT, 0, b"m", orjson.dumps(value), headers)


async def test_a_listing_reads_the_newest_letters_from_the_end_not_the_whole_topic() -> None:
    log = new_log()
    await fill(log, [letter(n) for n in range(3_000)])
    log.handed = 0
    book = await read_letters(log.reader(), DLT, [0], 10)
    assert [x.offset for x in book.letters] == list(range(2_990, 3_000))  # log order
    # The first window, 64 records back from the end, held them: 54 read and left out,
    # and the 2,936 records before it not read.
    assert book.older == 3_000 - 10
    assert log.handed <= 64 + 16, log.handed  # that window (and one batch past it)


async def test_a_listing_holds_the_errors_not_the_records_bytes() -> None:
    log = new_log()
    await fill(log, [letter(n, value=b"x" * 100_000) for n in range(3)])
    book = await read_letters(log.reader(), DLT, [0], whole=False)
    assert [x.letter.context.exception_message for x in book.letters] == [
        f"not JSON {n}" for n in range(3)
    ]
    assert all(x.letter.value is None and x.letter.key is None for x in book.letters)
    page = await recent_letters(log.reader(), DLT, 20)
    assert [x.offset for x in page.letters] == [2, 1, 0]
    assert all(x.letter.value is None for x in page.letters)


async def test_a_filter_reads_further_back_in_widening_windows_and_finds_marks_after() -> None:
    """The one letter of the commands topic is at the start, behind 1,000 others, and it
    was marked replayed twice (forged or not, the first mark counts): the listing reads
    back until it finds it, and takes its first mark, read in an earlier window."""
    log = new_log()
    await fill(log, [letter(0, COMMANDS)])
    await fill(log, [mark(0, 111)])
    await fill(log, [letter(n) for n in range(1, 1_000)])
    await fill(log, [mark(0, 222)])

    def commands(c: Any) -> bool:
        return bool(c.topic == COMMANDS)

    book = await read_letters(log.reader(), DLT, [0], 5, want=commands)
    assert [x.offset for x in book.letters] == [0]
    replayed = book.letters[0].replayed
    assert replayed is not None and replayed.time == 111
    assert book.older == 0  # read back to the start: nothing older left


async def test_a_listing_reads_at_most_so_many_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic another writer filled with records that are no letters: the listing stops
    after `SCAN_RECORDS` of them and says how many older ones it did not read."""
    monkeypatch.setattr(app.ops.letter_reads, "SCAN_RECORDS", 500)
    log = new_log()
    await fill(log, [letter(0)])
    await fill(log, [(DLT, 0, b"x", b"no letter", ()) for _ in range(2_000)])
    log.handed = 0
    book = await read_letters(log.reader(), DLT, [0])
    assert book.letters == [] and book.unreadable == 500
    assert book.older == 2_001 - 500
    assert log.handed <= 500 + 16, log.handed


async def test_a_replay_and_a_show_read_from_their_letter_on() -> None:
    log = new_log()
    await fill(log, [letter(n) for n in range(2_000)])
    log.handed = 0
    shown = await show_letter(log, "shop", 0, 1_990)
    assert shown.letter.value == b"bad 1990" and shown.replayed is None
    assert log.handed <= 16, log.handed
    log.handed = 0
    done = await replay(log, "g", "shop", 0, 1_990, T + 1)
    assert done.written is not None
    assert log.handed <= 16, log.handed
    found = await find_letter(log.reader(), DLT, 0, 1_990)
    assert found.replayed == done.mark  # its mark, read after it
    assert (await replay(log, "g", "shop", 0, 1_990, T + 2)).written is None


async def test_no_letter_where_a_mark_or_nothing_sits() -> None:
    log = new_log()
    at = (await log.publisher().send_many([letter(0)]))[0]
    await replay(log, "g", "shop", 0, at, T + 1)
    for offset in (at + 1, at + 2, 99):  # the mark, the transaction's marker, the end
        with pytest.raises(app.ops.letter_reads.NoLetter, match=f"offset {offset}$"):
            await find_letter(log.reader(), DLT, 0, offset)


# --- the command ----------------------------------------------------------------------------


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["dead-letters", *args, "--context", "shop"])


def test_the_list_command_shows_the_newest_and_says_older_ones_were_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = new_log()
    asyncio.run(fill(log, [letter(n) for n in range(LIST_LIMIT + 150)]))
    monkeypatch.setattr(app.cli.dead_letters, "clients_for", lambda settings: log)

    listed = invoke("list")
    assert listed.exit_code == 0, listed.output
    offsets = [int(line.split("\t")[0].split(":")[1]) for line in listed.stdout.splitlines()]
    assert offsets == list(range(150, LIST_LIMIT + 150))
    assert listed.stderr == (
        f"{LIST_LIMIT} dead letter(s) in {DLT}; 150 older record(s) not listed (--limit, up "
        "to 10000, lists more)\n"
    )
    three = invoke("list", "--limit", "3", "--json")
    assert [orjson.loads(line)["offset"] for line in three.stdout.splitlines()] == [
        LIST_LIMIT + 147,
        LIST_LIMIT + 148,
        LIST_LIMIT + 149,
    ]
    whole = invoke("list", "--limit", "1000")
    assert whole.stdout.count("\n") == LIST_LIMIT + 150
    assert whole.stderr == f"{LIST_LIMIT + 150} dead letter(s) in {DLT}\n"
    assert invoke("list", "--limit", "10001").exit_code == 2
    assert invoke("list", "--limit", "0").exit_code == 2


class GrowingReader:
    """A dead-letter partition with a letter at offset 0 and `size` records after it, none
    a mark, to which another writer appends as fast as it is read (each batch read, one
    more): read to its end as the end moves, the read would not stop. Each record's value
    is `record_bytes` made as it is handed out, so a read that kept them would hold them."""

    batch = 16

    def __init__(self, letter: Record, size: int, record_bytes: int, most: int) -> None:
        self.letter = letter
        self.end = 1 + size
        self.record_bytes = record_bytes
        self.most = most  # an end to a wrong read, so that it fails rather than hangs
        self.handed = 0

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, self.end

    async def read(self, topic: str, partition: int, start: int) -> Any:
        assert start == 0
        yield [self.letter]
        offset = 1
        while offset < self.most:
            batch = [
                Record(topic, partition, o, b"x", bytes(self.record_bytes), T, ())
                for o in range(offset, offset + self.batch)
            ]
            self.handed += len(batch)
            offset += self.batch
            self.end += self.batch
            yield batch


async def test_finding_a_letter_never_replayed_reads_to_the_end_taken_at_its_start() -> None:
    """Its replay mark may be anywhere after it (a replay days later): for a letter never
    replayed the read goes on to the partition's end, but to the end taken when the read
    started (records written since are not read), and it holds the letter alone, not the
    records read past it: its time grows with the records after the letter, its memory
    does not. (`dead-letters show` and `dead-letters replay` find their letter so.)"""
    log = new_log()
    await fill(log, [letter(0)])
    (written,) = [r async for batch in log.reader().read(DLT, 0, 0) for r in batch]
    size, record_bytes = 2_000, 64 * 1024  # 125 MiB of records, were they held
    reader = GrowingReader(written, size, record_bytes, most=20 * size)
    tracemalloc.start()
    try:
        found = await find_letter(reader, DLT, 0, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found.offset == 0 and found.replayed is None
    assert found.letter.value == b"bad 0"
    # The records up to that end, and at most the batch that passed it.
    assert size <= reader.handed <= size + GrowingReader.batch, reader.handed
    # About a batch of records at a time (16 of 64 KiB), not the 125 MiB read.
    assert peak < 8 * 1024 * 1024, peak
