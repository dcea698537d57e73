"""A change's wait (`tickwheel timers set --wait`, the web edge's timer and job routes, the
page's timer and job buttons: each reads through `app.ops.deadline.reader_for`) bounds the
librdkafka reader's stop too, not only its reads: a read cut at the deadline leaves its call
in flight on the reader's thread (librdkafka's watermarks wait up to the reader's timeout,
30 s, for a partition leader that is gone), and the consumer's close waits behind it. The
stop is given up at the deadline (or `STOP_GRACE_S` after it, for a close that is not held
up), said in a warning, and the thread still ends once the close did: none is left waiting
for calls. On a fake consumer in place of confluent-kafka's."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, ClassVar, cast

import pytest
from fakes import MIN, T0, FakeClock
from multidict import MultiDict

import app.ops.deadline
from app.cli.timer_changes import send_change
from app.clients.timer_book import timer_book
from app.jobs import Job, JobRun, JobScope
from app.jobs.commands import trigger_command
from app.kafka import TopicSpec, rdkafka_reader
from app.kafka.memory import MemoryLog
from app.kafka.rdkafka_reader import RdkafkaReader
from app.ops.job_routes import JobRoutes
from app.ops.page_actions import PageActions
from app.ops.timer_routes import TimerRoutes
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, decode
from tables import AggregateRef, IntervalRule

P = 2
BOOK = AggregateTopics("shop", "reminders")
RESULTS = ContextTopics("shop").results
WAIT_S = 0.2
GRACE_S = 0.3


class _Consumer:
    """confluent-kafka's Consumer whose watermarks wait for `gate`: a partition leader
    gone, which librdkafka waits for up to the reader's timeout."""

    gate = threading.Event()
    made: ClassVar[list[_Consumer]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.calls: list[str] = []
        _Consumer.made.append(self)

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.calls.append("watermarks")
        _Consumer.gate.wait(timeout)
        return 0, 0

    def close(self) -> None:
        self.calls.append("close")


@pytest.fixture(autouse=True)
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Consumer]]:
    monkeypatch.setattr(rdkafka_reader, "Consumer", _Consumer)
    monkeypatch.setattr(app.ops.deadline, "STOP_GRACE_S", GRACE_S)
    _Consumer.gate, _Consumer.made = threading.Event(), []
    before = set(threading.enumerate())
    yield _Consumer
    _Consumer.gate.set()  # the call in flight ends: then the close, then the thread
    for t in set(threading.enumerate()) - before:
        if t.name == "tickwheel-reader":
            t.join(5)
            assert not t.is_alive(), "the reader's thread is left waiting for calls"
    assert all(c.calls[-1] == "close" for c in _Consumer.made)


def _close_held() -> bool:
    """The change answered while its reader's close still waits behind the call in flight
    (the gate shut): its stop was given up at the wait, not waited out (the 5 s guard of
    each call is only against a hang)."""
    made = _Consumer.made
    return not _Consumer.gate.is_set() and bool(made) and made[-1].calls[-1] == "watermarks"


class Cluster(MemoryLog):
    """The CLI's clients, its reader librdkafka's (on the fake consumer)."""

    def reader(self, *, read_committed: bool = True, batch: int = 5_000) -> Any:
        return RdkafkaReader("127.0.0.1:1", timeout=30.0)


CMD = CommandEnvelope(
    request_id="r-1",
    type="wow.TriggerTimer",
    aggregate=AggregateRef(context="shop", aggregate="reminders", id="o-1"),
    body={"key": "k"},
    issued_at=T0,
)


async def test_timers_set_wait_bounds_the_readers_stop_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = Cluster([TopicSpec(BOOK.commands, P), TopicSpec(RESULTS, P)])
    with caplog.at_level(logging.WARNING):
        got = await asyncio.wait_for(send_change(log, CMD, WAIT_S), 5.0)
    assert got is None  # no answer in time: the command says so, with its request id
    assert _close_held()
    sent = [
        decode(CommandEnvelope, r.value) for p in range(P) for r in log.records(BOOK.commands, p)
    ]
    assert sent == [CMD]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "did not stop within the wait" in warning, warning
    assert "left to end on its own" in warning, warning


async def test_the_web_edges_wait_bounds_the_readers_stop() -> None:
    log = Cluster([TopicSpec(BOOK.commands, P), TopicSpec(RESULTS, P)])
    node = SimpleNamespace(
        clients=log, producer=log.publisher(), settings=SimpleNamespace(partitions=P)
    )
    routes = TimerRoutes(cast(Any, node), WAIT_S)
    answer = await asyncio.wait_for(routes._send(CMD), 5.0)
    assert answer.status == 504  # no answer in time, with the request id to send again
    assert _close_held()


def _run(run: JobRun) -> None:
    pass


JOB = Job("minutely", JobScope.SYSTEM, IntervalRule(start=T0, every=MIN), _run)
SCHEDULE = AggregateTopics("shop", "schedule")


def _node(topics: AggregateTopics) -> Any:
    """A stand-in for the node, its clients the cluster above."""
    log = Cluster([TopicSpec(topics.commands, P), TopicSpec(RESULTS, P)])
    return SimpleNamespace(
        clients=log,
        producer=log.publisher(),
        settings=SimpleNamespace(partitions=P),
        aggregates={BOOK.type_name: timer_book("shop", "reminders")},
        types={},
        service=SimpleNamespace(jobs={"shop": [JOB]}),
        clock=FakeClock(T0),
    )


async def test_the_job_routes_wait_bounds_the_readers_stop() -> None:
    routes = JobRoutes(_node(SCHEDULE), WAIT_S)
    cmd = trigger_command("shop", JOB, request_id="r-1")
    answer = await asyncio.wait_for(routes._send("trigger", "shop", JOB, [cmd]), 5.0)
    assert answer.status == 504  # no answer in time, with the request ids to send again
    assert _close_held()


@pytest.mark.parametrize("button", ["timer", "job"])
async def test_the_pages_buttons_wait_bounds_the_readers_stop(button: str) -> None:
    page = SimpleNamespace(confirm=lambda rid, message, back: message)
    actions = PageActions(_node(BOOK if button == "timer" else SCHEDULE), cast(Any, page), WAIT_S)
    if button == "timer":
        form = dict(action="cancel", type=BOOK.type_name, owner="o-1", key="k", request_id="f1")
        said = await asyncio.wait_for(actions.timer(MultiDict(form)), 5.0)
    else:
        form = dict(action="trigger", context="shop", job=JOB.name, request_id="f1")
        said = await asyncio.wait_for(actions.job(MultiDict(form)), 5.0)
    assert "not answered in" in cast(str, said), said
    assert _close_held()


async def test_a_stop_cut_short_leaves_no_thread_waiting_for_calls() -> None:
    reader = RdkafkaReader("127.0.0.1:1", timeout=30.0)
    await reader.start()
    asking = asyncio.create_task(reader.offsets("t", 0))
    await asyncio.sleep(0.05)  # the watermarks in flight, held
    asking.cancel()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.stop(), 0.1)  # behind the call in flight: cut
    # The fixture lets the call end: the close runs, then the thread ends.
