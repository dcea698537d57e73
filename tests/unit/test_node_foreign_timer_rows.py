"""A whole node (in-memory log) whose timer changelog holds rows the live path never writes
there: no such row fires, each is dead-lettered once (`restore`) and deleted from the
changelog (a tombstone under its key), and the partition's own timers fire.

The rows are another writer's, well formed, each under its own row key with its
`partition` field the partition it sits in: one of an owner of another aggregate type
(`bank.account` in `mem.counter.timers`), one of a `mem.counter` owner keyed to the other
partition. Their owners' cancels and deletion are applied in their own type's or
partition's table, never reaching them: loaded, they fired (the store's own check is in
`test_restore_foreign_owner.py`; this is what it keeps a node from doing)."""

from __future__ import annotations

import time
from pathlib import Path

from fakes import RunningNode, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS, events, schedule

from app.kafka.memory import MemoryLog
from app.node import node_topics
from app.protocol.dead_letters import DeadLetter, Stage
from app.protocol.topics import ContextTopics
from tables import AggregateRef, CommandSpec, OnceRule, Timer
from tables.keys import encode_timer, row_key
from tables.partitioner import partition_of


def id_in(partition: int, prefix: str) -> str:
    return next(
        f"{prefix}{n}" for n in range(100) if partition_of(f"{prefix}{n}", PARTITIONS) == partition
    )


def forged(owner: AggregateRef, target: str, now: int) -> Timer:
    """A due `Fire` of `target`, set (its field says) in partition 0."""
    return Timer(
        id=f"{owner.id}/k",
        owner=owner,
        key="k",
        version=1,
        partition=0,
        rule=OnceRule(at=now),
        target=AggregateRef(context="mem", aggregate="counter", id=target),
        command=CommandSpec(type="Fire"),
        slot_due_at=now,
        due_at=now,
    )


async def test_rows_of_owners_the_partition_never_holds_are_lettered_and_never_fire(
    tmp_path: Path,
) -> None:
    log = MemoryLog(node_topics([TOPICS], PARTITIONS))
    now = int(time.time() * 1000) - 1_000  # due before the partition's own timer
    victims = [id_in(0, "v"), id_in(0, "w")]
    rows = [
        forged(AggregateRef(context="bank", aggregate="account", id="a-1"), victims[0], now),
        forged(AggregateRef(context="mem", aggregate="counter", id=id_in(1, "o")), victims[1], now),
    ]
    keys = [row_key(t.owner, t.key) for t in rows]
    publisher = log.publisher()
    offsets = [
        await publisher.send(TOPICS.timers_changelog, key, encode_timer(t), 0)
        for key, t in zip(keys, rows, strict=True)
    ]
    node = await RunningNode(log, tmp_path, "n1", SERVICE, PARTITIONS).start()
    try:
        ours = id_in(0, "ours")
        await schedule(log, ours, int(time.time() * 1000))
        # The partition's own timer, due after the forged ones, fires: they had their turn.
        await wait_until(lambda: any(e.aggregate.id == ours for e in events(log, "Fired")))
        assert not [e for e in events(log, "Fired") if e.aggregate.id in victims]
        letters = [
            DeadLetter.read(r.key, r.value, r.headers)
            for r in log.records(ContextTopics("mem").dead_letters, 0)
        ]
        lettered = [
            (d.topic, d.partition, d.offset, d.key)
            for d in letters
            if d.context.stage is Stage.RESTORE
        ]
        assert sorted(lettered) == [
            (TOPICS.timers_changelog, 0, offset, key)
            for offset, key in zip(offsets, keys, strict=True)
        ]
        # Deleted after their letters (their keys held nothing before): no restore meets
        # them again.
        last = {r.key: r.value for r in log.records(TOPICS.timers_changelog, 0)}
        assert [last[key] for key in keys] == [None, None]
    finally:
        await node.stop()
