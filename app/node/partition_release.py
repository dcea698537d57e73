"""Letting a partition of one type go, as its task closes: its commits (clean: what its
transaction holds, committed), its firing in the type's runner, its producer, store and
states, and the results readers' p once no other type's task of p reads it, all within
one deadline (`TaskShared.close_deadline_s`) so that a revoke never outlasts the group's
rebalance timeout."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from app.task_ends import cancelled_here
from app.timers.runner import RoundStats
from tables import StoreClosed, StoreError, TimerStore

if TYPE_CHECKING:
    from app.node.partition_task import PartitionTask, TaskShared
    from app.node.partition_transaction import PartitionTransaction
    from app.timers.sender import ResultsReader
    from tables.partition_handle import PartitionHandle

__all__ = ["CloseFailed", "let_results_go", "release_partition"]

logger = logging.getLogger(__name__)


class CloseFailed(Exception):
    """A part of a partition's close failed (the rest was let go all the same): p may be
    half let go and its copy is not clean, so no new task takes it (as a crashed close).
    Not a store's fault in p that let p's DB go all the same (a RocksDB close refused
    after a failed write): p is let go whole, its copy restored whole by its next take."""


async def release_partition(
    s: TaskShared, task: PartitionTask, *, clean: bool, store: PartitionHandle | None = None
) -> None:
    """Lets everything of `task`'s p go (its `close`): `clean`, what its transaction holds
    is committed first and its local copy marked clean; all of it within one deadline. Its
    timer firing is stopped and dropped, its transaction abandoned and dropped.
    Not clean (or its commits failed), its copy is rolled back through `store` (its
    handle) to what its landed commits left and marked clean, unless the store itself
    failed in p or rows were thrown away uncommitted (then the next take restores it
    whole); a take cut short marks what its restore applied clean (read on next).
    `CloseFailed` when a part failed: every other part is done all the same (p's
    producer always stopped), and the copy is not marked clean."""
    kept, p, commits = task.kept, task.p, task.commits
    commits.take_offsets()  # passed over, not committed: read again by the next
    loop = asyncio.get_running_loop()
    # One deadline for the whole close, its commits and producer stop: a revoke waits
    # for its closes, and the group throws out (moving all its partitions) a member not
    # back within its rebalance timeout. What is not done by then is abandoned: closed
    # dirty, never marked clean.
    until = loop.time() + s.close_deadline_s
    failed: list[str] = []
    committed = False
    try:
        # The commit in flight first (the runner's claims may wait on it).
        whole = clean and await commits.settle(until=until, rest=False)
        # The task's firing: its last writes made. They may wait on the failure ledger (a
        # park's record, each up to its timeout, behind the context's other writes): past
        # the deadline they are cut short and p closes dirty, its copy restored by the next
        # take, whose rounds fire those timers again.
        last: RoundStats | None = None
        try:
            async with asyncio.timeout(max(until - loop.time(), 0.0)):
                last = await kept.runner.stop_partition(p)
        except TimeoutError:
            logger.warning(
                "partition %d of %s: its timers' last writes not done within the close's"
                " deadline (%.1f s): let go dirty",
                p,
                kept.name,
                s.close_deadline_s,
            )
            whole = False
        # What waits (the runner's last writes included), if p's producer is open.
        committed = whole and commits.owns() and await commits.settle(until=until)
        if last is not None and (committed or (whole and not commits.owns())):
            # Counted as its rounds' are, once landed: a dirty close's are done (and
            # counted) again by the next take.
            s.metrics.round(kept.name, last)
        if (firing := task.firing) is not None and firing.fault is not None:
            # The store failed in p (a corrupt row): what landed commits, but the copy
            # is not marked clean (a fault its round had not told the task yet, or met
            # by the stop's last writes): the next take restores it from its changelog.
            committed = False
    except (Exception, asyncio.CancelledError) as exc:
        _unless_cancelled(exc)
        logger.exception("letting partition %d of %s go failed", p, kept.name)
        failed.append(f"{kept.name}: {exc!r}")
    finally:
        # Its restore series and its place among the partitions shown go with it.
        s.metrics.let_go_of(kept.name, p)
        if (firing := task.firing) is not None and firing.fault is not None:
            task.copy_doubtful = True  # never rolled back (a close cut short included)
        task.firing = None
        txn = task.transaction
        undo = None
        if txn is not None and not (committed or failed or txn.discarded or txn.letters_staged):
            undo = store
        # Whatever failed (or was cancelled) before: p's producer is stopped and its
        # store and processor let go, or a retake's open would leak the producer.
        failed += await _let_go(s, task, until, committed, undo, txn)
    await let_results_go(s.reading_results, s.results, p, kept.name, until)
    if failed:
        # Not a clean close: p may be half let go, so no new task takes it (the node stops).
        raise CloseFailed(f"partition {p} of {kept.name}: " + "; ".join(failed))


async def let_results_go(
    reading: dict[int, set[str]],
    readers: Mapping[str, ResultsReader],
    p: int,
    type_name: str,
    until: float,
) -> None:
    """`type_name`'s task of p reads p's results no more (`TaskShared.reading_results`):
    once no other type's task of p does, each context's results reader lets p go, within
    the close's deadline `until` (the loop's time), each failure logged.

    A type's task of p opening meanwhile (between two readers' removes: each is awaited)
    adds p to every reader itself, in turn: the readers not let go yet are left reading p
    (a remove after its add would leave the new task's remote sends of that context
    unanswered, each timing out until the timer parks, for as long as p stays here)."""
    names = reading.get(p, set())
    names.discard(type_name)
    if names:
        return  # another type's task of p reads its results
    reading.pop(p, None)
    loop = asyncio.get_running_loop()
    for reader in readers.values():
        if p in reading:
            # Opened again since: its adds follow, each after the remove a reader took
            # before it (a reader takes its calls in order); the rest read p on.
            return
        try:
            # Bounded too; past the deadline given a second (cut short, the reader only
            # reads p's results on, unused).
            async with asyncio.timeout(max(until - loop.time(), 1.0)):
                await reader.remove_partition(p)
        except (Exception, asyncio.CancelledError) as exc:
            _unless_cancelled(exc)
            logger.exception("results reader: letting partition %d go failed", p)


async def _let_go(
    s: TaskShared,
    task: PartitionTask,
    until: float,
    committed: bool,
    undo: PartitionHandle | None = None,
    txn: PartitionTransaction | None = None,
) -> list[str]:
    """Abandons the task's transaction (its producer stopped) and lets its store partition
    and processor go, each whatever the others raised; the copy is marked clean only when
    `committed`, or rolled back through `undo` to what `txn`'s landed commits left once
    the producer stopped, or it holds what a take cut short restored alone
    (`PartitionTask.copy_committed`), and all of it went well. What failed, described."""
    kept, p, commits = task.kept, task.p, task.commits
    failed: list[str] = []
    loop = asyncio.get_running_loop()
    try:
        # Dropped first: whatever its producer's stop does, the task holds it no more (the
        # type's registry holds it too, while it is p's one: no other task takes p before
        # this close is done).
        task.transaction = None
        await kept.transactions.abandon(
            p, within=max(0.0, until - loop.time()), after=commits.abandon()
        )
    except (Exception, asyncio.CancelledError) as exc:
        _unless_cancelled(exc)
        logger.exception("partition %d of %s: stopping its producer failed", p, kept.name)
        failed.append(f"{kept.name} producer: {exc!r}")
    if undo is not None and txn is not None and not failed and not task.copy_doubtful:
        # What did not land is written back, so the copy holds committed writes only, read
        # on from there (a commit landing later is read on too: its landing is not
        # recorded, and the store takes no write any more). Within the close's deadline:
        # cut short, the copy is not marked, and restored whole next.
        try:
            async with asyncio.timeout(max(until - loop.time(), 1.0)):
                rolled = await undo.roll_back(txn.unlanded())
            committed = True
            logger.info(
                "partition %d of %s: %d timer row(s) not committed rolled back; its copy"
                " is read on from its changelog next",
                p,
                kept.name,
                rolled,
            )
        except (Exception, asyncio.CancelledError) as exc:
            _unless_cancelled(exc)
            logger.warning(
                "partition %d of %s: not rolled back (%s): restored whole next", p, kept.name, exc
            )
    # The store failed in p as it let it go, its DB closed all the same: p's fault alone.
    faulted = False
    try:
        if p in kept.store.assigned:
            await kept.store.revoke({p})
    except (Exception, asyncio.CancelledError) as exc:
        _unless_cancelled(exc)
        if isinstance(exc, StoreError) and _let_go_of(kept.store, p):
            # RocksDB refuses a DB's every write once one failed (a full disk for a
            # moment), the close's sync included; the DB is closed all the same. Its copy
            # is not marked clean: the next take restores it whole (never the node stopped
            # for one partition's fault: a fault that lasts fails that take, and the node
            # stops, loudly, once p cannot be taken).
            logger.warning(
                "partition %d of %s: its store failed as it let it go (%s): its copy is"
                " restored whole by its next take",
                p,
                kept.name,
                exc,
            )
            faulted = True
        else:
            logger.exception("partition %d of %s: letting its store go failed", p, kept.name)
            failed.append(f"{kept.name} store: {exc!r}")
    if undo is None and task.copy_committed and not task.copy_doubtful:
        # A take cut short (a stop, a revoke) in its restore or before it ran: the copy
        # holds the changelog's records alone through its offset, flushed by the store's
        # revoke (written without the WAL), and the next take reads on from there. A
        # crash never gets here: the mark its take removed stays removed.
        committed = True
    if committed and not failed and not faulted:
        # In step now once its restore was done (the take ran, or got that far); a take
        # cut short in it, as of when it was.
        at = task.copy_in_step_at
        try:
            kept.marks.mark(p, s.now() if at is None else at)
        except OSError as exc:  # a full disk: not marked, restored whole next
            logger.exception("partition %d of %s: marking its copy clean failed", p, kept.name)
            failed.append(f"{kept.name} clean mark: {exc!r}")
    if task.processor is not None:
        task.processor = None
        assert kept.states is not None
        try:
            kept.states.release(p)
        except Exception as exc:
            if isinstance(exc, StoreError) and kept.states.is_bad(p):
                # Closed all the same, its copy marked bad: the next take folds the log whole.
                logger.warning(
                    "partition %d of %s: its states failed as they were let go (%s): folded"
                    " again from the log by its next take",
                    p,
                    kept.name,
                    exc,
                )
            else:
                logger.exception("partition %d of %s: releasing its states failed", p, kept.name)
                failed.append(f"{kept.name} states: {exc!r}")
    return failed


def _let_go_of(store: TimerStore, p: int) -> bool:
    """Whether `store` serves p no more (its revoke got as far as closing p's DB, which is
    closed whatever that raised); False when that is not known (the store is closed)."""
    try:
        return p not in store.assigned
    except StoreClosed:
        return False


def _unless_cancelled(exc: BaseException) -> None:
    """Re-raises `exc` when it is the close's own cancellation; a CancelledError leaked
    out of a call (a client's) while nobody cancels the close is a part that failed."""
    if isinstance(exc, asyncio.CancelledError) and cancelled_here():
        raise exc
