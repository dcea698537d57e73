"""A command whose target's topic does not exist (a typo'd target type, a context not
deployed yet), on a whole node on the in-memory log (which refuses a write to a topic it
does not have, as a broker without `auto.create.topics.enable` does after the client's
metadata wait). Whether sent by a decision in the partition's transaction (a timer book's
trigger) or by the runner (a timer firing into another context), it is that one command's
failure, NO_TARGET, said where it is looked for; the partition never fails over it and goes
on; and once the topic exists, a retry sends it. A job's run whose handler sends there is
a failed run (`wow.schedule.RunFailed`): the schedule ticks on, and the slot's `run:` timer
runs it again.

The node, its web edge and the clock are `test_timer_api`'s fixtures, imported (hence F811:
a test's argument named as the fixture it takes)."""

# ruff: noqa: F811

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import test_jobs_failures as jobs
from fakes import T0, sent_base
from test_timer_api import BOOK, Edge, P, edge, rows, until  # noqa: F401

from app.errors import KafkaUnavailable
from app.jobs import RAN, RUN_FAILED, TICK, TICKED, enable_command, ref_of
from app.kafka import TopicSpec
from app.kafka.catalog import TopicCatalog, no_target_message
from app.kafka.memory import MemoryLog
from app.model.decide import decide
from app.protocol.topics import AggregateTopics
from app.protocol.wire import (
    SCHEDULE_SET,
    CommandEnvelope,
    EventEnvelope,
    ResultCode,
    TimerAction,
    decode,
)
from app.timers.operator import new_op, op_records
from tables import AggregateRef, TimerStatus

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
    await until(lambda: [sent_base(c.request_id) for c in sent_to(edge, MISSING)] == ["t-1>0"])


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


# --- a job run: its handler's send fails as the handler's own failure ----------------------


class Unreachable:
    """`Decision.unreachable` as the node's topic list answers it: `missing` topics."""

    def __init__(self, *missing: str) -> None:
        self.missing = set(missing)

    def __call__(self, target: AggregateRef) -> str | None:
        topic = AggregateTopics(target.context, target.aggregate).commands
        return no_target_message(topic) if topic in self.missing else None


def test_a_job_runs_send_to_a_missing_topic_is_a_failed_run_and_the_schedule_ticks_on() -> None:
    s = jobs.Schedule(jobs.Handler())
    unreachable = Unreachable("shop.report.commands")

    def run(cmd: CommandEnvelope, now: int) -> tuple[ResultCode, list[EventEnvelope]]:
        d = decide(s.agg, s.stored, cmd, now=now, seen=False, unreachable=unreachable)
        if d.stored is not None:
            s.stored = d.stored
            s.log += d.events
            s.sent += d.commands
        return d.code, d.events

    s.run(enable_command(jobs.CONTEXT, s.job, now=T0 - 1_000), T0 - 1_000)
    timer_id = s.state.timer_id
    assert timer_id is not None
    tick = CommandEnvelope(
        request_id=f"{timer_id}#2",
        type=TICK,
        aggregate=ref_of(jobs.CONTEXT, "report"),
        not_before=T0 + 2 * jobs.MIN,
        issued_at=T0 + 2 * jobs.MIN,
    )
    # The slot's run is recorded as failed, with the topic named; the schedule ticks on,
    # and the slot's `run:` timer runs it again.
    code, events = run(tick, T0 + 2 * jobs.MIN)
    assert code is ResultCode.COMMITTED
    assert [e.type for e in events] == [TICKED, RUN_FAILED, SCHEDULE_SET]
    (failed,) = s.events(RUN_FAILED)
    assert "NO_TARGET" in failed["error"] and "shop.report.commands" in failed["error"]
    assert s.sent == []
    again = jobs.run_command(events[2], T0 + 2 * jobs.MIN)
    code, _ = run(again, T0 + 2 * jobs.MIN + 1_000)
    assert code is ResultCode.ERROR, "still no topic: the run timer retries, then parks"
    # Deployed: the run timer's retry sends the slot's command, once.
    unreachable.missing.clear()
    code, ran = run(again, T0 + 2 * jobs.MIN + 2_000)
    assert code is ResultCode.COMMITTED and [e.type for e in ran] == [RAN]
    assert [sent_base(c.request_id) for c in s.sent] == [f"{again.request_id}>0"]


# --- the topic list ----------------------------------------------------------------------


async def test_the_catalog_lists_on_a_miss_when_due_and_keeps_its_list_on_a_failure() -> None:
    now = [T0]
    names = {"a.b.commands"}
    calls: list[int] = []
    fail = [False]

    async def list_topics() -> set[str]:
        calls.append(now[0])
        if fail[0]:
            raise KafkaUnavailable("the broker is not reachable")
        return set(names)

    misses: list[str] = []
    catalog = TopicCatalog(
        list_topics,
        lambda: now[0],
        max_age_ms=30_000,
        min_interval_ms=1_000,
        on_missing=misses.append,
    )
    assert not catalog.missing("x.y.commands"), "never listed: not known missing"
    await catalog.refresh()  # joins the listing that question started
    assert len(calls) == 1
    assert catalog.known("a.b.commands") and catalog.missing("x.y.commands")
    assert misses == ["x.y.commands"]
    names.add("x.y.commands")
    now[0] += 1_000
    assert await catalog.exists("x.y.commands"), "a miss a second on lists again"
    assert len(calls) == 2
    # A listing that fails keeps the list as it was.
    fail[0] = True
    now[0] += 30_000
    assert not catalog.missing("a.b.commands")  # stale: a listing starts in the background
    await catalog.refresh()
    assert catalog.known("a.b.commands") and len(calls) == 3
    await catalog.stop()


class _Clocked:
    """A catalog over a memory log's admin, on a fake clock its waits move on."""

    def __init__(self, log: MemoryLog) -> None:
        self.now = T0
        self.listed: list[int] = []
        self.slept: list[int] = []
        self.began = asyncio.Event()  # set when a listing begins
        admin = log.admin()

        async def list_topics() -> set[str]:
            self.listed.append(self.now)
            self.began.set()
            names = await admin.topic_names()  # as the cluster is when it is asked
            await asyncio.sleep(0)  # the answer takes a turn of the loop at least
            return names

        async def sleep_ms(ms: int) -> None:
            self.slept.append(ms)
            self.now += ms

        async def no_deadline(ms: int) -> None:
            # Its sleeps move its clock on at once, which cannot time a deadline; its
            # listings always answer (hung ones: tests/unit/test_topic_catalog.py).
            await asyncio.Event().wait()

        self.catalog = TopicCatalog(
            list_topics,
            lambda: self.now,
            min_interval_ms=1_000,
            sleep_ms=sleep_ms,
            timer_ms=no_deadline,
        )


async def test_a_topic_created_just_after_a_listing_is_found_by_a_send() -> None:
    # A send right after a listing was refused NO_TARGET for a topic created since: the
    # catalog listed again only a second on, so the timer's attempt failed once for nothing.
    log = MemoryLog([TopicSpec("a.b.commands", 2)])
    c = _Clocked(log)
    await c.catalog.refresh()
    log.create_topic("c.d.commands")
    c.now += 300
    assert await c.catalog.exists("c.d.commands")
    # Not listed at once: 700 ms later, when the interval since the last listing ended.
    assert (c.listed, c.slept) == ([T0, T0 + 1_000], [700])
    assert await c.catalog.exists("c.d.commands") and len(c.listed) == 2  # known: no listing
    await c.catalog.stop()


async def test_misses_share_one_listing_a_second_and_a_missing_topic_is_refused() -> None:
    log = MemoryLog([TopicSpec("a.b.commands", 2)])
    c = _Clocked(log)
    await c.catalog.refresh()
    # A flood of sends to a topic that does not exist: one listing answers them all.
    answers = await asyncio.gather(*(c.catalog.exists("x.y.commands") for _ in range(50)))
    assert answers == [False] * 50 and c.listed == [T0, T0 + 1_000]
    # Each later miss waits for a listing begun after it: never more than one a second.
    for _ in range(3):
        assert not await c.catalog.exists("x.y.commands")
    assert c.listed == [T0 + n * 1_000 for n in range(5)]
    # A miss while a listing is in flight waits for the next one, begun after it.
    c.now += 5_000
    c.began.clear()
    first = asyncio.ensure_future(c.catalog.exists("x.y.commands"))
    await c.began.wait()
    assert c.listed[-1] == c.now and not first.done()  # in flight
    log.create_topic("x.y.commands")
    second = asyncio.ensure_future(c.catalog.exists("x.y.commands"))
    assert await second and len(c.listed) == 7
    assert c.listed[-1] - c.listed[-2] == 1_000
    await first  # (answered from the list as it is when it resumes: either is right)
    await c.catalog.stop()


async def test_a_memory_log_lists_its_topics() -> None:
    log = MemoryLog([TopicSpec("a.b.commands", 2)])
    assert await log.admin().topic_names() == {"a.b.commands"}
    log.create_topic("c.d.commands")
    assert await log.admin().topic_names() == {"a.b.commands", "c.d.commands"}


async def test_a_timer_into_a_topic_created_after_the_last_listing_fires_at_once(
    edge: Edge,
) -> None:
    """Its first attempt was NO_TARGET when it fell due within a second of the node's last
    listing of the topics: it now waits for the next listing, which has the topic."""
    assert (await edge.call("PUT", f"{PATH}/late", timer(T0 + 500, "billing.late")))[0] == 200
    await until(lambda: len(rows(edge.log)) == 1)
    edge.log.create_topic("billing.late.commands", P)  # the node listed at T0 without it
    edge.clock.set(T0 + 500)
    await until(lambda: [t.status for t in rows(edge.log)] == [TimerStatus.FIRED])
    (fired,) = rows(edge.log)
    assert (fired.attempts, fired.outcome, fired.error_code) == (0, "SENT", None), fired
    assert [c.request_id for c in sent_to(edge, "billing.late.commands")] == [fired.request_id]
    assert no_targets(edge) == 0


async def test_a_timer_whose_topic_listing_fails_is_retried_as_unknown_never_no_target(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's listing failed and its last good list had no such topic: the attempt was
    refused NO_TARGET as if the topic were known missing. It is a transport failure (the
    answer is unknown), retried; once the listing works again the retry fires it."""
    assert (await edge.call("PUT", f"{PATH}/blind", timer(T0 + 500, "billing.blind")))[0] == 200
    await until(lambda: len(rows(edge.log)) == 1)
    edge.log.create_topic("billing.blind.commands", P)  # the node listed at T0 without it
    listing = edge.node.targets._list

    async def failing() -> set[str]:
        raise KafkaUnavailable("the admin connection is down")

    monkeypatch.setattr(edge.node.targets, "_list", failing)
    edge.clock.set(T0 + 500)
    await until(lambda: [t.attempts for t in rows(edge.log)] == [1])
    (failed,) = rows(edge.log)
    assert (failed.status, failed.error_code) == (TimerStatus.PENDING, "TRANSPORT_ERROR")
    assert "cannot tell whether topic billing.blind.commands exists" in (failed.error_text or "")
    assert no_targets(edge) == 0 and not sent_to(edge, "billing.blind.commands")
    monkeypatch.setattr(edge.node.targets, "_list", listing)
    edge.clock.set(failed.due_at)
    await until(lambda: [t.status for t in rows(edge.log)] == [TimerStatus.FIRED])
    assert [c.request_id for c in sent_to(edge, "billing.blind.commands")] == [failed.request_id]


async def test_a_timer_parked_on_no_target_fires_once_on_an_operators_retry_once_it_exists(
    edge: Edge,
) -> None:
    assert (await edge.call("PUT", f"{PATH}/away", timer(T0 + 1_000, "billing.nosuch")))[0] == 200
    await until(lambda: len(rows(edge.log)) == 1)
    # Every attempt (5 by default) fails as NO_TARGET, and the timer parks.
    for attempt in range(1, 6):
        (row,) = rows(edge.log)
        edge.clock.set(row.due_at)

        def failed(n: int = attempt) -> bool:
            (t,) = rows(edge.log)
            return t.attempts == n and t.status in (TimerStatus.PENDING, TimerStatus.PARKED)

        await until(failed)
    (parked,) = rows(edge.log)
    assert (parked.status, parked.outcome, parked.error_code) == (
        TimerStatus.PARKED,
        "FAILED",
        NO_TARGET,
    )
    assert no_targets(edge) >= 5
    assert "failing" not in edge.node.health()

    edge.log.create_topic(ELSEWHERE, P)
    # The operator's retry, as `tickwheel timers retry` writes it (to every partition), a
    # while after the park (the node lists the topics again on a miss once a second).
    edge.clock.set(edge.clock.now() + 2_000)
    op = new_op(TimerAction.RETRY, parked.target, now=edge.clock.now())
    await edge.log.publisher().send_many(op_records(BOOK.timer_ops, op, P))
    await until(lambda: [t.status for t in rows(edge.log)] == [TimerStatus.FIRED])
    assert [c.request_id for c in sent_to(edge, ELSEWHERE)] == [parked.request_id]
