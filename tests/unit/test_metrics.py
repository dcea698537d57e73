"""NodeMetrics and what feeds it, without a broker: a fake clock, the memory store, fakes
for the producer and the reader. Each test reads the registry as Prometheus would.

The last tests keep the dashboard from drifting from the code: every metric the Grafana
JSON queries is exported here, and the compose file, Prometheus and Grafana configs agree.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from fakes import (
    DASHBOARD,
    METRIC_NAME,
    OWNER,
    T0,
    AnsweringSender,
    FakeLocal,
    Order,
    StillClock,
    dashboard_metrics,
    exported,
    order_type,
)
from prometheus_client import generate_latest

from app.commands.processor import CommandProcessor
from app.kafka import OutRecord, Reader, Record, TransactionalProducer
from app.kafka.broker_watch import BrokerWatch
from app.model.aggregate import Command, Decision
from app.node.metrics import LATENESS_BUCKETS, NodeMetrics
from app.node.partition_transaction import Transaction, _Staged
from app.node.settings import Settings
from app.ops.status_for_node import bad_records_counter, report_errors_counter
from app.protocol.wire import CommandEnvelope, ResultCode
from app.timers.restore import restore_partition
from app.timers.runner import SENT, SendResult, TimerOptions, TimerRunner
from tables import (
    AggregateRef,
    CommandSpec,
    OnceRule,
    Timer,
    TimerChange,
    TimerStatus,
    TimerStore,
    open_timer_store,
)
from tables.aggregate_store import MemoryAggregateStore
from tables.ledger import MemoryFailureLedger
from tables.partitioner import partition_of

ROOT = Path(__file__).resolve().parents[2]
P = 4
TYPE = "shop.order"


def sample(metrics: NodeMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def timer(n: int, due: int, partition: int = 0) -> Timer:
    return Timer(
        id=f"t-{n}",
        owner=AggregateRef(context="shop", aggregate="order", id=f"o-{n}"),
        key="remind",
        version=1,
        partition=partition,
        rule=OnceRule(at=due),
        target=OWNER,
        command=CommandSpec(type="shop.Remind"),
        slot_due_at=due,
        due_at=due,
    )


def runner(store: TimerStore, clock: StillClock, local: FakeLocal | None = None) -> TimerRunner:
    options = TimerOptions(claim_timeout=5_000, send_timeout=1_000, poll_interval_ms=100)
    r = TimerRunner(
        store,
        AnsweringSender(then=SENT),
        clock,
        MemoryFailureLedger(),
        options,
        partitions=range(P),
        in_process=None if local is None else local.targets,
    )
    if local is not None:
        local.runner = r
    return r


# --- lateness ---------------------------------------------------------------------------


def test_fired_puts_each_timers_lateness_in_its_types_histogram_and_the_window() -> None:
    metrics = NodeMetrics()
    now = T0 + 5_000
    metrics.fired(TYPE, [T0 + 4_996, T0 + 4_950, T0 + 3_000], now)
    metrics.fired("shop.invoice", [], now)  # a batch without timers: nothing observed

    assert sample(metrics, "tickwheel_timer_lateness_seconds_count", type=TYPE) == 3
    assert sample(metrics, "tickwheel_timer_lateness_seconds_sum", type=TYPE) == pytest.approx(
        0.004 + 0.05 + 2.0
    )
    le = {b: sample(metrics, "tickwheel_timer_lateness_seconds_bucket", type=TYPE, le=str(b))
          for b in LATENESS_BUCKETS}  # fmt: skip
    assert le[0.0025] == 0 and le[0.005] == 1 and le[0.05] == 2 and le[2.5] == 3
    assert sample(metrics, "tickwheel_timer_lateness_seconds_count", type="shop.invoice") is None

    [point] = metrics.recent_lateness.recent(1, now / 1000)
    assert point.second == now // 1000
    assert point.count == 3
    assert point.max_ms == pytest.approx(2000.0)


orders = order_type()


@orders.command("shop.Refuse")
def refuse(state: Order, cmd: Command, d: Decision) -> None:
    d.reject("no")


@orders.command("shop.Crash")
def crash(state: Order, cmd: Command, d: Decision) -> None:
    raise ValueError("a body the handler cannot read")


async def test_the_batch_keeps_the_due_times_of_timer_commands_decided_for_good() -> None:
    """Committed, unchanged and rejected commands were decided for good; a duplicate was
    counted the first time, an error is sent again, a command with no due time is no
    timer's: only the first kind is measured."""
    p = partition_of(OWNER.id, P)

    async def commit(
        records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]
    ) -> list[int]:
        return list(range(len(records)))

    processor = CommandProcessor(
        orders, p, partitions=P, states=MemoryAggregateStore(), commit=commit, now=lambda: T0
    )

    def cmd(request_id: str, type_: str, not_before: int | None) -> CommandEnvelope:
        return CommandEnvelope(
            request_id=request_id,
            type=type_,
            aggregate=OWNER,
            not_before=not_before,
            issued_at=T0,
            in_process=True,
        )

    batch = processor.begin()
    decided = processor.decide_local(
        batch,
        [
            cmd("t-1#0", "shop.Remind", T0 - 10),
            cmd("t-1#0", "shop.Remind", T0 - 10),  # the same slot again: DUPLICATE
            cmd("t-2#0", "shop.Refuse", T0 - 20),
            cmd("t-3#0", "shop.Crash", T0 - 30),
            cmd("plain", "shop.Remind", None),
        ],
    )
    codes = [code for _, code, _ in decided]
    assert codes == [
        ResultCode.COMMITTED,
        ResultCode.DUPLICATE,
        ResultCode.REJECTED,
        ResultCode.ERROR,
        ResultCode.COMMITTED,
    ]
    assert batch.fired_due == [T0 - 10, T0 - 20]


# --- the firing loop's counts -------------------------------------------------------------


async def test_a_lapsed_claim_taken_again_is_counted_with_the_rounds_actions() -> None:
    store = open_timer_store("memory://", partitions=P)
    clock = StillClock(T0)
    r = runner(store, clock)
    [held] = await store.put_many([timer(1, T0 - 1_000)])
    # A claim made by a node that died before settling it: FIRING, its lapse passed.
    claim = held.model_copy(update={"status": TimerStatus.FIRING, "due_at": T0 - 1})
    assert await store.settle([TimerChange(loaded=held, next=claim)]) == 1
    metrics = NodeMetrics()

    stats = await r.run_round()
    metrics.round(TYPE, stats)

    assert stats.lapsed == 1 and stats.fired == 1
    assert sample(metrics, "tickwheel_timer_actions_total", type=TYPE, action="lapsed") == 1
    assert sample(metrics, "tickwheel_timer_actions_total", type=TYPE, action="fired") == 1
    assert (await r.run_round()).lapsed == 0, "settled: not lapsed again"


async def test_backlog_counts_rows_due_and_timers_handed_over_but_not_fired_yet() -> None:
    store = open_timer_store("memory://", partitions=P)
    clock = StillClock(T0)
    local = FakeLocal()
    r = runner(store, clock, local)
    # Each aimed at its owner: fired in-process in its own partition.
    aimed = [timer(1, T0 + 10), timer(2, T0 + 20, partition=1), timer(3, T0 + 90)]
    await store.put_many([t.model_copy(update={"target": t.owner}) for t in aimed])
    stats = await r.run_round()  # nothing due yet: the wheel holds the three
    assert stats.claimed == 0
    assert r.backlog(T0) == (0, None)

    clock.t = T0 + 50  # two due, no round yet: due and not sent
    assert r.backlog(clock.t) == (2, T0 + 10)

    await r.run_round()  # handed over to fire in-process, their cycle not run yet
    assert sorted(t.id for t in local.fired) == ["t-1", "t-2"]
    assert r.backlog(clock.t) == (2, T0 + 10)

    outcomes = [(t, SendResult(ResultCode.COMMITTED.value)) for t in local.fired]
    await r.record_outcomes(outcomes)
    assert r.backlog(clock.t) == (0, None)


# --- gauges read at a scrape ------------------------------------------------------------


async def test_refresh_sets_the_gauges_and_drops_the_series_of_partitions_let_go() -> None:
    store = open_timer_store("memory://", partitions=P)
    clock = StillClock(T0)
    r = runner(store, clock)
    ledger = MemoryFailureLedger()
    held = await store.put_many([timer(1, T0 - 3_000), timer(2, T0 + 60_000), timer(3, T0 + 1, 2)])
    parked = held[1].model_copy(update={"status": TimerStatus.PARKED})
    await store.settle([TimerChange(loaded=held[1], next=parked)])
    await ledger.record(TimerOptions.PARKED_SUBSCRIPTION, OWNER, [parked])
    await r.run_round()  # loads the wheel; t-1 is claimed and sent (SENT: fired)
    clock.t = T0 + 5
    metrics = NodeMetrics()

    await metrics.refresh(clock.t, [(TYPE, store, r)], {"shop": ledger})

    def active(partition: int, status: str) -> float | None:
        return sample(
            metrics, "tickwheel_timers", type=TYPE, partition=str(partition), status=status
        )

    assert [active(0, s) for s in ("pending", "firing", "parked")] == [0, 0, 1]
    assert active(2, "pending") == 1
    assert active(1, "pending") == 0, "an owned partition without timers reads 0"
    assert sample(metrics, "tickwheel_timer_backlog", type=TYPE) == 1  # t-3, due at T0 + 1
    assert sample(metrics, "tickwheel_timer_backlog_oldest_seconds", type=TYPE) == 0.004
    assert sample(metrics, "tickwheel_ledger_entries", context="shop") == 1

    await r.stop_partition(2)
    await metrics.refresh(clock.t, [(TYPE, store, r)], {"shop": ledger})
    assert active(2, "pending") is None, "a partition let go leaves no stale series"
    assert active(0, "parked") == 1


async def test_store_counts_follow_every_write_without_a_scan() -> None:
    """Counted once (all zero), then each put, claim, cancel and settle moves the counts;
    finished rows (FIRED, CANCELLED) are not counted."""
    store = open_timer_store("memory://", partitions=P)
    assert store.status_counts(0) == {s: 0 for s in _ACTIVE}
    [a, b] = await store.put_many([timer(1, T0), timer(2, T0 + 1)])
    firing = a.model_copy(update={"status": TimerStatus.FIRING, "due_at": T0 + 5_000})
    await store.settle([TimerChange(loaded=a, next=firing)])
    assert await store.cancel(b.owner, b.key, b.version)
    assert store.status_counts(0) == {
        TimerStatus.PENDING: 0,
        TimerStatus.FIRING: 1,
        TimerStatus.PARKED: 0,
        TimerStatus.PAUSED: 0,
    }
    fired = firing.model_copy(update={"status": TimerStatus.FIRED})
    await store.settle([TimerChange(loaded=firing, next=fired)])
    assert sum(store.status_counts(0).values()) == 0


_ACTIVE = (TimerStatus.PENDING, TimerStatus.FIRING, TimerStatus.PARKED, TimerStatus.PAUSED)


# --- restores and commits ----------------------------------------------------------------


class FakeReader:
    """A changelog of `end` offsets, read in batches of two."""

    def __init__(self, records: list[Record], end: int) -> None:
        self._records = records
        self._end = end

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, self._end

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        todo = [r for r in self._records if r.offset >= start]
        for i in range(0, len(todo), 2):
            yield todo[i : i + 2]


async def test_a_restore_reports_its_progress_in_offsets_to_its_partitions_gauges() -> None:
    from tables.keys import encode_timer, row_key

    rows = [timer(n, T0 + n) for n in range(5)]
    # Offsets 0..4 are rows, 5 a transaction marker: the restore must read 6 offsets.
    records = [
        Record("t", 0, n, row_key(t.owner, t.key), encode_timer(t), T0) for n, t in enumerate(rows)
    ]
    store = open_timer_store("memory://", partitions=P)
    metrics = NodeMetrics()
    progress = metrics.restore_progress(TYPE, 0, "timers")
    seen: list[tuple[int, int]] = []

    def both(read: int, to_read: int) -> None:
        seen.append((read, to_read))
        progress(read, to_read)

    reader = cast(Reader, FakeReader(records, end=6))
    assert await restore_partition(store, reader, "t", 0, progress=both) == 5
    assert seen == [(0, 6), (2, 6), (4, 6), (5, 6), (6, 6)]
    labels = {"type": TYPE, "partition": "0", "store": "timers"}
    assert sample(metrics, "tickwheel_restore_records_read", **labels) == 6
    assert sample(metrics, "tickwheel_restore_records_to_read", **labels) == 6
    assert store.status_counts(0)[TimerStatus.PENDING] == 5


class FakeProducer:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    async def commit(
        self, records: list[OutRecord], offsets: dict[tuple[str, int], int], group: str
    ) -> list[int]:
        if self.fail:
            raise RuntimeError("the broker went away")
        return list(range(len(records)))


async def test_each_successful_commit_is_timed_a_failed_one_is_not() -> None:
    metrics = NodeMetrics()
    observe = metrics.commit_duration.labels(TYPE).observe

    def transaction(producer: FakeProducer) -> Transaction:
        staged = _Staged(records=[("t", 0, b"k", b"v")])
        return Transaction(cast(TransactionalProducer, producer), "g", [], staged, observe)

    assert await transaction(FakeProducer()).send() == [0]
    with pytest.raises(RuntimeError):
        await transaction(FakeProducer(fail=True)).send()
    assert sample(metrics, "tickwheel_commit_duration_seconds_count", type=TYPE) == 1
    total = sample(metrics, "tickwheel_commit_duration_seconds_sum", type=TYPE)
    assert total is not None and 0 <= total < 1


def test_web_host_comes_from_the_environment_loopback_by_default() -> None:
    assert Settings.from_env({}).web_host == "127.0.0.1"
    assert Settings.from_env({"TICKWHEEL_WEB_HOST": " "}).web_host == "127.0.0.1"
    assert Settings.from_env({"TICKWHEEL_WEB_HOST": "0.0.0.0"}).web_host == "0.0.0.0"


# --- the dashboard and the monitoring profile ----------------------------------------------


async def fed() -> NodeMetrics:
    """A NodeMetrics fed as a node feeds it, one of each."""
    metrics = NodeMetrics()
    store = open_timer_store("memory://", partitions=P)
    clock = StillClock(T0)
    r = runner(store, clock)
    await store.put_many([timer(1, T0)])
    stats = await r.run_round()
    metrics.round(TYPE, stats)
    metrics.fired(TYPE, [T0 - 5], T0)
    metrics.puts.labels(TYPE).inc()
    metrics.commands.labels(TYPE, ResultCode.BUSY.value).inc()
    metrics.commit_duration.labels(TYPE).observe(0.01)
    metrics.restore_progress(TYPE, 0, "timers")(3, 3)
    metrics.restore_duration.labels(TYPE, "timers").observe(0.5)
    metrics.owned.set(P)
    await metrics.refresh(clock.t, [(TYPE, store, r)], {"shop": MemoryFailureLedger()})
    return metrics


async def test_every_metric_the_dashboard_queries_is_exported_with_samples() -> None:
    """The exposition as /metrics serves it: the dashboard cannot name a metric the code
    does not export. The same check runs on a real worker's /metrics in
    tests/integration/test_metrics_worker.py."""
    metrics = await fed()
    missing = dashboard_metrics() - exported(generate_latest(metrics.registry).decode())
    assert not missing, f"the dashboard queries metrics nobody exports: {sorted(missing)}"


def readme_metrics() -> str:
    """The Metrics section of docs/operations.md (where the README's contents send a
    reader for metrics)."""
    text = (ROOT / "docs" / "operations.md").read_text()
    assert "docs/operations.md#metrics" in (ROOT / "README.md").read_text()
    return text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]


async def test_the_readme_lists_exactly_the_metrics_a_node_exports() -> None:
    """As a worker's registry has them: the node's metrics, its broker watch's and its
    cluster status's, all on one registry (`Node`: `BrokerWatch(..., registry=...)`; the
    worker: `app.ops.status_for_node.for_node`)."""
    metrics = await fed()
    BrokerWatch("127.0.0.1:9092", registry=metrics.registry)
    bad_records_counter(metrics.registry)  # the worker's cluster status (`for_node`)
    report_errors_counter(metrics.registry)
    names = {f.name for f in metrics.registry.collect()}
    samples = exported(generate_latest(metrics.registry).decode())
    listed = set(METRIC_NAME.findall(readme_metrics()))
    assert listed, "no metric in the docs' Metrics section"
    # A counter's family is named without `_total`, which its samples carry.
    families = {m.removesuffix("_total") for m in listed}
    assert families - names - samples == set(), "the docs list metrics nobody exports"
    assert names - families == set(), "exported but not in the docs"
    assert {"tickwheel_broker_reachable", "tickwheel_broker_outages"} <= families


def test_the_readme_names_every_action_the_firing_loop_counts() -> None:
    from app.node.metrics import _ROUND_FIELDS

    [row] = [r for r in readme_metrics().splitlines() if "tickwheel_timer_actions_total" in r]
    named = set(re.findall(r"`([a-z_]+)`", row))
    assert set(_ROUND_FIELDS) - named == set(), "actions exported but not in the docs"
    assert "lapsed" in _ROUND_FIELDS


def test_the_readmes_monitoring_command_starts_the_profile_the_compose_file_has() -> None:
    """No Docker engine here to run it: the command's profile and scaled service are
    checked against the compose file (`docker compose config` accepts both: run by hand
    with docker-compose 1.29)."""
    [command] = re.findall(r"```sh\n(docker compose [^\n]*)\n```", readme_metrics())
    words = command.split()
    assert words[:3] == ["docker", "compose", "--profile"] and words[4] == "up", command
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    profiles = {p for s in compose["services"].values() for p in s.get("profiles", [])}
    assert words[3] in profiles
    scaled = words[words.index("--scale") + 1].split("=")[0]
    assert scaled in compose["services"]


def test_the_dashboard_covers_what_operators_watch() -> None:
    used = dashboard_metrics()
    for name in (
        "tickwheel_timer_lateness_seconds_bucket",
        "tickwheel_timer_backlog",
        "tickwheel_timer_actions_total",
        "tickwheel_timer_puts_total",
        "tickwheel_timers",
        "tickwheel_commit_duration_seconds_bucket",
        "tickwheel_restore_records_read",
        "tickwheel_restore_records_to_read",
    ):
        assert name in used, name


def test_the_monitoring_profile_scrapes_the_workers_and_provisions_the_dashboard() -> None:
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"], name
    for name in ("kafka", "worker"):
        assert "profiles" not in services[name], f"{name} runs without the profile too"

    worker_env = services["worker"]["environment"]
    prometheus: dict[str, Any] = yaml.safe_load((ROOT / "ops" / "prometheus.yml").read_text())
    [job] = prometheus["scrape_configs"]
    [sd] = job["dns_sd_configs"]
    assert sd["names"] == ["worker"] and sd["port"] == int(worker_env["TICKWHEEL_WEB_PORT"])
    assert worker_env["TICKWHEEL_WEB_HOST"] == "0.0.0.0", "reachable from another container"
    assert job.get("metrics_path", "/metrics") == "/metrics"

    mounts: dict[str, str] = {}
    for service in ("prometheus", "grafana"):
        for volume in services[service]["volumes"]:
            source, target = volume.split(":")[:2]
            assert (ROOT / source).exists(), f"{service} mounts {source}, which is missing"
            mounts[target] = source
    assert mounts["/etc/prometheus/prometheus.yml"] == "./ops/prometheus.yml"

    provisioning = ROOT / "ops" / "grafana" / "provisioning"
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    [datasource] = datasources["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((provisioning / "dashboards" / "tickwheel.yml").read_text())
    [provider] = providers["providers"]
    dashboard_dir = provider["options"]["path"]
    assert mounts[f"{dashboard_dir}/tickwheel.json"] == "./ops/grafana/tickwheel.json"
    dashboard = json.loads(DASHBOARD.read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    uids |= {p["datasource"]["uid"] for p in dashboard["panels"]}
    assert uids == {datasource["uid"]}, "every panel queries the provisioned Prometheus"
