"""The node's compacted topics' policy, read again while it runs. The start refuses a
table (a timer changelog, a failure ledger, the nodes' statuses) whose `cleanup.policy`
or retention deletes rows (`app.kafka.topic_policy`); one changed on a running cluster
(`kafka-configs --alter`) went unseen until the next start, and a restore meanwhile (a
partition moved, a lost disk) silently lost what the retention had deleted.

Every `interval` s (`CHECK_INTERVAL_S`) a `TopicPolicyWatch` reads their configs again,
one DescribeConfigs, and judges them as the start does:

- a table that deletes rows is `refused` with the start's own message: the node stops on
  it (`Node.fail`), as it stops on the other faults no retry passes (an ACL taken away
  mid-run), and as its next start would refuse it anyway. Kept running, not ready, it
  would only hold its partitions from the nodes of the group that could not take them
  either;
- an aggregate's log that drops records is warned about, as at the start, once each time
  what is wrong with it changes (not every check; the first check says again what the
  start said);
- a read that fails, whole (the broker away, the client refused) or for a topic (no
  DescribeConfigs ACL on it), is one WARNING for the check, and read again at the next:
  never a reason to stop the node. A failure of any other kind, a cancellation leaking
  out of the client library included, is a failed read too: the watch never ends but by
  its own cancellation (its owner supervises it all the same).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from app.kafka.records import TopicConfigs
from app.kafka.topic_policy import POLICY_CONFIGS, policy_findings
from app.task_ends import cancelled_here

__all__ = ["CHECK_INTERVAL_S", "TopicPolicyWatch"]

logger = logging.getLogger(__name__)

CHECK_INTERVAL_S: Final = 60.0
"""How often a running node reads its tables' policy again: one small request a minute; a
broker deletes by retention every 5 minutes (`log.retention.check.interval.ms`), so a
change is often seen before it deleted anything."""

ReadConfigs = Callable[[Sequence[str], Sequence[str]], Awaitable[TopicConfigs]]
"""(topics, config names) → what the cluster tells of them (`Admin.topic_configs`)."""


class TopicPolicyWatch:
    """Reads the policy of `tables` (compacted, deleting nothing) and `logs` (keeping every
    record) every `interval` s; `refused` is told why a table deletes rows, at each check
    that finds it so."""

    def __init__(
        self,
        read: ReadConfigs,
        *,
        tables: Sequence[str],
        logs: Sequence[str] = (),
        refused: Callable[[str], None],
        interval: float = CHECK_INTERVAL_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._read = read
        self.tables, self.logs = list(tables), list(logs)
        self._refused = refused
        self.interval = interval
        self.sleep = sleep
        """How it waits between checks (a test's fake clock)."""
        # Each log's warning last given: said again only once it changes.
        self._warned: dict[str, str] = {}

    async def run(self) -> None:
        """Checks every `interval` s (the start checked just before) until cancelled."""
        while True:
            await self.sleep(self.interval)
            await self.check()

    async def check(self) -> str | None:
        """Reads the configs once and acts on them; the refusal found (None: none)."""
        asked = [*self.tables, *self.logs]
        if not asked:
            return None
        try:
            configs = await self._read(asked, POLICY_CONFIGS)
        except asyncio.CancelledError:
            if cancelled_here():
                raise
            self._failed("cancelled inside the client library")
            return None
        except Exception as exc:  # any failed read: tried again at the next check
            self._failed(str(exc) or repr(exc))
            return None
        if configs.unread:
            logger.warning(
                "cannot read the cleanup.policy of %s (read again in %g s): %s",
                ", ".join(configs.unread),
                self.interval,
                "; ".join(sorted(set(configs.unread.values()))),
            )
        refusal, warnings = policy_findings(configs, self.tables, self.logs)
        for log, warning in warnings.items():
            if self._warned.get(log) != warning:
                logger.warning("%s", warning)
        # A log read and found well again is warned about again if it changes back.
        for log in self.logs:
            if log in configs.read:
                if log in warnings:
                    self._warned[log] = warnings[log]
                else:
                    self._warned.pop(log, None)
        if refusal is not None:
            self._refused(refusal)
        return refusal

    def _failed(self, why: str) -> None:
        logger.warning(
            "reading the cleanup.policy of the node's topics failed (read again in %g s): %s",
            self.interval,
            why,
        )
