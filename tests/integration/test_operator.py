"""Parked timers, the failure ledger on Kafka, and operators' retry and skip, on the real broker.

The target has no handler for the timers' command: every send comes back ERROR, so after
`max_attempts` (2) the timers are PARKED and their target is in the ledger. An operator
asks from a client of its own (the library call, or the `tickwheel timers` command), and
the owners of the timers' partitions carry it out, each for its own partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from harness import ROOT, Client, Cluster, eventually, owned

from app.kafka import KafkaClients, Producer, TopicSpec, read_to_end
from app.node.parked_names import keep_parked_named
from app.protocol.topics import ContextTopics
from app.protocol.wire import OpOutcome, ResultCode
from app.timers.ledger import KafkaFailureLedger, decode_key, read_ledger
from app.timers.operator import read_timers, request_retry
from app.timers.runner import SendResult, SystemClock, TimerOptions, TimerRunner
from tables import (
    AggregateRef,
    CommandSpec,
    OnceRule,
    Outcome,
    Timer,
    TimerChange,
    TimerStatus,
    open_timer_store,
)
from tables.ledger import LedgerEntry
from tables.partitioner import partition_of

pytestmark = pytest.mark.kafka

PARTITIONS = 3
OPTIONS = {
    "retry": {"initial_backoff_ms": 100, "max_backoff_ms": 200, "max_attempts": 2},
    "claim_timeout": 3000,
    "send_timeout": 2000,
}
SUB = TimerOptions.PARKED_SUBSCRIPTION


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(
        kafka_bootstrap,
        tmp_path,
        partitions=PARTITIONS,
        env={"TICKWHEEL_TIMER_OPTIONS": orjson.dumps(OPTIONS).decode()},
    )
    yield c
    c.stop_all()


def owners_in_every_partition() -> list[str]:
    """One owner id per partition, so that the parked timers sit in all of them."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < PARTITIONS:
        found.setdefault(partition_of(f"owner-{n}", PARTITIONS), f"owner-{n}")
        n += 1
    return [found[p] for p in range(PARTITIONS)]


async def tickwheel(cluster: Cluster, *args: str) -> tuple[int, str, str]:
    """Runs `tickwheel timers …` as an operator would: another process, another client."""
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap,
        "TICKWHEEL_PARTITIONS": str(cluster.partitions),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.cli",
        "timers",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def history(client: Client) -> dict[str, list[Timer]]:
    """Every row the changelog holds, per timer key, in order: what the table went through."""
    rows: dict[str, list[Timer]] = {}
    for p in range(client.cluster.partitions):
        async for batch in read_to_end(
            client.cluster.bootstrap, client.topics.timers_changelog, p, 0
        ):
            for r in batch:
                if r.value is not None:
                    t = Timer.model_validate(orjson.loads(r.value))
                    rows.setdefault(t.key, []).append(t)
    return rows


async def ledger_history(client: Client) -> list[LedgerEntry | None]:
    """The ledger records of the cluster's context, in order (one key here: one partition)."""
    out: list[LedgerEntry | None] = []
    for p in range(client.cluster.partitions):
        async for batch in read_to_end(client.cluster.bootstrap, client.ctx.ledger, p, 0):
            for r in batch:
                decode_key(r.key)
                out.append(None if r.value is None else LedgerEntry.model_validate_json(r.value))
    return out


async def test_parked_timers_are_retried_and_skipped_by_their_owners(cluster: Cluster) -> None:
    began = time.monotonic()
    async with Client(cluster) as client:
        w1 = cluster.start_worker()
        await cluster.wait_owned(w1)
        w2 = cluster.start_worker()
        workers = [w1, w2]

        def split() -> bool:
            mine = [set(owned(w)) for w in workers]
            return all(mine) and not mine[0] & mine[1] and mine[0] | mine[1] == {0, 1, 2}

        await eventually(split, 90, "two workers sharing the partitions")
        target = client.ref("unanswering")
        owners = owners_in_every_partition()
        keys = [f"k-{o}" for o in owners]
        # A client's own view of the ledger, following the topic as every node does.
        producer = Producer(cluster.bootstrap)
        await producer.start()
        kafka = KafkaClients(cluster.bootstrap)
        follower = KafkaFailureLedger(kafka, cluster.context, PARTITIONS, producer)
        await follower.start()
        try:
            now = int(time.time() * 1000)
            commands = [
                client.command(
                    owner,
                    "Schedule",
                    {
                        "key": f"k-{owner}",
                        "rule": {"kind": "once", "at": now},
                        "type": "NoSuchCommand",  # the target has no handler: ERROR
                        "target": target.model_dump(),
                    },
                    request_id=f"schedule-{owner}",
                )
                for owner in owners
            ]
            await client.send(*commands)
            await client.wait_results([c.request_id for c in commands])

            # 1. Two failed attempts each, then PARKED, the target in the ledger first.
            async def all_parked() -> bool:
                rows = {t.key: t for t in (await client.timers()).values()}
                return all(k in rows and rows[k].status is TimerStatus.PARKED for k in keys)

            await eventually(all_parked, 60, "every timer PARKED")
            rows = {t.key: t for t in (await client.timers()).values()}
            assert {rows[k].partition for k in keys} == set(range(PARTITIONS))
            assert all((rows[k].attempts, rows[k].outcome) == (2, Outcome.FAILED) for k in keys)
            # Why they did not fire (#22), sent in-process or through the command topic.
            no_handler = f"{target.type_name} has no handler for NoSuchCommand"
            assert {(rows[k].error_code, rows[k].error_text) for k in keys} == {
                ("ERROR", no_handler)
            }
            request_ids = {rows[k].request_id for k in keys}
            # The owner in the target's partition fires in-process: its commands get no
            # result record and its claims no row of their own (they commit with the
            # outcome); the others' are sent through the command topic.
            here = partition_of(target.id, PARTITIONS)
            local = {f"k-{o}" for o in owners if partition_of(o, PARTITIONS) == here}
            remote_ids = {rows[k].request_id for k in keys if k not in local}
            errors = [r for r in await client.all_results() if r.request_id in request_ids]
            assert len(errors) == 2 * len(remote_ids)
            assert {r.request_id for r in errors} == remote_ids
            assert {r.code for r in errors} == {ResultCode.ERROR}

            await eventually(
                lambda: _has_entry(follower, request_ids), 30, "the follower sees the entry"
            )
            [entry] = await read_ledger(kafka, cluster.context, PARTITIONS)
            assert (entry.subscription, entry.target) == (SUB, target)
            assert (entry.error_code, entry.error_text) == ("ERROR", no_handler)
            # Each node names the timers it parked; two parking at once: the later's win.
            assert entry.timers and set(entry.timers) <= request_ids
            code, out, err = await tickwheel(
                cluster, "ledger", "--context", cluster.context, "--json"
            )
            assert code == 0, err
            [line] = out.splitlines()
            assert LedgerEntry.model_validate_json(line) == entry
            code, out, err = await tickwheel(
                cluster, "list", "--type", client.topics.type_name, "--status", "PARKED", "--json"
            )
            assert code == 0, err
            assert {Timer.model_validate_json(line).key for line in out.splitlines()} == set(keys)

            # 2. An operator's retry from another client: PENDING again, attempts from zero,
            # sent again (and, still unanswered, PARKED again: the ledger entry re-created).
            before = {k: len(v) for k, v in (await history(client)).items()}
            await request_retry(kafka, client.topics.type_name, target, PARTITIONS)

            def expected(key: str) -> int:
                return 4 if key in local else 5

            async def parked_again() -> bool:
                rows_now = await history(client)
                return all(
                    len(rows_now[k]) == before[k] + expected(k)
                    and rows_now[k][-1].status is TimerStatus.PARKED
                    for k in rows_now
                )

            await eventually(parked_again, 60, "every parked timer sent twice more, PARKED")
            got = [r for r in await client.all_results() if r.request_id in request_ids]
            assert len(got) == 4 * len(remote_ids)
            for key, rows_of_key in (await history(client)).items():
                after = rows_of_key[before[key] :]
                assert (after[0].status, after[0].attempts) == (TimerStatus.PENDING, 0), after
                assert after[0].slot == rows_of_key[before[key] - 1].slot
                if key in local:
                    assert [t.status for t in after] == [
                        TimerStatus.PENDING,  # the operator's retry, due now
                        TimerStatus.PENDING,  # attempt 1 failed (claimed and decided at once)
                        # Attempt 2 failed: its cycle calls no ledger, so it writes the
                        # attempt to send again after the backoff; then, the ledger holding
                        # the target, the partition's next round parks it.
                        TimerStatus.PENDING,
                        TimerStatus.PARKED,
                    ]
                    assert [t.attempts for t in after] == [0, 1, 1, 2]
                    continue
                assert [t.status for t in after] == [
                    TimerStatus.PENDING,  # the operator's retry, due now
                    TimerStatus.FIRING,
                    TimerStatus.PENDING,  # attempt 1 failed
                    TimerStatus.FIRING,
                    TimerStatus.PARKED,  # attempt 2 failed
                ]
                assert [t.attempts for t in after] == [0, 0, 1, 1, 2]
            records = await ledger_history(client)
            # Recorded, resolved by the retry, recorded again when the timers parked again.
            assert records[-1] is not None and set(records[-1].timers) <= request_ids
            assert None in records
            assert records.index(None) < len(records) - 1
            await eventually(
                lambda: _has_entry(follower, request_ids), 30, "the ledger entry re-created"
            )
            # Each owner carried out the op for its own partitions, and only those.
            for w in workers:
                done = {
                    int(labels["partition"])
                    for name, labels, value in w.metrics() or []
                    if name == "tickwheel_operator_requests_total"
                    and labels["action"] == "retry"
                    and value > 0
                }
                assert done == set(owned(w)), (w.name, done)

            # 3. A bad op record is dead-lettered and skipped; the node goes on.
            await producer.send(client.topics.timer_ops, b"x", b"{not an op", 1)

            # 4. An operator's skip through the CLI: CANCELLED/SKIPPED, the entry resolved.
            # It waits for every partition's owner to answer what it did there.
            args = ["--type", client.topics.type_name, "--target-id", target.id]
            code, out, err = await tickwheel(cluster, "skip", *args, "--request-id", "skip-1")
            assert code == 0, err
            skipped = f"skipped {len(keys)} timers of {client.topics.type_name} parked on"
            assert skipped in out.splitlines()[-1], out
            answers = [a for a in await client.op_answers() if a.request_id == "skip-1"]
            assert sorted(a.partition for a in answers) == list(range(PARTITIONS))
            assert {a.outcome for a in answers} == {OpOutcome.DONE}
            assert sum(a.skipped for a in answers) == len(keys)
            # Sent again under its request id: a DUPLICATE in every partition.
            code, out, err = await tickwheel(
                cluster, "skip", *args, "--request-id", "skip-1", "--json"
            )
            assert code == 0, err
            said = orjson.loads(out)
            assert [a["outcome"] for a in said["answers"]] == ["DUPLICATE"] * PARTITIONS
            assert said["unanswered"] == []

            async def all_skipped() -> bool:
                rows = {t.key: t for t in (await client.timers()).values()}
                return all(
                    k in rows
                    and (rows[k].status, rows[k].outcome)
                    == (TimerStatus.CANCELLED, Outcome.SKIPPED)
                    for k in keys
                )

            await eventually(all_skipped, 60, "every timer CANCELLED/SKIPPED")
            await eventually(lambda: _is_empty(follower), 30, "the entry resolved")
            assert await read_ledger(kafka, cluster.context, PARTITIONS) == []
            timers = await read_timers(kafka, client.topics.type_name, PARTITIONS)
            assert {t.key for t in timers if t.outcome is Outcome.SKIPPED} == set(keys)
            letters = await client.dead_letters()
            ops = [d for d in letters if d.topic == client.topics.timer_ops]
            assert [(d.topic, d.partition) for d in ops] == [(client.topics.timer_ops, 1)]
            assert "not a valid TimerOp" in ops[0].error
            # Each send of a command no handler takes is answered ERROR and dead-lettered.
            unknown = [d for d in letters if d.topic == client.topics.commands]
            assert len(unknown) == len(letters) - 1 >= 4 * len(remote_ids)
            assert all("no handler for NoSuchCommand" in d.error for d in unknown)
            for w in workers:
                assert w.alive
                assert "Traceback" not in w.text()
        finally:
            await follower.stop()
            await producer.stop()
    print(f"operator scenario: {time.monotonic() - began:.1f} s")


class _NoSends:
    async def send(self, timer: Timer) -> SendResult:
        raise AssertionError(f"nothing is sent here: {timer.request_id}")


async def test_a_resolve_another_node_wrote_brings_this_nodes_parked_timers_back(
    kafka_bootstrap: str,
) -> None:
    # The real broker's side of test_parked_names: node B resolves an entry that names a
    # timer PARKED on node A (a late copy of a request, there); A follows the tombstone
    # and records the timer again, so that both nodes' views name it.
    kafka = KafkaClients(kafka_bootstrap)
    context = f"names{int(time.time() * 1000)}"
    await kafka.admin().ensure_topics(
        [TopicSpec(ContextTopics(context).ledger, PARTITIONS, compacted=True)]
    )
    producer = Producer(kafka_bootstrap)
    await producer.start()
    a = KafkaFailureLedger(kafka, context, PARTITIONS, producer)
    b = KafkaFailureLedger(kafka, context, PARTITIONS, producer)
    store = open_timer_store("memory://", partitions=PARTITIONS)
    now = int(time.time() * 1000)
    runner = TimerRunner(store, _NoSends(), SystemClock(), a, partitions=[2])
    await a.start()
    await b.start()
    keeper = asyncio.create_task(keep_parked_named(a, lambda: [runner], after_s=0))
    try:
        target = AggregateRef(context=context, aggregate="invoice", id="i-1")
        pending = Timer(
            id="t-1",
            owner=AggregateRef(context=context, aggregate="order", id="o-1"),
            key="k-1",
            version=1,
            partition=2,
            rule=OnceRule(at=now),
            target=target,
            command=CommandSpec(type="billing.Remind"),
            slot_due_at=now,
            due_at=now,
        )
        assert await store.put(pending)
        parked = pending.model_copy(
            update={"status": TimerStatus.PARKED, "attempts": 5, "outcome": Outcome.FAILED}
        )
        assert await store.settle([TimerChange(loaded=pending, next=parked)]) == 1
        await a.record(SUB, target, [parked])

        async def b_names_it() -> bool:
            return [e.timers for e in await b.entries()] == [(parked.request_id,)]

        await eventually(b_names_it, 30, "node B following the park")
        assert await b.resolve(SUB, target)
        await eventually(lambda: _is_empty(b), 30, "B's tombstone")
        await eventually(b_names_it, 30, "the timer named again by A, as B reads it")
        assert [e.timers for e in await a.entries()] == [(parked.request_id,)]
        assert not keeper.done()
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        await b.stop()
        await a.stop()
        await producer.stop()
        await store.close()


async def _has_entry(ledger: KafkaFailureLedger, request_ids: set[str]) -> bool:
    entries = await ledger.entries()
    return len(entries) == 1 and bool(entries[0].timers) and set(entries[0].timers) <= request_ids


async def _is_empty(ledger: KafkaFailureLedger) -> bool:
    return await ledger.entries() == []
