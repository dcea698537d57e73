"""A command into a topic the broker does not have (the test broker, as production's, runs
with `auto.create.topics.enable=false`), against a real worker: a timer book's trigger of a
timer whose target type is a typo is answered ERROR at once, naming the topic (not after
the client's 40 s metadata wait, and without failing the book's partition again and again);
a timer firing into a context not deployed fails as NO_TARGET; the worker goes on; and once
the topic exists, the trigger sent again goes through, and no topic was created by any of
it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Client, Cluster, book_cluster, eventually, web_call
from kafka_broker import create_topics

from app.kafka import topic_names

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_next]


@pytest.fixture
def cluster(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Cluster]:
    yield from book_cluster(kafka_bootstrap, tmp_path)


async def test_a_command_into_a_missing_topic_is_no_target_and_the_worker_goes_on(
    cluster: Cluster,
) -> None:
    ctx = cluster.context
    missing, elsewhere = f"{ctx}.nosuch.commands", f"{ctx}x.billing.commands"
    w = await cluster.web_worker()
    now = int(time.time() * 1000)
    path = f"/timers/{ctx}.book/b-1"

    def put(at: int, target_type: str, target: str) -> dict[str, Any]:
        return {
            "rule": {"kind": "once", "at": at},
            "target": {"type": target_type, "id": target},
            "command": {"type": "Fire"},
        }

    assert (await web_call(w, "PUT", f"{path}/typo", put(now + 3_600_000, f"{ctx}.nosuch", "n-1")))[
        0
    ] == 200
    began = time.monotonic()
    status, answer = await web_call(w, "POST", f"{path}/typo/trigger", **{"Idempotency-Key": "t-1"})
    assert (status, answer["code"]) == (502, "ERROR"), answer
    assert "NO_TARGET" in answer["message"] and missing in answer["message"], answer
    assert time.monotonic() - began < 20, "answered after a metadata wait"
    assert w.metric("tickwheel_no_target_sends_total") >= 1

    # A timer into a context not deployed: its attempt fails as NO_TARGET, retried.
    assert (await web_call(w, "PUT", f"{path}/away", put(now + 2_000, f"{ctx}x.billing", "b-9")))[
        0
    ] == 200
    async with Client(cluster, "book") as books:

        async def failed_no_target() -> bool:
            rows = {t.key: t for t in (await books.timers()).values()}
            away = rows.get("away")
            return away is not None and away.error_code == "NO_TARGET"

        await eventually(failed_no_target, 60, "the timer's attempt failed as NO_TARGET")
        away = {t.key: t for t in (await books.timers()).values()}["away"]
        assert away.error_text is not None and elsewhere in away.error_text

    # The book's partition never failed over either: the same owner's next change is decided.
    health = w.health()
    assert health is not None and "failing" not in health, health
    assert (
        await web_call(w, "PUT", f"{path}/next", put(now + 3_600_000, f"{ctx}.counter", "c-1"))
    )[0] == 200
    assert not {missing, elsewhere} & await topic_names(cluster.bootstrap), "a topic was created"

    # Deployed: the trigger sent again (its request id was never applied) goes through.
    await create_topics(cluster.bootstrap, [missing], 2)

    async def triggered() -> bool:
        _, answer = await web_call(w, "POST", f"{path}/typo/trigger", **{"Idempotency-Key": "t-1"})
        assert answer["code"] in ("ERROR", "COMMITTED"), answer
        return bool(answer["code"] == "COMMITTED")

    await eventually(triggered, 60, "the trigger went through once the topic existed", 1.0)
