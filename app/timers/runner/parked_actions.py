"""The operator's actions on a target's PARKED timers as the runner offers them: retry,
skip, name them in the ledger again, and the wheels loaded again after they change rows.

`TimerRunner` inherits them (`ParkedActions`), so its callers (`app.timers.operator`, a
node's `parked_names`, the tests) reach them on the runner as ever. They are apart from
`runner` because they take no part in its rounds: they settle rows and resolve ledger
entries behind the wheels' back (the how is `operating`'s), sharing only the runner's
store, ledger, clock and firings, while `runner` holds the starting, stopping and rounds
of the partitions' firings.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from app.timers.runner.decision_types import Decision
from app.timers.runner.decisions import retry_parked, skip_parked
from app.timers.runner.operating import Operated, Unresolved, name_parked, operate
from app.timers.runner.options import TimerOptions
from app.timers.runner.partition import PartitionFiring
from app.timers.runner.ports import Clock, FiringStore
from tables.ledger import FailureLedger
from tables.refs import AggregateRef
from tables.timer import Timer

__all__ = ["ParkedActions"]


class ParkedActions:
    """The operator's retry, skip and naming of PARKED timers, over the state of the
    `TimerRunner` that inherits them: it sets the attributes declared here (its own, which
    its rounds use too) in its `__init__`."""

    _store: FiringStore
    _clock: Clock
    _options: TimerOptions
    _window: int
    _ledger: FailureLedger
    _firings: dict[int, PartitionFiring]
    _unresolved: dict[int, Unresolved]

    def invalidate(self) -> None:
        """The wheels are loaded again at the next round (rows changed behind their back)."""
        for f in self._firings.values():
            f.wheel.invalidate()

    async def retry(
        self,
        target: AggregateRef,
        partitions: Iterable[int] | None = None,
        *,
        resolve_later: bool = False,
        past_window: bool = False,
    ) -> int:
        """An operator's retry: the PARKED timers of `target` due now, attempts reset, and its
        ledger entry resolved; how many. Any node may call it; the partition's owner sends
        them. `retry_counted` says how many were refused too.

        `partitions`: only the timers of these partitions (a node carrying out an operator's
        request read from one partition of the ops topic); all the store serves when None.
        `resolve_later`: the entry is resolved by the next round of each of `partitions`
        (its cycle, which holds the partition's lock, calls no ledger); of one not fired
        here yet, by the first round of its next firing here (`start_partition`).
        `past_window`: also those whose slot was due longer ago than their target may keep
        its request id (`retry_parked`), which are otherwise refused and stay PARKED.
        """
        counted = await self.retry_counted(
            target, partitions, resolve_later=resolve_later, past_window=past_window
        )
        return counted.changed

    async def retry_counted(
        self,
        target: AggregateRef,
        partitions: Iterable[int] | None = None,
        *,
        resolve_later: bool = False,
        past_window: bool = False,
    ) -> Operated:
        """`retry`, saying how many timers it retried and how many it refused (their slot
        past the request-id window, not asked `past_window`: they stay PARKED, and the
        ledger entry naming them stays open)."""
        decide = functools.partial(
            retry_parked,
            now=self._clock.now(),
            options=self._options,
            window=self._window,
            past_window=past_window,
        )
        return await self._operate(target, partitions, decide, resolve_later)

    async def skip(
        self,
        target: AggregateRef,
        partitions: Iterable[int] | None = None,
        *,
        resolve_later: bool = False,
    ) -> int:
        """An operator's skip: the PARKED timers of `target` CANCELLED/SKIPPED, entry resolved;
        `partitions` and `resolve_later` as for `retry`."""
        operated = await self._operate(target, partitions, skip_parked, resolve_later)
        return operated.changed

    async def name_parked(self, target: AggregateRef) -> int:
        """`target`'s PARKED timers in the partitions fired here recorded in the ledger
        again, once its entry was resolved (`operating.name_parked`); how many."""
        return await name_parked(self._store, self._ledger, self._firings, target)

    async def _operate(
        self,
        target: AggregateRef,
        partitions: Iterable[int] | None,
        decide: Callable[[Timer], Decision],
        later: bool,
    ) -> Operated:
        only = None if partitions is None else frozenset(partitions)
        # No lock across its ledger calls: a park under way is waited for (`operating`).
        unresolved = self._unresolved if later else None
        firings = self._firings
        written = await operate(
            self._store, self._ledger, firings, target, only, decide, later=unresolved
        )
        self.invalidate()
        return written
