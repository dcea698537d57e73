"""`tickwheel timers show`: a timer's row now and its history, as the committed records of
the timers changelog hold them, against real workers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from harness import Client, Cluster, TimerJson, eventually
from typer.testing import CliRunner, Result

from app.cli import cli
from app.kafka import read_to_end
from tables import Timer, TimerStatus
from tables.keys import row_key
from tables.partitioner import partition_of

pytestmark = pytest.mark.kafka

PARTITIONS = 2


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(kafka_bootstrap, tmp_path, partitions=PARTITIONS)
    yield c
    c.stop_all()


async def show(cluster: Cluster, *args: str) -> Result:
    """The command in-process (in a thread: it runs its own event loop)."""
    argv = ["timers", "show", "--bootstrap", cluster.bootstrap, *args]
    return await asyncio.to_thread(CliRunner().invoke, cli, argv)


async def test_show_prints_a_timer_set_fired_and_set_again(cluster: Cluster) -> None:
    async with Client(cluster) as client:
        w = cluster.start_worker()
        await cluster.wait_owned(w)
        owner = client.ref("o-shown")
        soon: TimerJson = {
            "key": "remind",
            "rule": {"kind": "once", "at": int(time.time() * 1000) + 300},
        }
        first = client.command(owner.id, "Schedule", soon)
        other = client.command(owner.id, "Schedule", {**soon, "key": "other"})
        await client.send(first, other)
        await client.wait_results([first.request_id, other.request_id])

        async def row() -> Timer | None:
            return (await client.timers()).get(row_key(owner, "remind"))

        async def fired() -> bool:
            got = await row()
            return got is not None and got.status == TimerStatus.FIRED

        await eventually(fired, 30, "the timer fired")
        fired_row = await row()
        assert fired_row is not None
        later = int(time.time() * 1000) + 3_600_000
        again = client.command(
            owner.id, "Schedule", {"key": "remind", "rule": {"kind": "once", "at": later}}
        )
        await client.send(again)
        await client.wait_results([again.request_id])

        # The row follows from the event once the node reads it back from the log: a
        # transaction of its own, after the command's.
        async def set_again() -> bool:
            got = await row()
            return got is not None and got.status == TimerStatus.PENDING and got.id != fired_row.id

        await eventually(set_again, 30, "the timer set again")
        now = await row()
        assert now is not None

        # What the changelog's partition holds for the key, record by record.
        topic, p = client.topics.timers_changelog, partition_of(owner.id, PARTITIONS)
        records = [
            r
            async for batch in read_to_end(cluster.bootstrap, topic, p, 0)
            for r in batch
            if r.key == row_key(owner, "remind")
        ]
        as_json = await show(
            cluster, "--type", client.topics.type_name, "--owner", owner.id, "--key", "remind",
            "--json",
        )  # fmt: skip
        assert as_json.exit_code == 0, as_json.output
        versions = [orjson.loads(line) for line in as_json.stdout.splitlines()]
        assert [(v["partition"], v["offset"], v["timestamp"]) for v in versions] == [
            (p, r.offset, r.timestamp) for r in records
        ]
        rows = [Timer.model_validate(v["row"]) for v in versions]
        assert rows == [Timer.model_validate_json(r.value or b"") for r in records]
        assert {v["key"] for v in versions} == {"remind"}
        # Set, fired (its first row PENDING, a FIRED one later), then set again.
        assert rows[0].status == TimerStatus.PENDING and rows[0].id == fired_row.id
        assert fired_row in rows
        assert rows[-1] == now and rows[-1].due_at == later

        text = await show(
            cluster, "--type", client.topics.type_name, "--owner", owner.id, "--key", "remind"
        )
        assert text.exit_code == 0, text.output
        lines = text.stdout.splitlines()
        assert lines[0].startswith(f"{owner}: 1 timer(s) in {topic}[{p}]")
        assert lines[1].startswith("remind: PENDING\tslot 0\tdue ")
        assert [line.split("\t")[0] for line in lines[2:]] == [f"  @{r.offset}" for r in records]
        assert [line.split("\t")[2] for line in lines[2:]] == [str(r.status) for r in rows]

        # Without --key: all of the owner's timers; errors for what is not there.
        both = await show(cluster, "--type", client.topics.type_name, "--owner", owner.id)
        assert both.exit_code == 0 and both.stdout.startswith(f"{owner}: 2 timer(s)"), both.output
        unknown_key = await show(
            cluster, "--type", client.topics.type_name, "--owner", owner.id, "--key", "nope"
        )
        assert unknown_key.exit_code == 1
        assert f"{owner} has no timer 'nope' in {topic}[{p}] (its timers: other, remind)" in (
            unknown_key.stderr
        )
        nobody = await show(cluster, "--type", client.topics.type_name, "--owner", "nobody")
        assert nobody.exit_code == 1 and "has no timers in" in nobody.stderr, nobody.output
