"""A topic of the node's own made beforehand with a smaller `max.message.bytes` than the
records `TICKWHEEL_MAX_RECORD_BYTES` lets through: a decision (or a timer) whose record it
would refuse is refused as too large, answered ERROR and dead-lettered, and its partition
goes on. Before, such a record passed every check, the broker refused the partition's
batch (MESSAGE_SIZE_TOO_LARGE, not retried), and the partition was taken again and failed
again on the same command, every command and timer of it stalled for good.

The memory log accepts any size: here it refuses, in a transaction, what the broker would
(a record whose batch is over its topic's `max.message.bytes`)."""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import MessageSizeTooLargeError
from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel

from app.errors import KafkaUnavailable
from app.kafka import OutRecord, TopicSpec
from app.kafka.memory import MemoryLog
from app.kafka.records import RECORD_FRAMING
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.protocol.dead_letters import DeadLetter
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    IN_PROCESS_HEADER,
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    decode,
    encode,
)
from app.service import Service
from app.timers.runner import RetryPolicy, TimerOptions
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.partitioner import partition_of

P = 2
T = AggregateTopics("big", "thing")
C = ContextTopics("big")
BATCH_HEADER = 61
"""A record batch's header: the broker counts it in what `max.message.bytes` bounds."""


class S(BaseModel):
    n: int = 0


thing = AggregateType("big", "thing", S)


@thing.command("Grow")
def _grow(state: S, cmd: Command, d: Decision) -> None:
    d.emit("Grown", {"blob": "x" * int(cmd.body["size"])})


@thing.applies("Grown")
def _grown(state: S, e: Event) -> S:
    return state.model_copy(update={"n": state.n + 1})


@thing.command("Later")
def _later(state: S, cmd: Command, d: Decision) -> None:
    pad = "y" * int(cmd.body["size"])
    d.schedule("k", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Grow", body={"pad": pad}))


@thing.command("LaterTwice")
def _later_twice(state: S, cmd: Command, d: Decision) -> None:
    for _ in range(2):  # the same timer, set from two code paths of one handler
        _later(state, cmd, d)


@thing.command("Forget")
def _forget(state: S, cmd: Command, d: Decision) -> None:
    d.cancel_schedule("k")


@thing.command("SmallThenBig")
def _small_then_big(state: S, cmd: Command, d: Decision) -> None:
    _later(state, cmd.model_copy(update={"body": {**cmd.body, "size": 10}}), d)
    _later(state, cmd, d)  # the same key, another body: this set replaces the first


SERVICE = Service(aggregates=(thing,))


def refusing(log: MemoryLog, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The broker's `max.message.bytes` check of a transaction's records; the topics of
    those it refused."""
    refused: list[str] = []
    append = log._append

    def checked(records: list[OutRecord], txn: Any) -> list[int]:
        for r in records:
            size = len(r[2] or b"") + len(r[3] or b"") + BATCH_HEADER
            if txn is not None and size > log.max_message_bytes(r[0]):
                refused.append(r[0])
                raise KafkaUnavailable("produce refused") from MessageSizeTooLargeError()
        return append(records, txn)

    monkeypatch.setattr(log, "_append", checked)
    return refused


def owners(n: int, p: int = 0) -> list[str]:
    """`n` aggregate ids of partition p."""
    return [f"o{i}" for i in range(1000) if partition_of(f"o{i}", P) == p][:n]


async def send(log: MemoryLog, owner: str, type_: str, **body: Any) -> str:
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type=type_,
        aggregate=AggregateRef(context="big", aggregate="thing", id=owner),
        body=body,
        issued_at=int(time.time() * 1000),
    )
    await log.publisher().send(T.commands, owner.encode(), encode(cmd), partition_of(owner, P))
    return cmd.request_id


def results(log: MemoryLog) -> dict[str, CommandResult]:
    got = {}
    for p in range(P):
        for r in log.records(C.results, p):
            res = decode(CommandResult, r.value)
            got[res.request_id] = res
    return got


def letters(log: MemoryLog) -> list[DeadLetter]:
    return [DeadLetter.read(r.key, r.value, r.headers) for r in log.records(C.dead_letters, 0)]


def timers(log: MemoryLog, p: int) -> list[Timer]:
    """The rows of p's changelog, each as last written (none deleted)."""
    rows: dict[bytes, bytes | None] = {}
    for r in log.records(T.timers_changelog, p):
        assert r.key is not None
        rows[r.key] = r.value
    return [Timer.model_validate_json(v) for v in rows.values() if v is not None]


def timer_keys(log: MemoryLog, p: int) -> set[tuple[str, str]]:
    """The timers of p's changelog set to fire (not cancelled)."""
    return {(t.owner.id, t.key) for t in timers(log, p) if t.status is TimerStatus.PENDING}


async def answered(log: MemoryLog, *request_ids: str) -> dict[str, CommandResult]:
    await wait_until(lambda: set(request_ids) <= set(results(log)), within=10)
    return {r: results(log)[r] for r in request_ids}


@contextlib.asynccontextmanager
async def small_topic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, topic: str, max_bytes: int
) -> AsyncIterator[tuple[MemoryLog, list[str], RunningNode]]:
    """A node running on a log whose `topic` was made taking `max_bytes` (the broker's
    check of a transaction's records on: `refusing`), on the fake clock at `T0`."""
    log = MemoryLog()
    log.ensure_topics([TopicSpec(topic, P, max_message_bytes=max_bytes)])
    refused = refusing(log, monkeypatch)
    async with running(RunningNode(log, tmp_path, "a", SERVICE, P, clock=FakeClock(T0))) as node:
        yield log, refused, node


async def test_an_event_over_its_topics_limit_is_answered_error_and_the_partition_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A 100 KB event, within the node's 256 KiB bound, to an events topic made at 64 KiB:
    ERROR and a dead letter saying so; the command behind it in the partition applied."""
    async with small_topic(tmp_path, monkeypatch, T.events, 64 * 1024) as (log, refused, node):
        big_owner, small_owner = owners(2)
        big = await send(log, big_owner, "Grow", size=100_000)
        small = await send(log, small_owner, "Grow", size=10)
        got = await answered(log, big, small)
        assert got[big].code == "ERROR" and T.events in (got[big].message or "")
        assert got[small].code == "COMMITTED"
        [letter] = letters(log)
        assert letter.topic == T.commands and letter.context.stage == "decide"
        assert "over 65024 (what the topic takes" in letter.context.exception_message
        assert decode(CommandEnvelope, letter.value).request_id == big
        assert refused == [] and node.node.health().get("failing") in (None, {})
        # Read at the start, and warned about once.
        assert node.node.limits.topic_record_bytes == {T.events: 64 * 1024 - RECORD_FRAMING}
        warned = [r.getMessage() for r in caplog.records if "TICKWHEEL_MAX_RECORD" in r.msg]
        assert len(warned) == 1 and warned[0].startswith(f"{T.events} takes records of 65024")


async def test_a_timer_whose_row_is_over_its_changelogs_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision setting a timer whose changelog row would be over what the changelog
    (made at 16 KiB) takes: ERROR and a dead letter, no timer; the partition goes on."""
    changelog = T.timers_changelog
    async with small_topic(tmp_path, monkeypatch, changelog, 16 * 1024) as (log, refused, _):
        big_owner, small_owner = owners(2)
        at = T0 + 3_600_000
        big = await send(log, big_owner, "Later", size=40_000, at=at)
        small = await send(log, small_owner, "Later", size=10, at=at)
        got = await answered(log, big, small)
        assert got[big].code == "ERROR" and "its row in the timer table's changelog" in (
            got[big].message or ""
        )
        assert got[small].code == "COMMITTED"
        [letter] = letters(log)
        assert letter.topic == T.commands and T.timers_changelog in letter.context.exception_message
        await wait_until(lambda: timer_keys(log, 0) == {(small_owner, "k")})
        assert refused == []


async def test_a_set_in_the_log_whose_row_is_over_its_changelogs_limit_is_dead_lettered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer's `wow.ScheduleSet` in the log, its row over what the changelog
    takes: the subscription dead-letters it, no timer stored, and the partition goes on."""
    changelog = T.timers_changelog
    async with small_topic(tmp_path, monkeypatch, changelog, 16 * 1024) as (log, refused, _):
        writer, other = owners(2)
        at = T0 + 3_600_000
        event = EventEnvelope(
            id="written-elsewhere",
            type="wow.ScheduleSet",
            aggregate=AggregateRef(context="big", aggregate="thing", id=writer),
            version=1,
            created_at=T0,
            body={
                "key": "k",
                "rule": {"kind": "once", "at": at},
                "command": {"type": "Grow", "body": {"pad": "y" * 40_000}},
            },
        )
        await log.publisher().send(T.events, writer.encode(), encode(event), 0)
        await wait_until(lambda: len(letters(log)) == 1)
        [letter] = letters(log)
        assert letter.topic == T.events and letter.context.stage == "apply"
        assert T.timers_changelog in letter.context.exception_message
        behind = await send(log, other, "Later", size=10, at=at)
        assert (await answered(log, behind))[behind].code == "COMMITTED"
        await wait_until(lambda: timer_keys(log, 0) == {(other, "k")})
        assert refused == []


ONCE = TimerOptions(retry=RetryPolicy(max_attempts=1))
"""A failed attempt parks its timer."""


async def test_a_stored_timer_whose_command_its_topic_now_refuses_is_parked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timer stored with a 100 KB in-process command, then its commands topic lowered to
    64 KiB (the nodes restarted): fired, its command is answered ERROR, not written, and the
    timer parked; the partition goes on. Before, its record joined the partition's
    transaction unchecked: refused by the broker at every retake, the partition stalled."""
    log, clock = MemoryLog(), FakeClock(T0)
    refused = refusing(log, monkeypatch)
    big_owner, small_owner = owners(2)
    at = T0 + 60_000
    async with running(RunningNode(log, tmp_path, "a", SERVICE, P, clock=clock, timers=ONCE)):
        rid = await send(log, big_owner, "Later", size=100_000, at=at)
        assert (await answered(log, rid))[rid].code == "COMMITTED"
        await wait_until(lambda: (big_owner, "k") in timer_keys(log, 0))
        # Its own event read back: the set is not taken again under the new limit.
        await wait_until(lambda: (log.committed("g", T.events, 0) or 0) >= 1)
    log._max_bytes[T.commands] = 64 * 1024  # an operator lowers it
    node = RunningNode(log, tmp_path, "b", SERVICE, P, clock=clock, timers=ONCE)
    async with running(node):
        assert node.node.limits.topic_record_bytes == {T.commands: 64 * 1024 - RECORD_FRAMING}
        clock.set(at)
        parked = [TimerStatus.PARKED]
        await wait_until(lambda: [t.status for t in timers(log, 0)] == parked, within=15)
        [row] = timers(log, 0)
        assert row.error_code == "ERROR" and "over 65024" in (row.error_text or "")
        small = await send(log, small_owner, "Grow", size=10)
        assert (await answered(log, small))[small].code == "COMMITTED"
        written = log.records(T.commands, 0)
        assert not any(name == IN_PROCESS_HEADER for r in written for name, _ in r.headers)
        assert refused == [] and node.node.health().get("failing") in (None, {})


@pytest.mark.parametrize("command", ["Later", "LaterTwice"])
async def test_a_committed_timer_read_back_under_a_smaller_limit_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """A `Later` decided COMMITTED, its 100 KB timer stored at once; the node stops before
    its event is read back, and the commands topic is lowered to 64 KiB: the next node reads
    the event back and finds its timer stored from it: done, kept, no letter. Before, it
    took the set again under the smaller limit, cancelled the stored timer and dead-lettered
    the event (only the run that decided it knew it carried out): its sender was told
    COMMITTED, and the timer never fired. `LaterTwice` sets it twice alike: the table keeps
    the first set's timer (`tables.writes.rewritten`), the second's read-back is the same
    command's doing, not a set to cancel."""
    log, clock = MemoryLog(), FakeClock(T0)
    refused = refusing(log, monkeypatch)
    owner, _ = owners(2)
    at = T0 + 3_600_000
    async with running(RunningNode(log, tmp_path, "a", SERVICE, P, clock=clock)):
        rid = await send(log, owner, command, size=100_000, at=at)
        assert (await answered(log, rid))[rid].code == "COMMITTED"
        await wait_until(lambda: (owner, "k") in timer_keys(log, 0))
    # Stopped before its read-back committed: the group's offset left before the event.
    set_at, *_ = offsets = [r.offset for r in log.records(T.events, 0)]
    log.commit_group_offsets("g", {(T.events, 0): set_at})
    log._max_bytes[T.commands] = 64 * 1024  # an operator lowers it
    node = RunningNode(log, tmp_path, "b", SERVICE, P, clock=clock)
    async with running(node):
        assert node.node.limits.topic_record_bytes == {T.commands: 64 * 1024 - RECORD_FRAMING}
        await wait_until(lambda: (log.committed("g", T.events, 0) or 0) > offsets[-1])
        assert letters(log) == [] and refused == []
        assert (owner, "k") in timer_keys(log, 0)


async def test_a_refused_set_whose_command_set_its_key_otherwise_first_cancels_that(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command (another deployment's: its event ids made as a node makes them) sets k
    small, then big: the big set replaces the small one. Read by a node whose commands
    topic takes 64 KiB, in two batches (the small set stored first), the big set is
    refused: it is a letter, and the small timer it replaced is cancelled. Taken for the
    big set's own doing (the same command), the small timer was kept and fired a command
    its decision had replaced."""
    other, clock = MemoryLog(), FakeClock(T0)
    owner, _ = owners(2)
    async with running(RunningNode(other, tmp_path / "w", "w", SERVICE, P, clock=clock)):
        rid = await send(other, owner, "SmallThenBig", size=100_000, at=T0 + 3_600_000)
        assert (await answered(other, rid))[rid].code == "COMMITTED"
    theirs = list(other.records(T.events, 0))
    log = MemoryLog()
    log.ensure_topics([TopicSpec(T.commands, P, max_message_bytes=64 * 1024)])
    refusing(log, monkeypatch)
    async with running(RunningNode(log, tmp_path / "a", "a", SERVICE, P, clock=clock)):
        for read, r in enumerate(theirs, start=1):
            await log.publisher().send(T.events, r.key, r.value, 0)
            await wait_until(functools.partial(_committed_past, log, read))
        assert len(letters(log)) == 1
        assert (owner, "k") not in timer_keys(log, 0)


def _committed_past(log: MemoryLog, read: int) -> bool:
    return (log.committed("g", T.events, 0) or 0) >= read


@pytest.mark.parametrize("then", ["fired", "cancelled"])
async def test_a_stored_timer_whose_row_its_changelog_now_refuses_is_dead_lettered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """A timer stored with a 40 KB command, then its timers changelog lowered to 16 KiB
    (the nodes restarted): the row its firing (or its owner's cancel) writes is over what
    the changelog takes. The row is dead-lettered whole, the timer deleted, and the
    partition goes on. Before, the row joined the partition's transaction, the broker
    refused it at every retake, and every command and timer of the partition waited
    behind it for good."""
    log, clock = MemoryLog(), FakeClock(T0)
    refused = refusing(log, monkeypatch)
    big_owner, small_owner = owners(2)
    at = T0 + 60_000
    async with running(RunningNode(log, tmp_path, "a", SERVICE, P, clock=clock)):
        rid = await send(log, big_owner, "Later", size=40_000, at=at)
        assert (await answered(log, rid))[rid].code == "COMMITTED"
        await wait_until(lambda: (big_owner, "k") in timer_keys(log, 0))
        await wait_until(lambda: (log.committed("g", T.events, 0) or 0) >= 1)
    [stored] = timers(log, 0)
    log._max_bytes[T.timers_changelog] = 16 * 1024  # an operator lowers it
    node = RunningNode(log, tmp_path, "b", SERVICE, P, clock=clock)
    async with running(node):
        if then == "fired":
            clock.set(at)
        else:
            forget = await send(log, big_owner, "Forget")
            assert (await answered(log, forget))[forget].code == "COMMITTED"
        await wait_until(lambda: len(letters(log)) == 1, within=15)
        [letter] = letters(log)
        assert letter.topic == T.timers_changelog and letter.context.truncated is None
        assert letter.value is not None and Timer.model_validate_json(letter.value) == stored
        assert "over 15872 (what big.thing.timers takes" in letter.context.exception_message
        # Deleted (a cancel read after it leaves a small mark of its own).
        gone = [] if then == "fired" else [TimerStatus.CANCELLED]
        await wait_until(lambda: [t.status for t in timers(log, 0)] == gone)
        small = await send(log, small_owner, "Grow", size=10)
        assert (await answered(log, small))[small].code == "COMMITTED"
        # Nothing over the limit written since (the first record: the row stored before).
        later = log.records(T.timers_changelog, 0)[1:]
        assert all(r.value is None or len(r.value) < 15_000 for r in later)
        assert refused == []
        await wait_until(lambda: node.node.health().get("failing") in (None, {}))
        assert not [r for r in results(log).values() if r.request_id == stored.request_id]
