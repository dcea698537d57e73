"""Dead letters read back and replayed (`app.ops.letters`) on the in-memory log: the
original bytes and headers go back to their topic and partition once, with a mark on the
dead-letter topic; a second replay, or one racing it, writes nothing more; a cut letter,
a missing one and a gone topic are refused with nothing written. And the CLI's output."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

import app.cli.dead_letters
from app.cli import cli
from app.errors import Fenced, MissingTopic
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.kafka.records import Record
from app.ops.letters import (
    REPLAY_HEADER,
    LetterBook,
    NoLetter,
    Replayed,
    list_letters,
    read_letters,
    replay,
    replay_letter,
    replay_transactional_id,
)
from app.protocol.dead_letters import HEADER_PREFIX, DeadLetter, Stage, dead_letter

DLT = "shop.dead-letters"
EVENTS = "shop.order.events"
T = 1_800_000_000_000
HEADERS = (("traceparent", b"00-abc-01"), ("empty", None), ("traceparent", b"second"))


def bad_record(offset: int = 7, value: bytes = b'{"id": 1, "broken": \xff}') -> Record:
    return Record(EVENTS, 2, offset, b"o-42", value, T - 5, HEADERS)


def new_log() -> MemoryLog:
    return MemoryLog([TopicSpec(DLT, 1), TopicSpec(EVENTS, 3)], now=lambda: T)


async def write_letter(log: MemoryLog, record: Record, stage: Stage = Stage.READ, **kw: Any) -> int:
    letter = dead_letter(record, "not JSON", stage, T, **kw)
    return (await log.publisher().send_many([letter]))[0]


async def book(log: MemoryLog) -> LetterBook:
    return await read_letters(log.reader(), DLT, [0])


async def do_replay(log: MemoryLog, offset: int, check: Any = None) -> Replayed:
    writer = log.transactional_writer(replay_transactional_id("g", DLT, 0, offset))
    return await replay_letter(log.reader(), writer, DLT, 0, offset, T + 1, check)


def events(log: MemoryLog) -> list[Record]:
    return [r for p in range(3) for r in log.records(EVENTS, p)]


async def test_a_letter_reads_back_with_its_record_whole() -> None:
    log = new_log()
    at = await write_letter(log, bad_record())
    (x,) = (await book(log)).letters
    assert (x.partition, x.offset, x.replayed) == (0, at, None)
    assert (x.letter.key, x.letter.value, x.letter.headers) == (
        b"o-42",
        bad_record().value,
        HEADERS,
    )
    c = x.letter.context
    assert (c.topic, c.partition, c.offset, c.stage, c.exception_message) == (
        EVENTS,
        2,
        7,
        Stage.READ,
        "not JSON",
    )


async def test_a_replay_writes_the_original_bytes_back_once_and_marks_the_letter() -> None:
    log = new_log()
    at = await write_letter(log, bad_record())
    first = await do_replay(log, at)
    assert first.written == 0 and first.mark.topic == EVENTS and first.mark.partition == 2
    (back,) = events(log)
    assert (back.partition, back.key, back.value, back.headers) == (
        2,
        b"o-42",
        bad_record().value,
        HEADERS,
    )
    assert not any(k.startswith(HEADER_PREFIX) for k, _ in back.headers)
    (x,) = (await book(log)).letters
    assert x.replayed == first.mark and x.replayed.time == T + 1
    marks = [r for r in log.records(DLT, 0) if any(k == REPLAY_HEADER for k, _ in r.headers)]
    assert len(marks) == 1 and dict(marks[0].headers)[REPLAY_HEADER] == str(at).encode()

    again = await do_replay(log, at)
    assert again.written is None and again.mark == first.mark
    assert len(events(log)) == 1
    assert len(log.records(DLT, 0)) == 2  # the letter and its one mark


async def test_two_replays_racing_write_the_record_once() -> None:
    """The second replay of a letter starts while the first is committing: it fences the
    first (whose transaction is aborted) and writes the record itself, once."""
    log = new_log()
    at = await write_letter(log, bad_record())
    raced: list[Replayed] = []

    async def second(transactional_id: str) -> None:
        log.before_commit = None
        raced.append(await do_replay(log, at))

    log.before_commit = second
    with pytest.raises(Fenced):
        await do_replay(log, at)
    assert raced[0].written is not None
    assert len(events(log)) == 1
    (x,) = (await book(log)).letters
    assert x.replayed is not None
    assert (await do_replay(log, at)).written is None and len(events(log)) == 1


async def test_letters_replay_each_on_their_own() -> None:
    log = new_log()
    a = await write_letter(log, bad_record(7, b"a"))
    b = await write_letter(log, bad_record(8, b"b"))
    await do_replay(log, b)
    letters = (await book(log)).letters
    assert [(x.offset, x.replayed is not None) for x in letters] == [(a, False), (b, True)]
    await do_replay(log, a)
    assert sorted(r.value or b"" for r in events(log)) == [b"a", b"b"]


async def test_a_cut_letter_is_not_replayed() -> None:
    log = new_log()
    at = await write_letter(log, bad_record(value=b"x" * 5000), limit=2048)
    (x,) = (await book(log)).letters
    assert x.letter.context.truncated is not None
    with pytest.raises(NoLetter, match="was cut to fit its topic"):
        await do_replay(log, at)
    assert events(log) == [] and len(log.records(DLT, 0)) == 1


async def test_no_letter_there_and_a_gone_topic_write_nothing() -> None:
    log = new_log()
    await log.publisher().send_many([(DLT, 0, b"k", b"not a letter")])
    at = await write_letter(log, bad_record())
    got = await book(log)
    assert got.unreadable == 1 and len(got.letters) == 1
    with pytest.raises(NoLetter, match="no dead letter at partition 0, offset 0"):
        await do_replay(log, 0)
    with pytest.raises(NoLetter, match="offset 99"):
        await do_replay(log, 99)

    async def gone(topic: str) -> None:
        raise MissingTopic(f"topic {topic} does not exist")

    with pytest.raises(MissingTopic, match=EVENTS):
        await do_replay(log, at, gone)
    assert events(log) == [] and len(log.records(DLT, 0)) == 2


async def test_a_letter_of_every_stage_reads_back() -> None:
    log = new_log()
    for i, stage in enumerate(Stage):
        await write_letter(log, bad_record(i), stage)
    assert [x.letter.context.stage for x in (await book(log)).letters] == list(Stage)


# --- on the cluster's clients (`Clients`): the tools the CLI runs ---------------------------


async def test_the_context_letters_are_listed_and_replayed_through_the_ports() -> None:
    log = new_log()
    at = await write_letter(log, bad_record())
    topic, listed = await list_letters(log, "shop")
    assert topic == DLT and [x.offset for x in listed.letters] == [at]
    done = await replay(log, "g", "shop", 0, at, T + 1)
    assert done.written == 0 and [r.value for r in events(log)] == [bad_record().value]
    assert (await replay(log, "g", "shop", 0, at, T + 2)).written is None
    assert len(events(log)) == 1
    with pytest.raises(NoLetter, match="has no partition 1"):
        await replay(log, "g", "shop", 1, at, T + 3)


async def test_a_missing_topic_is_named_and_none_is_created() -> None:
    log = MemoryLog([TopicSpec(DLT, 1)], now=lambda: T)
    missing = re.escape(f"topic other.dead-letters does not exist at {log.admin().where()}")
    with pytest.raises(MissingTopic, match=missing):
        await list_letters(log, "other")
    at = await write_letter(log, bad_record())
    with pytest.raises(MissingTopic, match=re.escape(f"topic {EVENTS} does not exist")):
        await replay(log, "g", "shop", 0, at, T + 1)
    assert log.topic_names() == {DLT}
    assert len(log.records(DLT, 0)) == 1  # no mark: nothing was replayed


# --- the command's output, on a memory log standing for the cluster -------------------------


@pytest.fixture
def letters(monkeypatch: pytest.MonkeyPatch) -> MemoryLog:
    """The CLI's reads and replays run on a memory log holding two letters."""
    log = new_log()
    asyncio.run(write_letter(log, bad_record(7, b"\xff\xfe")))
    asyncio.run(write_letter(log, bad_record(8, b'{"ok": 1}'), Stage.APPLY))
    monkeypatch.setattr(app.cli.dead_letters, "clients_for", lambda settings: log)
    return log


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["dead-letters", *args, "--context", "shop"])


def test_the_commands_list_show_and_replay(letters: MemoryLog) -> None:
    listed = invoke("list")
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["0:0", "0:1"]
    assert lines[1].split("\t")[2:] == [
        "apply",
        f"{EVENTS}[2]@8",
        "BadRecord: not JSON",
        "-",
    ]
    assert listed.stderr == f"2 dead letter(s) in {DLT}\n"
    assert invoke("list", "--stage", "APPLY").stdout.count("\n") == 1

    shown = invoke("show", "--offset", "0", "--json")
    data = orjson.loads(shown.stdout)
    assert data["value"] == {"text": None, "base64": "//4="}
    assert data["key"] == {"text": "o-42", "base64": "by00Mg=="}
    assert data["headers"][0] == ["traceparent", {"text": "00-abc-01", "base64": "MDAtYWJjLTAx"}]
    assert data["headers"][1] == ["empty", {"text": None, "base64": None}]
    text = invoke("show", "--offset", "1").stdout
    assert '  value: {"ok": 1}' in text and "  stage: apply" in text

    done = invoke("replay", "--offset", "1")
    assert done.exit_code == 0, done.output
    assert done.stdout == f"0:1 replayed to {EVENTS}[2]@0\n"
    twice = invoke("replay", "--offset", "1")
    assert twice.exit_code == 0 and "was replayed before" in twice.stdout
    assert "nothing written" in twice.stdout
    assert invoke("list").stdout.splitlines()[1].endswith(f"to {EVENTS}[2]")
    as_json = orjson.loads(invoke("replay", "--offset", "1", "--json").stdout)
    assert as_json["written"] is None and as_json["replayed"]["letter_offset"] == 1
    assert len(events(letters)) == 1


def test_no_such_letter_exits_1_and_a_bad_context_2(letters: MemoryLog) -> None:
    missing = invoke("show", "--offset", "5")
    assert missing.exit_code == 1
    assert missing.stderr == "error: no dead letter at partition 0, offset 5\n"
    bad = CliRunner().invoke(cli, ["dead-letters", "list", "--context", "sh op"])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: context 'sh op'")


def test_a_letter_read_back_keeps_its_headers_in_order() -> None:
    letter = dead_letter(bad_record(), "x", Stage.READ, T)
    back = DeadLetter.read(letter[2], letter[3], letter[4])
    assert back.headers == HEADERS


def test_what_another_writer_put_in_a_letter_reaches_no_terminal_as_control_characters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record's value and header, and the error text, holding an escape sequence (here
    one that retitles the terminal) are shown with it written out; a letter whose time is
    past what a date holds is listed (it ended the listing with "year ... is out of
    range")."""
    log = new_log()
    evil = "\x1b]0;owned\x07"
    record = Record(
        EVENTS, 2, 7, b"o-42", f'{{"x": "{evil}"}}'.encode(), T, (("h", evil.encode()),)
    )
    letter = dead_letter(record, f"bad {evil}", Stage.READ, 2**62)
    asyncio.run(log.publisher().send_many([letter]))
    monkeypatch.setattr(app.cli.dead_letters, "clients_for", lambda settings: log)
    listed = invoke("list")
    assert listed.exit_code == 0, listed.output
    assert "after 9999-12-31" in listed.stdout and "\x1b" not in listed.stdout
    assert "bad \\x1b]0;owned\\x07" in listed.stdout
    shown = invoke("show", "--offset", "0")
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    assert "  header h: \\x1b]0;owned\\x07" in shown.stdout
    assert '  value: {"x": "\\x1b]0;owned\\x07"}' in shown.stdout
