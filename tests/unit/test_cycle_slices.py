"""A partition's worker decides what its queue holds in cycles of at most `CYCLE_RECORDS`
records (`cycle_slices`), the event loop let run between two of them: a partition
catching up on thousands of records held every other partition's timers and cycles for
hundreds of milliseconds (one cycle is one turn of the loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from app.kafka import Record
from app.node.commits import Commits
from app.node.cycle_work import CYCLE_RECORDS, behind_of, cycle_slices
from app.node.cycles import PartitionCycles
from app.node.kept import KeptType
from app.node.metrics import NodeMetrics
from app.node.partition_input import LOCAL, Batch, PartitionInput
from app.node.task_id import TaskId


def batch(topic: str, first: int, n: int) -> Batch:
    return (topic, [Record(topic, 0, first + i, None, None, 0) for i in range(n)])


batches = st.lists(
    st.tuples(st.sampled_from(["a.events", "a.commands"]), st.integers(1, 700)), max_size=8
)


@given(batches, st.integers(1, 300))
def test_slices_keep_every_record_in_order_each_within_the_budget(
    sizes: list[tuple[str, int]], budget: int
) -> None:
    items = [batch(topic, 1_000 * i, n) for i, (topic, n) in enumerate(sizes)]
    cycles = cycle_slices(items, budget)
    total = sum(n for _, n in sizes)
    assert len(cycles) == max(1, -(-total // budget))  # as few cycles as the budget allows
    assert all(sum(len(rs) for _, rs in c) <= budget for c in cycles)
    assert all(rs for c in cycles for _, rs in c), "an empty batch in a cycle"
    flat = [(topic, r.offset) for c in cycles for topic, rs in c for r in rs]
    assert flat == [(topic, r.offset) for topic, rs in items for r in rs]


@given(batches, st.integers(1, 300))
def test_each_cycle_knows_the_records_of_each_topic_in_the_cycles_after_it(
    sizes: list[tuple[str, int]], budget: int
) -> None:
    # A command's backlog counts them (BUSY), as when a whole poll was one cycle.
    items = [batch(topic, 1_000 * i, n) for i, (topic, n) in enumerate(sizes)]
    cycles = cycle_slices(items, budget)
    behind = behind_of(cycles)
    assert len(behind) == len(cycles)
    for i, after in enumerate(behind):
        expected: dict[str, int] = {}
        for cycle in cycles[i + 1 :]:
            for topic, records in cycle:
                expected[topic] = expected.get(topic, 0) + len(records)
        assert after == expected


def test_nothing_queued_but_timers_to_fire_is_one_empty_cycle() -> None:
    assert cycle_slices([]) == [[]]


class _Task:
    def __init__(self) -> None:
        self.input: PartitionInput | None = None
        self.read: list[dict[str, int]] = []

    def read_past(self, done: dict[str, int]) -> None:
        self.read.append(dict(done))

    def failed(self, what: str, exc: BaseException) -> None:
        raise AssertionError(f"{what}: {exc!r}")


class _Commits:
    async def room(self, kept: object, p: int) -> None:
        return None


async def test_a_backlog_is_decided_in_bounded_cycles_with_the_loop_let_run_between() -> None:
    """1,000 records queued at once are decided in 4 cycles of at most `CYCLE_RECORDS`,
    and another task (another partition's timer round) runs between two of them: without
    the slices, one cycle of 1,000 records held the loop throughout."""
    task = _Task()
    key = TaskId("a", 0)
    running: Mapping[TaskId, Any] = {key: task}
    cycles = PartitionCycles(
        types={"a": cast(KeptType, None)},  # its commits' `room` is all a worker asks of it
        by_topic={"a.events": (cast(KeptType, None), "events")},
        partitions=1,
        metrics=cast(NodeMetrics, None),
        commits=cast(Commits, _Commits()),
        running=running,
        backlog=lambda topic, p: asyncio.sleep(0, 0),
        now=lambda: 0,
    )
    seen: list[str] = []
    waits: list[int] = []  # the records behind each cycle, counted in its commands' backlog
    done = asyncio.Event()

    async def cycle(key: TaskId, items: list[Batch], backlogs: Mapping[str, int]) -> bool:
        firing = " firing" if inp.take_local() else ""
        waits.append(inp.behind.get("a.events", 0))
        seen.append(f"cycle of {sum(len(rs) for _, rs in items)}{firing}")
        if items and items[-1][1][-1].offset == 999:
            done.set()
        return True

    cycles._cycle = cycle  # type: ignore[method-assign]
    inp = PartitionInput(key, cycles, task.failed, lambda: None)
    task.input = inp
    try:
        for first in (0, 400, 800):
            inp.queue.put_nowait(batch("a.events", first, 200 if first == 800 else 400))
        inp.local = True  # timers handed over to fire (as `InProcess.fire` hands them)
        inp.queue.put_nowait(LOCAL)

        async def other_round() -> None:
            while not done.is_set():
                seen.append("other")
                await asyncio.sleep(0)

        other = asyncio.create_task(other_round())
        await asyncio.wait_for(done.wait(), 5)
        await other
    finally:
        await inp.stop()
    mine = [s for s in seen if s != "other"]
    # The timers handed over fire in the last: a cancel among the records is decided first.
    last = f"cycle of {1_000 - 3 * CYCLE_RECORDS} firing"
    assert mine == [f"cycle of {CYCLE_RECORDS}"] * 3 + [last]
    assert waits == [1_000 - n * CYCLE_RECORDS for n in (1, 2, 3)] + [0]
    between = [seen[i + 1] for i, s in enumerate(seen[:-1]) if s.startswith("cycle")]
    assert all(s == "other" for s in between[:-1]), seen
    assert task.read[-1] == {"a.events": 999}
