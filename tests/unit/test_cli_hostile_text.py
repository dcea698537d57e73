"""The text output of `tickwheel jobs list|enable|trigger|backfill`, of the timer changes'
answers and of `tickwheel rebuild`, fed strings with control characters: a job's name and
rule, a rebuild's topics and group (names the service or the command line gives), a
tenant or an instance's state read from a schedule log (another writer's), a result's
message (a worker's, or another writer's), a backfill's request id (its live tick's timer
id, read from the log), a C1 control or a line separator on the command line (the check
of new input refuses C0 controls only). Each reaches the terminal escaped
(`app.cli.text.printable`): no newline forges a line, no escape sequence clears the
screen. The JSON output escapes them as JSON does."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from rich.console import Console
from typer.testing import CliRunner

import app.cli.common
import app.cli.job_options
import app.cli.job_runs
import app.cli.jobs
import app.cli.rebuild
import app.cli.timer_changes
import app.cli.timers
import app.ops.rebuild
from app.cli import cli
from app.cli.job_actions import LogInstances
from app.cli.rebuild import Ended, RebuildRun, run_rebuild
from app.jobs import TICK_KEY, Job, JobRun, JobScope, ScheduleState, ref_of
from app.ops.job_api import InstanceState
from app.ops.op_answers import Answered
from app.ops.rebuild import PartitionPlan, Progress, RebuildPlan, Span, TypePlan
from app.protocol.topics import AggregateTopics
from app.protocol.wire import (
    SCHEDULE_SET,
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    ResultCode,
    TimerOp,
)
from app.service import Service
from tables import AggregateRef, CronRule, IntervalRule

T0 = 1_800_000_000_000
MIN = 60_000
CONTEXT = "ops"


def _nothing(run: JobRun) -> None:
    pass


REPORT = Job("report", JobScope.TENANT, IntervalRule(start=T0, every=MIN), _nothing)
SERVICE = Service(aggregates=(), jobs={CONTEXT: (REPORT,)})
JOB = ["--service", f"{__name__}:SERVICE", "--context", CONTEXT, "--job", "report"]

FORGED = "\r\nerror: forged\x1b[2J\x00"
"""A carriage return and newline that forge a line, an escape sequence that clears the
screen, a NUL."""
FORGED_SHOWN = "\\x0d\\x0aerror: forged\\x1b[2J\\x00"
TYPED = "t\x9b2J\u2028x\x85"
"""What the command line may hold (new input refuses C0 controls and DEL only): an 8-bit
CSI, a line separator, a next-line."""
TYPED_SHOWN = "t\\x9b2J\\u2028x\\x85"


def _one_line_each(out: str, count: int) -> list[str]:
    """`out`'s `count` lines, after checking that nothing in them but tabs is a control
    character and that no other line break splits them."""
    lines = out.split("\n")
    assert lines.pop() == "" and len(lines) == count, lines
    assert out.splitlines() == lines, lines
    assert [c for c in out if c not in "\t\n" and not c.isprintable()] == [], lines
    return lines


@pytest.fixture(autouse=True)
def _no_access_check(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_check(kafka: object) -> None:
        return None

    monkeypatch.setattr(app.cli.common, "check_access", no_check)


def test_jobs_list_escapes_what_an_instances_state_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    state = ScheduleState(job="report", enabled=True, override={"note": "\x9b2J\u2028\x7f"})
    held = InstanceState(f"t{FORGED}", "report", 3, state, f"ValueError: bad{FORGED}")

    async def read(kafka: object, context: str, jobs: object, limits: object) -> LogInstances:
        return LogInstances(12, [held])

    monkeypatch.setattr(app.cli.jobs, "read_instances", read)
    result = CliRunner().invoke(cli, ["jobs", "list", *JOB, "--state", "--bootstrap", "b:1"])
    assert result.exit_code == 0, result.output
    line = _one_line_each(result.stdout, 3)[2]
    # The error's whitespace (its newline, as a validation error's lines) is one space.
    assert line == (
        "\t\tt\\x0d\\x0aerror: forged\\x1b[2J\\x00/report: enabled, "
        'override {"note":"\\x9b2J\\u2028\\x7f"}, rule -, last run -; '
        "ValueError: bad error: forged\\x1b[2J\\x00"
    ), line
    as_json = CliRunner().invoke(cli, ["jobs", "list", *JOB, "--state", "--json"])
    assert orjson.loads(as_json.stdout)["state"][0]["tenant"] == f"t{FORGED}"


def _answering(monkeypatch: pytest.MonkeyPatch, code: ResultCode, message: str) -> None:
    """The workers answer each command sent with `code` and `message`."""

    async def send(
        bootstrap: object, partitions: int, commands: list[CommandEnvelope], wait: float, rep: Any
    ) -> dict[str, CommandResult]:
        return {
            c.request_id: CommandResult(
                request_id=c.request_id,
                aggregate=c.aggregate,
                code=code,
                message=message,
                decided_at=T0,
            )
            for c in commands
        }

    monkeypatch.setattr(app.cli.job_options, "send_and_wait", send)


@pytest.mark.parametrize("action", ["enable", "trigger"])
def test_a_jobs_answer_escapes_its_message_tenant_and_request_id(
    monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    _answering(monkeypatch, ResultCode.REJECTED, f"no{FORGED}\u2028")
    given = ["--tenant", TYPED, "--request-id", "r\x9b"]
    result = CliRunner().invoke(cli, ["jobs", action, *JOB, *given])
    assert result.exit_code == 1, result.output
    (line,) = _one_line_each(result.stdout, 1)
    run = " trigger:r\\x9b" if action == "trigger" else ""
    named = f"ops.schedule/{TYPED_SHOWN}/report{run}"
    assert line == f"{action} {named}: REJECTED: no{FORGED_SHOWN}\\u2028", line
    as_json = CliRunner().invoke(cli, ["jobs", action, *JOB, *given, "--json"])
    assert orjson.loads(as_json.stdout)["message"] == f"no{FORGED}\u2028"


@pytest.fixture
def logged_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """The instance's log: its tick timer set at T0 by an event whose id (another
    writer's) holds control characters; the backfill's slots are named by it."""
    ref = ref_of(CONTEXT, REPORT)
    rule = IntervalRule(start=T0, every=MIN).model_dump(mode="json")
    body = {"key": TICK_KEY, "rule": rule}
    set_ = EventEnvelope(
        id=f"e{FORGED}", type=SCHEDULE_SET, aggregate=ref, version=1, created_at=T0, body=body
    )

    async def events(
        kafka: object, asked: AggregateRef, partitions: int, limits: object
    ) -> list[EventEnvelope]:
        return [set_] if asked == ref else []

    monkeypatch.setattr(app.cli.job_runs, "read_instance_events", events)
    monkeypatch.setattr(app.cli.job_runs, "now_ms", lambda: T0 + 10 * MIN)


BACKFILL = ["jobs", "backfill", *JOB, "--from", str(T0), "--until", str(T0 + MIN)]


@pytest.mark.usefixtures("logged_tick")
def test_a_backfills_slots_escape_their_request_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    dry = CliRunner().invoke(cli, [*BACKFILL, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    slots = _one_line_each(dry.stdout, 2)
    assert slots[1].endswith(f"\tslot 1\t2027-01-15T08:01:00.000+00:00\te{FORGED_SHOWN}#1")
    _answering(monkeypatch, ResultCode.DUPLICATE, "")
    sent = CliRunner().invoke(cli, BACKFILL)
    assert sent.exit_code == 0, sent.output
    ran = _one_line_each(sent.stdout, 2)
    assert ran[0] == f"backfill ops.schedule/(0)/report e{FORGED_SHOWN}#0: DUPLICATE", ran


def test_a_timer_changes_answer_escapes_the_owner_and_request_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def send(kafka: object, cmd: CommandEnvelope, wait_s: float) -> CommandResult:
        return CommandResult(
            request_id=cmd.request_id,
            code=ResultCode.COMMITTED,
            aggregate=cmd.aggregate,
            version=2,
            decided_at=T0,
        )

    monkeypatch.setattr(app.cli.timer_changes, "send_change", send)
    args = ["--type", "shop.reminders", "--owner", TYPED, "--key", "k\x9b", "--tenant", TYPED]
    result = CliRunner().invoke(cli, ["timers", "pause", *args, "--request-id", "r\x9b"])
    assert result.exit_code == 0, result.output
    (line,) = _one_line_each(result.stdout, 1)
    assert line == (
        f"pause shop.reminders/{TYPED_SHOWN}/{TYPED_SHOWN} 'k\\x9b': COMMITTED "
        "(request r\\x9b, version 2)"
    ), line


def test_a_retry_escapes_the_target_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    # A parked target's id is taken as stored, control characters and all.
    async def retry(
        clients: object, type_name: str, op: TimerOp, partitions: int, wait_s: float
    ) -> Any:
        return Answered(op, partitions)  # sent, not waited for

    monkeypatch.setattr(app.cli.timers, "request_answered", retry)
    args = ["--type", "shop.order", "--target-id", f"t{FORGED}", "--request-id", "r-1"]
    result = CliRunner().invoke(cli, ["timers", "retry", *args, "--bootstrap", "b:1"])
    assert result.exit_code == 0, result.output
    (line,) = _one_line_each(result.stdout, 1)
    assert line.startswith(
        f"retry of the timers of shop.order parked on shop.order/(0)/t{FORGED_SHOWN} requested "
        "(request r-1, "
    ), line


HOSTILE = Service(
    aggregates=(),
    jobs={
        CONTEXT: (
            # cronsim splits a cron expression's fields at a next-line and a line
            # separator as at a space, and JSON leaves them as they are.
            Job("report", JobScope.SHARDED, CronRule(expr="*\x85*\u2028* * *"), _nothing),
        )
    },
)
"""A service whose job rule holds control characters (its name and its context's name
are refused with one: `test_a_name_with_a_trailing_newline_is_refused`)."""


def test_jobs_list_escapes_the_job_names_and_rules_it_shows() -> None:
    result = CliRunner().invoke(
        cli, ["jobs", "list", "--service", f"{__name__}:HOSTILE", "--partitions", "2"]
    )
    assert result.exit_code == 0, result.output
    lines = _one_line_each(result.stdout, 3)
    assert lines[0] == (
        "ops\treport\tSHARDED\t"
        '{"coalesce":true,"kind":"cron","expr":"*\\x85*\\u2028* * *","zone":"UTC","start":0}'
    ), lines
    assert lines[1].startswith("\treport~"), lines


def _plan(group_id: str, types: Sequence[AggregateTopics]) -> RebuildPlan:
    # The group committed on the log (the workers'): else the rebuild refuses it.
    part = PartitionPlan(0, 0, 5, 3, Span(0, 5))
    return RebuildPlan(group_id, 0, tuple(TypePlan(t, (part,)) for t in types))


def test_rebuilds_dry_run_escapes_the_group_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    # The group (the settings refuse a control character in it) as a plan may hold it.
    async def planned(bootstrap: object, group_id: str, types: Any, **kw: Any) -> RebuildRun:
        return RebuildRun(_plan(f"g{FORGED}", types), Ended.NOT_FOLLOWED)

    monkeypatch.setattr(app.cli.rebuild, "run_rebuild", planned)
    args = ["rebuild", "--type", "shop.order", "--bootstrap", "b:1", "--dry-run"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    lines = _one_line_each(result.stdout, 6)
    assert lines[1] == "shop.order: changelog shop.order.timers", lines
    assert lines[3] == f"shop.order: group g{FORGED_SHOWN} on shop.order.events", lines
    assert lines[5] == f"group g{FORGED_SHOWN} has no running worker: the rebuild may run"


@pytest.mark.parametrize("name", ["shop.order\n", "shop\n.order", "shop.order\r\n"])
def test_a_type_with_a_line_end_is_refused(name: str) -> None:
    # Python's `$` matches before a trailing newline: the check is a whole match.
    args = ["rebuild", "--type", name, "--bootstrap", "b:1", "--dry-run"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "must be '<context>.<aggregate>'" in result.output
    assert result.output.count("\n") == 1, result.output  # the value said on one line


@pytest.mark.parametrize("name", ["report\n", "\nreport"])
def test_a_job_name_with_a_line_end_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="use 1-100 letters"):
        Job(name, JobScope.SHARDED, CronRule(expr="* * * * *"), _nothing)


async def test_a_rebuild_escapes_the_topics_and_group_it_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`run_rebuild` as an embedding caller may call it, with any group."""

    async def plan(clients: object, group_id: str, types: Any) -> RebuildPlan:
        return _plan(group_id, types)

    async def applied(clients: object, plan: RebuildPlan, **kw: Any) -> None:
        for t in plan.types:
            kw["done"](t)

    async def followed(*args: object, **kw: object) -> Progress:
        return Progress(5, 5, None, 0.0)

    class NoOffsets:
        def __init__(self, *args: object) -> None:
            pass

        async def __aenter__(self) -> NoOffsets:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(app.cli.rebuild, "KafkaClients", lambda bootstrap: None)
    monkeypatch.setattr(app.cli.rebuild, "GroupOffsets", NoOffsets)
    monkeypatch.setattr(app.ops.rebuild, "plan_rebuild", plan)
    monkeypatch.setattr(app.ops.rebuild, "apply_plan", applied)
    monkeypatch.setattr(app.ops.rebuild, "follow_replay", followed)
    out = io.StringIO()
    console = Console(file=out, highlight=False, soft_wrap=True)
    topics = [AggregateTopics("shop", "order\n")]
    # "[/x]": rich's closing tag, which its markup refused (MarkupError) once the offsets
    # were reset.
    ran = await run_rebuild(
        "b:1", f"g{FORGED}[/x]", topics, dry_run=False, wait=True, out=console, err=io.StringIO()
    )
    assert ran.ended is Ended.COMPLETE
    lines = _one_line_each(out.getvalue(), 6)
    assert lines[2] == (f"shop.order\\x0a: group g{FORGED_SHOWN}[/x] on shop.order\\x0a.events"), (
        lines
    )
    assert lines[4] == "shop.order\\x0a: done (log offsets reset, changelog emptied)", lines
    assert lines[5].startswith(f"following the replay of group g{FORGED_SHOWN}[/x]: "), lines


def test_jobs_list_state_holds_the_log_to_the_workers_record_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The view folds what the workers fold: a record past their bound is passed over by
    # both, one within a raised bound by neither.
    seen: list[Any] = []

    async def read(kafka: object, context: str, jobs: object, limits: Any) -> LogInstances:
        seen.append(limits)
        return LogInstances(12, [])

    monkeypatch.setattr(app.cli.jobs, "read_instances", read)
    monkeypatch.setenv("TICKWHEEL_MAX_RECORD_BYTES", "4096")
    result = CliRunner().invoke(cli, ["jobs", "list", *JOB, "--state", "--bootstrap", "b:1"])
    assert result.exit_code == 0, result.output
    assert [limits.max_record_bytes for limits in seen] == [4096]
