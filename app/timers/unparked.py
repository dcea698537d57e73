"""The ledger names of timers that left PARKED other than by an operator's retry or skip,
taken out of their entries, and of those a resume parked again, named again (`Unparked`).

A park records its target's entry (naming the timer), and an operator's retry or skip
resolves it (`app.timers.runner.operating`). A PARKED row may also leave PARKED by its
owner's hand: a `wow.ScheduleCancelled` of its key (a job dropping its oldest failed
slot, `app.jobs.runs.runs_to_drop`), a `wow.ScheduleSet` of its key replacing it, its
owner deleted. Nothing then told the ledger: the entry named the timer for ever, and once
it named only such timers, the target stayed on the operator page with nothing to retry.

A partition's changelog sink sees every write of its rows with the row it replaced
(`ChangelogRecord.before`): `note` keeps those that were PARKED, by target, and the
partition's next round (`forget`), once the outcome writes under way are done (a park's
row written after its record), takes their names out of the entries of their targets,
passing over any PARKED again by then (a retried timer that failed again keeps its request
id), and names the target's PARKED timers of the partition (`pruned_entry`, written by
`KafkaFailureLedger.forget` in one write, a tombstone when nothing is left). Should a
write noted roll back (its commit failed), its row is PARKED again with its name taken
out: the partition is then taken afresh, and its first round names its PARKED timers no
entry names (`name_unnamed`).

A PARKED timer its owner pauses leaves PARKED too (its name is taken out: an operator's
retry or skip passes over a paused timer), and its resume parks it again
(`tables.writes.resume_row`), in the partition's cycle, which calls no ledger. So `note`
keeps as well the rows that were PAUSED so marked (`Timer.parked_when_paused`), and the
round names again those of them PARKED by then that their target's entry does not name
(`name_again`). Until that round the resumed row is PARKED with no entry naming it (a
retry or skip reaches it all the same: they act on PARKED rows); a note lost with its
node is made up for by the partition's next take, whose first round names its PARKED
timers no entry names.

A park records its entry before it writes its PARKED row (a crash between them leaves a
name with no PARKED row, never a PARKED row no entry names), and that write is
conditional: refused (the owner cancelled or replaced the timer while its last attempt
was in flight) or failed, the name would stay in its entry for ever. So the outcome write
keeps the names of such parks too (`refused`), taken out by the same round, which looks
at the rows as they are then.

Notes are bounded (`MAX_NOTED`): one dropped leaves a name in its entry, as before, or a
timer parked again unnamed until the partition's next take.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from typing import Final, Protocol, runtime_checkable

from tables.ledger import FailureLedger, LedgerEntry, merged
from tables.refs import AggregateRef
from tables.timer import Timer, TimerStatus

__all__ = [
    "MAX_NOTED",
    "RETRY_AFTER_MS",
    "Forgetting",
    "ParkedRows",
    "Unparked",
    "forget_unparked",
    "left_parked",
    "name_again",
    "pruned_entry",
]

logger = logging.getLogger(__name__)

MAX_NOTED: Final = 10_000
"""The names a partition keeps to take out of the ledger at most; past it, notes are
dropped (their names stay in their entries, as before this existed)."""

RETRY_AFTER_MS: Final = 30_000
"""How long after its round began a partition whose `forget` failed (the ledger did not
answer) waits to try again: longer than a ledger write's own timeout (10 s), so that a
ledger that does not answer holds up one round in three at most, not every one."""

TARGETS_PER_ROUND: Final = 20
"""The entries one round writes at most (each a ledger write acknowledged): a partition
whose owners cancelled thousands of parked timers at once takes them out over its next
rounds, none of them held up for long."""


def left_parked(row: Timer) -> bool:
    """Whether a row a write replaced is one `Unparked.note` keeps: PARKED, or PAUSED when
    PARKED (`Timer.parked_when_paused`), whatever it became."""
    return row.status is TimerStatus.PARKED or (
        row.status is TimerStatus.PAUSED and row.parked_when_paused
    )


def pruned_entry(
    known: LedgerEntry, gone: Collection[str], parked: Sequence[Timer]
) -> LedgerEntry | None:
    """`known` without the names of `gone` (timers no longer PARKED: cancelled, replaced,
    deleted with their owner, paused, retried, skipped), with `parked` (the target's PARKED timers
    where the caller looked) named; None when it names nothing then; `known` itself when
    none of `gone` is named but by a timer `parked` still has (nothing to write).

    A name taken out makes room: `truncated` is cleared, and the PARKED timers it did not
    name are named again, `parked` here and each other node's by `app.node.parked_names`
    when it follows this write (the names stay within `MAX_NAMED`, as `merged` keeps them).
    """
    still = {t.request_id for t in parked}
    names = tuple(n for n in known.timers if n not in gone or n in still)
    if len(names) == len(known.timers):
        return known
    entry = merged(
        known.model_copy(update={"timers": names, "truncated": False}),
        known.subscription,
        known.target,
        parked,
    )
    return entry if entry.timers or entry.truncated else None


@runtime_checkable
class Forgetting(Protocol):
    """A ledger that writes an entry's names back itself (`KafkaFailureLedger.forget`)."""

    async def forget(
        self,
        subscription: str,
        target: AggregateRef,
        gone: Collection[str],
        parked: Sequence[Timer] = (),
    ) -> bool: ...


async def forget_unparked(
    ledger: FailureLedger,
    subscription: str,
    target: AggregateRef,
    gone: Collection[str],
    parked: Sequence[Timer],
) -> bool:
    """The names `gone` taken out of the entry of `(subscription, target)`, `parked` named
    (`pruned_entry`); whether the ledger was written. A ledger that can only record and
    resolve (the memory one: no I/O between its calls) is resolved and `parked` recorded
    again, only when the entry names nothing else: it cannot write back the names of
    timers the caller did not look at (another partition's), so such an entry stays."""
    if isinstance(ledger, Forgetting):
        return await ledger.forget(subscription, target, gone, parked)
    known = await ledger.entry(subscription, target)
    if known is None or (entry := pruned_entry(known, gone, parked)) is known:
        return False
    if entry is not None and not set(entry.timers) <= {t.request_id for t in parked}:
        return False
    await ledger.resolve(subscription, target)
    if parked:
        await ledger.record(subscription, target, parked)
    return True


async def name_again(
    ledger: FailureLedger, subscription: str, target: AggregateRef, parked: Sequence[Timer]
) -> bool:
    """`parked` (timers a resume PARKED again, whose pause took their names out) named in
    the entry of `(subscription, target)`, unless it names them all already or names no
    more (`truncated`: recorded, it would only be written again); whether it wrote."""
    if not parked:
        return False
    known = await ledger.entry(subscription, target)
    if known is not None and (
        known.truncated or {t.request_id for t in parked} <= set(known.timers)
    ):
        return False
    await ledger.record(subscription, target, parked)
    return True


class ParkedRows(Protocol):
    """What `forget` reads of the partition's store: a target's PARKED rows."""

    async def parked(self, target: AggregateRef) -> list[Timer]: ...


class Unparked:
    """One partition's timers that left PARKED, by target, waiting to be taken out of the
    ledger by its round, and those that left a PAUSED row marked parked, waiting to be
    named again if PARKED (see the module). Its owner's: one partition, one event loop."""

    def __init__(self, partition: int, *, limit: int = MAX_NOTED) -> None:
        self.partition = partition
        self._limit = limit
        self._names: dict[AggregateRef, set[str]] = {}
        self._again: dict[AggregateRef, set[str]] = {}
        """The timers that were PAUSED, PARKED when paused: perhaps PARKED again."""
        self._count = 0
        self.dropped = 0
        """Notes not kept (`MAX_NOTED`): their names stay in their entries."""
        self.after = 0
        """Not tried again before then (the runner's clock), after a failure."""

    def __len__(self) -> int:
        return self._count

    def note(self, before: Iterable[Timer | None]) -> None:
        """Of the rows a write replaced (`ChangelogRecord.before`), keeps those that were
        PARKED, and those that were PAUSED when PARKED (`Timer.parked_when_paused`),
        whatever they became: the round looks at what they are then."""
        for row in before:
            if row is None or not left_parked(row):
                continue
            if row.partition != self.partition:
                continue  # another partition's round answers for it
            self._add(self._names if row.status is TimerStatus.PARKED else self._again, row)

    def refused(self, parks: Iterable[Timer]) -> None:
        """Keeps the names of parks the ledger recorded whose PARKED rows were not written
        (`parks`: the rows they would have written; refused, the row changed since loaded,
        or the write failed): their names are taken out by the round as those of rows that
        left PARKED, but for any PARKED by then (the write landed after all)."""
        for row in parks:
            if row.partition == self.partition:
                self._add(self._names, row)

    def _add(self, kept: dict[AggregateRef, set[str]], row: Timer) -> None:
        names = kept.get(row.target)
        if names is not None and row.request_id in names:
            return
        if self._count >= self._limit:
            self.dropped += 1
            return
        kept.setdefault(row.target, set()).add(row.request_id)
        self._count += 1

    async def forget(
        self, store: ParkedRows, ledger: FailureLedger, subscription: str, now: int
    ) -> int:
        """Takes the names noted out of their targets' entries under `subscription`, and
        names again the timers noted PARKED again; how many entries it wrote. The caller
        waits first for the partition's outcome writes under way
        (`PartitionFiring.written`): a park of one of them records its entry before it
        writes its row. A failure keeps what is left for `RETRY_AFTER_MS`."""
        if not (self._names or self._again) or now < self.after:
            return 0
        written = 0
        for _ in range(TARGETS_PER_ROUND):
            # The names gone first, then the timers parked again: each looks at the rows
            # as they are by then (a timer paused and resumed since is PARKED, kept named).
            kept = self._names or self._again
            if not kept:
                break
            # Taken out first: a note of this target made while the ledger is awaited
            # starts a set of its own, for the next round.
            target, noted = next(iter(kept.items()))
            del kept[target]
            self._count -= len(noted)
            try:
                rows = await store.parked(target)
                parked = [t for t in rows if t.partition == self.partition]
                if kept is self._names:
                    wrote = await forget_unparked(ledger, subscription, target, noted, parked)
                else:
                    back = [t for t in parked if t.request_id in noted]
                    wrote = await name_again(ledger, subscription, target, back)
                if wrote:
                    written += 1
            except Exception as exc:
                self._keep(kept, target, noted)
                self.after = now + RETRY_AFTER_MS
                logger.warning(
                    "partition %d: the ledger names of %d timer(s) %s not %s yet (%d waiting): %r",
                    self.partition,
                    len(noted),
                    "no longer parked" if kept is self._names else "parked again",
                    "taken out" if kept is self._names else "written",
                    self._count,
                    exc,
                )
                break
        return written

    def _keep(
        self, kept: dict[AggregateRef, set[str]], target: AggregateRef, noted: set[str]
    ) -> None:
        names = kept.setdefault(target, set())
        before = len(names)
        names |= noted
        self._count += len(names) - before
