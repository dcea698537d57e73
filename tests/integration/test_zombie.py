"""A frozen owner that thaws beside the new one commits nothing and sends nothing (DESIGN.md,
invariant 6): a claim is committed before its command leaves the node, and a timer fired
in-process commits with its claim, so a fenced owner can do neither."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import Client, Cluster, eventually, owned, sleep_until

from tables.partitioner import partition_of

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_next]

PARTITIONS = 4


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(kafka_bootstrap, tmp_path, partitions=PARTITIONS)
    yield c
    c.stop_all()


def elsewhere(owner: str) -> str:
    """An aggregate id in another partition than `owner`'s: its timer is sent remotely."""
    mine = partition_of(owner, PARTITIONS)
    return next(
        f"{owner}-t{i}" for i in range(100) if partition_of(f"{owner}-t{i}", PARTITIONS) != mine
    )


async def test_a_thawed_owner_never_applies_a_timer_the_new_owner_cancelled(
    cluster: Cluster,
) -> None:
    async with Client(cluster) as client:
        old = cluster.start_worker("old")
        await cluster.wait_owned(old)
        due = int(time.time() * 1000) + 25_000
        owners = [f"o{i}" for i in range(24)]
        sentinels = [
            next(
                f"later-{p}-{i}"
                for i in range(1000)
                if partition_of(f"later-{p}-{i}", PARTITIONS) == p
            )
            for p in range(PARTITIONS)
        ]
        schedule = [
            client.command(
                owner,
                "ScheduleMany",
                {
                    "timers": [
                        {"key": "local", "rule": {"kind": "once", "at": due}},
                        {
                            "key": "remote",
                            "rule": {"kind": "once", "at": due},
                            "target": client.ref(elsewhere(owner)).model_dump(),
                        },
                    ]
                },
            )
            for owner in owners
        ]
        await client.send(*schedule)
        await client.wait_results([c.request_id for c in schedule])

        async def all_pending() -> bool:
            rows = await client.timers()
            return len(rows) == 2 * len(owners)

        await eventually(all_pending, 30, "the old owner keeps every timer")
        # The old owner freezes with every timer in its wheel; the group moves on.
        old.freeze()
        new = cluster.start_worker("new")
        await eventually(lambda: len(owned(new)) == PARTITIONS, 60, "new owner has everything")
        cancel = [client.command(o, "Unschedule", {"keys": ["local", "remote"]}) for o in owners]
        # A timer in each partition due just after the cancelled ones, which nobody cancels:
        # once the old owner applied them all, its loop had passed the cancelled ones' due time.
        later = [
            client.command(
                sentinel,
                "Schedule",
                {"key": "later", "rule": {"kind": "once", "at": due + 500}},
            )
            for sentinel in sentinels
        ]
        await client.send(*cancel, *later)
        await client.wait_results([c.request_id for c in [*cancel, *later]])
        assert time.time() * 1000 < due, "cancelled before the due time (machine too slow)"
        # Stop the new owner too, so that only the old one could fire, then wake the old one
        # once everything is due: its stale table still holds every timer PENDING.
        assert new.stop() == 0
        await sleep_until(due + 1_000)  # everything is due
        old.thaw()
        # It knows at once that it was stopped for longer than its session: not ready
        # (not a 200 for the partitions it no longer owns) until the group answers.
        thawed = old.health(timeout=10)
        assert thawed is not None and not thawed["ready"], thawed
        assert thawed["suspended_s"] > 6, thawed
        # Fenced, it lets its partitions go; back in the group alone, it takes them again
        # from the changelog, where the timers are cancelled.
        await eventually(
            lambda: (h := old.health()) is not None and h["ready"] and len(h["owned"]) == 4,
            60,
            "the old owner took its partitions again",
        )

        async def later_fired() -> bool:
            events = await client.events()
            return {e.aggregate.id for e in events if e.type == "Fired"} >= set(sentinels)

        await eventually(later_fired, 60, "the old owner applied the later timers")
        events = await client.events()
        fired = [e for e in events if e.type == "Fired" and e.aggregate.id not in sentinels]
        assert fired == [], f"{len(fired)} cancelled timer(s) applied by the fenced owner"
        assert old.alive, old.text()[-3000:]
