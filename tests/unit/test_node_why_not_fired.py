"""Why a timer did not fire (#22), end to end on the in-memory log: a target whose handler
fails answers ERROR with a message; the timer's row (its changelog record), the failure
ledger's entry and `tickwheel timers show` all carry that code and message."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from fakes import RunningNode, wait_until
from pydantic import BaseModel
from typer.testing import CliRunner

import app.cli.timers
from app.cli import cli
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, encode
from app.service import Service
from app.timers.ledger import LedgerView
from app.timers.runner import RetryPolicy, TimerOptions
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.partitioner import partition_of

PARTITIONS = 2
TOPICS = AggregateTopics("why", "order")
MESSAGE = "ValueError: out of stock\tfor sku 7"


class Order(BaseModel):
    pass


order = AggregateType("why", "order", Order)


@order.command("Schedule")
def _schedule(state: Order, cmd: Command, d: Decision) -> None:
    d.schedule("ship", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Ship"))


@order.command("Ship")
def _ship(state: Order, cmd: Command, d: Decision) -> None:
    raise ValueError("out of stock\tfor sku 7")


def rows(log: MemoryLog) -> list[Timer]:
    """The changelog's latest row of each timer."""
    latest: dict[bytes, bytes | None] = {}
    for p in range(PARTITIONS):
        for r in log.records(TOPICS.timers_changelog, p):
            assert r.key is not None
            latest[r.key] = r.value
    return [Timer.model_validate_json(v) for v in latest.values() if v is not None]


@pytest.fixture
async def parked(tmp_path: Path) -> AsyncIterator[MemoryLog]:
    """A node whose timer's target always fails, run until the timer is parked."""
    log = MemoryLog()
    retry = RetryPolicy(initial_backoff_ms=10, max_backoff_ms=10, max_attempts=2)
    service = Service(aggregates=(order,))
    node = RunningNode(log, tmp_path, "node", service, PARTITIONS, timers=TimerOptions(retry=retry))
    await node.start()
    try:
        owner = AggregateRef(context="why", aggregate="order", id="o-1")
        now = int(time.time() * 1000)
        cmd = CommandEnvelope(
            request_id=uuid.uuid4().hex,
            type="Schedule",
            aggregate=owner,
            body={"at": now},
            issued_at=now,
        )
        p = partition_of(owner.id, PARTITIONS)
        await log.publisher().send(TOPICS.commands, owner.id.encode(), encode(cmd), p)
        await wait_until(
            lambda: any(t.status is TimerStatus.PARKED for t in rows(log)),
            what=lambda: f"never parked: {rows(log)}",
        )
    finally:
        await node.stop()
    yield log


async def test_the_row_and_the_ledger_entry_keep_the_targets_error(parked: MemoryLog) -> None:
    [row] = rows(parked)
    assert (row.status, row.attempts, row.outcome) == (TimerStatus.PARKED, 2, "FAILED")
    assert (row.error_code, row.error_text) == ("ERROR", MESSAGE)
    view = LedgerView()
    ledger = ContextTopics("why").ledger
    for p in range(parked.partitions(ledger)):
        for record in parked.records(ledger, p):
            assert view.apply_record(record)
    [entry] = view.entries()
    assert entry.timers == (row.request_id,)
    assert (entry.error_code, entry.error_text) == ("ERROR", MESSAGE)


def test_timers_show_prints_the_error_of_the_row_and_of_each_failed_version(
    parked: MemoryLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI reads the same changelog: the node's memory log is the CLI's cluster."""
    monkeypatch.setattr(app.cli.timers, "clients_for", lambda settings: parked)
    args = ["timers", "show", "--type", "why.order", "--owner", "o-1", "--bootstrap", "b:9092"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    quoted = orjson.dumps(MESSAGE).decode()
    assert lines[1].startswith("ship: PARKED\t")
    assert lines[1].endswith(f"\terror ERROR {quoted}")
    # Its versions: the claims and the first failure, then the park, each as written.
    failed = [line for line in lines[2:] if line.endswith(f"\terror ERROR {quoted}")]
    assert len(failed) >= 2 and "\tPARKED\t" in failed[-1]
    assert "\terror" not in lines[2], "the first version (set, never sent) has none"
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    last = orjson.loads(result.stdout.splitlines()[-1])["row"]
    assert (last["error_code"], last["error_text"]) == ("ERROR", MESSAGE)
