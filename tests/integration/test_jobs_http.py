"""A job enabled and triggered over a real worker's web edge (#22): the trigger, sent twice
under one request id, runs the job once; the writes need the web token; the list reads
the instance's state from the broker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import tw_jobs
from harness import Cluster, Worker, eventually

from app.jobs import TRIGGERED_SLOT
from app.kafka import read_partitions
from app.protocol.topics import AggregateTopics
from app.protocol.wire import EventEnvelope, decode

pytestmark = pytest.mark.kafka

TOKEN = "itest-token"


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(kafka_bootstrap, tmp_path, partitions=2, service="tw_jobs:service")
    yield c
    c.stop_all()


async def call(
    worker: Worker, method: str, path: str, body: Any = None, token: str | None = TOKEN
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, f"http://127.0.0.1:{worker.port}{path}", json=body, headers=headers
        ) as r,
    ):
        return r.status, await r.json()


async def ran(cluster: Cluster) -> list[dict[str, Any]]:
    """The bodies of every `Ran` the job runs sent, in log order per partition."""
    topic = AggregateTopics(cluster.context, tw_jobs.RUNS).events
    out = []
    async for batch in read_partitions(cluster.bootstrap, topic, range(cluster.partitions)):
        out += [decode(EventEnvelope, r.value).body for r in batch if r.value]
    return out


async def test_a_job_triggered_over_http_runs_once(cluster: Cluster) -> None:
    ctx = cluster.context
    # Its rule's slots an hour apart: the only run in the test is the triggered one.
    w = cluster.start_worker(TICKWHEEL_WEB_TOKEN=TOKEN, TW_JOB_EVERY_MS="3600000")
    await cluster.wait_owned(w)
    path = f"/jobs/{ctx}/{tw_jobs.heartbeat.name}"

    status, answer = await call(w, "POST", f"{path}/trigger", {}, token=None)
    assert status == 401, answer
    status, enabled = await call(w, "POST", f"{path}/enable", {"request_id": f"on-{ctx}"})
    assert (status, enabled["outcomes"][0]["code"]) == (200, "COMMITTED"), enabled

    trigger = {"request_id": f"by-hand-{ctx}"}
    status, first = await call(w, "POST", f"{path}/trigger", trigger)
    assert (status, first["outcomes"][0]["code"]) == (200, "COMMITTED"), first
    status, second = await call(w, "POST", f"{path}/trigger", trigger)
    assert (status, second["outcomes"][0]["code"]) == (200, "DUPLICATE"), second

    async def triggered() -> list[dict[str, Any]]:
        return [r for r in await ran(cluster) if r["slot"] == TRIGGERED_SLOT]

    async def has_run() -> bool:
        return bool(await triggered())

    await eventually(has_run, 30, "the triggered run's Ran", 0.5)
    # The second trigger was decided DUPLICATE before it was answered: it sent nothing.
    # Its request id is the action's own, named from the caller's (`action_request_id`).
    assert [r["tick"] for r in await triggered()] == [f"trigger:by-hand-{ctx}"]

    status, listed = await call(w, "GET", f"/jobs?job={tw_jobs.heartbeat.name}&state=true")
    assert status == 200, listed
    (job,) = listed["jobs"]
    (state,) = job["state"]
    assert state["enabled"] is True and state["job"] == tw_jobs.heartbeat.name
