"""`tickwheel jobs …`: which commands it makes for which instances, and its errors."""

from __future__ import annotations

import re

import orjson
import pytest
from typer.testing import CliRunner

from app.cli import cli
from app.cli.jobs import (
    find_job,
    instance_commands,
    parse_rule_option,
)
from app.errors import JobsCliError
from app.jobs import DISABLE, ENABLE, RESCHEDULE, Job, JobRun, JobScope, shard_ref
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
        ('{"kind": "cron", "expr": "nope"}', "invalid cron expression"),
        ('{"colour": "red"}', "colour"),
    ],
)
def test_a_bad_rule_is_refused_before_anything_is_sent(text: str, message: str) -> None:
    with pytest.raises(JobsCliError, match=re.escape(message)):
        parse_rule_option(text, SWEEP)


def test_a_rule_is_an_override_and_null_is_none() -> None:
    assert parse_rule_option('{"every": 700}', SWEEP) == {"every": 700}
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
    commands = instance_commands("enable", "ops", SWEEP, partitions=PARTITIONS, rule={"every": 500})
    assert [partition_of(c.aggregate.id, PARTITIONS) for c in commands] == list(range(PARTITIONS))
    assert all(c.body == {"job": "sweep", "rule": {"every": 500}} for c in commands)
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
            ["enable", *DEMO, "--context", "shop", "--job", "unpaid-report", "--rule", "{"],
            "--rule is not JSON",
        ),
        (
            ["reschedule", *DEMO, "--context", "shop", "--job", "unpaid-report", "--rule", "3"],
            "must be a JSON object",
        ),
        (
            ["enable", *DEMO, "--context", "shop", "--job", "unpaid-report", "--partition", "0"],
            "--partition is for SHARDED jobs",
        ),
        (
            ["disable", *DEMO, "--context", "shop", "--job", "unpaid-report", "--tenant", "t"],
            "--tenant is for TENANT jobs",
        ),
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
