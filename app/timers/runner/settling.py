"""How the runner's decisions are written: parks recorded in the ledger first, claims
settled in one conditional batch, outcomes of in-process fires made against the row as
loaded, and a previous owner's claims taken over. A store fault in one partition's rows
(`StoreError`: a corrupt row) fails only that partition's part (`apart`). No lock and no
state: the runner calls these under its partitions' locks."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Set
from typing import TypeVar

from app.timers.runner.decision_types import Decision
from app.timers.runner.decisions import expire_or_claim, guarded, unparked
from app.timers.runner.options import TimerOptions
from app.timers.runner.ports import FiringStore
from app.timers.runner.stats import RoundStats
from tables.copies import change_of
from tables.exceptions import StoreError
from tables.ledger import FailureLedger
from tables.refs import AggregateRef
from tables.timer import Timer, TimerChange

__all__ = ["apart", "from_loaded", "holds", "park", "reclaim", "settle_exactly", "taken_over"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


async def apart(
    call: Callable[[list[T]], Awaitable[R]],
    items: list[T],
    partition: Callable[[T], int],
    again: Callable[[list[T]], Awaitable[R]] | None = None,
) -> tuple[list[R], dict[int, StoreError]]:
    """`call` on all `items` at once; when the store fails it (`StoreError`), `again` (by
    default `call`) on each partition's items apart, so that a fault in one partition (a
    corrupt row) fails only its items: the results, and the fault of each partition that
    failed. A failed batch may have landed in some partitions (RocksDB writes one batch a
    partition): their conditional writes are refused on the retry, so `again` is what
    must tell a part that landed from one refused, when it matters (a claim to send)."""
    try:
        return [await call(items)], {}
    except StoreError as exc:
        partitions = sorted({partition(i) for i in items})
        if len(partitions) == 1:
            return [], {partitions[0]: exc}
    results: list[R] = []
    faults: dict[int, StoreError] = {}
    for p in partitions:
        try:
            results.append(await (again or call)([i for i in items if partition(i) == p]))
        except StoreError as exc:
            faults[p] = exc
    return results, faults


async def park(
    ledger: FailureLedger, subscription: str, decisions: list[Decision], stats: RoundStats
) -> list[Decision]:
    """The decisions to write: a park once the ledger holds its target, and if the
    ledger refuses it, its fallback (the last attempt sent again after the backoff)."""
    by_target: dict[AggregateRef, list[Timer]] = defaultdict(list)
    for d in decisions:
        if d.park and d.change is not None:
            by_target[d.change.next.target].append(d.change.next)
    refused: set[AggregateRef] = set()
    for target, timers in by_target.items():
        try:
            await ledger.record(subscription, target, timers)
        except Exception:
            logger.exception("the ledger refused target %s; its timers stay PENDING", target)
            stats.ledger_failures += len(timers)
            refused.add(target)
    return [
        unparked(d) if d.park and d.change and d.change.next.target in refused else d
        for d in decisions
    ]


async def settle_exactly(
    store: FiringStore, decisions: list[Decision], *, landed: bool = False
) -> list[Decision]:
    """Settles the decisions' changes in one batch; the decisions that were written.
    `landed`: the batch may have been written already (a retry after a batch that failed
    part way, `apart`): a row found as the change writes it counts as written, even when
    the store refused them all."""
    changes = [d.change for d in decisions if d.change is not None]
    if not changes:
        return []
    count = await store.settle(changes)
    if count == len(changes):
        return decisions
    if count == 0 and not landed:
        return []
    # The store says how many, not which: only then ask it which rows now hold our write.
    written = []
    for d in decisions:
        assert d.change is not None
        if await holds(store, d.change):
            written.append(d)
    return written


async def holds(store: FiringStore, change: TimerChange) -> bool:
    """Whether `change`'s row now holds its write (the store's `settle` counts, it does
    not say which)."""
    row = await store.find(change.next.owner, change.next.key)
    return row is not None and row.same_as_loaded(change.next)


def from_loaded(change: TimerChange | None, loaded: Timer) -> TimerChange | None:
    """`change` made against the row as loaded rather than the claim (never written)."""
    return None if change is None else change_of(loaded, change.next)


def reclaim(timer: Timer, now: int, options: TimerOptions) -> Decision:
    """A claim of a FIRING row as if its claim had lapsed now (the previous owner's, which
    is fenced): written conditionally against the row as it is."""
    decision = expire_or_claim(timer.model_copy(update={"due_at": now}), now, options)
    if decision.change is None:
        return decision
    change = decision.change.model_copy(update={"loaded": timer})
    return Decision(decision.action, change, decision.send, decision.fallback)


_TAKE_OVER_LIMIT = 100_000


async def taken_over(
    store: FiringStore, fresh: Set[int], now: int, options: TimerOptions
) -> tuple[list[Decision], dict[int, StoreError]]:
    """Claims again, at once, the FIRING rows of the partitions in `fresh` (started since
    the last round): a previous owner's claims, which it can no longer settle (fenced),
    whatever their deadlines: one written on a clock ahead of this node's, or by an owner
    with a longer `claim_timeout`, lapses that far ahead, and waited out, its timer fired
    that late, never overdue on this clock (those are said in a WARNING); and the
    partitions whose rows the store could not read. Each partition's rows are read apart,
    the event loop let go between them: a take of many partitions (a rebalance) scans
    each one's due index as far as its last claim."""
    if not fresh:
        return [], {}
    found: list[Timer] = []
    faults: dict[int, StoreError] = {}
    for i, p in enumerate(sorted(fresh)):
        if i:
            await asyncio.sleep(0)
        try:
            found += await store.firing({p}, limit=_TAKE_OVER_LIMIT)
        except StoreError as exc:
            faults[p] = exc  # a corrupt row, say: that partition alone fails
    # A claim lapsed already is due: the round takes it from its wheel.
    claims = [t for t in found if t.due_at > now]
    ahead = [t.due_at - now for t in claims if t.due_at > now + options.claim_timeout]
    if ahead:
        logger.warning(
            "%d claims taken over lapse past claim_timeout (%d ms), up to %d ms from now: "
            "written on a clock ahead of this node's, or by a previous owner with a longer "
            "claim_timeout; claimed again now",
            len(ahead),
            options.claim_timeout,
            max(ahead),
        )
    decided = [guarded(functools.partial(reclaim, t, now, options), t, now) for t in claims]
    return decided, faults
