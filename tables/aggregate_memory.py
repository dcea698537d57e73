"""The reference backend of the aggregate state store (`tables.aggregate_store`): in
memory, as the RocksDB one behaves."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from tables.aggregate_keys import id_key
from tables.exceptions import StoreClosed, StoreError

__all__ = ["MemoryAggregateStore"]


class MemoryAggregateStore:
    """The reference backend."""

    def __init__(self) -> None:
        self._states: dict[tuple[int, str], bytes] = {}
        self._requests: dict[tuple[int, str, str], int] = {}
        # Those of `_requests` only passed over (`tables.aggregate_keys.PASSED`).
        self._passed: set[tuple[int, str, str]] = set()
        # Per partition, no request id of it was applied before this (a sweep with nothing
        # to forget looks at none).
        self._oldest: dict[int, int] = {}
        self._offsets: dict[int, int] = {}
        self._bad: set[int] = set()
        self._closed = False

    def _check(self, partition: int) -> None:
        if self._closed:
            raise StoreClosed("aggregate store is closed")
        if partition in self._bad:
            raise StoreError(
                f"aggregate states of partition {partition} are bad", partition=partition
            )

    def _readable(self, partition: int) -> bool:
        if self._closed:
            raise StoreClosed("aggregate store is closed")
        return partition not in self._bad

    def get(self, partition: int, aggregate_id: str) -> bytes | None:
        if not self._readable(partition):
            return None
        return self._states.get((partition, aggregate_id))

    def seen(self, partition: int, aggregate_id: str, request_id: str) -> bool:
        return self._readable(partition) and (partition, aggregate_id, request_id) in self._requests

    def folded(
        self, partition: int, aggregate_id: str, request_id: str, since: int | None = None
    ) -> bool:
        key = (partition, aggregate_id, request_id)
        if not self.seen(partition, aggregate_id, request_id) or key in self._passed:
            return False
        return since is None or self._requests[key] > since

    def write(
        self,
        partition: int,
        states: Mapping[str, bytes],
        requests: Iterable[tuple[str, str]],
        offset: int | None,
        applied_at: int = 0,
        passed: Iterable[tuple[str, str]] = (),
        dates: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        self._check(partition)
        dates = dates or {}
        for aggregate_id, state in states.items():
            self._states[(partition, aggregate_id)] = state
        written: set[tuple[int, str, str]] = set()
        for a, r in requests:
            # As the RocksDB store: one entry a request id, at its latest write.
            self._requests[(partition, a, r)] = max(dates.get((a, r), applied_at), 0)
            self._passed.discard((partition, a, r))
            written.add((partition, a, r))
        for a, r in passed:
            if (key := (partition, a, r)) not in written and key not in self._requests:
                self._requests[key] = max(dates.get((a, r), applied_at), 0)
                self._passed.add(key)
                written.add(key)
        if written:
            oldest = min(self._requests[key] for key in written)
            self._oldest[partition] = min(self._oldest.get(partition, oldest), oldest)
        if offset is not None:
            self._offsets[partition] = offset

    def expire_requests(self, partition: int, before: int, limit: int) -> int:
        self._check(partition)
        if before < self._oldest.get(partition, before + 1):
            return 0
        held = [
            (at, id_key(a) + r.encode(), (p, a, r))
            for (p, a, r), at in self._requests.items()
            if p == partition
        ]
        doomed = heapq.nsmallest(limit, (h for h in held if h[0] <= before))
        for _, _, key in doomed:
            del self._requests[key]
            self._passed.discard(key)
        gone = {key for _, _, key in doomed}
        left = [at for at, _, key in held if key not in gone]
        self._oldest[partition] = min(left, default=before + 1)
        return len(doomed)

    def offset(self, partition: int) -> int | None:
        return self._offsets.get(partition) if self._readable(partition) else None

    def drop(self, partition: int) -> None:
        self._states = {k: v for k, v in self._states.items() if k[0] != partition}
        self._requests = {k: v for k, v in self._requests.items() if k[0] != partition}
        self._passed = {k for k in self._passed if k[0] != partition}
        self._oldest.pop(partition, None)
        self._offsets.pop(partition, None)
        self._bad.discard(partition)

    def mark_bad(self, partition: int) -> None:
        self._bad.add(partition)

    def is_bad(self, partition: int) -> bool:
        return partition in self._bad

    def close(self) -> None:
        self._closed = True
