"""The counts the stores keep for the metrics (`status_counts`) always equal a full count.

The random operations of the stores' stateful test (puts, cancels, settles to any status,
RocksDB reopened, the changelog restored), and after each step, for both backends and
every partition, the kept counts must equal the census (a scan of the indexes). The
counts are taken once before the first step, so every later step goes through the kept
path, never through a fresh count.
"""

from __future__ import annotations

import test_store_stateful as stateful
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, rule

from tables import TimerStatus, TimerStore, open_timer_store


def counted(store: TimerStore) -> list[dict[TimerStatus, int]]:
    return [store.status_counts(p) for p in range(stateful.P)]


class CountsKept(stateful.StoresAgree):
    def __init__(self) -> None:
        super().__init__()
        for store in (self.memory, self.rocks):
            assert all(sum(c.values()) == 0 for c in counted(store))

    def census(self, store: TimerStore) -> list[dict[TimerStatus, int]]:
        async def read() -> list[dict[TimerStatus, int]]:
            out = []
            for p in range(stateful.P):
                c = await store.census(p, 0, limit=10_000, parked_limit=0)
                assert c.complete
                rows = [await store.find(o, k) for o in stateful.OWNERS for k in stateful.KEYS]
                held = [t for t in rows if t is not None and t.partition == p]
                out.append(
                    {
                        TimerStatus.PENDING: c.pending,
                        TimerStatus.FIRING: c.firing,
                        TimerStatus.PARKED: c.parked,
                        # in no index the census reads: every key looked up
                        TimerStatus.PAUSED: sum(t.status is TimerStatus.PAUSED for t in held),
                    }
                )
            return out

        return self.runner.run(read())

    @invariant()
    def kept_counts_are_the_census(self) -> None:
        for store in (self.memory, self.rocks):
            assert counted(store) == self.census(store)

    @rule()
    def restore_into_a_counted_store(self) -> None:
        """A store counted before a restore counts again what the restore wrote."""
        restored = open_timer_store("memory://", partitions=stateful.P)
        before = counted(restored)
        by_partition: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
        for record in self.sinks[1].records:
            batch = by_partition.setdefault(record.partition, [])
            batch.append((len(batch), record.key, record.value))

        async def restore() -> None:
            for partition, records in by_partition.items():
                await restored.apply_changelog(partition, records)

        self.runner.run(restore())
        assert all(sum(c.values()) == 0 for c in before)
        assert counted(restored) == counted(self.rocks)
        self.runner.run(restored.close())


CountsKept.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCountsKept = CountsKept.TestCase
