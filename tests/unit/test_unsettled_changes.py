"""A change whose send, or the wait for its answer, fails: `tickwheel timers set|cancel|
pause|resume|trigger` and `tickwheel jobs trigger` say the request id each change was sent
under and how to send it again under it (a retry under a fresh one would apply it again:
a trigger would fire twice), on the in-memory log whose broker goes away once it has the change,
or whose send times out having written it. And `submit`'s wait bounds its reads, each of
whose requests may wait far longer for a partition's leader that is gone."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from fakes import T0
from typer.testing import CliRunner, Result

import app.cli.job_actions
import app.cli.timer_changes
import app.cli.timers
from app.cli import cli
from app.clients.book_commands import unscoped_request_id
from app.errors import KafkaUnavailable
from app.jobs import SCHEDULE, Job, JobRun, JobScope
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog, MemoryPublisher, MemoryReader
from app.kafka.records import OutRecord
from app.ops.timer_api import submit
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, TimerOp, decode
from app.service import Service
from tables import AggregateRef, IntervalRule
from tables.partitioner import partition_of

P = 2
BOOK = AggregateTopics("shop", "reminders")
SCHEDULES = AggregateTopics("ops", SCHEDULE)
RESULTS = ContextTopics("shop").results


class FailingPublisher(MemoryPublisher):
    """Writes what it sends; then the broker goes away, and with `timed_out` the send
    fails too (a send that timed out having been written)."""

    def __init__(self, log: MemoryLog, *, timed_out: bool) -> None:
        super().__init__(log)
        self._down = log
        self._timed_out = timed_out

    async def send_many(self, records: Sequence[OutRecord]) -> list[int]:
        offsets = await super().send_many(records)
        self._down.down = True
        if self._timed_out:
            raise KafkaUnavailable("send failed: KafkaTimeoutError")
        return offsets


class Cluster(MemoryLog):
    """The CLI's clients: the broker fails at the first send while `failing`."""

    def __init__(self, topics: Iterable[TopicSpec], *, timed_out: bool = False) -> None:
        super().__init__(topics)
        self.failing = True
        self._timed_out = timed_out

    def publisher(self) -> MemoryPublisher:
        if not self.failing:
            return super().publisher()
        return FailingPublisher(self, timed_out=self._timed_out)

    def heal(self) -> None:
        self.down = self.failing = False


def sent(log: MemoryLog, topic: str) -> list[CommandEnvelope]:
    return [decode(CommandEnvelope, r.value) for p in range(P) for r in log.records(topic, p)]


def error_line(result: Result) -> str:
    """The command's one line on stderr; it ended with exit code 1, nothing on stdout."""
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and result.stdout == "", result.output
    return line


# --- tickwheel timers ------------------------------------------------------------------------

KEY = ["--type", "shop.reminders", "--owner", "o-1", "--key", "k"]
TIMERS = {
    "trigger": ["timers", "trigger", *KEY],
    "set": [
        *("timers", "set", *KEY, "--rule", "once:2027-01-15T08:00:00Z"),
        *("--target-type", "shop.order", "--command", "RemindToPay"),
    ],
    "cancel": ["timers", "cancel", *KEY],
}


@pytest.mark.parametrize("timed_out", [False, True], ids=["down after the send", "send timed out"])
@pytest.mark.parametrize("action", sorted(TIMERS))
def test_a_timer_change_the_broker_failed_says_its_request_id_to_send_it_again_with(
    monkeypatch: pytest.MonkeyPatch, action: str, timed_out: bool
) -> None:
    log = Cluster([TopicSpec(BOOK.commands, P), TopicSpec(RESULTS, P)], timed_out=timed_out)
    monkeypatch.setattr(app.cli.timer_changes, "clients_for", lambda settings: log)
    line = error_line(CliRunner().invoke(cli, TIMERS[action]))
    (first,) = sent(log, BOOK.commands)
    # The id as the caller gave it (`unscoped_request_id`), scoped again alike.
    resend = f"--request-id {shlex.quote(unscoped_request_id(first.request_id))}"
    assert "the broker is not reachable" in line or "KafkaTimeoutError" in line, line
    assert f"sent or not, send it again with {resend} to learn what became of it" in line
    # Sent again as said: under the same request id (DUPLICATE to the book: nothing more).
    log.heal()
    again = CliRunner().invoke(cli, [*TIMERS[action], *shlex.split(resend), "--wait", "0"])
    assert "no answer from the book in time" in error_line(again)
    assert [c.request_id for c in sent(log, BOOK.commands)] == [first.request_id] * 2


@pytest.mark.parametrize("action", ["retry", "skip"])
def test_a_timers_retry_or_skip_the_broker_failed_says_its_request_id_to_send_it_again_with(
    monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    """Sent again under it, each partition's owner carries it out once (its copy is a
    DUPLICATE: `tests/unit/test_timer_ops_dedup.py`); under a fresh one, a retry would
    retry the timers parked again meanwhile."""
    ops_topic = AggregateTopics("shop", "order").timer_ops
    log = Cluster([TopicSpec(ops_topic, P)], timed_out=True)
    monkeypatch.setattr(app.cli.timers, "clients_for", lambda settings: log)
    args = ["timers", action, "--type", "shop.order", "--target-id", "t-1", "--partitions", str(P)]
    line = error_line(CliRunner().invoke(cli, args))
    first = {
        decode(TimerOp, r.value).request_id for p in range(P) for r in log.records(ops_topic, p)
    }
    (request_id,) = first
    resend = f"--request-id {shlex.quote(request_id)}"
    assert f"sent or not, send it again with {resend}" in line, line
    log.heal()
    again = CliRunner().invoke(cli, [*args, *shlex.split(resend), "--json", "--wait", "0"])
    assert again.exit_code == 0, again.output
    ops = [decode(TimerOp, r.value) for p in range(P) for r in log.records(ops_topic, p)]
    assert [op.request_id for op in ops] == [request_id] * 2 * P


def test_a_timers_retry_takes_a_request_id_of_1_to_200_characters() -> None:
    args = ["timers", "retry", "--type", "shop.order", "--target-id", "t-1"]
    result = CliRunner().invoke(cli, [*args, "--request-id", "x" * 201])
    assert result.exit_code == 2, result.output
    assert "--request-id must be 1-200 characters" in result.stderr


# --- tickwheel jobs trigger ------------------------------------------------------------------


def _nothing(run: JobRun) -> None:
    pass


EVERY = IntervalRule(start=0, every=60_000)
SERVICE = Service(
    aggregates=(),
    jobs={
        "ops": (
            Job("sweep", JobScope.SHARDED, EVERY, _nothing),
            Job("report", JobScope.TENANT, EVERY, _nothing),
            Job("nightly", JobScope.SYSTEM, EVERY, _nothing),
        )
    },
)
JOB = ["jobs", "trigger", "--service", f"{__name__}:SERVICE", "--context", "ops"]


@pytest.fixture
def jobs_log(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """The jobs commands' clients: the schedule's topics are made, as a worker would."""
    log = Cluster([])

    async def ensure_topics(
        bootstrap: object, specs: Iterable[TopicSpec], replication: object = None
    ) -> None:
        log.ensure_topics(specs)

    monkeypatch.setattr(app.cli.job_actions, "ensure_topics", ensure_topics)
    monkeypatch.setattr(app.cli.job_actions, "Reader", lambda bootstrap: log.reader())
    monkeypatch.setattr(app.cli.job_actions, "Producer", lambda bootstrap: log.publisher())
    return log


def _resend(c: CommandEnvelope, several: bool) -> str:
    """The options that send `c` again: its request id, with those that name its instance
    alone when the trigger ran several."""
    alone = ""
    if several and c.aggregate.id == "report":
        alone = f"--tenant {shlex.quote(c.aggregate.tenant)} "
    elif several:
        alone = f"--partition {partition_of(c.aggregate.id, P)} "
    return f"{alone}--request-id {shlex.quote(c.request_id)}"


@pytest.mark.parametrize(
    "args",
    [
        ["--job", "sweep"],
        ["--job", "report", "--tenant", "t1", "--tenant", "t2"],
        ["--job", "report", "--tenant", "t1", "--tenant", "t2", "--request-id", "mine"],
        ["--job", "nightly"],
    ],
    ids=["sharded", "tenants", "tenants, own request id", "system"],
)
def test_a_jobs_trigger_the_broker_failed_says_each_runs_request_id_to_send_it_again_with(
    jobs_log: Cluster, args: list[str]
) -> None:
    line = error_line(CliRunner().invoke(cli, [*JOB, *args, "--partitions", str(P)]))
    first = sent(jobs_log, SCHEDULES.commands)
    assert first and "the broker is not reachable" in line
    resends = [_resend(c, len(first) > 1) for c in first]
    assert all(r in line for r in resends), line
    # Each sent again as said: its instance alone, under the same request id.
    jobs_log.heal()
    job = args[:2]
    for resend in resends:
        again = [*JOB, *job, *shlex.split(resend), "--partitions", str(P), "--wait", "0"]
        assert CliRunner().invoke(cli, again).exit_code == 0
    twice = sent(jobs_log, SCHEDULES.commands)
    assert sorted((c.aggregate.id, c.aggregate.tenant, c.request_id) for c in twice) == sorted(
        (c.aggregate.id, c.aggregate.tenant, c.request_id) for c in first * 2
    )


# --- the wait ------------------------------------------------------------------------------


class StuckReader(MemoryReader):
    """Answers `answered` requests, then waits for ever: a partition's leader gone (a
    `Reader`'s request waits 40 s for it, and fails)."""

    def __init__(self, log: MemoryLog, answered: int) -> None:
        super().__init__(log)
        self._answered = answered

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        if self._answered == 0:
            await asyncio.Event().wait()
        self._answered -= 1
        return await super().offsets(topic, partition)


@pytest.mark.parametrize("answered", [0, 1], ids=["the offsets hang", "the read hangs"])
async def test_the_wait_bounds_reads_that_hang_and_the_change_is_sent(answered: int) -> None:
    log = MemoryLog([TopicSpec(BOOK.commands, P), TopicSpec(RESULTS, P)])
    cmd = CommandEnvelope(
        request_id="r-1",
        type="wow.TriggerTimer",
        aggregate=AggregateRef(context="shop", aggregate="reminders", id="o-1"),
        body={"key": "k"},
        issued_at=T0,
    )
    waiting = submit(log.publisher(), StuckReader(log, answered), cmd, P, 0.05)
    # None, as when no answer comes in time: its request id learns what became of it.
    got: Any = await asyncio.wait_for(waiting, 2.0)
    assert got is None
    assert sent(log, BOOK.commands) == [cmd]
