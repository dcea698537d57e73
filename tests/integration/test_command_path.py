"""The command path on the real broker: every result code, dead letters, and not-before."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import Client, Cluster, eventually

from app.protocol.wire import SCHEDULE_SET, EventEnvelope, ResultCode, encode
from tables.partitioner import partition_of

pytestmark = pytest.mark.kafka


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(kafka_bootstrap, tmp_path, partitions=3, env={"TICKWHEEL_BUSY_BACKLOG": "400"})
    yield c
    c.stop_all()


@pytest.mark.kafka_next
async def test_result_codes_and_dedup(cluster: Cluster) -> None:
    async with Client(cluster) as client:
        w = cluster.start_worker()
        await cluster.wait_owned(w)
        now = int(time.time() * 1000)
        applied = client.command("a", "Apply", request_id="r-apply")
        again = client.command("a", "Apply", request_id="r-apply")
        early = client.command("a", "Apply", request_id="r-early", not_before=now + 3_600_000)
        rejected = client.command("b", "Reject", request_id="r-reject")
        noop = client.command("b", "Noop", request_id="r-noop")
        unknown = client.command("b", "NoSuchCommand", request_id="r-unknown")
        await client.send(applied)
        await client.wait_results(["r-apply"])
        await client.send(again, early, rejected, noop, unknown)
        results_by_id = await client.wait_results(
            ["r-apply", "r-early", "r-reject", "r-noop", "r-unknown"]
        )
        assert results_by_id["r-early"].code == ResultCode.SCHEDULE_NOT_DUE
        assert results_by_id["r-reject"].code == ResultCode.REJECTED
        assert results_by_id["r-reject"].message == "rejected on purpose"
        assert results_by_id["r-noop"].code == ResultCode.UNCHANGED
        assert results_by_id["r-unknown"].code == ResultCode.ERROR
        codes = [r.code for r in await client.all_results() if r.request_id == "r-apply"]
        assert codes == [ResultCode.COMMITTED, ResultCode.DUPLICATE]
        applied_events = [e for e in await client.events() if e.type == "Applied"]
        assert [e.request_id for e in applied_events] == ["r-apply"]


async def test_bad_input_is_dead_lettered_and_the_node_goes_on(cluster: Cluster) -> None:
    async with Client(cluster) as client:
        w = cluster.start_worker()
        await cluster.wait_owned(w)
        before = client.command("x", "Apply", request_id="before")
        after = client.command("x", "Apply", request_id="after")
        p = partition_of("x", cluster.partitions)
        await client.send(before)
        await client.send_raw(p, b"x", b"{not json")
        await client.send_raw(p, b"x", b'{"request_id": "r", "type": "Apply"}')
        await client.send_raw(p, b"x", b"x" * 300_000)
        other = client.command("x", "Apply", request_id="wrong-type")
        wrong = other.model_copy(
            update={"aggregate": other.aggregate.model_copy(update={"aggregate": "nope"})}
        )
        await client.send_raw(p, b"x", encode(wrong))
        await client.send(after)
        results = await client.wait_results(["before", "after"])
        assert results["before"].code == ResultCode.COMMITTED
        assert results["after"].code == ResultCode.COMMITTED
        assert results["after"].version == 2
        letters = await client.dead_letters()
        assert len(letters) == 4
        assert {d.offset for d in letters} == {1, 2, 3, 4}
        assert "not a valid CommandEnvelope" in letters[0].error
        assert "exceeds" in letters[2].error
        assert w.alive
        # The node counts what it skipped, by topic (once the batch that skipped it committed).
        await eventually(
            lambda: w.metric("tickwheel_dead_letters_total", topic=client.topics.commands) == 4,
            10,
            f"4 dead letters counted on {client.topics.commands}",
        )


async def test_records_outside_their_aggregates_partition_are_dead_lettered(
    cluster: Cluster,
) -> None:
    """kcat's default partitioner is not murmur2, and a null key goes anywhere: such a
    record would split an aggregate's log across two owners, so it is refused."""
    async with Client(cluster) as client:
        w = cluster.start_worker()
        await cluster.wait_owned(w)
        p = partition_of("m", cluster.partitions)
        wrong = (p + 1) % cluster.partitions
        far = int(time.time() * 1000) + 3_600_000
        schedule = EventEnvelope(
            id="ext-1",
            type=SCHEDULE_SET,
            aggregate=client.ref("m"),
            version=1,
            created_at=far - 3_600_000,
            body={"key": "k", "rule": {"kind": "once", "at": far}, "command": {"type": "Fire"}},
        )
        producer = client._producer
        await producer.send(client.topics.events, b"m", encode(schedule), wrong)
        await producer.send(client.topics.events, None, encode(schedule), p)
        await producer.send(client.topics.events, b"other", encode(schedule), p)
        await client.send_raw(wrong, b"m", encode(client.command("m", "Apply", request_id="w")))
        unknown = client.command("m", "NoSuchType", request_id="unknown")
        await client.send(unknown)
        results = await client.wait_results(["unknown"])
        assert results["unknown"].code == ResultCode.ERROR

        async def five() -> bool:
            return len(await client.dead_letters()) == 5

        await eventually(five, 30, "five dead letters")
        errors = sorted(d.error for d in await client.dead_letters())
        assert sum(f"belongs in partition {p}" in e for e in errors) == 2, errors
        assert sum("no key" in e for e in errors) == 1, errors
        assert sum("is not the aggregate id" in e for e in errors) == 1, errors
        assert sum("no handler for NoSuchType" in e for e in errors) == 1, errors
        assert await client.timers() == {}, "no timer from a misrouted ScheduleSet"
        # A misrouted command is not decided: answered ERROR (its reply address reads).
        misrouted = (await client.results())["w"]
        assert misrouted.code == ResultCode.ERROR, misrouted
        assert f"belongs in partition {p}" in misrouted.message, misrouted
        assert not [e for e in await client.events() if e.request_id == "w"]
        assert w.alive


async def test_an_overloaded_partition_answers_busy_and_applies_nothing_it_refused(
    cluster: Cluster,
) -> None:
    # The cluster's bound is 400 waiting commands per partition.
    async with Client(cluster) as client:
        w = cluster.start_worker()
        await cluster.wait_owned(w)
        burst = [client.command("hot", "Apply", request_id=f"b{i}") for i in range(3_000)]
        await client.send(*burst)
        results = await client.wait_results([c.request_id for c in burst], within=120)
        busy = {r for r, res in results.items() if res.code == ResultCode.BUSY}
        committed = {r for r, res in results.items() if res.code == ResultCode.COMMITTED}
        assert busy, "no BUSY under a burst 7x the bound"
        assert committed, "nothing processed"
        assert busy | committed == set(results)
        applied = {e.request_id for e in await client.events() if e.type == "Applied"}
        assert applied == committed
        assert "waiting (bound 400)" in next(iter(results[r] for r in busy)).message


async def test_http_health_metrics_and_errors(cluster: Cluster) -> None:
    import socket

    import aiohttp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with Client(cluster) as client:
        w = cluster.start_worker(TICKWHEEL_WEB_PORT=str(port))
        await cluster.wait_owned(w)
        await client.send(client.command("m", "Apply", request_id="m1"))
        await client.wait_results(["m1"])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                assert r.status == 200
                assert (await r.json())["owned"] == [0, 1, 2]
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
                assert 'tickwheel_commands_total{code="COMMITTED"' in text
                assert "tickwheel_owned_partitions 3.0" in text
            async with http.get(f"http://127.0.0.1:{port}/ledger") as r:
                assert await r.json() == {"entries": [], "more": 0}
            async with http.get(f"http://127.0.0.1:{port}/nope") as r:
                assert r.status == 404
                assert (await r.json())["error"] == "Not Found"
            async with http.post(f"http://127.0.0.1:{port}/healthz") as r:
                assert r.status == 405
