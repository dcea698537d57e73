"""A real worker's /metrics: the timer metrics measured on both firing paths, and every
metric the Grafana dashboard queries exported (the dashboard cannot drift from the code).

One timer fires in-process (its owner is its target), one through the command topic (its
target is in another partition): both lateness observations are made when the
transaction that applied the command committed.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import dashboard_metrics, exported
from harness import Client, Cluster, Worker, eventually

from tables.partitioner import partition_of

pytestmark = pytest.mark.kafka

PARTITIONS = 3


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(kafka_bootstrap, tmp_path, partitions=PARTITIONS)
    yield c
    c.stop_all()


def scrape(worker: Worker) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/metrics", timeout=5) as r:
        body: bytes = r.read()
        return body.decode()


def value(text: str, series: str) -> float | None:
    """The sample of `series` (its name and labels exactly as exposed)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_workers_metrics_measure_both_firing_paths_and_feed_the_dashboard(
    cluster: Cluster,
) -> None:
    async with Client(cluster) as client:
        owner = "m-owner"
        home = partition_of(owner, PARTITIONS)
        away = next(
            f"m-target-{i}" for i in range(100) if partition_of(f"m-target-{i}", PARTITIONS) != home
        )
        w = cluster.start_worker()
        await cluster.wait_owned(w)
        at = int(time.time() * 1000) + 1_500
        rule = {"kind": "once", "at": at}
        await client.send(
            client.command(owner, "Schedule", {"key": "here", "rule": rule}, request_id="s1"),
            client.command(
                owner,
                "Schedule",
                {"key": "there", "rule": rule, "target": client.ref(away).model_dump()},
                request_id="s2",
            ),
        )

        async def both_fired() -> bool:
            fired = {e.aggregate.id for e in await client.events() if e.type == "Fired"}
            return fired == {owner, away}

        await eventually(both_fired, 60, "both timers fired")

        series = f'tickwheel_timer_lateness_seconds_count{{type="{cluster.context}.counter"}}'

        def measured() -> bool:
            count = value(scrape(w), series)
            return count is not None and count >= 2

        # Measured at the commit, which may follow the event's visibility by a moment.
        await eventually(measured, 30, "both latenesses measured")
        text = scrape(w)

    type_ = f"{cluster.context}.counter"
    count = value(text, series)
    total = value(text, f'tickwheel_timer_lateness_seconds_sum{{type="{type_}"}}')
    assert count == 2, text
    # Applied no earlier than due (the target refuses before), and not a minute late.
    assert total is not None and 0 <= total < 60, total
    fired = value(text, f'tickwheel_timer_actions_total{{action="fired",type="{type_}"}}')
    assert fired == 2, "one settled in-process, one from its target's result"
    assert value(text, f'tickwheel_timer_puts_total{{type="{type_}"}}') == 2
    for p in range(PARTITIONS):
        labels = f'partition="{p}",status="pending",type="{type_}"'
        assert value(text, f"tickwheel_timers{{{labels}}}") == 0, "both fired: none pending"
        restored = f'partition="{p}",store="timers",type="{type_}"'
        read = value(text, f"tickwheel_restore_records_read{{{restored}}}")
        assert read == value(text, f"tickwheel_restore_records_to_read{{{restored}}}")
    assert value(text, f'tickwheel_timer_backlog{{type="{type_}"}}') == 0
    assert (value(text, f'tickwheel_commit_duration_seconds_count{{type="{type_}"}}') or 0) > 0

    missing = dashboard_metrics() - exported(text)
    assert not missing, f"the dashboard queries metrics the worker does not export: {missing}"
