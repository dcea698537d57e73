"""Timers set, cancelled, paused, resumed and triggered through a timer book against a real
worker: one set by HTTP (`PUT /timers/{type}/{owner}/{key}`, with the web token) fires
once, a PUT sent again with its request id writes nothing, and one cancelled by
`tickwheel timers cancel` (another process, as an operator runs it) never fires; one
paused by HTTP fires nothing past its slot until `timers resume` catches it up, and a
trigger sent twice with one request id fires once."""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import Client, Cluster, book_cluster, eventually, sent_base, web_call
from kafka_broker import create_topics

from app.kafka import topic_names
from tables import TimerStatus

pytestmark = pytest.mark.kafka


@pytest.fixture
def cluster(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Cluster]:
    yield from book_cluster(kafka_bootstrap, tmp_path)


async def test_a_timer_set_by_http_fires_once_and_one_cancelled_by_the_cli_never(
    cluster: Cluster,
) -> None:
    ctx = cluster.context
    w = await cluster.web_worker()
    now = int(time.time() * 1000)

    def put(at: int, target: str, request_id: str) -> dict[str, Any]:
        return {
            "rule": {"kind": "once", "at": at},
            "target": {"type": f"{ctx}.counter", "id": target},
            "command": {"type": "Fire"},
            "request_id": request_id,
        }

    # Due first, and cancelled before then: were the cancel lost, it would fire first.
    status, cancelled = await web_call(
        w, "PUT", f"/timers/{ctx}.book/b-2/later", put(now + 15_000, "c-2", "set-later")
    )
    assert status == 200 and cancelled["code"] == "COMMITTED", cancelled
    status, answer = await web_call(
        w, "PUT", f"/timers/{ctx}.book/b-1/soon", put(now + 20_000, "c-1", "set-soon")
    )
    assert status == 200 and answer["code"] == "COMMITTED", answer
    again = await web_call(
        w, "PUT", f"/timers/{ctx}.book/b-1/soon", put(now + 20_000, "c-1", "set-soon")
    )
    assert again[0] == 200 and again[1]["code"] == "DUPLICATE", again
    assert again[1]["version"] == answer["version"]

    code, out, err, _ = await cluster.run_cli(
        [
            "timers",
            "cancel",
            "--type",
            f"{ctx}.book",
            "--owner",
            "b-2",
            "--key",
            "later",
            "--request-id",
            "cancel-later",
        ]
    )
    assert code == 0, (out, err)
    assert out.startswith(f"cancel {ctx}.book/(0)/b-2 'later': COMMITTED (request cancel-later")
    code, out, err, _ = await cluster.run_cli(
        [
            "timers",
            "cancel",
            "--type",
            f"{ctx}.book",
            "--owner",
            "b-2",
            "--key",
            "later",
            "--request-id",
            "cancel-later",
        ]
    )
    assert code == 0 and "DUPLICATE before by this request id: nothing written" in out, err

    async with Client(cluster, "book") as books, Client(cluster) as counters:

        async def settled() -> bool:
            rows = {t.key: t.status for t in (await books.timers()).values()}
            return rows == {"later": TimerStatus.CANCELLED, "soon": TimerStatus.FIRED}

        await eventually(settled, 60, "the set timer fired and the cancelled one did not")
        fired = [e for e in await counters.events() if e.type == "Fired"]
        assert [e.aggregate.id for e in fired] == ["c-1"]
        book_events = [e.type for e in await books.events()]
        assert sorted(book_events) == [
            "wow.ScheduleCancelled",
            "wow.ScheduleSet",
            "wow.ScheduleSet",
        ]
    # The only worker keeps every partition: it shows the row its table has.
    status, shown = await web_call(w, "GET", f"/timers/{ctx}.book/b-1/soon")
    assert status == 200, shown
    assert shown["status"] == "FIRED" and shown["target"]["id"] == "c-1"


async def test_a_paused_timer_fires_nothing_until_resumed_and_a_trigger_fires_once(
    cluster: Cluster,
) -> None:
    ctx = cluster.context
    w = await cluster.web_worker()
    now = int(time.time() * 1000)
    path = f"/timers/{ctx}.book/b-1/tick"

    def put(rule: dict[str, Any], target: str) -> dict[str, Any]:
        return {"rule": rule, "target": {"type": f"{ctx}.counter", "id": target},
                "command": {"type": "Fire"}}  # fmt: skip

    # Slot 0 at now + 6 s, then hourly; paused before it comes.
    hourly = {"kind": "interval", "start": now + 6_000, "every": 3_600_000}
    assert (await web_call(w, "PUT", path, put(hourly, "c-1")))[0] == 200
    status, paused = await web_call(w, "POST", f"{path}/pause", **{"Idempotency-Key": "pause-1"})
    assert status == 200 and paused["code"] == "COMMITTED", paused
    again = await web_call(w, "POST", f"{path}/pause", **{"Idempotency-Key": "pause-2"})
    assert again[0] == 200 and again[1]["code"] == "UNCHANGED", again
    # A timer due after slot 0, not paused: once it fired, slot 0's time has passed.
    control = {"kind": "once", "at": now + 9_000}
    assert (await web_call(w, "PUT", f"/timers/{ctx}.book/b-1/control", put(control, "c-2")))[
        0
    ] == 200

    async with Client(cluster, "book") as books, Client(cluster) as counters:

        async def status_of(key: str) -> TimerStatus | None:
            rows = {t.key: t for t in (await books.timers()).values()}
            return rows[key].status if key in rows else None

        async def fired_to(target: str) -> list[str]:
            return [
                e.request_id or ""
                for e in await counters.events()
                if e.type == "Fired" and e.aggregate.id == target
            ]

        async def control_fired() -> bool:
            return await status_of("control") is TimerStatus.FIRED

        await eventually(control_fired, 60, "the control timer fired")
        assert await status_of("tick") is TimerStatus.PAUSED
        assert await fired_to("c-1") == [], "a paused timer fired"
        shown = await web_call(w, "GET", path)
        assert shown[0] == 200 and shown[1]["status"] == "PAUSED", shown

        code, out, err, _ = await cluster.run_cli(
            ["timers", "resume", "--type", f"{ctx}.book", "--owner", "b-1", "--key", "tick",
             "--request-id", "resume-1"]
        )  # fmt: skip
        assert code == 0 and f"resume {ctx}.book/(0)/b-1 'tick': COMMITTED" in out, (out, err)

        async def slot_0_fired() -> bool:
            return len(await fired_to("c-1")) == 1

        await eventually(slot_0_fired, 60, "the resumed timer fired its slot 0")
        (first,) = await fired_to("c-1")
        assert first.endswith("#0")

        trigger = ["timers", "trigger", "--type", f"{ctx}.book", "--owner", "b-1", "--key",
                   "tick", "--request-id", "trigger-1"]  # fmt: skip
        code, out, err, _ = await cluster.run_cli(trigger)
        assert code == 0 and "COMMITTED" in out, (out, err)
        code, out, err, _ = await cluster.run_cli(trigger)
        assert code == 0 and "DUPLICATE" in out, (out, err)
        status, second = await web_call(
            w, "POST", f"{path}/trigger", **{"Idempotency-Key": "trigger-2"}
        )
        assert status == 200 and second["code"] == "COMMITTED", second

        async def triggered_twice() -> bool:
            return len(await fired_to("c-1")) == 3

        await eventually(triggered_twice, 60, "each trigger fired once")
        assert sorted(map(sent_base, (await fired_to("c-1"))[1:])) == ["trigger-1>0", "trigger-2>0"]
        # The rule is as it was: its next slot is an hour on, PENDING.
        rows = {t.key: t for t in (await books.timers()).values()}
        assert (rows["tick"].status, rows["tick"].slot) == (TimerStatus.PENDING, 1)
        assert rows["tick"].slot_due_at == now + 6_000 + 3_600_000
        book_events = sorted(e.type for e in await books.events())
        assert book_events.count("wow.SchedulePaused") == 1
        assert book_events.count("wow.ScheduleResumed") == 1
        assert book_events.count("wow.ScheduleTriggered") == 2


def docs_lines(command: str) -> list[str]:
    """docs/operations.md's `tickwheel timers <command> …` line, every optional part given,
    as its words."""
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    (span,) = re.findall(rf"`(tickwheel timers {command} [^`]+)`", text)
    words = shlex.split(" ".join(span.split()))
    return [w.removeprefix("[").removesuffix("]") for w in words[1:]]


async def test_the_docs_set_and_cancel_lines_run_as_written(cluster: Cluster) -> None:
    """In this test's context for `shop`, and without the (PLAINTEXT) broker's setup."""
    ctx = cluster.context
    # The trigger's command goes to the timer's target type, which no worker here runs:
    # its topic is there before the worker starts (it lists the topics then, and refuses
    # a command into one its list has not, NO_TARGET, until it lists them again).
    await create_topics(cluster.bootstrap, [f"{ctx}.order.commands"], 2)
    w = cluster.start_worker()
    await cluster.wait_owned(w)
    for command in ("set", "pause", "resume", "trigger", "cancel"):
        args = [a.replace("shop.", f"{ctx}.") for a in docs_lines(command)]
        code, out, err, _ = await cluster.run_cli(args)
        assert code == 0, (args, out, err)
        assert orjson.loads(out)["code"] == "COMMITTED", out  # the line gives --json
    # A book no worker runs: refused, naming its topic, and nothing created.
    before = await topic_names(cluster.bootstrap)
    missing = [a.replace("shop.reminders", f"{ctx}.nobook") for a in docs_lines("cancel")]
    code, out, err, _ = await cluster.run_cli([a.replace("shop.", f"{ctx}.") for a in missing])
    assert code == 1 and f"topic {ctx}.nobook.commands does not exist" in err, (out, err)
    assert "nothing was created" in err
    assert await topic_names(cluster.bootstrap) == before
    async with Client(cluster, "reminders") as books:
        (row,) = (await books.timers()).values()
        assert (row.key, row.status, row.target.type_name) == (
            "pay",
            TimerStatus.CANCELLED,
            f"{ctx}.order",
        )
        assert row.rule.jitter == 600_000 and row.command.body == {"level": 1}
