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
    from app.node.kept import KeptType
    from app.node.partition_task import TaskShared
    from app.node.partition_transaction import PartitionTransaction
    from app.timers.runner import PartitionFiring

__all__ = ["CloseFailed", "release_partition"]

logger = logging.getLogger(__name__)


class CloseFailed(Exception):
    """A part of a partition's close failed (the rest was let go all the same): p may be
    half let go and its copy is not clean, so no new task takes it (as a crashed close)."""


async def release_partition(
    s: TaskShared,
    commits: PartitionCommits,
    processors: dict[str, CommandProcessor],
    transactions: dict[str, PartitionTransaction],
    firings: dict[str, PartitionFiring],
    p: int,
    *,
    clean: bool,
) -> None:
    """Lets everything of p go (its task's `close`): `clean`, what its transactions hold is
    committed first and its local copy marked clean; all of it within one deadline. Its
    timer firings (`firings`, per type) are stopped and dropped, its transactions
    (`transactions`) abandoned and dropped.
    `CloseFailed` when a part failed: every other part is done all the same (p's producer
    always stopped), and the copy is not marked clean."""
    commits.take_offsets()  # passed over, not committed: read again by the next
    loop = asyncio.get_running_loop()
    # One deadline for the whole close, every type's commits and producer stops: a
    # revoke waits for its closes, and the group throws out (moving all its partitions)
    # a member not back within its rebalance timeout. What is not done by then is
    # abandoned: closed dirty, never marked clean.
    until = loop.time() + s.close_deadline_s
    failed: list[str] = []
    for kept in s.types.values():
        committed = False
        try:
            # The commit in flight first (the runner's claims may wait on it).
            whole = clean and await commits.settle(kept, until=until, rest=False)
            # The task's firing: its last writes made, and counted as its rounds' are.
            s.metrics.round(kept.name, await kept.runner.stop_partition(p))
            # What waits (the runner's last writes included), if p's producer is open.
            committed = whole and commits.owns(kept) and await commits.settle(kept, until=until)
            if (firing := firings.get(kept.name)) is not None and firing.fault is not None:
                # The store failed in p (a corrupt row): what landed commits, but the copy
                # is not marked clean (a fault its round had not told the task yet, or met
                # by the stop's last writes): the next take restores it from its changelog.
                committed = False
        except Exception as exc:
            logger.exception("letting partition %d of %s go failed", p, kept.topics.type_name)
            failed.append(f"{kept.name}: {exc!r}")
        finally:
            firings.pop(kept.name, None)
            # Whatever failed (or was cancelled) before: p's producer is stopped and its
            # store and processor let go, or a retake's open would leak the producer.
            failed += await _let_go(s, kept, commits, processors, transactions, p, until, committed)
    for reader in s.results.values():
        try:
            # Bounded too; past the deadline given a second (cut short, the reader
            # only reads p's results on, unused).
            async with asyncio.timeout(max(until - loop.time(), 1.0)):
                await reader.remove_partition(p)
        except Exception:
            logger.exception("results reader: letting partition %d go failed", p)
    if failed:
        # Not a clean close: p may be half let go, so no new task takes it (the node stops).
        raise CloseFailed(f"partition {p}: " + "; ".join(failed))


async def _let_go(
    s: TaskShared,
    kept: KeptType,
    commits: PartitionCommits,
    processors: dict[str, CommandProcessor],
    transactions: dict[str, PartitionTransaction],
    p: int,
    until: float,
    committed: bool,
) -> list[str]:
    """Abandons p's transaction (its producer stopped) and lets its store partition and
    processor go, each whatever the others raised; the copy is marked clean only when
    `committed` and all of it went well. What failed, described."""
    failed: list[str] = []
    loop = asyncio.get_running_loop()
    try:
        # Dropped first: whatever its producer's stop does, the task holds it no more (the
        # type's registry holds it too, while it is p's one: no other task takes p before
        # this close is done).
        transactions.pop(kept.name, None)
        await kept.transactions.abandon(
            p, within=max(0.0, until - loop.time()), after=commits.abandon(kept)
        )
    except Exception as exc:
        logger.exception("partition %d of %s: stopping its producer failed", p, kept.name)
        failed.append(f"{kept.name} producer: {exc!r}")
    try:
        if p in kept.store.assigned:
            await kept.store.revoke({p})
    except Exception as exc:
        logger.exception("partition %d of %s: letting its store go failed", p, kept.name)
        failed.append(f"{kept.name} store: {exc!r}")
    if committed and not failed:
        kept.marks.mark(p)
    if processors.pop(kept.name, None) is not None:
        assert kept.states is not None
        try:
            kept.states.release(p)
        except Exception as exc:
            logger.exception("partition %d of %s: releasing its states failed", p, kept.name)
            failed.append(f"{kept.name} states: {exc!r}")
    return failed
