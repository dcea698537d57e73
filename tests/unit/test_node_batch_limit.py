"""A topic of the node's own whose `max.message.bytes` an operator lowers while the node
runs, under its partition producers' batch size: each record still fits, but a batch of
many does not. The broker refuses such a batch whole (MESSAGE_SIZE_TOO_LARGE, not
retried), so a partition committing a burst failed at every retake, its timers stalled
for good while the rest went on (the batch size was worked out once, at the node's
start). Now a retake after a refusal reads the limits again first and opens its producer
with batches under them, and cuts its dead letters to what their topic takes now.

The memory log takes any batch: here a partition producer's records are cut into batches
as aiokafka cuts them (`max_batch_bytes`, a larger record alone) and one over its
topic's limit is refused, as the broker refuses it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest
from aiokafka.errors import MessageSizeTooLargeError
from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel

from app.errors import KafkaUnavailable
from app.kafka import OutRecord
from app.kafka.memory import MemoryLog
from app.kafka.memory_clients import MemoryWriter
from app.kafka.records import BROKER_MAX_MESSAGE_BYTES
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.protocol.dead_letters import DeadLetter
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, EventEnvelope, decode, encode
from app.service import Service
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.partitioner import partition_of

P = 2
T = AggregateTopics("lim", "box")
LOWERED = 16 * 1024
RECORD_OVERHEAD = 24
"""A record's own framing in a batch (lengths, offsets, timestamp deltas), about."""
BATCH_HEADER = 61


def refusing_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The broker's check of each batch a partition producer sends against its topic's
    `max.message.bytes`; the sizes of the batches it refused."""
    refused: list[int] = []
    send = MemoryWriter._send

    def batched(self: MemoryWriter, records: Sequence[OutRecord]) -> list[int]:
        by_partition: dict[tuple[str, int | None], list[int]] = {}
        for r in records:
            headers = sum(len(k) + len(v or b"") for k, v in (r[4] if len(r) > 4 else ()))
            size = len(r[2] or b"") + len(r[3] or b"") + headers + RECORD_OVERHEAD
            by_partition.setdefault((r[0], r[1]), []).append(size)
        for (topic, _), sizes in by_partition.items():
            limit = self._log.max_message_bytes(topic)
            batch = BATCH_HEADER
            for size in sizes:
                if batch > BATCH_HEADER and batch + size > self.max_batch_bytes:
                    batch = BATCH_HEADER  # full: the next batch begins
                batch += size
                if batch > limit:
                    refused.append(batch)
                    raise KafkaUnavailable("produce refused") from MessageSizeTooLargeError()
        return send(self, records)

    monkeypatch.setattr(MemoryWriter, "_send", batched)
    return refused


class Box(BaseModel):
    n: int = 0


box = AggregateType("lim", "box", Box)


@box.command("Later")
def _later(state: Box, cmd: Command, d: Decision) -> None:
    pad = "y" * 2_000
    d.schedule("k", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Ping", body={"pad": pad}))


@box.command("Ping")
def _ping(state: Box, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {})


@box.applies("Pinged")
def _pinged(state: Box, e: Event) -> Box:
    return state.model_copy(update={"n": state.n + 1})


SERVICE = Service(aggregates=(box,))


async def later(log: MemoryLog, owner: str, at: int) -> str:
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type="Later",
        aggregate=AggregateRef(context="lim", aggregate="box", id=owner),
        body={"at": at},
        issued_at=int(time.time() * 1000),
    )
    await log.publisher().send(T.commands, owner.encode(), encode(cmd), partition_of(owner, P))
    return cmd.request_id


def answers(log: MemoryLog) -> dict[str, str]:
    results = ContextTopics("lim").results
    read = (orjson.loads(r.value or b"") for p in range(P) for r in log.records(results, p))
    return {v["request_id"]: v["code"] for v in read}


def rows(log: MemoryLog) -> list[Timer]:
    """The rows of partition 0's changelog, each as last written."""
    latest = {r.key: r.value for r in log.records(T.timers_changelog, 0)}
    return [Timer.model_validate_json(v) for v in latest.values() if v is not None]


def pinged(log: MemoryLog) -> int:
    """How many timers' commands were decided (their `Pinged` events)."""
    events = (decode(EventEnvelope, r.value) for p in range(P) for r in log.records(T.events, p))
    return sum(e.type == "Pinged" for e in events)


@pytest.mark.parametrize("lowered", [T.timers_changelog, T.commands], ids=["changelog", "commands"])
@pytest.mark.parametrize("due_ms", [1_000, 61_000], ids=["limits-fresh", "limits-old"])
async def test_a_burst_under_a_limit_lowered_while_running_fires_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, due_ms: int, lowered: str
) -> None:
    """Its changelog or its commands topic (the record of each command fired in-process)
    lowered. limits-fresh: due before the limits last read are old (`TopicCatalog.
    max_age_ms`): the refusal itself has them read again. limits-old: read again as old."""
    log, clock = MemoryLog(), FakeClock(T0)
    refused = refusing_batches(monkeypatch)
    ids = [f"o{i}" for i in range(100) if partition_of(f"o{i}", P) == 0][:12]
    async with running(RunningNode(log, tmp_path, "a", SERVICE, P, clock=clock)):
        rids = [await later(log, o, T0 + due_ms) for o in ids]
        await wait_until(lambda: set(rids) <= set(answers(log)))
        assert {answers(log)[r] for r in rids} == {"COMMITTED"}
        await wait_until(lambda: len(rows(log)) == len(ids))
        # Each ~2.5 KB record fits what the operator leaves; a dozen in one batch do not.
        log._max_bytes[lowered] = LOWERED
        clock.advance(due_ms + 1)
        await wait_until(
            lambda: pinged(log) == len(ids),
            within=30,
            what=lambda: f"{pinged(log)} fired, batches refused: {refused}",
        )
        await wait_until(
            lambda: {t.status for t in rows(log)} == {TimerStatus.FIRED},
            what=lambda: str([t.status for t in rows(log)]),
        )
    assert all(size > LOWERED for size in refused)


def letters(log: MemoryLog) -> list[DeadLetter]:
    return [
        DeadLetter.read(r.key, r.value, r.headers)
        for r in log.records(ContextTopics("lim").dead_letters, 0)
    ]


@pytest.mark.parametrize(
    ("lowered", "size"),
    [(LOWERED, 45_000), (BROKER_MAX_MESSAGE_BYTES, BROKER_MAX_MESSAGE_BYTES - 200)],
    ids=["16KiB", "broker-default"],
)
async def test_a_letter_over_a_dead_letter_topic_lowered_while_running_is_cut_to_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lowered: int, size: int
) -> None:
    """Letters were cut to what the dead-letter topic took at the node's start: lowered
    since, a letter of a large bad record failed its partition's commit at every retake
    (broker-default: from the 4 MiB the node makes it with to Kafka's default, over
    what the node's other topics are assumed to take)."""
    log, clock = MemoryLog(), FakeClock(T0)
    refused = refusing_batches(monkeypatch)
    owner, other = [f"o{i}" for i in range(100) if partition_of(f"o{i}", P) == 0][:2]
    async with running(RunningNode(log, tmp_path, "a", SERVICE, P, clock=clock)):
        first = await later(log, owner, T0 + 3_600_000)
        await wait_until(lambda: first in answers(log))
        log._max_bytes[ContextTopics("lim").dead_letters] = lowered
        garbage = b"x" * size  # not JSON; dead-lettered whole when its topic takes it
        await log.publisher().send(T.commands, owner.encode(), garbage, 0)
        after = await later(log, other, T0 + 3_600_000)
        await wait_until(lambda: after in answers(log), within=30, what=lambda: str(refused))
        [letter] = letters(log)
        assert letter.context.truncated is not None
        assert len(letter.value or b"") < lowered
    assert refused  # the letter cut to the start's limit was refused once


SINK = AggregateTopics("lim", "sink")
fanning = AggregateType("lim", "box", Box)
sink = AggregateType("lim", "sink", Box)


@fanning.command("Fan")
def _fan(state: Box, cmd: Command, d: Decision) -> None:
    for i in range(12):
        to = AggregateRef(context="lim", aggregate="sink", id="s1")
        d.send(to, "Got", {"pad": "y" * 2_000, "i": i})
    d.emit("Pinged", {})


fanning.applies("Pinged")(_pinged)


@sink.command("Got")
def _got(state: Box, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {})


sink.applies("Pinged")(_pinged)


async def fan(log: MemoryLog, owner: str) -> str:
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type="Fan",
        aggregate=AggregateRef(context="lim", aggregate="box", id=owner),
        issued_at=int(time.time() * 1000),
    )
    await log.publisher().send(T.commands, owner.encode(), encode(cmd), partition_of(owner, P))
    return cmd.request_id


@pytest.mark.parametrize("wait_ms", [0, 61_000], ids=["limits-fresh", "limits-old"])
async def test_another_types_commands_lowered_while_running_size_the_batches_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wait_ms: int
) -> None:
    """A decision of box sends a dozen commands to one sink (its commands topic, in box's
    partition's transaction): sink's topic lowered, box's partition was sized, and read
    its limits again, by box's own topics alone."""
    log, clock = MemoryLog(), FakeClock(T0)
    refused = refusing_batches(monkeypatch)
    service = Service(aggregates=(fanning, sink))
    async with running(RunningNode(log, tmp_path, "a", service, P, clock=clock)):
        first = await fan(log, "o1")
        await wait_until(lambda: first in answers(log))
        log._max_bytes[SINK.commands] = LOWERED
        clock.advance(wait_ms)
        second = await fan(log, "o2")
        await wait_until(
            lambda: second in answers(log),
            within=30,
            what=lambda: f"refused {len(refused)} batches: {refused[:4]}",
        )
        assert answers(log)[second] == "COMMITTED"
