"""Bad input on the real broker, while timers are due: every bad record another team's
producer could write (numbers past their bounds, an oversized key or value, bytes that are
not UTF-8, a reply address that is not the context's results topic) is dead-lettered once,
byte for byte, with where it came from and why; the records around it are processed, every
valid timer fires exactly once, and no partition is retaken or held."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from harness import Client, Cluster, eventually, kcat_produce

from app.kafka import Record, read_partitions
from app.model.decide import event_id
from app.protocol.dead_letters import HEADER_PREFIX, DeadLetter, Headers, Stage
from app.protocol.wire import (
    SCHEDULE_SET,
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    ResultCode,
    decode,
    encode,
)
from tables import ACTIVE, TimerStatus
from tables.partitioner import partition_of

pytestmark = pytest.mark.kafka

PARTITIONS = 3
KIB = 1024
LETTER_HEADERS = [
    "topic",
    "partition",
    "offset",
    "timestamp",
    "stage",
    "exception.class.name",
    "exception.message",
    "node",
    "time",
]
"""`__tickwheel.errors.*`, in order, of a letter not cut (`truncated` only when cut)."""


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(kafka_bootstrap, tmp_path, partitions=PARTITIONS)
    yield c
    c.stop_all()


def ids_in(partition: int, prefix: str, count: int) -> list[str]:
    """`count` aggregate ids whose records belong in `partition` (murmur2)."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        name = f"{prefix}-{i}"
        if partition_of(name, PARTITIONS) == partition:
            found.append(name)
        i += 1
    return found


@dataclass(frozen=True)
class Bad:
    """A bad record as written, where it landed, and the stage that must refuse it."""

    what: str
    topic: str
    partition: int
    key: bytes
    value: bytes
    headers: Headers
    stage: Stage
    error: str  # a part of the letter's exception message
    offset: int = -1


class Writer:
    """Writes as another team's producer would: raw bytes, into a partition it picks."""

    def __init__(self, client: Client, partition: int) -> None:
        self.client = client
        self.partition = partition
        self.now = int(time.time() * 1000)
        self.ref = client.ref(ids_in(partition, "bad", 1)[0]).model_dump()

    def schedule_set(self, eid: str, rule: dict[str, object], **extra: object) -> bytes:
        """A `wow.ScheduleSet` as JSON of any integer size (json, not orjson: 64 bits)."""
        return json.dumps(
            {
                "id": eid,
                "type": SCHEDULE_SET,
                "aggregate": self.ref,
                "version": 1,
                "created_at": self.now,
                "body": {"key": eid, "rule": rule, "command": {"type": "Fire"}, **extra},
            }
        ).encode()

    def schedule_command(self, request_id: str, pad: str = "", **fields: object) -> bytes:
        """A `Schedule` command for the bad-record aggregate, valid but for `fields` (set
        on the envelope) and `pad` (added to its body): decided, it would set a timer."""
        body = {"key": request_id, "rule": {"kind": "once", "at": self.now + 2_000}}
        if pad:
            body["pad"] = pad
        cmd = self.client.command(self.ref["id"], "Schedule", body, request_id=request_id)
        return json.dumps({**json.loads(encode(cmd)), **fields}).encode()

    def records(self) -> list[Bad]:
        topics = self.client.topics
        ev, cmd, p = topics.events, topics.commands, self.partition
        key = self.ref["id"].encode()
        big_key = b"K" * (300 * KIB)
        pad = "x" * (300 * KIB)
        return [
            Bad(
                "once at 2**64+5",
                ev,
                p,
                key,
                self.schedule_set("at-2-64", {"kind": "once", "at": 2**64 + 5}),
                (("team", b"orders"),),
                # No 64-bit reader holds it: refused where it comes in, with the envelope.
                Stage.READ,
                "body.rule.at: integer 18446744073709551621 is outside signed 64 bits",
            ),
            Bad(
                "every 2**70",
                ev,
                p,
                key,
                self.schedule_set(
                    "every-2-70", {"kind": "interval", "start": self.now, "every": 2**70}
                ),
                (),
                Stage.READ,
                "body.rule.every: integer 1180591620717411303424 is outside signed 64 bits",
            ),
            Bad(
                "300 KiB key (events)",
                ev,
                p,
                big_key,
                self.schedule_set("big-key-event", {"kind": "once", "at": self.now + 2_000}),
                (),
                Stage.READ,
                f"key of {len(big_key)} bytes exceeds 4096 (TICKWHEEL_MAX_KEY_BYTES)",
            ),
            Bad(
                "300 KiB key (commands)",
                cmd,
                p,
                big_key,
                self.schedule_command("big-key-command"),
                (),
                Stage.READ,
                f"key of {len(big_key)} bytes exceeds 4096 (TICKWHEEL_MAX_KEY_BYTES)",
            ),
            Bad(
                "invalid UTF-8 (events)",
                ev,
                p,
                key,
                self.schedule_set("utf8-event", {"kind": "once", "at": self.now + 2_000}).replace(
                    b"utf8-event", b"utf8-\xff\xfe"
                ),
                (("bin", b"\x00\xff"),),
                Stage.READ,
                "invalid unicode code point",
            ),
            Bad(
                "invalid UTF-8 (commands)",
                cmd,
                p,
                key,
                self.schedule_command("utf8-command").replace(b"utf8-command", b"utf8-\xc3\x28"),
                (),
                Stage.READ,
                "invalid unicode code point",
            ),
            Bad(
                "300 KiB value (events)",
                ev,
                p,
                key,
                self.schedule_set("big-event", {"kind": "once", "at": self.now + 2_000}, pad=pad),
                (),
                Stage.READ,
                "exceeds 262144 (TICKWHEEL_MAX_RECORD_BYTES)",
            ),
            Bad(
                "300 KiB value (commands)",
                cmd,
                p,
                key,
                self.schedule_command("big-command", pad=pad),
                (),
                Stage.READ,
                "exceeds 262144 (TICKWHEEL_MAX_RECORD_BYTES)",
            ),
            Bad(
                "reply_to the events topic",
                cmd,
                p,
                key,
                self.schedule_command("reply-to-events", reply_to=ev),
                (),
                Stage.READ,
                f"reply_to {ev!r} is not {self.client.ctx.results}",
            ),
            Bad(
                "in_process without the node's header",
                cmd,
                p,
                key,
                self.schedule_command("in-process-forged", in_process=True),
                (("team", b"orders"),),
                # Passed over in silence before: a node's own in-process record (those of
                # the local owners here, read back) has the header and is passed over.
                Stage.READ,
                "lacks the __tickwheel.in-process header",
            ),
            Bad(
                "reply_partition that does not exist",
                cmd,
                p,
                key,
                self.schedule_command("reply-partition", reply_partition=PARTITIONS),
                (),
                Stage.READ,
                f"reply_partition {PARTITIONS} does not exist",
            ),
        ]


async def raw(client: Client, topic: str) -> list[Record]:
    out: list[Record] = []
    async for batch in read_partitions(client.cluster.bootstrap, topic, range(PARTITIONS)):
        out += batch
    return out


async def raw_letters(client: Client) -> list[Record]:
    out: list[Record] = []
    async for batch in read_partitions(client.cluster.bootstrap, client.ctx.dead_letters, [0]):
        out += batch
    return out


async def settled(client: Client, timers: set[str]) -> bool:
    """Every timer of `timers` is in the table and none can be sent any more."""
    rows = {t.id: t for t in (await client.timers()).values()}
    return timers <= set(rows) and all(t.status not in ACTIVE for t in rows.values())


async def test_bad_records_are_dead_lettered_once_each_and_every_timer_fires(
    cluster: Cluster,
) -> None:
    async with Client(cluster) as client:
        w = cluster.start_worker()
        await cluster.wait_owned(w)
        p = 1
        # Owners in the bad records' partition fire in-process; owners elsewhere send their
        # timers' commands to targets in p, through the commands topic the bad ones are on.
        local_owners = ids_in(p, "local", 3)
        remote_owners = [i for q in range(PARTITIONS) if q != p for i in ids_in(q, "remote", 2)]
        targets = ids_in(p, "target", 2)
        writer = Writer(client, p)

        def schedules(round_: str, due_in: int) -> list[CommandEnvelope]:
            at = int(time.time() * 1000) + due_in
            rule = {"kind": "once", "at": at}
            own = [
                client.command(
                    o, "Schedule", {"key": round_, "rule": rule}, request_id=f"{round_}-{o}"
                )
                for o in local_owners
            ]
            sent = [
                client.command(
                    o,
                    "Schedule",
                    {"key": round_, "rule": rule, "target": client.ref(t).model_dump()},
                    request_id=f"{round_}-{o}",
                )
                for o, t in zip(remote_owners, targets * len(remote_owners), strict=False)
            ]
            return own + sent

        before = schedules("before", 2_500)
        await client.send(*before)
        await client.wait_results([c.request_id for c in before])
        # Timers are due while the bad records arrive, between valid commands in p.
        bad = writer.records()
        written = await client._producer.send_many(
            [(b.topic, b.partition, b.key, b.value, b.headers) for b in bad]
        )
        bad = [replace(b, offset=o) for b, o in zip(bad, written, strict=True)]
        after = schedules("after", 1_000)
        await client.send(*after)
        valid = [c.request_id for c in before + after]
        targets_of = {
            event_id(c.aggregate, c.request_id, 0): str(
                c.body.get("target", {"id": c.aggregate.id})["id"]
            )
            for c in before + after
        }
        refused = ["reply-to-events", "reply-partition", "in-process-forged"]
        results = await client.wait_results([*valid, *refused])

        for rid in valid:
            assert results[rid].code == ResultCode.COMMITTED, results[rid]
        # Timer ids: a Schedule's one ScheduleSet event's (`event_id`); its slot 0.
        timers = {event_id(c.aggregate, c.request_id, 0) for c in before + after}
        await eventually(
            lambda: settled(client, timers), 30, f"{len(timers)} timers fired and settled"
        )

        async def all_letters() -> bool:
            return len(await client.dead_letters()) >= len(bad)

        await eventually(all_letters, 30, f"{len(bad)} dead letters")

        # The events topic holds the bad records as written and the node's own events; no
        # result of a misaddressed command went there (or anywhere else but its results).
        mine = {(b.topic, b.partition, b.offset) for b in bad}
        on_events = await raw(client, client.topics.events)
        for misaddressed in (b"reply-to-events", b"reply-partition"):
            assert not [r for r in on_events if misaddressed in (r.value or b"")], misaddressed
        # The node's own in-process command records carry its header (read back, passed
        # over: no letter of them below).
        own_fires = [
            r
            for r in await raw(client, client.topics.commands)
            if b'"in_process":true' in (r.value or b"")
            and (r.topic, r.partition, r.offset) not in mine
        ]
        assert len(own_fires) == 2 * len(local_owners), len(own_fires)
        assert {r.headers for r in own_fires} == {(("__tickwheel.in-process", b"1"),)}
        events = [
            decode(EventEnvelope, r.value)
            for r in on_events
            if (r.topic, r.partition, r.offset) not in mine
        ]
        assert not [e for e in events if (e.request_id or "").startswith("reply-")]

        # Every valid timer fired exactly once, on its target, not before it was due.
        fired = [e for e in events if e.type == "Fired"]
        assert Counter(e.request_id for e in fired) == Counter(f"{t}#0" for t in timers)
        for e in fired:
            assert e.request_id is not None
            assert e.aggregate.id == targets_of[e.request_id.removesuffix("#0")], e
            assert e.created_at >= e.body["not_before"], e
        rows = {t.id: t for t in (await client.timers()).values()}
        assert {rows[t].status for t in timers} == {TimerStatus.FIRED}
        assert set(rows) == timers, "no timer from a bad record"

        # One letter per bad record, its bytes whole, naming where it came from and why.
        letters = await client.dead_letters()
        by_source: dict[tuple[str, int, int], list[DeadLetter]] = {}
        for d in letters:
            by_source.setdefault((d.topic, d.partition, d.offset), []).append(d)
        assert len(letters) == len(bad), [(d.topic, d.offset, d.error) for d in letters]
        node = f":{w.proc.pid}"
        for b in bad:
            (d,) = by_source[(b.topic, b.partition, b.offset)]
            assert d.key == b.key, b.what
            assert d.value == b.value, b.what
            assert d.headers == b.headers, b.what
            assert d.context.stage == b.stage, (b.what, d.context)
            assert b.error in d.error, (b.what, d.error)
            assert d.context.exception_class == "BadRecord", (b.what, d.context)
            assert d.context.truncated is None, b.what
            assert d.context.node.endswith(node), (b.what, d.context.node)
            assert abs(d.context.timestamp - writer.now) < 60_000, (b.what, d.context)

        # Where and why, in the headers Kafka Connect's dead-letter queues name them by.
        names = [
            [k.removeprefix(HEADER_PREFIX) for k, _ in r.headers if k.startswith(HEADER_PREFIX)]
            for r in await raw_letters(client)
        ]
        assert names == [LETTER_HEADERS] * len(bad), names[0]
        per_topic = Counter(b.topic for b in bad)
        await eventually(
            lambda: all(
                w.metric("tickwheel_dead_letters_total", topic=topic) == n
                for topic, n in per_topic.items()
            ),
            10,
            f"dead letters counted by topic: {dict(per_topic)}",
        )

        # The misaddressed commands: answered ERROR on the context's results topic, in the
        # request id's partition; never decided, and nothing written where they asked.
        for rid in refused:
            assert results[rid].code == ResultCode.ERROR, results[rid]
        answered = {
            (decode(CommandResult, r.value).request_id, r.partition)
            for r in await raw(client, client.ctx.results)
            if r.value is not None
        }
        assert ("reply-to-events", partition_of("reply-to-events", PARTITIONS)) in answered
        assert ("reply-partition", partition_of("reply-partition", PARTITIONS)) in answered

        # No partition was retaken or is held: the node went on past every record.
        health = w.health()
        assert health is not None
        assert health["ready"] is True, health
        assert "failing" not in health, health
        assert health["stalled"] == {}, health
        assert w.metrics() is not None
        for reason in ("failed", "fenced"):
            let_go = w.metric("tickwheel_partitions_let_go_total", reason=reason)
            assert let_go == 0, (reason, w.text()[-4000:])
        assert "a cycle failed" not in w.text()
        assert w.alive


@pytest.mark.kafka_next
async def test_a_header_key_that_is_not_utf8_stops_nothing(cluster: Cluster) -> None:
    """Kafka's Java clients read such a key with the replacement character and aiokafka
    raised on it at every poll (the node stopped, and the next owner of the partition
    after it): the command and the event carrying one are taken as they are, and the
    partition goes on past them."""
    async with Client(cluster) as client:
        w = cluster.start_worker()
        await cluster.wait_owned(w)
        p = 1
        writer = Writer(client, p)
        owner = ids_in(p, "hdr", 1)[0]
        due = int(time.time() * 1000) + 1_000
        cmd = client.command(
            owner, "Schedule", {"key": "hdr", "rule": {"kind": "once", "at": due}}, request_id="hdr"
        )
        kcat_produce(cluster.bootstrap, client.topics.commands, p, owner.encode(), encode(cmd))
        event = writer.schedule_set("hdr-event", {"kind": "once", "at": due})
        kcat_produce(cluster.bootstrap, client.topics.events, p, writer.ref["id"].encode(), event)
        after = client.command(
            owner,
            "Schedule",
            {"key": "after", "rule": {"kind": "once", "at": due}},
            request_id="after",
        )
        await client.send(after)
        results = await client.wait_results(["hdr", "after"])
        assert {r.code for r in results.values()} == {ResultCode.COMMITTED}, results

        async def fired() -> bool:
            rows = list((await client.timers()).values())
            done = {t.key for t in rows if t.status is TimerStatus.FIRED}
            return {"hdr", "after", "hdr-event"} <= done

        await eventually(fired, 30, "the three timers fired")
        health = w.health()
        assert health is not None and health["ready"] is True, health
        assert health["stalled"] == {}, health
        for reason in ("failed", "fenced"):
            assert w.metric("tickwheel_partitions_let_go_total", reason=reason) == 0, reason
        assert w.alive
        assert await client.dead_letters() == []


async def produce_compressed(
    bootstrap: str, topic: str, p: int, key: bytes, value: bytes, codec: str
) -> None:
    """One record in a batch compressed with `codec`, as another team's producer (a Java
    one's `compression.type`) may write it."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key, partition=p)
    finally:
        await producer.stop()


@pytest.mark.kafka_next
async def test_batches_compressed_with_every_codec_kafka_has_are_read(cluster: Cluster) -> None:
    """A batch compressed with lz4, snappy or zstd raised UnsupportedCodecError at every
    poll (aiokafka reads them with cramjam, which the project did not install): its
    partition stopped for good on every node, and records other partitions' fetches held
    were dropped. Each codec's command is decided, its timer fires, nothing is let go."""
    codecs = ["gzip", "lz4", "snappy", "zstd"]
    async with Client(cluster) as client:
        w = cluster.start_worker()
        await cluster.wait_owned(w)
        due = int(time.time() * 1000) + 1_000
        for i, codec in enumerate(codecs):
            p = i % PARTITIONS
            owner = ids_in(p, f"codec-{codec}", 1)[0]
            rule = {"kind": "once", "at": due}
            cmd = client.command(owner, "Schedule", {"key": codec, "rule": rule}, request_id=codec)
            await produce_compressed(
                cluster.bootstrap, client.topics.commands, p, owner.encode(), encode(cmd), codec
            )
        results = await client.wait_results(codecs)
        assert {r.code for r in results.values()} == {ResultCode.COMMITTED}, results

        async def fired() -> bool:
            rows = list((await client.timers()).values())
            return set(codecs) <= {t.key for t in rows if t.status is TimerStatus.FIRED}

        await eventually(fired, 30, "every codec's timer fired")
        health = w.health()
        assert health is not None and health["ready"] is True and health["stalled"] == {}, health
        for reason in ("failed", "fenced"):
            assert w.metric("tickwheel_partitions_let_go_total", reason=reason) == 0, reason
        assert await client.dead_letters() == []
