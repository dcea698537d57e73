"""`tickwheel jobs list --state` and `jobs backfill` when TICKWHEEL_PARTITIONS is not the
count of the schedule log (the workers ran with 8 partitions, the operator's shell has the
default 12). The read-only listing reads the log with its own count, as the other
read-only commands read a topic; the backfill, which writes, refuses the count as the
other commands that write refuse it, dry run too: before, the instances' events were
looked for in other partitions and passed over as misrouted, and both said nothing was
there (`"state": []`, `0 slot(s)`, `no slot in the range`), exit 0."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from typer.testing import CliRunner, Result

import app.cli.common
import app.cli.job_actions
import app.cli.job_runs
from app.cli import cli
from app.jobs import Job, JobRun, JobScope, enable_commands, schedule_aggregate
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.model.decide import decide
from app.protocol.topics import AggregateTopics
from app.protocol.wire import encode
from app.service import Service
from tables import IntervalRule
from tables.partitioner import partition_of

T0 = 1_800_000_000_000
MIN = 60_000
HAVE = 8
"""The workers' count, and the log's; the commands' is the default, 12."""
EVENTS = AggregateTopics("shop", "schedule").events


def _nothing(run: JobRun) -> None:
    pass


NIGHTLY = Job("nightly", JobScope.SYSTEM, IntervalRule(start=T0, every=MIN), _nothing)
SWEEP = Job("sweep", JobScope.SHARDED, IntervalRule(start=T0, every=MIN), _nothing)
SERVICE = Service(aggregates=(), jobs={"shop": (NIGHTLY, SWEEP)})
assert partition_of(NIGHTLY.name, HAVE) != partition_of(NIGHTLY.name, 12)


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> MemoryLog:
    """The schedule log of 8 partitions, every instance enabled in it as the workers
    decided it; the commands' clients on it."""
    agg = schedule_aggregate("shop", [NIGHTLY, SWEEP], HAVE)
    log = MemoryLog([TopicSpec(EVENTS, HAVE)])
    records = []
    for job in (NIGHTLY, SWEEP):
        for cmd in enable_commands("shop", job, partitions=HAVE, now=T0 - 1):
            d = decide(agg, None, cmd, now=T0 - 1, seen=False)
            key = cmd.aggregate.id
            part = partition_of(key, HAVE)
            records += [(EVENTS, part, key.encode(), encode(e)) for e in d.events]
    asyncio.run(log.publisher().send_many(records))

    async def require_topic(where: object, topic: str, why: str) -> int:
        return log.partitions(topic)

    async def ensure_topics(where: object, specs: list[TopicSpec], replication: object) -> None:
        log.ensure_topics(specs)

    async def no_check(kafka: object) -> None:
        return None

    actions = app.cli.job_actions
    monkeypatch.setattr(actions, "require_topic", require_topic)
    monkeypatch.setattr(actions, "ensure_topics", ensure_topics)
    monkeypatch.setattr(actions, "Reader", lambda where: log.reader())
    monkeypatch.setattr(actions, "Producer", lambda where: log.publisher())
    monkeypatch.setattr(app.cli.common, "check_access", no_check)
    monkeypatch.setattr(app.cli.job_runs, "now_ms", lambda: T0 + 60 * MIN)
    monkeypatch.delenv("TICKWHEEL_PARTITIONS", raising=False)
    return log


SHOP = ["--service", f"{__name__}:SERVICE", "--context", "shop", "--bootstrap", "m:1"]


def _list(*extra: str) -> Result:
    return CliRunner().invoke(cli, ["jobs", "list", *SHOP, "--state", *extra])


@pytest.mark.usefixtures("log")
@pytest.mark.parametrize("given", [[], ["--partitions", str(HAVE)], ["--partitions", "3"]])
def test_jobs_list_state_reads_the_log_with_its_own_count(given: list[str]) -> None:
    result = _list("--json", *given)
    assert result.exit_code == 0, result.output
    nightly, sweep = (orjson.loads(line) for line in result.stdout.splitlines())
    assert [s["enabled"] for s in nightly["state"]] == [True]
    assert nightly["instances"] == [{"id": "nightly", "partition": partition_of("nightly", HAVE)}]
    # A SHARDED job's instances are the log's: one per partition of its 8.
    assert [i["partition"] for i in sweep["instances"]] == list(range(HAVE))
    assert len(sweep["state"]) == HAVE and all(s["enabled"] for s in sweep["state"])
    text = _list(*given)
    assert text.exit_code == 0, text.output
    assert text.stderr.endswith(f"1 context(s) with jobs, {HAVE} partition(s)\n"), text.stderr


def _backfill(*extra: str) -> Result:
    between = ["--from", str(T0), "--until", str(T0 + 4 * MIN)]
    return CliRunner().invoke(
        cli, ["jobs", "backfill", *SHOP, "--job", "nightly", *between, *extra]
    )


REFUSED = (
    f"error: topic {EVENTS} has {HAVE} partitions, expected 12: "
    "co-partitioned topics must all have the same count\n"
)


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
def test_a_backfill_refuses_a_log_of_another_count(log: MemoryLog, dry_run: list[str]) -> None:
    before = _written(log)
    result = _backfill(*dry_run, "--wait", "0")
    assert result.exit_code == 1, result.output
    assert result.stdout == "" and result.stderr == REFUSED, result.output
    assert _written(log) == before  # no topic made, nothing sent


def _written(log: MemoryLog) -> tuple[set[str], list[tuple[int, int]]]:
    return log.topic_names(), [log.offsets(EVENTS, p) for p in range(HAVE)]


@pytest.mark.usefixtures("log")
def test_a_backfill_with_the_logs_count_plans_its_slots() -> None:
    result = _backfill("--dry-run", "--json", "--partitions", str(HAVE))
    assert result.exit_code == 0, result.output
    assert [orjson.loads(line)["slot"] for line in result.stdout.splitlines()] == list(range(5))
