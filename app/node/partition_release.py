"""Letting a partition go, as its task closes: its commits (clean: what its transactions
hold, committed), its runner, producers, stores and readers, all within one deadline
(`TaskShared.close_deadline_s`) so that a revoke never outlasts the group's rebalance
timeout."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from app.commands.processor import CommandProcessor
from app.node.commits import PartitionCommits

if TYPE_CHECKING:
    from app.node.partition_task import TaskShared

__all__ = ["release_partition"]

logger = logging.getLogger(__name__)


async def release_partition(
    s: TaskShared,
    commits: PartitionCommits,
    processors: dict[str, CommandProcessor],
    p: int,
    *,
    clean: bool,
) -> None:
    """Lets everything of p go (its task's `close`): `clean`, what its transactions hold is
    committed first and its local copy marked clean; all of it within one deadline."""
    s.cycles.drop_local(p)
    # A cycle cut short wrote half of its work: nothing of p's transaction may commit.
    clean = not s.cycles.cut_short(p) and clean
    commits.take_offsets()  # passed over, not committed: read again by the next
    loop = asyncio.get_running_loop()
    # One deadline for the whole close, every type's commits and producer stops: a
    # revoke waits for its closes, and the group throws out (moving all its partitions)
    # a member not back within its rebalance timeout. What is not done by then is
    # abandoned: closed dirty, never marked clean.
    until = loop.time() + s.close_deadline_s
    for kept in s.types.values():
        try:
            # The commit in flight first (the runner's claims may wait on it).
            whole = clean and await commits.settle(kept, until=until, rest=False)
            await kept.runner.stop_partition(p)
            # What waits (the runner's last writes included), if p's producer is open.
            committed = (
                whole and kept.transactions.owns(p) and await commits.settle(kept, until=until)
            )
            await kept.transactions.abandon(
                p, within=max(0.0, until - loop.time()), after=commits.abandon(kept)
            )
            if p in kept.store.assigned:
                await kept.store.revoke({p})
            if committed:
                kept.marks.mark(p)
            if processors.pop(kept.name, None) is not None:
                assert kept.states is not None
                kept.states.release(p)
        except Exception:
            logger.exception("letting partition %d of %s go failed", p, kept.topics.type_name)
    for reader in s.results.values():
        try:
            # Bounded too; past the deadline given a second (cut short, the reader
            # only reads p's results on, unused).
            async with asyncio.timeout(max(until - loop.time(), 1.0)):
                await reader.remove_partition(p)
        except Exception:
            logger.exception("results reader: letting partition %d go failed", p)
