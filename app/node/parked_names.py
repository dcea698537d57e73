"""Every PARKED timer named by a ledger entry, after a resolve (`keep_parked_named`).

An operator's request goes to every partition of the type's ops topic, and each owner
resolves the target's entry once it settled its own partition's rows. A copy read late
(its partition being taken, its input behind) resolves the entry as it is then, which
may be one a newer park recorded, in another partition, after the request: that timer
would be PARKED with no entry naming it, invisible to `timers ledger` and the operator
page. So every node, for each entry resolved (its own tombstones and those it follows),
records the target's PARKED timers of the partitions it fires again
(`TimerRunner.name_parked`): within moments an entry is open for the target again (one
node's names, should two nodes record at once: the ledger keeps the later write).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from app.errors import node_fault
from app.timers.ledger import KafkaFailureLedger
from app.timers.runner import TimerOptions, TimerRunner

__all__ = ["NAME_AFTER_S", "RETRY_S", "keep_parked_named"]

logger = logging.getLogger(__name__)

NAME_AFTER_S = 5.0
"""How long after an entry's resolve its target's PARKED timers are looked for: the
request's copies in the other partitions are carried out by then (a timer they are about
to settle is not recorded again only to be resolved again), a late one excepted."""

RETRY_S = 30.0
"""How long a target whose PARKED timers could not be recorded waits for the next try
(put back in the queue: the other targets are not held up meanwhile)."""


async def keep_parked_named(
    ledger: KafkaFailureLedger,
    runners: Callable[[], Iterable[TimerRunner]],
    *,
    after_s: float = NAME_AFTER_S,
    retry_s: float = RETRY_S,
) -> None:
    """For each entry of `ledger` resolved, `runners()` (its context's types') record
    their PARKED timers of its target again, `after_s` after the resolve was read; a
    target that failed is tried again `retry_s` later, until it passes. Runs until
    cancelled; a failure never ends it."""
    me = asyncio.current_task()
    loop = asyncio.get_running_loop()
    resolved = ledger.resolved
    # Python 3.11's `wait_for` (the ledger's writes) may swallow a cancellation that comes
    # as its write completes: a stop asked is heard before the next target and runner.
    while me is None or not me.cancelling():
        key, taken = await resolved.get()
        if key.subscription != TimerOptions.PARKED_SUBSCRIPTION:
            continue
        await asyncio.sleep(max(0.0, taken + after_s - loop.time()))
        for runner in runners():
            if me is not None and me.cancelling():
                break
            try:
                await runner.name_parked(key.target)
            except Exception as exc:
                log = logger.warning if node_fault(exc) else logger.exception
                log("parked timers of %s not named again, tried again later: %s", key.target, exc)
                # Back in the queue when due, behind no other target's wait.
                loop.call_later(retry_s, resolved.put_nowait, (key, -after_s))
                break
    raise asyncio.CancelledError
