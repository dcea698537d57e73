"""`tickwheel jobs …`: which commands it makes for which instances, and its errors."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import app.cli.common
import app.cli.job_options
from app.cli import cli
from app.cli.job_options import input_exit_code
from app.cli.jobs import (
    find_job,
    instance_commands,
    parse_rule_option,
)
from app.errors import JobsCliError
from app.jobs import (
    DISABLE,
    ENABLE,
    RESCHEDULE,
    Job,
    JobRun,
    JobScope,
    action_request_id,
    shard_ref,
)
from app.jobs.commands import TRIGGER_SENDS
from app.kafka.records import Replication
from app.model.aggregate import sent_suffix_length
from app.ops.job_api import JobInputError
from app.protocol.wire import MAX_REQUEST_ID, CommandEnvelope, CommandResult, ResultCode
from app.service import Service
from tables import DEFAULT_TENANT, CronRule, IntervalRule
from tables.partitioner import partition_of

PARTITIONS = 8


def _nothing(run: JobRun) -> None:
    pass


NIGHTLY = Job("nightly", JobScope.SYSTEM, CronRule(expr="0 3 * * *"), _nothing)
REPORT = Job("report", JobScope.TENANT, IntervalRule(start=0, every=60_000), _nothing)
SWEEP = Job("sweep", JobScope.SHARDED, IntervalRule(start=0, every=1_000), _nothing)
SERVICE = Service(aggregates=(), jobs={"ops": (NIGHTLY, REPORT, SWEEP), "empty": ()})


def test_find_job_names_what_is_declared() -> None:
    assert find_job(SERVICE, "ops", "sweep") is SWEEP
    with pytest.raises(JobsCliError, match=r"unknown job 'nope' in ops \(its jobs: nightly, "):
        find_job(SERVICE, "ops", "nope")
    with pytest.raises(JobsCliError, match=r"'shop' declares no jobs \(contexts with jobs: ops\)"):
        find_job(SERVICE, "shop", "sweep")
    with pytest.raises(JobsCliError, match="'empty' declares no jobs"):
        find_job(SERVICE, "empty", "sweep")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{every: 1}", "--rule is not JSON"),
        ("[1]", "must be a JSON object of rule fields (or null), not list"),
        ('{"every": 0}', "invalid rule for job 'sweep': interval.every: Input should be greater"),
        ('{"every": 999}', "invalid rule for job 'sweep': every 999 ms is shorter than a job's"),
        ('{"kind": "cron", "expr": "nope"}', "invalid cron expression"),
        ('{"colour": "red"}', "colour"),
    ],
)
def test_a_bad_rule_is_refused_before_anything_is_sent(text: str, message: str) -> None:
    with pytest.raises(JobsCliError, match=re.escape(message)):
        parse_rule_option(text, SWEEP)


def test_a_rule_is_an_override_and_null_is_none() -> None:
    assert parse_rule_option('{"every": 1500}', SWEEP) == {"every": 1500}
    assert parse_rule_option("null", SWEEP) is None
    assert parse_rule_option(None, SWEEP) is None
    # another kind is a rule of its own: whole
    cron = '{"kind": "cron", "expr": "*/5 * * * * *"}'
    assert parse_rule_option(cron, SWEEP) == {"kind": "cron", "expr": "*/5 * * * * *"}


def test_a_system_job_has_one_instance_in_the_default_tenant() -> None:
    (cmd,) = instance_commands("enable", "ops", NIGHTLY, partitions=PARTITIONS)
    assert (cmd.type, cmd.aggregate.tenant, cmd.aggregate.id) == (ENABLE, DEFAULT_TENANT, "nightly")
    assert cmd.body == {"job": "nightly"}
    assert cmd.aggregate.type_name == "ops.schedule"


def test_a_tenant_job_has_one_instance_per_tenant_named() -> None:
    commands = instance_commands(
        "disable", "ops", REPORT, partitions=PARTITIONS, tenants=["acme", "globex", "acme"]
    )
    assert [(c.type, c.aggregate.tenant, c.aggregate.id) for c in commands] == [
        (DISABLE, "acme", "report"),
        (DISABLE, "globex", "report"),
    ]
    (default,) = instance_commands("disable", "ops", REPORT, partitions=PARTITIONS)
    assert default.aggregate.tenant == DEFAULT_TENANT


def test_a_sharded_job_has_one_instance_per_partition_or_the_one_named() -> None:
    commands = instance_commands(
        "enable", "ops", SWEEP, partitions=PARTITIONS, rule={"every": 1500}
    )
    assert [partition_of(c.aggregate.id, PARTITIONS) for c in commands] == list(range(PARTITIONS))
    assert all(c.body == {"job": "sweep", "rule": {"every": 1500}} for c in commands)
    (one,) = instance_commands("reschedule", "ops", SWEEP, partitions=PARTITIONS, partition=5)
    assert one.aggregate == shard_ref("ops", SWEEP, 5, PARTITIONS)
    assert (one.type, one.body) == (RESCHEDULE, {"rule": None})
    assert len({c.request_id for c in commands}) == PARTITIONS


@pytest.mark.parametrize(
    ("job", "tenants", "partition", "message"),
    [
        (NIGHTLY, [], 1, "is SYSTEM: --partition is for SHARDED jobs"),
        (REPORT, [], 1, "is TENANT: --partition is for SHARDED jobs"),
        (SWEEP, ["acme"], None, "is SHARDED: its instances are in the default tenant"),
        (NIGHTLY, ["acme"], None, "--tenant is for TENANT jobs"),
        (SWEEP, [], 8, "--partition 8 is not one of 8 partitions"),
        (REPORT, ["ac\x00me"], None, "--tenant 'ac\\x00me': Value error, holds the control"),
    ],
)
def test_instances_a_job_does_not_have_are_refused(
    job: Job, tenants: list[str], partition: int | None, message: str
) -> None:
    with pytest.raises(JobsCliError, match=re.escape(message)):
        instance_commands(
            "enable", "ops", job, partitions=PARTITIONS, tenants=tenants, partition=partition
        )


def test_a_default_tenant_named_is_fine_for_any_scope() -> None:
    (cmd,) = instance_commands(
        "enable", "ops", NIGHTLY, partitions=PARTITIONS, tenants=[DEFAULT_TENANT]
    )
    assert cmd.aggregate.tenant == DEFAULT_TENANT


DEMO = ["--service", "app.demo:service"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enable", *DEMO, "--context", "shop", "--job", "nope"], "unknown job 'nope' in shop"),
        (["enable", *DEMO, "--context", "ops", "--job", "x"], "'ops' declares no jobs"),
        (
            ["enable", "--service", "no.such.module:svc", "--context", "shop", "--job", "x"],
            "cannot load service 'no.such.module:svc'",
        ),
        (
            ["disable", "--service", "app.demo:orders", "--context", "shop", "--job", "x"],
            "is a AggregateType, not a Service",
        ),
        (["list", *DEMO, "--context", "ops"], "'ops' declares no jobs"),
        (
            [
                *("enable", *DEMO, "--context", "shop", "--job", "unpaid-report"),
                *("--bootstrap", "127.0.0.1:1"),
            ],
            "127.0.0.1:1",
        ),
    ],
)
def test_bad_input_and_no_broker_exit_1_with_a_message(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["jobs", *args])
    assert result.exit_code == 1, result.output
    assert "error: " in result.stderr and message in result.stderr, result.stderr
    assert "Traceback" not in result.output


SHOP = [*DEMO, "--context", "shop", "--job", "unpaid-report"]
RANGE = ["--from", "0", "--until", "60000"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enable", *SHOP, "--rule", "{"], "--rule is not JSON"),
        (["reschedule", *SHOP, "--rule", "3"], "must be a JSON object"),
        (
            ["enable", *SHOP, "--rule", '{"kind": "interval", "start": 0, "every": 100}'],
            "invalid rule for job 'unpaid-report': every 100 ms is shorter than a job's shortest",
        ),
        (["enable", *SHOP, "--partition", "0"], "--partition is for SHARDED jobs"),
        (["disable", *SHOP, "--tenant", "t"], "--tenant is for TENANT jobs"),
        (["disable", *SHOP, "--partition", "0"], "--partition is for SHARDED jobs"),
        (["reschedule", *SHOP, "--rule", "null", "--tenant", "t"], "--tenant is for TENANT"),
        (["trigger", *SHOP, "--partition", "0"], "--partition is for SHARDED jobs"),
        (["backfill", *SHOP, *RANGE, "--tenant", "t"], "--tenant is for TENANT jobs"),
        (["backfill", *SHOP, "--from", "60000", "--until", "0"], "is before --from"),
    ],
)
def test_an_options_bad_value_exits_2_on_every_jobs_command(args: list[str], message: str) -> None:
    """As every command says a value it cannot take (`app.cli.common`): `enable`, `disable`
    and `reschedule` exited 1 where `trigger` and `backfill` exited 2."""
    result = CliRunner().invoke(cli, ["jobs", *args, "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and message in line, line


@pytest.mark.parametrize("action", ["enable", "disable", "reschedule", "trigger", "backfill"])
@pytest.mark.parametrize(
    ("where", "message"),
    [
        (["--context", "shop", "--job", "nope"], "unknown job 'nope' in shop"),
        (["--context", "ops", "--job", "x"], "'ops' declares no jobs"),
    ],
)
def test_a_job_or_context_not_declared_exits_1_on_every_jobs_command(
    action: str, where: list[str], message: str
) -> None:
    """What it was asked about does not exist (`app.cli.common`), as `jobs list --context`
    says: `trigger` and `backfill` exited 2 for it."""
    more = {"reschedule": ["--rule", "null"], "backfill": RANGE}.get(action, [])
    result = CliRunner().invoke(
        cli, ["jobs", action, *DEMO, *where, *more, "--bootstrap", "127.0.0.1:1"]
    )
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and message in line, line


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (JobInputError("job", "unknown job"), 1),
        (JobInputError("context", "no jobs"), 1),
        (JobInputError("tenants", "--tenant is for TENANT jobs"), 2),
        (JobInputError("until", "is after now"), 2),
        (JobInputError("request_id", "too long"), 2),
        (JobsCliError("--rule is not JSON"), 2),
    ],
)
def test_input_exit_code_of_each_refusal(error: JobsCliError, code: int) -> None:
    assert input_exit_code(error) == code


def test_list_prints_the_jobs_and_their_instances_without_a_broker() -> None:
    result = CliRunner().invoke(cli, ["jobs", "list", *DEMO, "--partitions", "4"])
    assert result.exit_code == 0, result.output
    first, instance = result.stdout.splitlines()[:2]
    assert first.split("\t")[:3] == ["shop", "unpaid-report", "SYSTEM"]
    assert '"expr":"*/5 * * * * *"' in first
    assert instance.split("\t")[1:3] == [
        "unpaid-report",
        f"partition {partition_of('unpaid-report', 4)}",
    ]


def test_list_as_json() -> None:
    result = CliRunner().invoke(cli, ["jobs", "list", *DEMO, "--partitions", "4", "--json"])
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    job = orjson.loads(line)
    assert (job["context"], job["job"], job["scope"]) == ("shop", "unpaid-report", "SYSTEM")
    assert job["rule"]["kind"] == "cron"
    assert job["instances"] == [
        {"id": "unpaid-report", "partition": partition_of("unpaid-report", 4)}
    ]


def _sized(alphabet: st.SearchStrategy[str], most: int) -> st.SearchStrategy[str]:
    """Text of every length up to `most` as likely (plain `st.text` seldom draws long ones)."""
    return st.integers(1, most).flatmap(lambda n: st.text(alphabet, min_size=n, max_size=n))


# no control character: a tenant refuses it (`tables.refs.control_character`)
_TENANT = _sized(
    st.characters(codec="utf-8", exclude_characters=[*map(chr, range(32)), "\x7f"]), 200
)


@settings(max_examples=200, deadline=None)
@given(
    action=st.sampled_from(["enable", "disable", "trigger"]),
    request_id=_sized(st.sampled_from("ab-"), 200),
    tenants=st.lists(_TENANT, min_size=1, max_size=3),
)
def test_per_instance_request_ids_fit_or_are_refused_naming_the_request_id(
    action: str, request_id: str, tenants: list[str]
) -> None:
    """`<request id>@<tenant>/<instance>` is never longer than a request id may be (a
    trigger's leaves room for its run's `>n` sends): refused up front otherwise, and the
    same request makes the same ids (sent again, each is a DUPLICATE)."""
    limit = MAX_REQUEST_ID - (sent_suffix_length(TRIGGER_SENDS - 1) if action == "trigger" else 0)

    def made() -> list[str]:
        cmds = instance_commands(
            action, "ops", REPORT, partitions=PARTITIONS, tenants=tenants, request_id=request_id
        )
        return [c.request_id for c in cmds]

    try:
        ids = made()
    except JobsCliError as exc:
        assert getattr(exc, "field", None) == "request_id", exc
        assert "--request-id is too long" in str(exc)
        assert any(
            len(f"{action_request_id(action, request_id)}@{t}/report") > limit for t in tenants
        )
        return
    assert ids == made()
    if len(ids) > 1:
        assert all(len(i) <= limit for i in ids)


JOBS_OPS = ["--service", f"{__name__}:SERVICE", "--context", "ops", "--job", "report"]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        # a bad option's value exits 2 on every command (enable's exited 1)
        (["trigger", "--tenant", "t" * 201], 2, "--tenant 'tttt"),
        (["enable", "--tenant", "t" * 201], 2, "--tenant 'tttt"),
        (
            ["trigger", "--tenant", "a", "--tenant", "t" * 100, "--request-id", "r" * 190],
            2,
            "--request-id is too long for 2 instances",
        ),
    ],
)
def test_a_tenant_or_request_id_too_long_is_one_error_line_naming_it(
    args: list[str], code: int, message: str
) -> None:
    result = CliRunner().invoke(cli, ["jobs", args[0], *JOBS_OPS, *args[1:]])
    assert result.exit_code == code, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and message in line, line
    assert "at most" in line, line


def test_a_fresh_request_id_fits_whatever_the_tenant_and_instance() -> None:
    """`<verb>:<tenant>:<instance>:<uuid>` was longer than a request id for a long tenant
    and job name (a ValidationError, a 500): its readable prefix is cut, the uuid kept."""
    long_job = Job("j" * 100, JobScope.TENANT, IntervalRule(start=0, every=60_000), _nothing)
    made = [
        instance_commands(action, "ops", long_job, partitions=PARTITIONS, tenants=["t" * 200])[0]
        for action in ("reschedule", "reschedule", "enable")
    ]
    assert all(len(c.request_id) <= MAX_REQUEST_ID for c in made)
    assert len({c.request_id for c in made}) == 3
    assert made[0].request_id.startswith("reschedule:" + "t" * 200 + ":jjj")


@pytest.mark.parametrize(
    ("action", "more"),
    [("enable", []), ("disable", []), ("reschedule", ["--rule", "null"]), ("trigger", [])],
)
def test_the_request_id_given_is_the_one_sent(
    action: str, more: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`jobs enable|disable|reschedule` took no `--request-id` where their HTTP routes take
    one (and `jobs trigger` did): sent again, a change made under a fresh id each time was
    never answered DUPLICATE. Sent as the action's own id (`<action>:<request id>`)."""
    sent: list[CommandEnvelope] = []

    async def send(
        bootstrap: object,
        partitions: int,
        commands: list[CommandEnvelope],
        wait: float,
        replication: Replication,
    ) -> dict[str, CommandResult]:
        # The context's topics, made here when no worker made them yet, as a worker would.
        assert replication == Replication(3, 2)
        sent.extend(commands)
        return {
            c.request_id: CommandResult(
                request_id=c.request_id,
                aggregate=c.aggregate,
                code=ResultCode.DUPLICATE,
                decided_at=0,
            )
            for c in commands
        }

    async def no_check(kafka: object) -> None:
        pass

    monkeypatch.setattr(app.cli.common, "check_access", no_check)
    monkeypatch.setattr(app.cli.job_options, "send_and_wait", send)
    nightly = ["--service", f"{__name__}:SERVICE", "--context", "ops", "--job", "nightly"]
    result = CliRunner().invoke(
        cli, ["jobs", action, *nightly, *more, "--request-id", "deploy-42", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert [c.request_id for c in sent] == [f"{action}:deploy-42"]
    assert orjson.loads(result.stdout)["request_id"] == f"{action}:deploy-42"


@pytest.mark.parametrize("action", ["enable", "disable", "reschedule"])
@pytest.mark.parametrize("request_id", ["", " padded", "r" * 201])
def test_a_bad_request_id_exits_2_as_triggers_does(action: str, request_id: str) -> None:
    more = ["--rule", "null"] if action == "reschedule" else []
    result = CliRunner().invoke(
        cli,
        ["jobs", action, *JOBS_OPS[:-1], "nightly", *more, "--request-id", request_id],
    )
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: --request-id ") and "1-200 characters" in line, line
