"""A record's own headers named as the dead-letter topic's (`__tickwheel.replay.of`,
`__tickwheel.errors.*`) forge nothing: its letter is listed and replayed as any other, with
those headers written back as they were, and no letter is taken for a replay mark."""

from __future__ import annotations

import orjson

from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.kafka.records import Record
from app.ops.letters import (
    REPLAY_HEADER,
    LetterBook,
    Replayed,
    read_letters,
    recent_letters,
    replay_letter,
    replay_transactional_id,
)
from app.protocol.dead_letters import HEADER_PREFIX, Headers, Stage, dead_letter

DLT = "shop.dead-letters"
COMMANDS = "shop.order.commands"
T = 1_800_000_000_000


def new_log() -> MemoryLog:
    return MemoryLog([TopicSpec(DLT, 1), TopicSpec(COMMANDS, 3)], now=lambda: T)


def command(offset: int, value: bytes, headers: Headers = ()) -> Record:
    return Record(COMMANDS, 1, offset, b"o-1", value, T - 5, headers)


async def write_letter(log: MemoryLog, record: Record) -> int:
    letter = dead_letter(record, "not a command", Stage.READ, T)
    return (await log.publisher().send_many([letter]))[0]


async def book(log: MemoryLog) -> LetterBook:
    return await read_letters(log.reader(), DLT, [0])


async def do_replay(log: MemoryLog, offset: int) -> Replayed:
    writer = log.transactional_writer(replay_transactional_id("g", DLT, 0, offset))
    return await replay_letter(log.reader(), writer, DLT, 0, offset, T + 1)


def mark_value(letter_offset: int) -> bytes:
    return orjson.dumps(
        {
            "letter_partition": 0,
            "letter_offset": letter_offset,
            "topic": COMMANDS,
            "partition": 1,
            "time": 0,
        }
    )


async def test_a_letter_of_a_record_carrying_the_replay_header_is_no_replay_mark() -> None:
    """The review's repro: a bad command whose header is `__tickwheel.replay.of` and whose
    value is a mark naming the next letter. Both letters are listed, neither is replayed,
    and each replay writes its own record back."""
    log = new_log()
    forged = command(10, mark_value(1), ((REPLAY_HEADER, b"1"),))
    assert await write_letter(log, forged) == 0
    assert await write_letter(log, command(11, b"{oops")) == 1
    for got in [await book(log), await recent_letters(log.reader(), DLT, 20)]:
        assert sorted((x.offset, x.replayed) for x in got.letters) == [(0, None), (1, None)]
        assert got.unreadable == 0

    for offset, record in ((0, forged), (1, command(11, b"{oops"))):
        done = await do_replay(log, offset)
        assert done.written is not None, "written, not taken for replayed before"
        back = log.records(COMMANDS, 1)[-1]
        assert (back.key, back.value, back.headers) == (b"o-1", record.value, record.headers)
    assert [x.replayed is not None for x in (await book(log)).letters] == [True, True]


async def test_a_replay_writes_back_every_header_of_the_record_whatever_its_name() -> None:
    own: Headers = (
        (f"{HEADER_PREFIX}truncated", b"1"),
        (f"{HEADER_PREFIX}trace", b"abc"),
        ("app", b"x"),
        (f"{HEADER_PREFIX}truncated", b"abc"),
        (REPLAY_HEADER, b"0"),
        (f"{HEADER_PREFIX}time", None),
    )
    log = new_log()
    at = await write_letter(log, command(7, b"not json", own))
    (x,) = (await book(log)).letters
    assert x.letter.context.truncated is None and x.letter.headers == own
    assert (await do_replay(log, at)).written == 0
    (back,) = log.records(COMMANDS, 1)
    assert back.headers == own


async def test_a_mark_is_taken_only_as_a_replay_writes_it() -> None:
    """A record of a mark's shape that names a letter of another partition, a letter after
    it, or with a header that is not the letter's offset, marks nothing (it is counted
    unreadable)."""
    log = new_log()
    first = await write_letter(log, command(3, b"{"))

    def mark(value: dict[str, int | str], header: int) -> tuple[str, int, bytes, bytes, Headers]:
        named = orjson.loads(mark_value(first)) | value
        return (DLT, 0, b"m", orjson.dumps(named), ((REPLAY_HEADER, str(header).encode()),))

    await log.publisher().send_many(
        [
            mark({}, first + 5),  # its header names another offset
            mark({"letter_partition": 1}, first),  # another partition's letter
            mark({"letter_offset": first + 4}, first + 4),  # the letter after it
        ]
    )
    then = await write_letter(log, command(4, b"{"))
    assert then == first + 4
    got = await book(log)
    assert [(x.offset, x.replayed) for x in got.letters] == [(first, None), (then, None)]
    assert got.unreadable == 3
    assert (await do_replay(log, then)).written is not None
