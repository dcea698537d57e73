"""Every PARKED timer named by a ledger entry (`keep_parked_named`).

A park records its target's entry, then writes its PARKED row; an entry changed by
another's hand may no longer name such a timer:
- a resolve. An operator's request goes to every partition of the type's ops topic, and
  each owner resolves the target's entry once it settled its own partition's rows. A
  copy read late (its partition being taken, its input behind) resolves the entry as it
  is then, which may be one a newer park recorded, in another partition, after the
  request.
- another node's record. Two nodes parking timers of one target at the same moment each
  write the entry they know with their own timers added; the ledger keeps the later
  write, which names the other node's timers only.

Such a timer would be PARKED with no entry naming it, invisible to `timers ledger` and
the operator page. So every node, for each entry changed so (the ledger's `changed`: its
own tombstones, and whatever it follows of others), records its PARKED timers of the
target that the entry does not name, in the partitions it fires
(`TimerRunner.name_parked`), `after_s` later. The changes of a target taken before it is
looked at wait as one (`LedgerChanges`) and that look answers them all: one look a target
per `after_s` in a burst of parks, whatever their number. Should two nodes record again at
the same moment, each hears the other's write and records what it still misses: the
names only grow.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from app.errors import node_fault
from app.task_ends import cancelled_here
from app.timers.ledger import KafkaFailureLedger, LedgerChanges, LedgerKey
from app.timers.runner import TimerOptions, TimerRunner

__all__ = ["NAME_AFTER_S", "RETRY_S", "keep_parked_named"]

logger = logging.getLogger(__name__)

NAME_AFTER_S = 5.0
"""How long after an entry's change (a resolve, another node's record) its target's
PARKED timers are looked for: a request's copies in the other partitions are carried out
by then (a timer they are about to settle is not recorded again only to be resolved
again), a late one excepted."""

RETRY_S = 30.0
"""How long a target whose PARKED timers could not be recorded waits to be put back in
the queue (then `NAME_AFTER_S` more: the other targets are not held up meanwhile)."""


async def keep_parked_named(
    ledger: KafkaFailureLedger,
    runners: Callable[[], Iterable[TimerRunner]],
    *,
    after_s: float = NAME_AFTER_S,
    retry_s: float = RETRY_S,
) -> None:
    """For each entry of `ledger` changed by another's hand (`KafkaFailureLedger.changed`),
    `runners()` (its context's types') record their PARKED timers of its target that the
    entry does not name, `after_s` after its first change not looked at yet was read (that
    look answers those read meanwhile); a target that failed is tried again `retry_s` +
    `after_s` later, until it passes. Runs until cancelled; a failure never ends it."""
    loop = asyncio.get_running_loop()
    changed = ledger.changed
    # Python 3.11's `wait_for` (the ledger's writes) may swallow a cancellation that comes
    # as its write completes: a stop asked is heard before the next target and runner.
    while not cancelled_here():
        key, taken = await changed.first()
        if key.subscription != TimerOptions.PARKED_SUBSCRIPTION:
            changed.take(key)
            continue
        # Still waiting, the changes of it taken meanwhile join it: this look answers them.
        await asyncio.sleep(max(0.0, taken + after_s - loop.time()))
        changed.take(key)
        for runner in runners():
            if cancelled_here():
                break
            try:
                await runner.name_parked(key.target)
            except Exception as exc:
                log = logger.warning if node_fault(exc) else logger.exception
                log("parked timers of %s not named again, tried again later: %s", key.target, exc)
                # Back in the queue `retry_s` from now, as a change taken then (its
                # wait after it too), behind no other target's wait.
                loop.call_later(retry_s, _again, changed, key)
                break
    raise asyncio.CancelledError


def _again(changed: LedgerChanges, key: LedgerKey) -> None:
    changed.put(key, asyncio.get_running_loop().time())
