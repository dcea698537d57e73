"""A change interrupted by Ctrl-C once its send began: `tickwheel timers set|cancel|trigger`
and `tickwheel jobs trigger` exit 130, as any interrupted command, and say first the request
id it was sent under and how to send it again under it, as a change the broker failed does
(`app.cli.common.unsettled`): written or not, the operator learns which by that resend, and
a resend under a fresh id could apply it twice (a trigger would fire twice).

Ctrl-C is a real SIGINT, raised once the broker has the change: `asyncio.run` cancels the
command's task (a second Ctrl-C raises KeyboardInterrupt in the task itself)."""

from __future__ import annotations

import shlex
import signal
from collections.abc import Iterable, Iterator, Sequence

import pytest
from typer.testing import CliRunner, Result

import app.cli.job_actions
import app.cli.timer_changes
from app.cli import cli
from app.clients.book_commands import unscoped_request_id
from app.jobs import SCHEDULE, Job, JobRun, JobScope
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog, MemoryPublisher
from app.kafka.records import OutRecord
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, decode
from app.service import Service
from tables import IntervalRule

P = 2
BOOK = AggregateTopics("shop", "reminders")
SCHEDULES = AggregateTopics("ops", SCHEDULE)
RESULTS = ContextTopics("shop").results


class InterruptingPublisher(MemoryPublisher):
    """Writes what it sends, then the operator presses Ctrl-C (twice with `twice`: the
    second raises KeyboardInterrupt where the command's task runs)."""

    def __init__(self, log: MemoryLog, twice: bool) -> None:
        super().__init__(log)
        self._twice = twice

    async def send_many(self, records: Sequence[OutRecord]) -> list[int]:
        offsets = await super().send_many(records)
        signal.raise_signal(signal.SIGINT)
        if self._twice:
            signal.raise_signal(signal.SIGINT)
        return offsets


class Cluster(MemoryLog):
    """The CLI's clients; Ctrl-C is pressed at the first send while `interrupting`."""

    def __init__(self, topics: Iterable[TopicSpec], *, twice: bool = False) -> None:
        super().__init__(topics)
        self.interrupting = True
        self._twice = twice

    def publisher(self) -> MemoryPublisher:
        if not self.interrupting:
            return super().publisher()
        self.interrupting = False
        return InterruptingPublisher(self, self._twice)


def sent(log: MemoryLog, topic: str) -> list[CommandEnvelope]:
    return [decode(CommandEnvelope, r.value) for p in range(P) for r in log.records(topic, p)]


def interrupted_line(result: Result) -> str:
    """The command's one line on stderr; it ended with exit code 130, nothing on stdout."""
    assert result.exit_code == 130, (result.output, result.exception)
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: interrupted: sent or not, ") and result.stdout == ""
    return line


@pytest.fixture(autouse=True)
def _default_sigint() -> Iterator[None]:
    # asyncio.run turns SIGINT into a cancel only over Python's own handler, which a run in
    # the background of a shell without job control does not have (SIGINT ignored).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


KEY = ["--type", "shop.reminders", "--owner", "o-1", "--key", "k"]
TIMERS = {
    "trigger": ["timers", "trigger", *KEY],
    "set": [
        *("timers", "set", *KEY, "--rule", "once:2027-01-15T08:00:00Z"),
        *("--target-type", "shop.order", "--command", "RemindToPay"),
    ],
    "cancel": ["timers", "cancel", *KEY, "--request-id", "mine 1"],
}


@pytest.mark.parametrize("twice", [False, True], ids=["ctrl-c", "ctrl-c twice"])
@pytest.mark.parametrize("action", sorted(TIMERS))
def test_a_timer_change_interrupted_after_its_send_says_its_request_id_and_exits_130(
    monkeypatch: pytest.MonkeyPatch, action: str, twice: bool
) -> None:
    log = Cluster([TopicSpec(BOOK.commands, P), TopicSpec(RESULTS, P)], twice=twice)
    monkeypatch.setattr(app.cli.timer_changes, "clients_for", lambda settings: log)
    line = interrupted_line(CliRunner().invoke(cli, TIMERS[action]))
    (first,) = sent(log, BOOK.commands)
    # The id as the caller gave it (`unscoped_request_id`), scoped again alike.
    resend = f"--request-id {shlex.quote(unscoped_request_id(first.request_id))}"
    assert f"send it again with {resend} to learn what became of it" in line, line
    # Sent again as said: under the same request id (DUPLICATE to the book: nothing more).
    again = CliRunner().invoke(cli, [*TIMERS[action], *shlex.split(resend), "--wait", "0"])
    assert again.exit_code == 1 and "no answer from the book in time" in again.stderr
    assert [c.request_id for c in sent(log, BOOK.commands)] == [first.request_id] * 2


def _nothing(run: JobRun) -> None:
    pass


EVERY = IntervalRule(start=0, every=60_000)
SERVICE = Service(
    aggregates=(),
    jobs={"ops": (Job("report", JobScope.TENANT, EVERY, _nothing),)},
)
JOB = ["jobs", "trigger", "--service", f"{__name__}:SERVICE", "--context", "ops"]


def test_a_jobs_trigger_interrupted_after_its_send_says_each_runs_request_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = Cluster([])

    async def ensure_topics(
        bootstrap: object, specs: Iterable[TopicSpec], replication: object = None
    ) -> None:
        log.ensure_topics(specs)

    monkeypatch.setattr(app.cli.job_actions, "ensure_topics", ensure_topics)
    monkeypatch.setattr(app.cli.job_actions, "Reader", lambda bootstrap: log.reader())
    monkeypatch.setattr(app.cli.job_actions, "Producer", lambda bootstrap: log.publisher())
    args = [*JOB, "--job", "report", "--tenant", "t1", "--tenant", "t2", "--partitions", str(P)]
    line = interrupted_line(CliRunner().invoke(cli, args))
    runs = sent(log, SCHEDULES.commands)
    assert len(runs) == 2, runs
    for c in runs:
        resend = f"--tenant {shlex.quote(c.aggregate.tenant)} --request-id {c.request_id}"
        assert resend in line, line
