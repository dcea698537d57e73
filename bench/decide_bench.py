"""Worker CPU per timer fired in-process, without a broker (#20): `CommandProcessor.decide_local`
over a burst of due timers, each the first command of its own aggregate (as in
`bench.timers_bench --phases a`: one timer per owner, whose state is stored), with the
in-memory state store.

    python -m bench.decide_bench [--timers 1000] [--rounds 20] [--profile]

Prints JSON: µs per decided timer (best and median of the rounds). The figure is the share
of the partition's cycle spent deciding and encoding; the settle of the timer rows and the
transaction are not in it.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Sequence

import orjson
from pydantic import BaseModel

from app.commands.processor import CommandProcessor, state_key
from app.kafka import OutRecord
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.model.decide import StoredAggregate
from app.protocol.wire import CommandEnvelope, encode
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore

T0 = 1_700_000_000_000


class Counter(BaseModel):
    fired: int = 0


counter = AggregateType("bench", "counter", Counter)


@counter.command("Fire")
def _fire(state: Counter, cmd: Command, d: Decision) -> None:
    d.emit("Fired", {"n": state.fired + 1, "not_before": cmd.not_before})


@counter.applies("Fired")
def _fired(state: Counter, e: Event) -> Counter:
    # As the timers bench's service folds it (`tests/integration/tw_services.py`).
    return state.model_copy(update={"fired": e.body["n"]})


async def _commit(records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]) -> list[int]:
    return list(range(len(records)))


def _commands(n: int, round_: int) -> list[CommandEnvelope]:
    return [
        CommandEnvelope(
            request_id=f"timer-{round_}-{i}#0",
            type="Fire",
            aggregate=AggregateRef(context="bench", aggregate="counter", id=f"c-{round_}-{i}"),
            not_before=T0,
            issued_at=T0,
            in_process=True,
        )
        for i in range(n)
    ]


def _round(n: int, round_: int) -> float:
    """Seconds to decide `n` due timers on a fresh partition."""
    store = MemoryAggregateStore()
    commands = _commands(n, round_)
    # Each owner has an event already (its timer's `wow.ScheduleSet`): its state is read.
    stored = encode(StoredAggregate(version=1, state=Counter().model_dump(mode="json")))
    store.write(0, {state_key(c.aggregate): stored for c in commands}, [], None)
    processor = CommandProcessor(
        counter, 0, partitions=1, states=store, commit=_commit, now=lambda: T0
    )
    batch = processor.begin()
    start = time.process_time()
    decided = processor.decide_local(batch, commands)
    elapsed = time.process_time() - start
    assert len(decided) == n and len(batch.out) == 2 * n
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one round")
    args = parser.parse_args()
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(_round, args.timers, -1)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(35)
        return
    us = [_round(args.timers, r) / args.timers * 1e6 for r in range(args.rounds)]
    print(
        orjson.dumps(
            {
                "timers": args.timers,
                "rounds": args.rounds,
                "us_per_timer_best": round(min(us), 1),
                "us_per_timer_median": round(statistics.median(us), 1),
            }
        ).decode()
    )


if __name__ == "__main__":
    main()
