"""A command whose target's topic does not exist (a typo'd target type, a context not
deployed yet), on a whole node on the in-memory log (which refuses a write to a topic it
does not have, as a broker without `auto.create.topics.enable` does after the client's
metadata wait). Whether sent by a decision in the partition's transaction (a timer book's
trigger) or by the runner (a timer firing into another context), it is that one command's
failure, NO_TARGET, said where it is looked for; the partition never fails over it and goes
on; and once the topic exists, a retry sends it.

The node, its web edge and the clock are `test_timer_api`'s fixtures, imported (hence F811:
a test's argument named as the fixture it takes)."""

# ruff: noqa: F811

from __future__ import annotations

import asyncio
import time
from typing import Any

from fakes import T0
from test_timer_api import Edge, P, edge, rows, until  # noqa: F401

from app.protocol.wire import CommandEnvelope, decode
from tables import TimerStatus

NO_TARGET = "NO_TARGET"  # `app.kafka.catalog.NO_TARGET`

PATH = "/timers/shop.reminders/o-1"
MISSING = "shop.nosuch.commands"
ELSEWHERE = "billing.nosuch.commands"


def timer(at: int, target_type: str) -> dict[str, Any]:
    return {
        "rule": {"kind": "once", "at": at},
        "target": {"type": target_type, "id": "x-1"},
        "command": {"type": "Nudge", "body": {}},
    }


def sent_to(edge: Edge, topic: str) -> list[CommandEnvelope]:
    return [
        decode(CommandEnvelope, r.value)
        for p in range(edge.log.partitions(topic))
        for r in edge.log.records(topic, p)
    ]


def no_targets(edge: Edge) -> float:
    return edge.node.metrics.registry.get_sample_value("tickwheel_no_target_sends_total") or 0.0


async def trigger(edge: Edge, key: str, request_id: str) -> tuple[int, Any]:
    return await edge.call("POST", f"{PATH}/{key}/trigger", headers={"Idempotency-Key": request_id})


async def test_a_trigger_into_a_missing_topic_is_answered_error_and_the_partition_goes_on(
    edge: Edge,
) -> None:
    assert (await edge.call("PUT", f"{PATH}/typo", timer(T0 + 3_600_000, "shop.nosuch")))[0] == 200

    began = time.monotonic()
    status, answer = await trigger(edge, "typo", "t-1")
    # Answered at once, not after the edge's wait (the partition failing it again and again).
    assert (status, answer["code"]) == (502, "ERROR"), answer
    assert time.monotonic() - began < 4.0
    assert NO_TARGET in answer["message"] and MISSING in answer["message"], answer
    assert no_targets(edge) >= 1

    # The partition did not fail over it, and goes on: the same owner's next change is
    # decided, and nothing was ever staged for the missing topic.
    health = edge.node.health()
    assert "failing" not in health and health["stalled"] == {}, health
    assert (await edge.call("PUT", f"{PATH}/next", timer(T0 + 3_600_000, "shop.order")))[0] == 200
    assert {t.key for t in rows(edge.log)} == {"typo", "next"}
    assert edge.node.metrics.registry.get_sample_value("tickwheel_owned_partitions") == P

    # The context deployed: the same request id, decided again (it was never applied),
    # sends the command once.
    edge.log.create_topic(MISSING, P)
    edge.clock.set(T0 + 2_000)  # the list of topics is listed again on the next miss
    deadline = time.monotonic() + 10
    while True:
        status, answer = await trigger(edge, "typo", "t-1")
        if answer["code"] == "COMMITTED":
            break
        assert answer["code"] == "ERROR" and time.monotonic() < deadline, answer
        await asyncio.sleep(0.05)
    await until(lambda: [c.request_id for c in sent_to(edge, MISSING)] == ["t-1>0"])


async def test_a_timer_fired_into_a_missing_topic_fails_as_no_target_and_retries_once_it_exists(
    edge: Edge,
) -> None:
    assert (await edge.call("PUT", f"{PATH}/away", timer(T0 + 1_000, "billing.nosuch")))[0] == 200
    await until(lambda: len(rows(edge.log)) == 1)
    edge.clock.set(T0 + 1_000)
    await until(lambda: [t.outcome for t in rows(edge.log)] == ["FAILED"])
    (failed,) = rows(edge.log)
    assert (failed.status, failed.attempts, failed.error_code) == (
        TimerStatus.PENDING,
        1,
        NO_TARGET,
    )
    assert failed.error_text is not None and ELSEWHERE in failed.error_text
    assert no_targets(edge) >= 1
    assert "failing" not in edge.node.health()

    # Deployed before the retry is due: the retry sends it, once.
    edge.log.create_topic(ELSEWHERE, P)
    edge.clock.set(failed.due_at)
    await until(lambda: [t.status for t in rows(edge.log)] == [TimerStatus.FIRED])
    assert [c.request_id for c in sent_to(edge, ELSEWHERE)] == [failed.request_id]
    (fired,) = rows(edge.log)
    assert (fired.error_code, fired.error_text) == (None, None)
