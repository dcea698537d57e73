"""The command path's de-duplication at production sizes (#20): `RocksAggregateStore.seen`
(is this request id applied?) and `write` (record the applied ids) on one partition whose
store already holds `--ids` applied request ids, flushed to disk as a node's would be
after a while (the window keeps each id for 7 days: at 5,000 commands/s, ~3 billion).

    python -m bench.dedupe_bench [--ids 1000000] [--lookups 100000] [--batch 500]

Prints JSON: µs per `seen` of a new id (the usual case: a miss), per `seen` of an applied
one (a duplicate), and per id written (`write`, which reads each id's last entry), each
the best and median of `--rounds`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import machine
from tables.aggregate_store import RocksAggregateStore

P = 0


def _request(i: int) -> tuple[str, str]:
    """The i-th request: its own aggregate (as timers' owners) and its first slot's id."""
    return f"o{i}", f"t{i}#0"


def _fill(store: RocksAggregateStore, ids: int, batch: int) -> float:
    """Writes `ids` applied request ids (one aggregate each, as timers' owners), in
    batches as cycles write them; then flushes and compacts, as a store that ran a while
    is on disk; seconds taken."""
    began = time.perf_counter()
    for start in range(0, ids, batch):
        requests = [_request(i) for i in range(start, min(ids, start + batch))]
        store.write(P, {}, requests, start, applied_at=1_700_000_000_000 + start)
    db = store._db(P)
    db.flush()
    db.compact_range(None, None)
    return time.perf_counter() - began


def _timed(rounds: int, n: int, run: Callable[[int], None]) -> dict[str, float]:
    """µs per call of `run(round)` doing `n` calls: best and median of `rounds`."""
    per: list[float] = []
    for r in range(rounds):
        began = time.perf_counter()
        run(r)
        per.append((time.perf_counter() - began) / n * 1e6)
    return {"best_us": round(min(per), 3), "median_us": round(statistics.median(per), 3)}


def bench(ids: int, lookups: int, batch: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tw-dedupe-") as directory:
        store = RocksAggregateStore(Path(directory))
        try:
            fill_s = _fill(store, ids, batch)
            step = max(1, ids // lookups)

            def misses(r: int) -> None:
                for i in range(lookups):
                    store.seen(P, f"o{i * step}", f"new{r}-{i}#0")

            def hits(r: int) -> None:
                for i in range(lookups):
                    store.seen(P, *_request(i * step))

            def writes(r: int) -> None:
                base = ids + r * lookups
                for start in range(0, lookups, batch):
                    requests = [
                        _request(base + i) for i in range(start, min(lookups, start + batch))
                    ]
                    store.write(P, {}, requests, None, applied_at=1_800_000_000_000)

            return {
                "ids": ids,
                "fill_s": round(fill_s, 2),
                "seen_new_id": _timed(rounds, lookups, misses),
                "seen_applied_id": _timed(rounds, lookups, hits),
                "write_per_id": _timed(rounds, lookups, writes),
            }
        finally:
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=1_000_000, help="applied ids held")
    parser.add_argument("--lookups", type=int, default=100_000, help="calls timed a round")
    parser.add_argument("--batch", type=int, default=500, help="ids a write")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    figures = bench(args.ids, args.lookups, args.batch, args.rounds)
    print(
        json.dumps(
            {"bench": "dedupe", "machine": machine(), **figures},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
