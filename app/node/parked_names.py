"""Every PARKED timer named by a ledger entry, after a resolve (`keep_parked_named`).

An operator's request goes to every partition of the type's ops topic, and each owner
resolves the target's entry once it settled its own partition's rows. A copy read late
(its partition being taken, its input behind) resolves the entry as it is then, which
may be one a newer park recorded, in another partition, after the request: that timer
would be PARKED with no entry naming it, invisible to `timers ledger` and the operator
page. So every node, for each entry resolved (its own tombstones and those it follows),
records the target's PARKED timers of the partitions it fires again
(`TimerRunner.name_parked`): within moments an entry names them again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from app.errors import node_fault
from app.timers.ledger import KafkaFailureLedger
from app.timers.runner import TimerOptions, TimerRunner

__all__ = ["NAME_AFTER_S", "NAME_TRIES", "keep_parked_named"]

logger = logging.getLogger(__name__)

NAME_AFTER_S = 5.0
"""How long after an entry's resolve its target's PARKED timers are looked for: the
request's copies in the other partitions are carried out by then (a timer they are about
to settle is not recorded again only to be resolved again), a late one excepted."""

NAME_TRIES = 5
"""How many times a target's PARKED timers are recorded again when the ledger refuses
(one second apart): then the failure is logged, and the next resolve tries again."""


async def keep_parked_named(
    ledger: KafkaFailureLedger,
    runners: Callable[[], Iterable[TimerRunner]],
    *,
    after_s: float = NAME_AFTER_S,
) -> None:
    """For each entry of `ledger` resolved, `runners()` (its context's types') record
    their PARKED timers of its target again, `after_s` after the resolve was read. Runs
    until cancelled; a failure of one target is logged and passed (never the end of the
    task)."""
    me = asyncio.current_task()
    loop = asyncio.get_running_loop()
    # Python 3.11's `wait_for` (the ledger's writes) may swallow a cancellation that
    # comes as its write completes: a stop asked is read here, never waited past.
    while me is None or not me.cancelling():
        key, taken = await ledger.resolved.get()
        if key.subscription != TimerOptions.PARKED_SUBSCRIPTION:
            continue
        await asyncio.sleep(max(0.0, taken + after_s - loop.time()))
        for runner in runners():
            for attempt in range(1, NAME_TRIES + 1):
                try:
                    await runner.name_parked(key.target)
                    break
                except Exception as exc:
                    log = logger.warning if node_fault(exc) else logger.exception
                    log(
                        "parked timers of %s not named again (%d/%d): %s",
                        key.target,
                        attempt,
                        NAME_TRIES,
                        exc,
                    )
                    await asyncio.sleep(1)
    raise asyncio.CancelledError
