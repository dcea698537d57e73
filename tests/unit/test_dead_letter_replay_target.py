"""Where a replay may write (`app.ops.letters.replay_refusal`): a letter's topic and
partition are only its headers, which anyone who may write to the dead-letter topic may
forge. A replay writes only to an input topic of the same context that a node reads and
dead-letters (an aggregate type's events, commands or timer-ops topic), with a stage its
records are refused at, in a partition the topic has. A forged letter naming the timer
changelog (a Timer row that the next restore would load), another context's topic, the
results, ledger or nodes topic, or a partition the topic has not, is refused and nothing
is written, not even the replay mark; a genuine letter of each input topic still replays."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from typer.testing import CliRunner

import app.cli.dead_letters
from app.cli import cli
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.kafka.records import Record
from app.ops.letters import (
    NoLetter,
    ReplayRefused,
    replay,
    replay_letter,
    replay_refusal,
    replay_transactional_id,
)
from app.protocol.dead_letters import DeadLetterContext, LetterRecord, Stage, dead_letter
from tables import AggregateRef, CommandSpec, OnceRule, Timer
from tables.keys import row_key

T = 1_800_000_000_000
DLT = "shop.dead-letters"
EVENTS = "shop.order.events"
COMMANDS = "shop.order.commands"
TIMER_OPS = "shop.order.timer-ops"
CHANGELOG = "shop.order.timers"
OTHER_EVENTS = "bank.account.events"
OTHER_COMMANDS = "bank.account.commands"
OUTPUTS = ["shop.results", "shop.failure-ledger", "shop.nodes", DLT]


def new_log() -> MemoryLog:
    """Every topic a forged letter names is there, so that only the replay's rule refuses."""
    specs = [TopicSpec(DLT, 1), TopicSpec(CHANGELOG, 3, compacted=True)]
    specs += [TopicSpec(t, 3) for t in (EVENTS, COMMANDS, TIMER_OPS, OTHER_EVENTS)]
    specs += [TopicSpec(OTHER_COMMANDS, 3)]
    specs += [TopicSpec(t, 1) for t in OUTPUTS if t != DLT]
    return MemoryLog(specs, now=lambda: T)


def timer_row() -> tuple[bytes, bytes]:
    """A Timer row as the changelog holds one: a forger's refund of another's order."""
    owner = AggregateRef(context="shop", aggregate="order", id="o-1")
    victim = AggregateRef(context="shop", aggregate="order", id="o-2")
    timer = Timer(
        id="forged",
        owner=owner,
        key="k",
        version=1,
        partition=0,
        rule=OnceRule(at=T),
        target=victim,
        command=CommandSpec(type="Refund", body={"all": True}),
        slot=0,
        slot_due_at=T,
        due_at=T,
    )
    return row_key(owner, "k"), timer.model_dump_json().encode()


def forged(topic: str, partition: int = 0, stage: Stage = Stage.READ) -> LetterRecord:
    """A letter whose headers name `topic[partition]`, written to shop's dead-letter topic
    (as another writer may write any record there)."""
    key, value = timer_row()
    record = Record(topic, partition, 5, key, value, T - 5, (("h", b"v"),))
    _, p, k, v, headers = dead_letter(record, "anything", stage, T)
    return (DLT, p, k, v, headers)


async def send(log: MemoryLog, letter: LetterRecord) -> int:
    return (await log.publisher().send_many([letter]))[0]


async def do_replay(log: MemoryLog, offset: int) -> Any:
    writer = log.transactional_writer(replay_transactional_id("g", DLT, 0, offset))
    return await replay_letter(log.reader(), writer, DLT, 0, offset, T + 1)


def written(log: MemoryLog, topic: str) -> list[Record]:
    partitions = 1 if topic in OUTPUTS else 3
    return [r for p in range(partitions) for r in log.records(topic, p)]


def nothing_written(log: MemoryLog, letters: int = 1) -> bool:
    """No record anywhere but the letters on the dead-letter topic (and no replay mark)."""
    others = [EVENTS, COMMANDS, TIMER_OPS, CHANGELOG, OTHER_EVENTS, OTHER_COMMANDS]
    others += [t for t in OUTPUTS if t != DLT]
    return all(written(log, t) == [] for t in others) and len(log.records(DLT, 0)) == letters


@pytest.mark.parametrize("stage", [Stage.RESTORE, Stage.READ, Stage.APPLY])
async def test_a_letter_naming_the_timer_changelog_is_refused(stage: Stage) -> None:
    """The review's repro: a Timer row replayed into `shop.order.timers` would be loaded as
    a real timer by the next restore. Not even a restore's own letter goes back there."""
    log = new_log()
    at = await send(log, forged(CHANGELOG, 0, stage))
    with pytest.raises(ReplayRefused, match=rf"{CHANGELOG} is a timer changelog.*never useful"):
        await replay(log, "g", "shop", 0, at, T + 1)
    with pytest.raises(ReplayRefused, match="nothing was written"):
        await do_replay(log, at)
    assert nothing_written(log)


@pytest.mark.parametrize("topic", [OTHER_EVENTS, OTHER_COMMANDS])
async def test_a_letter_naming_another_contexts_topic_is_refused(topic: str) -> None:
    log = new_log()
    at = await send(log, forged(topic))
    with pytest.raises(ReplayRefused, match=rf"'{topic}' is not a topic of the context whose"):
        await replay(log, "g", "shop", 0, at, T + 1)
    assert nothing_written(log)


@pytest.mark.parametrize("topic", OUTPUTS)
async def test_a_letter_naming_a_topic_no_node_reads_is_refused(topic: str) -> None:
    log = new_log()
    at = await send(log, forged(topic))
    with pytest.raises(ReplayRefused, match=rf"'{topic}' is not a topic a node reads records"):
        await replay(log, "g", "shop", 0, at, T + 1)
    assert nothing_written(log)


async def test_a_letter_naming_a_partition_the_topic_has_not_is_refused() -> None:
    log = new_log()
    at = await send(log, forged(EVENTS, 7))
    with pytest.raises(ReplayRefused, match=rf"topic {EVENTS} has no partition 7 \(3 partition"):
        await replay(log, "g", "shop", 0, at, T + 1)
    assert nothing_written(log)


@pytest.mark.parametrize(
    ("topic", "stage"),
    [
        (EVENTS, Stage.OPERATE),
        (EVENTS, Stage.DECIDE),
        (COMMANDS, Stage.APPLY),
        (TIMER_OPS, Stage.FOLLOW),
        (TIMER_OPS, Stage.RESTORE),
        (COMMANDS, Stage.RESTORE),
    ],
)
async def test_a_letter_of_a_stage_its_topic_is_never_refused_at_is_refused(
    topic: str, stage: Stage
) -> None:
    log = new_log()
    at = await send(log, forged(topic, 1, stage))
    with pytest.raises(ReplayRefused, match=f"no letter of {topic} is refused at stage {stage}"):
        await replay(log, "g", "shop", 0, at, T + 1)
    assert nothing_written(log)


@pytest.mark.parametrize(
    ("topic", "stage"),
    [
        (EVENTS, Stage.READ),
        (EVENTS, Stage.FOLLOW),
        (EVENTS, Stage.APPLY),
        (COMMANDS, Stage.READ),
        (COMMANDS, Stage.DECIDE),
        (TIMER_OPS, Stage.READ),
    ],
)
async def test_a_genuine_letter_of_each_input_topic_still_replays(topic: str, stage: Stage) -> None:
    log = new_log()
    key, value = timer_row()
    record = Record(topic, 2, 5, key, value, T - 5, (("h", b"v"),))
    at = await send(log, dead_letter(record, "bad", stage, T))
    done = await replay(log, "g", "shop", 0, at, T + 1)
    assert done.written == 0 and (done.mark.topic, done.mark.partition) == (topic, 2)
    (back,) = log.records(topic, 2)
    assert (back.key, back.value, back.headers) == (key, value, (("h", b"v"),))
    assert len(log.records(DLT, 0)) == 2  # the letter and its mark


async def test_a_timer_op_that_failed_as_it_was_carried_out_is_not_replayed() -> None:
    """Its request id was used: the owner answered the replayed copy DUPLICATE and did
    nothing (found by a hunt), while the replay said it was written."""
    log = new_log()
    key, value = timer_row()
    record = Record(TIMER_OPS, 2, 5, key, value, T - 5, ())
    at = await send(log, dead_letter(record, "store failed", Stage.OPERATE, T))
    with pytest.raises(ReplayRefused, match="send it again under a new request id"):
        await replay(log, "g", "shop", 0, at, T + 1)
    assert nothing_written(log)


def context(topic: str, stage: Stage = Stage.READ) -> DeadLetterContext:
    return DeadLetterContext(
        topic=topic,
        partition=0,
        offset=0,
        timestamp=T,
        stage=stage,
        exception_class="BadRecord",
        exception_message="x",
        node="n:1",
        time=T,
    )


@pytest.mark.parametrize(
    "topic",
    [
        "shop",
        "shop.order",
        "shop.order.events.x",
        "shop..events",
        "shop.or der.events",
        "shop.order.Events",
        "shopx.order.events",
        "shop.dead-letters.events.x",
        "\x1b]0;x",
    ],
)
def test_a_name_that_is_no_input_topic_of_the_context_is_refused(topic: str) -> None:
    why = replay_refusal(DLT, context(topic))
    assert why is not None and "\x1b" not in why


def test_the_refusal_is_a_no_letter_the_command_line_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`tickwheel dead-letters replay` ends with exit code 1 and the reason, writing
    nothing; the letter is still listed, not replayed."""
    log = new_log()
    asyncio.run(send(log, forged(CHANGELOG)))
    monkeypatch.setattr(app.cli.dead_letters, "clients_for", lambda settings: log)
    done = CliRunner().invoke(cli, ["dead-letters", "replay", "--context", "shop", "--offset", "0"])
    assert done.exit_code == 1, done.output
    assert done.stderr.startswith("error: the dead letter at partition 0, offset 0 is not replayed")
    assert f"{CHANGELOG} is a timer changelog" in done.stderr
    assert nothing_written(log)
    listed = CliRunner().invoke(cli, ["dead-letters", "list", "--context", "shop"])
    assert listed.stdout.rstrip("\n").endswith("\t-")
    assert issubclass(ReplayRefused, NoLetter)
