"""The memory and RocksDB stores driven side by side by random operations: they must agree.

Each step runs the same call on both and compares the answers and the changelog records
each handed to its sink; after each step every known key, the due timers for a few
`until`s and every target's parked timers are compared too. RocksDB is now and then
closed and reopened, and the changelog replayed into a fresh store must match.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fakes import RecordingSink
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tables import (
    AggregateRef,
    CommandSpec,
    IntervalRule,
    Outcome,
    Timer,
    TimerChange,
    TimerStatus,
    TimerStore,
    open_timer_store,
)

P = 3
OWNERS = [
    AggregateRef(context="shop", aggregate="order", tenant=tenant, id=id)
    for tenant in ("t1", "t2")
    for id in ("a", "b", "ab")
]
KEYS = ["k1", "k2"]
TARGETS = [AggregateRef(context="shop", aggregate="order", id=f"target{i}") for i in range(2)]
UNTILS = [0, 500, 1_000, 2_000, 10**9]
CONDITIONS = ["id", "status", "slot", "slot_due_at", "attempts", "due_at"]

T = TypeVar("T")

FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
"""RocksDB opens ten times faster on tmpfs (no fsync to wait for); the examples open many."""


def partition_of(owner: AggregateRef) -> int:
    return OWNERS.index(owner) % P


owners = st.sampled_from(OWNERS)
keys = st.sampled_from(KEYS)
versions = st.integers(0, 6)
dues = st.sampled_from([0, 100, 500, 1_000, 1_500, 2_000])
statuses = st.sampled_from(list(TimerStatus))


class StoresAgree(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.dir = tempfile.mkdtemp(prefix="tickwheel-stateful-", dir=FAST_TMP)
        self.sinks = (RecordingSink(), RecordingSink())
        self.memory = open_timer_store("memory://", partitions=P, changelog=self.sinks[0])
        self.rocks = self._open_rocks()
        self.ids = 0
        self.seen: list[Timer] = []
        """Timers the stores returned: what a caller would settle as `loaded`."""

    def _open_rocks(self) -> TimerStore:
        return open_timer_store(f"rocksdb://{self.dir}", partitions=P, changelog=self.sinks[1])

    def both(self, call: Callable[[TimerStore], Coroutine[Any, Any, T]]) -> T:
        memory = self.runner.run(call(self.memory))
        rocks = self.runner.run(call(self.rocks))
        assert memory == rocks, (memory, rocks)
        assert self.sinks[0].records == self.sinks[1].records
        return memory

    def saw(self, timers: list[Timer] | Timer | None) -> None:
        for t in timers if isinstance(timers, list) else [timers]:
            if t is not None and t not in self.seen:
                self.seen.append(t)
        del self.seen[:-40]

    # --- writes ---------------------------------------------------------------------------

    @rule(
        owner=owners,
        key=keys,
        version=versions,
        due=dues,
        to=st.sampled_from(TARGETS),
        reuse=st.booleans(),
    )
    def put(
        self, owner: AggregateRef, key: str, version: int, due: int, to: AggregateRef,
        reuse: bool,
    ) -> None:  # fmt: skip
        held = self.runner.run(self.memory.find(owner, key))
        if reuse and held is not None:
            timer_id = held.id
        else:
            self.ids += 1
            timer_id = f"t{self.ids:03d}"
        t = Timer(
            id=timer_id,
            owner=owner,
            key=key,
            version=version,
            partition=partition_of(owner),
            rule=IntervalRule(start=due, every=1_000),
            target=to,
            command=CommandSpec(type="Tick"),
            slot_due_at=due,
            due_at=due,
        )
        self.both(lambda s: s.put(t))

    @rule(owner=owners, key=keys, version=versions)
    def cancel(self, owner: AggregateRef, key: str, version: int) -> None:
        self.both(lambda s: s.cancel(owner, key, version))

    @rule(owner=owners, key=keys, version=versions)
    def pause(self, owner: AggregateRef, key: str, version: int) -> None:
        self.both(lambda s: s.pause(owner, key, version))

    @rule(owner=owners, key=keys, version=versions, now=dues)
    def resume(self, owner: AggregateRef, key: str, version: int, now: int) -> None:
        self.saw(self.both(lambda s: s.resume(owner, key, version, now)))

    @rule(owner=owners, version=versions)
    def cancel_all(self, owner: AggregateRef, version: int) -> None:
        self.both(lambda s: s.cancel_all(owner, version))

    @precondition(lambda self: bool(self.seen))
    @rule(data=st.data(), count=st.integers(1, 4))
    def settle(self, data: st.DataObject, count: int) -> None:
        changes = []
        for _ in range(count):
            loaded: Timer = data.draw(st.sampled_from(self.seen))
            if data.draw(st.booleans()):  # now and then a loaded row that is not held
                field = data.draw(st.sampled_from(CONDITIONS))
                wrong: Any = {"id": "nope", "status": TimerStatus.FIRED}.get(field, 7_777)
                loaded = loaded.model_copy(update={field: wrong})
            new = loaded.model_copy(
                update={
                    "status": data.draw(statuses),
                    "due_at": data.draw(dues),
                    "slot": loaded.slot + data.draw(st.integers(0, 1)),
                    "attempts": data.draw(st.integers(0, 2)),
                    "outcome": data.draw(st.sampled_from([None, *Outcome])),
                }
            )
            changes.append(TimerChange(loaded=loaded, next=new))
        self.both(lambda s: s.settle(changes))

    @rule(now=st.integers(0, 2))
    def reopen_rocks(self, now: int) -> None:
        if now:  # one time in three: reopening is the slowest step
            return
        self.runner.run(self.rocks.close())
        self.rocks = self._open_rocks()

    @rule()
    def restore_from_the_changelog(self) -> None:
        restored = open_timer_store("memory://", partitions=P)
        by_partition: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
        for record in self.sinks[1].records:
            batch = by_partition.setdefault(record.partition, [])
            batch.append((len(batch), record.key, record.value))

        async def restore() -> None:
            for partition, records in by_partition.items():
                await restored.apply_changelog(partition, records)

        self.runner.run(restore())
        assert self.snapshot(restored) == self.snapshot(self.rocks)
        self.runner.run(restored.close())

    # --- reads ----------------------------------------------------------------------------

    @rule(owner=owners, key=keys)
    def find(self, owner: AggregateRef, key: str) -> None:
        self.saw(self.both(lambda s: s.find(owner, key)))

    @rule(
        partitions=st.sets(st.integers(0, P - 1)),
        until=st.sampled_from(UNTILS),
        limit=st.integers(1, 5),
    )
    def due(self, partitions: set[int], until: int, limit: int) -> None:
        found = self.both(lambda s: s.due(partitions, until, limit))
        self.saw(found)
        # The unbuilt rows: the same rows in the same order, on both backends.
        expected = [(t.due_at, t.id, t.partition, t) for t in found]
        for store in (self.memory, self.rocks):
            rows = self.runner.run(store.due_rows(partitions, until, limit))
            assert [(r.due_at, r.id, r.partition, r.timer()) for r in rows] == expected

    @rule(partitions=st.sets(st.integers(0, P - 1)), limit=st.integers(1, 5))
    def firing(self, partitions: set[int], limit: int) -> None:
        found = self.both(lambda s: s.firing(partitions, limit))
        self.saw(found)
        assert all(t.status is TimerStatus.FIRING for t in found)

    @rule(to=st.sampled_from(TARGETS))
    def parked(self, to: AggregateRef) -> None:
        self.saw(self.both(lambda s: s.parked(to)))

    def snapshot(self, store: TimerStore) -> list[Any]:
        """What a caller can see: every key, the due timers by `until`, the parked ones."""

        async def read() -> list[Any]:
            every = set(range(P))
            return [
                [await store.find(owner, key) for owner in OWNERS for key in KEYS],
                [await store.due(every, until, 1_000) for until in UNTILS],
                [await store.parked(target) for target in TARGETS],
            ]

        return self.runner.run(read())

    @invariant()
    def they_agree(self) -> None:
        assert self.snapshot(self.memory) == self.snapshot(self.rocks)

    def teardown(self) -> None:
        try:
            self.runner.run(self.memory.close())
            self.runner.run(self.rocks.close())
        finally:
            self.runner.close()
            shutil.rmtree(self.dir, ignore_errors=True)


StoresAgree.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoresAgree = StoresAgree.TestCase
