"""An operator's retry or skip of a target's PARKED timers (`operate`), with no lock held
across its ledger calls.

A park writes the ledger first, then the PARKED row; an operator's request settles the
PARKED rows (`settle_parked`), then resolves the entry (`resolve_entry`). Interleaved, a
park could record the target before the resolve and write its row after: a PARKED timer
no entry names, which no operator would see. So once the entry is resolved, the request
waits for the outcome writes under way in its partitions then (`PartitionFiring.writing`:
a park of theirs among them), and records again what is PARKED after them. A park begun
after the resolve records after it. A partition fired here is read and written through
its firing's store (`store_of`).

A partition's cycle, which holds its lock, calls no ledger: a request it carries out
settles the rows there and leaves the entry to its partition's next round
(`PartitionFiring.resolving`, `resolve_pending`), which resolves it only when nothing of
the target is PARKED in the partition by then, in one ledger write. A partition whose
cycles run but whose timers are not fired yet (held since a failure, until its log is read
past it) keeps the entry for its next firing here (`Unresolved`): a cycle never waits for
the ledger, which may not answer for seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, MutableMapping, Sequence, Set
from dataclasses import dataclass, field

from app.timers.runner.decision_types import Action, Decision
from app.timers.runner.options import TimerOptions
from app.timers.runner.partition import PartitionFiring, locked
from app.timers.runner.partition_store import store_of
from app.timers.runner.ports import Clock, FiringStore
from tables.exceptions import StoreError
from tables.ledger import FailureLedger
from tables.refs import AggregateRef
from tables.timer import Timer

__all__ = [
    "EXPECTED_TRIES",
    "NAMED_LIMIT",
    "RESOLVE_BACKOFF_MS",
    "STOP_RESOLVE_S",
    "Operated",
    "Unresolved",
    "name_parked",
    "name_unnamed",
    "operate",
    "resolve_at_stop",
    "resolve_entry",
    "resolve_pending",
    "settle_parked",
    "tend_ledger",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Operated:
    """What an operator's request did to a target's PARKED timers: how many it changed
    (retried or skipped), and how many retries it refused (`Action.OPERATOR_REFUSED`:
    left PARKED)."""

    changed: int
    refused: int = 0


@dataclass
class Unresolved:
    """The entries a cycle's requests settled in a partition not fired here (held since
    a failure), as a firing holds them (`PartitionFiring.resolving`, `expecting`): handed
    to the partition's next firing here, whose first round resolves them, or tried once
    more at the partition's stop (`TimerRunner.stop_partition`), as a firing's are."""

    resolving: list[AggregateRef] = field(default_factory=list)
    expecting: dict[AggregateRef, int] = field(default_factory=dict)

    def hand_to(self, firing: PartitionFiring) -> None:
        firing.resolving.extend(t for t in self.resolving if t not in firing.resolving)
        firing.expecting |= self.expecting


async def operate(
    store: FiringStore,
    ledger: FailureLedger,
    firings: Mapping[int, PartitionFiring],
    target: AggregateRef,
    only: Set[int] | None,
    decide: Callable[[Timer], Decision],
    *,
    later: MutableMapping[int, Unresolved] | None = None,
) -> Operated:
    """An operator's `decide` (retry, skip) on the PARKED timers of `target` (of the
    partitions `only`, all the store serves when None), then its ledger entry resolved;
    what it changed and refused. `firings`: the partitions fired here, whose locks its
    write takes. `later` (a cycle's request, which holds its partition's lock: no ledger
    call): the entry is resolved by the next round of each partition of `only` (which
    resolves none that a timer is still PARKED on); one not fired here (held since a
    failure) keeps it in `later` for its next firing. None: resolved now, unless a retry
    was refused (its timers still PARKED: the entry stays, naming them)."""
    operated = await settle_parked(store, firings, target, only, decide)
    written = operated.changed
    if later is not None and only:
        for p in sorted(only):
            holder = firings[p] if p in firings else later.setdefault(p, Unresolved())
            if target not in holder.resolving:  # one resolve answers both requests
                holder.resolving.append(target)
            if written:
                holder.expecting[target] = EXPECTED_TRIES
            if (firing := firings.get(p)) is not None:
                firing.answered.set()  # its next round resolves it, with no wait
        return operated
    if not operated.refused:
        # Resolved after the write: should the write fail, the entry stays for another try.
        await resolve_entry(store, ledger, firings, target, only)
    return operated


async def settle_parked(
    store: FiringStore,
    firings: Mapping[int, PartitionFiring],
    target: AggregateRef,
    only: Set[int] | None,
    decide: Callable[[Timer], Decision],
) -> Operated:
    """`decide` on the PARKED timers of `target` (of `only`, all when None), written under
    their partitions' locks (store calls only); how many changed, and were refused."""
    store = _store(store, firings, only)
    parked = _mine(await store.parked(target), only)
    decisions = list(map(decide, parked))
    changes = [d.change for d in decisions if d.change is not None]
    refused = sum(1 for d in decisions if d.action is Action.OPERATOR_REFUSED)
    written = 0
    if changes:
        touched = {c.loaded.partition for c in changes}
        async with locked(f for p, f in firings.items() if p in touched):
            written = await store.settle(changes)
    logger.info(
        "operator on %s%s: %d of %d parked timer(s) changed",
        target,
        "" if only is None else f" in partition(s) {sorted(only)}",
        written,
        len(parked),
    )
    if refused:
        logger.warning(
            "operator's retry on %s%s: %d parked timer(s) left parked, their slot due "
            "longer ago than the request-id window allows (their target may have applied "
            "them and forgotten their request id): retry them past the window to send them",
            target,
            "" if only is None else f" in partition(s) {sorted(only)}",
            refused,
        )
    return Operated(written, refused)


async def resolve_entry(
    store: FiringStore,
    ledger: FailureLedger,
    firings: Mapping[int, PartitionFiring],
    target: AggregateRef,
    only: Set[int] | None,
) -> None:
    """The ledger entry of `target` resolved once its PARKED rows were settled, and what
    was parked meanwhile in `only` (all when None) recorded again (see the module)."""
    subscription = TimerOptions.PARKED_SUBSCRIPTION
    await ledger.resolve(subscription, target)
    under_way = [f for p, f in firings.items() if (only is None or p in only) and f.writing]
    for f in under_way:
        await f.written()
    if under_way and (again := _mine(await _store(store, firings, only).parked(target), only)):
        await ledger.record(subscription, target, again)
        logger.info("operator on %s: %d timer(s) parked meanwhile, kept", target, len(again))


async def resolve_pending(
    store: FiringStore, ledger: FailureLedger, firing: PartitionFiring, now: int
) -> None:
    """Resolves the entries whose rows the cycle of `firing`'s partition settled
    (`PartitionFiring.resolving`), by its round, which no park of the partition runs
    beside: once the outcome writes under way are done, an entry is resolved only if
    nothing of its target is PARKED in the partition. One that is was recorded by its
    park (the ledger first), so the entry stays as it is (naming the settled timers too,
    which retry and skip pass over: they act on PARKED rows). One write at most, so any
    failure leaves an entry behind, never a PARKED timer no entry names; the entries a
    failure leaves wait `RESOLVE_BACKOFF_MS` (`now`: the runner's clock) for the next
    try, so that a ledger that does not answer holds up no round after round. An entry
    the ledger does not hold although the partition settled PARKED rows of its target
    (`PartitionFiring.expecting`: another node's park, its record perhaps still on its
    way here) is asked for again after that wait, `EXPECTED_TRIES` times in all."""
    if now < firing.resolve_after:
        return
    p = firing.partition
    await firing.written()
    later: list[AggregateRef] = []  # expected, not found: after the wait, not in this loop again
    try:
        while firing.resolving:
            target = firing.resolving.pop(0)  # taken: a round beside this takes the next
            done = False
            try:
                if not _mine(await store_of((firing,), store).parked(target), {p}):
                    await _resolve(ledger, firing, target, later)
                else:  # parked again: its entry stays, as it is
                    firing.expecting.pop(target, None)
                done = True
            except Exception as exc:
                firing.resolve_after = now + RESOLVE_BACKOFF_MS
                logger.warning(
                    "operator on %s in partition %d: entry not resolved yet (%d waiting): %r",
                    target,
                    p,
                    len(firing.resolving),
                    exc,
                )
                return
            finally:
                # Failed or cut short: tried again later, once (a request meanwhile
                # queued it).
                if not done and target not in firing.resolving:
                    firing.resolving.insert(0, target)
    finally:
        if later:
            firing.resolving.extend(t for t in later if t not in firing.resolving)
            firing.resolve_after = max(firing.resolve_after, now + RESOLVE_BACKOFF_MS)


async def _resolve(
    ledger: FailureLedger, firing: PartitionFiring, target: AggregateRef, later: list[AggregateRef]
) -> None:
    """The entry of `target` resolved; appended to `later` when the ledger holds none
    although one was expected (tries left in `PartitionFiring.expecting`)."""
    tries = firing.expecting.get(target, 0)  # kept should the resolve raise
    if await ledger.resolve(TimerOptions.PARKED_SUBSCRIPTION, target) or tries == 0:
        firing.expecting.pop(target, None)
        return
    if tries > 1:
        firing.expecting[target] = tries - 1
        later.append(target)
        return
    del firing.expecting[target]
    logger.info(
        "operator on %s in partition %d: no ledger entry of it found after %d tries",
        target,
        firing.partition,
        EXPECTED_TRIES,
    )


async def resolve_at_stop(
    store: FiringStore, ledger: FailureLedger, firing: PartitionFiring, now: int
) -> None:
    """What `firing`'s rounds had not resolved yet, tried once more as its partition
    stops, within `STOP_RESOLVE_S` (a close has a deadline); what is left stays in the
    ledger as it was, said in a warning."""
    if not firing.resolving:
        return
    firing.resolve_after = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(STOP_RESOLVE_S):
            await resolve_pending(store, ledger, firing, now)
    if firing.resolving:
        logger.warning(
            "timers of partition %d: the ledger entries of %s are left unresolved",
            firing.partition,
            ", ".join(str(t) for t in firing.resolving),
        )


async def name_parked(
    store: FiringStore,
    ledger: FailureLedger,
    firings: Mapping[int, PartitionFiring],
    target: AggregateRef,
) -> int:
    """The PARKED timers of `target` in the partitions fired here (`firings`) that its
    ledger entry does not name, recorded; how many. Called once its entry changed by
    another's hand: a resolve, by whatever node (a request's copy read late in another
    partition may resolve an entry a newer park recorded after the request, here or on
    another node, and no entry would name that timer), or another node's record, written
    over this node's at the same moment (the ledger keeps the later write). Recorded, an
    entry names them (one a request still to be carried out here is resolved again by it).
    A partition let go meanwhile is passed over (its next owner holds its rows)."""
    parked: list[Timer] = []
    for p, firing in sorted(firings.items()):
        if firing.stopped:
            continue
        try:
            parked += _mine(await store_of((firing,), store).parked(target), {p})
        except StoreError as exc:  # let go (`StoreClosed`), or a row it cannot read
            logger.info("parked timers of %s in partition %d not read: %s", target, p, exc)
    subscription = TimerOptions.PARKED_SUBSCRIPTION
    if parked and (entry := await ledger.entry(subscription, target)) is not None:
        if entry.truncated:
            # It names no more (`MAX_NAMED`) and says so: recording would only write it
            # again, which every other node would follow and look here again, for ever.
            return 0
        named = set(entry.timers)
        parked = [t for t in parked if t.request_id not in named]
    if parked:
        await ledger.record(subscription, target, parked)
        logger.warning(
            "%d parked timer(s) of %s named again: its ledger entry did not name them",
            len(parked),
            target,
        )
    return len(parked)


async def tend_ledger(
    store: FiringStore, ledger: FailureLedger, chosen: Sequence[PartitionFiring], clock: Clock
) -> None:
    """A round's ledger work before its claims, for each partition of `chosen`: the entries
    a cycle's request left to resolve (`resolve_pending`), the names of its timers no longer
    PARKED (`Unparked.forget`) and, at its firing's first round, its PARKED timers that
    their target's open entry does not name (`name_unnamed`)."""
    for f in chosen:
        if f.resolving:
            await resolve_pending(store, ledger, f, clock.now())
        if f.unparked:
            # After the outcome writes under way: a park records its entry, then its row.
            await f.written()
            subscription = TimerOptions.PARKED_SUBSCRIPTION
            await f.unparked.forget(store_of((f,), store), ledger, subscription, clock.now())
        if f.naming_at is not None:
            await name_unnamed(store, ledger, f, clock.now())


async def name_unnamed(
    store: FiringStore, ledger: FailureLedger, firing: PartitionFiring, now: int
) -> None:
    """At a partition's start here (`PartitionFiring.naming_at`), by its round: its
    PARKED timers (the first `NAMED_LIMIT`) that their target's open ledger entry does
    not name are recorded. A resolve read while the partition changed owner finds no firing of it on
    either node (`name_parked`), so its timers are looked at here. A failure tries again
    after `RESOLVE_BACKOFF_MS`."""
    if firing.naming_at is None or now < firing.naming_at:
        return
    p, subscription = firing.partition, TimerOptions.PARKED_SUBSCRIPTION
    try:
        census = await store_of((firing,), store).census(
            p, now, limit=NAMED_LIMIT, parked_limit=NAMED_LIMIT
        )
        by_target: dict[AggregateRef, list[Timer]] = {}
        for timer in census.parked_timers:
            by_target.setdefault(timer.target, []).append(timer)
        for target, parked in by_target.items():
            # Its target's entry alone: a ledger of every parked target is neither listed
            # nor sorted whole at each take.
            entry = await ledger.entry(subscription, target)
            if entry is not None and entry.truncated:
                continue  # it names no more (`MAX_NAMED`) and says so: left as it is
            named = set() if entry is None else set(entry.timers)
            if timers := [t for t in parked if t.request_id not in named]:
                await ledger.record(subscription, target, timers)
                logger.warning(
                    "partition %d: %d parked timer(s) of %s no ledger entry named: recorded",
                    p,
                    len(timers),
                    target,
                )
        firing.naming_at = None
    except Exception as exc:
        firing.naming_at = now + RESOLVE_BACKOFF_MS
        logger.warning("partition %d: its parked timers not checked yet: %r", p, exc)


NAMED_LIMIT = 1_000
"""How many PARKED timers of a partition its start checks (`name_unnamed`): its census
walks as many due entries too, ~3 ms at 1,000 (~30 ms at 10,000) on a partition of
100,000 pending timers, once a take."""

STOP_RESOLVE_S = 2.0
"""How long a partition's stop may spend resolving the entries its rounds had not yet."""

RESOLVE_BACKOFF_MS = 10_000
"""How long entries whose resolve failed, or which the ledger did not hold although their
partition settled PARKED rows of the target (`PartitionFiring.expecting`), wait for the
next try (`resolve_pending`)."""

EXPECTED_TRIES = 3
"""How many times an entry is asked for when the partition settled PARKED rows of its
target but the ledger holds none (`resolve_pending`): a followed ledger reads another
node's park within seconds; one never found (its names lost to a concurrent write) is
let be."""


def _store(
    store: FiringStore, firings: Mapping[int, PartitionFiring], only: Set[int] | None
) -> FiringStore:
    # Those of `only` (all served) fired here through their own stores, the rest not.
    others = only is None or any(p not in firings for p in only)
    return store_of(
        (f for p, f in firings.items() if only is None or p in only), store, others=others
    )


def _mine(timers: list[Timer], only: Set[int] | None) -> list[Timer]:
    return [t for t in timers if only is None or t.partition in only]
