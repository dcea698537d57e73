"""`tickwheel rebuild`: the timer table thrown away and replayed from the log equals the live
one, and timers that had fired are answered DUPLICATE rather than applied again; a dry run
changes nothing; the command follows the replay to its end, or stops following on Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import ROOT, Client, Cluster, OnceJson, TimerJson, eventually

from app.errors import GroupBusy, KafkaUnavailable
from app.kafka import GroupOffsets, KafkaClients, group_members, log_offsets, topic_names
from app.ops.rebuild import (
    plan_rebuild,
    rebuild,
)
from app.protocol.wire import EventEnvelope
from tables import AggregateRef, Outcome, TimerStatus

pytestmark = pytest.mark.kafka

PARTITIONS = 4


async def start_cli(cluster: Cluster, *args: str) -> asyncio.subprocess.Process:
    """`tickwheel <args>` in a process of its own, as an operator runs it (no terminal)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "integration"), str(ROOT)]),
        "KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap,
        "TICKWHEEL_PARTITIONS": str(cluster.partitions),
        "TICKWHEEL_GROUP_ID": cluster.group,
        "TW_TEST_CONTEXT": cluster.context,
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.cli",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finished(proc: asyncio.subprocess.Process, within: float) -> tuple[int, str, str]:
    """The process's exit code, stdout and stderr, once it exits (at most `within` s)."""
    out, err = await asyncio.wait_for(proc.communicate(), within)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def read_until(proc: asyncio.subprocess.Process, text: str, within: float) -> str:
    """What the process wrote to stdout up to the line holding `text` (at most `within` s)."""
    assert proc.stdout is not None
    lines: list[str] = []
    async with asyncio.timeout(within):
        while not lines or text not in lines[-1]:
            line = (await proc.stdout.readline()).decode()
            assert line, f"stdout ended before {text!r}: {''.join(lines)!r}"
            lines.append(line)
    return "".join(lines)


async def cluster_state(cluster: Cluster, client: Client) -> object:
    """What a rebuild changes: the topics, the changelog's offsets and rows, the group's
    offsets on the log."""
    t = client.topics
    async with GroupOffsets(cluster.bootstrap, cluster.group) as offsets:
        committed = await offsets.fetch((t.events, p) for p in range(cluster.partitions))
    return (
        await topic_names(cluster.bootstrap),
        await log_offsets(cluster.bootstrap, t.timers_changelog, cluster.partitions),
        await client.changelog_history(),
        committed,
    )


async def log_offsets_reset(cluster: Cluster, client: Client) -> bool:
    """Whether the group's offsets on every partition of the log are back at 0."""
    events = client.topics.events
    async with GroupOffsets(cluster.bootstrap, cluster.group) as offsets:
        committed = await offsets.fetch((events, p) for p in range(cluster.partitions))
    return set(committed.values()) == {0}


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(kafka_bootstrap, tmp_path, partitions=PARTITIONS)
    yield c
    c.stop_all()


@pytest.mark.kafka_next  # the group admin calls (reset, describe) on 4.x's coordinator
async def test_rebuild_from_the_log_equals_the_live_table(cluster: Cluster) -> None:
    async with Client(cluster) as client:
        w = cluster.start_worker("w")
        await cluster.wait_owned(w)
        now = int(time.time() * 1000)
        far: OnceJson = {"kind": "once", "at": now + 3_600_000}
        keys: list[tuple[AggregateRef, str]] = []
        first = []
        for i in range(40):
            timers: list[TimerJson] = [{"key": "far", "rule": far}, {"key": "moved", "rule": far}]
            if i % 10 != 3:
                # The log does not say a timer fired: one that fired and was then cancelled
                # by its owner's deletion is rebuilt CANCELLED, so deleted owners fire none.
                timers.append({"key": "soon", "rule": {"kind": "once", "at": now + 1_000}})
            keys += [(client.ref(f"o{i}"), t["key"]) for t in timers]
            first.append(client.command(f"o{i}", "ScheduleMany", {"timers": timers}))
        await client.send(*first)
        await client.wait_results([c.request_id for c in first])
        later = []
        for i in range(40):
            moved: TimerJson = {"key": "moved", "rule": {"kind": "once", "at": now + 7_200_000}}
            later.append(client.command(f"o{i}", "Schedule", moved))
            if i % 4 == 0:
                later.append(client.command(f"o{i}", "Unschedule", {"keys": ["far"]}))
            if i % 10 == 3:
                later.append(client.command(f"o{i}", "Delete", {}))
        await client.send(*later)
        await client.wait_results([c.request_id for c in later])

        async def soon_fired() -> bool:
            latest = await client.timers()
            soon = [t for t in latest.values() if t.key == "soon"]
            return len(soon) == 36 and all(t.status != TimerStatus.PENDING for t in soon)

        await eventually(soon_fired, 60, "the soon timers fired")
        with pytest.raises(GroupBusy, match="stop them"):
            await rebuild(KafkaClients(cluster.bootstrap), cluster.group, [client.topics])
        busy = await finished(
            await start_cli(cluster, "rebuild", "--type", client.topics.type_name, "--dry-run"), 60
        )
        assert busy[0] == 1, busy
        assert f"group {cluster.group} has 1 running worker(s): the rebuild would refuse" in busy[2]
        assert w.stop() == 0
        live = await cluster.local_rows(w, keys)

        async def group_empty() -> bool:
            return await group_members(cluster.bootstrap, cluster.group) == 0

        await eventually(group_empty, 30, "the stopped worker left the group")

        # A dry run says what the rebuild will do, offset by offset, and changes nothing.
        state = await cluster_state(cluster, client)
        code, out, err = await finished(
            await start_cli(cluster, "rebuild", "--type", client.topics.type_name, "--dry-run"), 60
        )
        assert code == 0, out + err
        assert await cluster_state(cluster, client) == state
        plan = await plan_rebuild(KafkaClients(cluster.bootstrap), cluster.group, [client.topics])
        t = client.topics
        for part in plan.types[0].partitions:
            p = part.partition
            assert part.changelog_end > 0
            # The stopped worker had read its log to the end: what it committed is where
            # a replay ends (past the last record, not past the commit marker after it).
            assert part.committed == part.replay.end > 0
            assert (
                f"{t.timers_changelog}[{p}]: delete the records before offset "
                f"{part.changelog_end} " in out
            )
            assert (
                f"{t.events}[{p}]: set the committed offset {part.committed} to 0; the replay "
                f"ends when the group commits offset {part.replay.end} " in out
            )
        assert f"group {cluster.group} has no running worker: the rebuild may run" in out
        total = sum(span.size for span in plan.spans().values())

        # The rebuild itself, followed until the worker started after it has replayed.
        proc = await start_cli(cluster, "rebuild", "--type", client.topics.type_name)
        await eventually(lambda: log_offsets_reset(cluster, client), 60, "the rebuild reset")

        async def changelog_emptied() -> bool:
            # The offsets are set back first, then the changelog emptied: a read between
            # the two sees it whole, one during its deletion may find its start moved.
            try:
                return await client.timers() == {}
            except KafkaUnavailable:
                return False

        await eventually(changelog_emptied, 60, "the rebuild emptied the changelog")
        again = cluster.start_worker("w")  # the same data directory: its copy is stale
        code, out, err = await finished(proc, 90)
        assert code == 0, out + err
        assert "\x1b" not in out and "\r" not in out, "control codes off a terminal"
        assert f"replayed {total:,} of {total:,} log offsets (100%)" in out
        assert out.rstrip().endswith(
            f"replay complete: {total:,} log offsets; the timer tables are rebuilt"
        )
        # The replay is over when the command says so: every row the log makes is there.
        want = {k for k, t in live.items() if t is not None}
        latest = {(t.owner.id, t.key) for t in (await client.timers()).values()}
        assert want <= latest

        async def replayed() -> bool:
            latest = {(t.owner.id, t.key): t for t in (await client.timers()).values()}
            return want <= set(latest) and all(
                latest[k].status not in (TimerStatus.PENDING, TimerStatus.FIRING)
                for k in want
                if k[1] == "soon"
            )

        await eventually(replayed, 90, "the fired timers were sent again")
        assert again.stop() == 0
        rebuilt = await cluster.local_rows(again, keys)
        for k, before in live.items():
            after = rebuilt[k]
            if before is None or k[1] != "soon" or before.status != TimerStatus.FIRED:
                assert after == before, k
            else:
                # Fired before the rebuild: sent again, and the target had it already. A FIRED
                # row's due_at is its last claim's deadline, which is of the replay's time.
                assert after is not None
                same = {"outcome", "due_at"}
                assert after.model_dump(exclude=same) == before.model_dump(exclude=same)
                assert after.outcome == Outcome.DUPLICATE
        fired = Counter(e.request_id for e in await client.events() if e.type == "Fired")
        assert fired and max(fired.values()) == 1


async def test_rebuild_stops_following_on_ctrl_c_or_at_once_with_no_wait(cluster: Cluster) -> None:
    async with Client(cluster) as client:
        # A log no worker has read: the replay cannot move until one starts.
        await client.write_events(
            *[
                EventEnvelope(
                    id=f"e{i}",
                    type="Applied",
                    aggregate=client.ref(f"o{i}"),
                    version=1,
                    created_at=int(time.time() * 1000),
                    body={"n": 1},
                )
                for i in range(20)
            ]
        )
        proc = await start_cli(cluster, "rebuild", "--type", client.topics.type_name)
        # Ctrl-C once it follows: one sent in the reset (the offsets reset, the partition
        # count still being written) ends it after the reset, without following.
        before = await read_until(proc, "following the replay", 60)
        assert await log_offsets_reset(cluster, client)
        proc.send_signal(signal.SIGINT)
        code, out, err = await finished(proc, 30)
        out = before + out
        assert code == 130, out + err
        assert "following the replay" in out
        assert "the rebuild is done and the workers replay on" in err
        assert "Traceback" not in err

        code, out, err = await finished(
            await start_cli(cluster, "rebuild", "--type", client.topics.type_name, "--no-wait"), 60
        )
        assert code == 0, out + err
        assert "following" not in out
        assert out.rstrip().endswith(
            "timer tables emptied; the workers replay the log when they start"
        )
        assert await log_offsets_reset(cluster, client)
