"""An operator's retry or skip of a target's PARKED timers (`operate`), with no lock held
across its ledger calls.

A park writes the ledger first, then the PARKED row; an operator's request settles the
PARKED rows, then resolves the entry. Interleaved, a park could record the target before
the resolve and write its row after: a PARKED timer no entry names, which no operator
would see. So once the entry is resolved, the request waits for the outcome writes under
way in its partitions then (`PartitionFiring.writing`: a park of theirs among them), and
records again what is PARKED after them. A park begun after the resolve records after it.
A partition fired here is read and written through its firing's store (`store_of`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Set

from app.timers.runner.decisions import Decision
from app.timers.runner.options import TimerOptions
from app.timers.runner.partition import PartitionFiring, locked
from app.timers.runner.partition_store import store_of
from app.timers.runner.ports import FiringStore
from tables.ledger import FailureLedger
from tables.refs import AggregateRef
from tables.timer import Timer

__all__ = ["operate"]

logger = logging.getLogger(__name__)


async def operate(
    store: FiringStore,
    ledger: FailureLedger,
    firings: Mapping[int, PartitionFiring],
    target: AggregateRef,
    only: Set[int] | None,
    decide: Callable[[Timer], Decision],
) -> int:
    """An operator's `decide` (retry, skip) on the PARKED timers of `target` (of the
    partitions `only`, all the store serves when None), then its ledger entry resolved;
    how many changed. `firings`: the partitions fired here, whose locks its write takes."""

    def mine(timers: list[Timer]) -> list[Timer]:
        return [t for t in timers if only is None or t.partition in only]

    # Those of `only` (all served) fired here through their own stores, the rest not.
    others = only is None or any(p not in firings for p in only)
    store = store_of(
        (f for p, f in firings.items() if only is None or p in only), store, others=others
    )

    parked = mine(await store.parked(target))
    changes = [d.change for d in map(decide, parked) if d.change is not None]
    written = 0
    if changes:
        touched = {c.loaded.partition for c in changes}
        async with locked(f for p, f in firings.items() if p in touched):
            written = await store.settle(changes)
    # Resolved after the write: should the write fail, the entry stays for another try.
    subscription = TimerOptions.PARKED_SUBSCRIPTION
    await ledger.resolve(subscription, target)
    under_way = [f for p, f in firings.items() if (only is None or p in only) and f.writing]
    for f in under_way:
        await f.written()
    if under_way and (again := mine(await store.parked(target))):
        await ledger.record(subscription, target, again)
        logger.info("operator on %s: %d timer(s) parked meanwhile, kept", target, len(again))
    logger.info(
        "operator on %s%s: %d of %d parked timer(s) changed",
        target,
        "" if only is None else f" in partition(s) {sorted(only)}",
        written,
        len(parked),
    )
    return written
