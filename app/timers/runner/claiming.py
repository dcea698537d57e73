"""How a round claims what it loaded (`to_claim`), each timer decided: an in-process
one's claim kept for its partition's cycle (`hand_over`), and the rest written in one
conditional batch under the locks of the partitions it touches, taken in partition order
(`write_claims`). A store fault in one partition's rows fails only that partition.

Only the firings the round began with (`Round.firings`) are claimed from, and only while
each is still the runner's and live: a partition stopped (or failed) meanwhile is not
claimed, and a claim written as its stop began is given back by that stop's write."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping

from app.timers.runner.decision_types import Decision
from app.timers.runner.decisions import release
from app.timers.runner.options import TimerOptions
from app.timers.runner.partition import PartitionFiring, locked
from app.timers.runner.rounds import Round
from app.timers.runner.settling import apart
from tables.timer import Timer, TimerStatus

__all__ = ["hand_limit", "hand_over", "to_claim", "write_claims"]


def hand_limit(options: TimerOptions) -> int:
    """How many timers a partition may hold handed over to fire in-process (its cycle
    not done with them yet) before its rounds take no more: two rounds' worth, so that
    its cycle finds the next round's ready as it ends one."""
    return 2 * options.batch_limit


def _current(r: Round, firings: Mapping[int, PartitionFiring]) -> dict[int, PartitionFiring]:
    """The firings the round began with that are still the runner's and live, by partition
    (looked up once a step: not once a timer)."""
    return {p: f for p, f in r.firings.items() if firings.get(p) is f and f.live}


def to_claim(r: Round, firings: Mapping[int, PartitionFiring], loaded: list[Timer]) -> list[Timer]:
    """The timers loaded to decide: not one of a partition stopped while it was being
    loaded, one already handed over to fire in-process, one whose send runs here, nor one
    whose outcome waits to be written (a claim of theirs lapsed only as the clock jumped)."""
    current = _current(r, firings)
    busy = {p: _busy(f) for p, f in current.items()}
    taken: list[Timer] = []
    for t in loaded:
        f = current.get(t.partition)
        if f is None or t.id in f.in_hand:
            continue
        if t.id in busy[t.partition]:
            f.wheel.invalidate()  # taken from the wheel, not claimed: loaded again later
            continue
        taken.append(t)
    return taken


def _busy(firing: PartitionFiring) -> set[str]:
    """The ids of `firing`'s timers sent, whose outcomes are not written yet."""
    if not firing.outcomes:
        return firing.sending
    return firing.sending | {d.change.loaded.id for d in firing.outcomes if d.change is not None}


def hand_over(
    r: Round, firings: Mapping[int, PartitionFiring], decided: list[Decision], room: int
) -> list[Decision]:
    """Keeps the in-process timers' claims for their cycles (claimed by the partition
    transaction that decides them and writes their outcomes, so nothing is written
    before, nor can a fenced owner commit), and parks with the outcomes (the ledger
    first); the decisions to write. No more sends are
    claimed than `room` (sends are not waited for: the rest are loaded again when sends
    come back, so a slow target holds no other timer up)."""
    to_write: list[Decision] = []
    current = _current(r, firings)
    for d in decided:
        if d.change is None:
            continue
        nxt = d.change.next
        firing = current.get(nxt.partition)
        if firing is None:
            continue  # stopped meanwhile: not claimed
        if d.park:
            # A rule its decision failed on (`guarded`): parked as an outcome is, its target
            # recorded in the ledger first (its fallback written if the ledger refuses), by
            # the partition's outcome write at the round's end, never a PARKED row unnamed.
            firing.outcomes.append(d)
            continue
        if d.send and firing.fires_in_process(nxt):
            firing.hand(d.change.loaded, nxt)
            r.handed += 1
            continue
        if d.send:
            if room <= 0:
                r.stats.deferred += 1
                continue
            room -= 1
        to_write.append(d)
    # Those of earlier rounds too: a round that failed after handing timers over never
    # had their cycles woken, and a timer in hand is not handed over again.
    r.in_process = frozenset(p for p, f in current.items() if f.handed)
    return to_write


async def write_claims(
    r: Round,
    firings: Mapping[int, PartitionFiring],
    to_write: list[Decision],
    settle: Callable[[list[Decision]], Awaitable[list[Decision]]],
    offer: Callable[[Iterable[Timer]], None],
    settle_again: Callable[[list[Decision]], Awaitable[list[Decision]]] | None = None,
) -> None:
    """Writes the round's claims and expiries (`settle`: one conditional batch) under the
    locks of their partitions: a claim written is the round's to send (`Round.remote`),
    an expiry's row offered back to its wheel (`offer`). `settle_again`: a partition's
    part after the batch failed, which may have landed already (`apart`)."""
    stats = r.stats
    partitions = {d.change.next.partition for d in to_write if d.change is not None}
    touched = {p: f for p in partitions if (f := r.firings.get(p)) is not None}
    async with locked(touched.values()):
        # Not claimed in a partition stopped (or failed) while its lock was waited for.
        current = _current(r, firings)
        mine = to_write
        if any(p not in current for p in partitions):
            mine = [d for d in to_write if _partition(d) in current]
        batches, faults = await apart(settle, mine, _partition, settle_again)
        for p, exc in faults.items():
            touched[p].fail(exc)
        written = batches[0] if len(batches) == 1 else [d for b in batches for d in b]
        for decision in written:
            assert decision.change is not None
            nxt = decision.change.next
            firing = touched[nxt.partition]
            if not decision.send:
                stats.expired += 1
                offer([nxt])
                if nxt.status is TimerStatus.PENDING:
                    stats.due_by(nxt.due_at)
            elif firings.get(nxt.partition) is not firing:
                # Its stop began while its claim was written (it waits for this lock):
                # given back unsent, by that stop's write.
                firing.outcomes.append(release(nxt))
            else:
                r.remote.append(nxt)
        tried = [d for d in mine if _partition(d) not in faults] if faults else mine
        stats.lost_claims = sum(d.send for d in tried) - sum(d.send for d in written)


def _partition(d: Decision) -> int:
    assert d.change is not None
    return d.change.next.partition
