"""`tickwheel rebuild` run as an operator runs it, on the in-memory log: under a group that
is not the workers' it refuses (a dry run too) and changes nothing; a rebuild that fails
half-way says what it left and that running it again finishes it, which it does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner, Result

import app.cli.common
import app.cli.rebuild
from app.cli import cli
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.protocol.topics import AggregateTopics

WORKERS = "prod"
ORDER = AggregateTopics("shop", "order")
PARTITIONS = 2


async def worked_log(*types: AggregateTopics, group: str = WORKERS) -> MemoryLog:
    """Per type: events its workers (of `group`) read, their changelog rows and offsets
    committed in one transaction."""
    specs = []
    for t in types:
        specs += [TopicSpec(t.events, PARTITIONS), TopicSpec(t.timers_changelog, PARTITIONS)]
    log = MemoryLog(specs)
    for t in types:
        await log.publisher().send_many([(t.events, 0, b"o", b"e")] * 3)
        worker = log.transactional_writer(f"worker-{t.type_name}")
        await worker.start()
        rows = [(t.timers_changelog, p, b"row", b"{}") for p in range(PARTITIONS)]
        await worker.commit(rows, {(t.events, 0): 3, (t.events, 1): 0}, group)
    return log


def state(log: MemoryLog, t: AggregateTopics, group: str = WORKERS) -> list[object]:
    return [
        (log.offsets(t.timers_changelog, p), log.committed(group, t.events, p))
        for p in range(PARTITIONS)
    ]


@pytest.fixture
def on_memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MemoryLog]]:
    """The command's clients are the log put in the list (the tests are not async: the
    command runs its own event loop)."""
    logs: list[MemoryLog] = []

    async def let_in(kafka: object) -> None:
        return None

    monkeypatch.setattr(app.cli.common, "check_access", let_in)
    monkeypatch.setattr(app.cli.rebuild, "KafkaClients", lambda bootstrap: logs[0])
    yield logs


def rebuild(*args: str, group: str | None = None) -> Result:
    env = {"TICKWHEEL_GROUP_ID": group} if group is not None else {}
    command = ["--log-level", "WARNING", "rebuild", "--no-wait", "--bootstrap", "m:1", *args]
    return CliRunner().invoke(cli, command, env=env)


@pytest.mark.parametrize("group", [None, "prdo"], ids=["unset", "typo"])
def test_a_group_with_no_offset_on_the_log_is_refused_and_nothing_changes(
    on_memory: list[MemoryLog], group: str | None
) -> None:
    """The workers run in `prod`; the operator's shell has no TICKWHEEL_GROUP_ID (the
    default group) or a typo of it. The rebuild emptied the live changelog, set back a
    group no worker runs in, and said it was done: `prod`, its offsets kept, replayed
    nothing, and its next take dropped its copy (older than the changelog): timers gone."""
    log = asyncio.run(worked_log(ORDER))
    on_memory.append(log)
    before = state(log, ORDER)
    used = group or "tickwheel"
    for dry in (["--dry-run"], []):
        result = rebuild("--type", ORDER.type_name, *dry, group=group)
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.splitlines()
        assert f"group '{used}' has no committed offset on {ORDER.events}" in line
        assert ORDER.timers_changelog in line and "TICKWHEEL_GROUP_ID" in line
        assert "--new-group" in line
        assert "may run" not in result.stdout
    assert state(log, ORDER) == before
    assert state(log, ORDER, used) == [((0, 2), None)] * PARTITIONS


def test_new_group_rebuilds_for_a_group_that_never_ran(on_memory: list[MemoryLog]) -> None:
    log = asyncio.run(worked_log(ORDER))
    on_memory.append(log)
    dry = rebuild("--type", ORDER.type_name, "--dry-run", "--new-group", group="fresh")
    assert dry.exit_code == 0, dry.output
    assert "group fresh has no running worker: the rebuild may run" in dry.stdout
    result = rebuild("--type", ORDER.type_name, "--new-group", group="fresh")
    assert result.exit_code == 0, result.output
    assert state(log, ORDER, "fresh") == [((2, 2), 0)] * PARTITIONS


def test_the_workers_group_is_rebuilt(on_memory: list[MemoryLog]) -> None:
    log = asyncio.run(worked_log(ORDER))
    on_memory.append(log)
    dry = rebuild("--type", ORDER.type_name, "--dry-run", "--json", group=WORKERS)
    assert dry.exit_code == 0, dry.output
    assert '"may_run":true' in dry.stdout
    result = rebuild("--type", ORDER.type_name, group=WORKERS)
    assert result.exit_code == 0, result.output
    assert state(log, ORDER) == [((2, 2), 0)] * PARTITIONS
