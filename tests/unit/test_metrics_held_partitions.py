"""The gauges a scrape reads of partitions taken here but not fired (held after a failed
cycle, behind their log's end), and of restores once their partition is let go."""

from __future__ import annotations

from pathlib import Path

from fakes import OWNER, T0, AnsweringSender, RunningNode, StillClock, wait_until
from test_node_memory import PARTITIONS, SERVICE

from app.kafka.memory import MemoryLog
from app.node.metrics import NodeMetrics
from app.timers.runner import SENT, TimerOptions, TimerRunner
from tables import AggregateRef, CommandSpec, OnceRule, Timer, open_timer_store
from tables.ledger import MemoryFailureLedger

P = 4
TYPE = "shop.order"


def timer(n: int, due: int, partition: int) -> Timer:
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


def sample(metrics: NodeMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_a_held_partitions_timers_and_overdue_ones_are_shown() -> None:
    """Fired: 0. Taken and restored but not fired (held): 1 and 2. Still restoring: 3,
    shown nothing (a count mid-restore would scan it). Let go: gone."""
    store = open_timer_store("memory://", partitions=P)  # serves every partition
    clock = StillClock(T0)
    options = TimerOptions(claim_timeout=5_000, send_timeout=1_000, poll_interval_ms=100)
    runner = TimerRunner(
        store, AnsweringSender(then=SENT), clock, MemoryFailureLedger(), options, partitions=[0]
    )
    metrics = NodeMetrics()
    for p in (0, 1, 2):
        metrics.restore_progress(TYPE, p, "timers")(4, 4)
    metrics.restore_progress(TYPE, 3, "timers")(1, 5)
    await store.put_many(
        [timer(1, T0 - 3_000, 2), timer(2, T0 + 60_000, 2), timer(3, T0 - 9_000, 3)]
    )

    await metrics.refresh(T0, [(TYPE, store, runner)], {})

    def active(p: int, status: str = "pending") -> float | None:
        return sample(metrics, "tickwheel_timers", type=TYPE, partition=str(p), status=status)

    assert [active(p) for p in range(P)] == [0, 0, 2, None]
    assert sample(metrics, "tickwheel_timer_backlog", type=TYPE) == 1, "held and overdue"
    assert sample(metrics, "tickwheel_timer_backlog_oldest_seconds", type=TYPE) == 3.0

    metrics.let_go_of(TYPE, 2)
    await store.revoke({2})
    await metrics.refresh(T0, [(TYPE, store, runner)], {})
    assert active(2) is None
    assert sample(metrics, "tickwheel_timer_backlog", type=TYPE) == 0


def test_a_partition_let_go_leaves_no_restore_series() -> None:
    metrics = NodeMetrics()
    for p in (0, 1):
        for kind in ("states", "timers"):
            metrics.restore_progress(TYPE, p, kind)(7, 7)
    metrics.let_go_of(TYPE, 1)
    metrics.let_go_of(TYPE, 3)  # never restored here: nothing to remove
    for name in ("tickwheel_restore_records_read", "tickwheel_restore_records_to_read"):
        for kind in ("states", "timers"):
            assert sample(metrics, name, type=TYPE, partition="0", store=kind) == 7
            assert sample(metrics, name, type=TYPE, partition="1", store=kind) is None


async def test_a_node_drops_the_restore_series_of_a_partition_moved_away(tmp_path: Path) -> None:
    log = MemoryLog()
    a = await RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS).start()
    b = None
    try:
        await wait_until(a.runs)
        b = await RunningNode(log, tmp_path, "b", SERVICE, PARTITIONS).start()
        await wait_until(lambda: a.runs(1) and b.runs(1), within=15)
        [kept] = a.node.owned
        restored = {
            (s.labels["partition"], s.labels["store"])
            for family in a.node.metrics.registry.collect()
            for s in family.samples
            if s.name == "tickwheel_restore_records_to_read"
        }
        assert restored == {(str(kept), "states"), (str(kept), "timers")}
    finally:
        if b is not None:
            await b.stop()
        await a.stop()
