"""Opening a partition of one type, as its task takes it (`open_partition`): the type's
transactional producer of p started (fencing the previous owner), its command processor
made and its aggregate states folded from the log, and its timer table restored from its
changelog (read on from a clean local copy, else dropped and restored whole; a take cut
short in it leaves what it restored to be read on: `PartitionTask.copy_committed`), the
operators' requests it carried out read again from its timer-ops topic, and
the handle its cycles write its timers through made (`PartitionHandle`: p's lock alone,
and refused once p is let go, so each take makes its own), with p's transaction attached to
it as p's changelog sink (p's rows go to it directly); then the results readers follow p
(`TaskShared.reading_results`: once for all the types' tasks of p).
What is opened is the task's (`transaction`, `processor`, `store`), for its close to
let go (`partition_release`) however far the take got."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING

from app.commands.processor import CommandProcessor, Commit
from app.commands.records import letter_bytes
from app.kafka import LogReader, OutRecord, Record
from app.node.copy_age import UNKNOWN_DELETE_RETENTION_MS, copy_usable
from app.node.local_state import CleanMark, CleanMarks
from app.node.partition_transaction import ChangelogBehind, PartitionTransaction
from app.node.row_limit import RowLimit
from app.node.task_shared import TaskShared
from app.timers.applied_ops import read_applied_ops
from app.timers.decided_ops import decided_timer_op
from app.timers.restore import restore_partition, unreadable_letters
from app.timers.unparked import MAX_NOTED, left_parked
from tables.keys import encode_timer
from tables.partition_handle import PartitionHandle
from tables.store import ChangelogRecord, ChangelogSink

if TYPE_CHECKING:
    from app.node.partition_task import PartitionTask

__all__ = ["open_partition"]

logger = logging.getLogger(__name__)


async def open_partition(s: TaskShared, task: PartitionTask, topics: set[str]) -> str | None:
    """Opens p of `task`'s type, whose `topics` are given here (see the module); why its
    changelog lost rows its clean copy held, if this take or an earlier one of this node
    found it did (`restore_partition`'s `lost`, noted in `CleanMarks`)."""
    kept, p = task.kept, task.p
    t = kept.topics
    if t.events in topics:
        # One producer per partition and type: starting it fences the previous owner,
        # before anything of p is read.
        txn = task.transaction = await kept.transactions.open(p)
        if t.commands in topics and kept.agg is not None and kept.states is not None:
            processor = CommandProcessor(
                kept.agg,
                p,
                partitions=s.settings.partitions,
                states=kept.states,
                commit=_committer(txn),
                now=s.now,
                busy_backlog=s.settings.busy_backlog,
                clock_skew_ms=s.settings.clock_skew_ms,
                limits=s.limits,
                request_id_window=s.settings.request_id_window_ms,
                targets=s.targets,
                timer_op=functools.partial(
                    decided_timer_op,
                    partition=p,
                    max_record_bytes=s.limits.max_record_bytes,
                    topic_bytes=s.limits.topic_record_bytes,
                ),
            )
            task.processor = processor
            progress = s.metrics.restore_progress(t.type_name, p, "states")
            with s.metrics.restore_duration.labels(t.type_name, "states").time():
                misplaced = s.metrics.misplaced.labels(t.type_name, str(p), "restore")
                await processor.restore(s.reader, progress, misplaced=misplaced.inc)
        mark = kept.marks.take(p)
        clean = mark is not None and _young_enough(mark, s, t.timers_changelog, p)
        await kept.store.assign({p})
        # A take cut short from here on marks the copy clean again while it holds
        # committed changelog records alone (its close, `release_partition`): as the mark
        # left it, then as the restore tells; in step as of the mark's time (read on), or
        # of now (restored whole: all it holds is read from here on).
        task.copy_committed = clean
        task.copy_in_step_at = mark.at if clean and mark is not None else s.now()

        def committed_only(holds: bool) -> None:
            task.copy_committed = holds

        progress = s.metrics.restore_progress(t.type_name, p, "timers")
        unreadable: list[tuple[Record, str]] = []
        with s.metrics.restore_duration.labels(t.type_name, "timers").time():
            await restore_partition(
                kept.store,
                s.reader,
                t.timers_changelog,
                p,
                clean=clean,
                progress=progress,
                unreadable=unreadable,
                # Noted at once, before the restore drops the copy: told later, a take
                # cut short would forget it.
                lost=functools.partial(kept.marks.note_lost, p),
                committed_only=committed_only,
            )
            # Counted whole once, here, where a restore is waited for anyway: from now
            # on each write keeps the count (the /metrics gauges scan nothing).
            kept.store.status_counts(p)
        task.copy_in_step_at = None  # at the changelog's end: in step while p is held
        # After the restore (a full one drops p: a handle made before it is refused).
        handle = task.store = kept.store.partition(p)
        handle.attach(_sink(txn, task))
        txn.rows_landed = _landing(handle, kept.marks, s.reader, t.timers_changelog)
        if unreadable:
            # Their letters commit in p's next transaction, and after each record, the row
            # its key held before it written again (a tombstone when none): as p's rows,
            # so that a row its first cycles write for the key follows it in the changelog.
            letters = unreadable_letters(unreadable, s.now(), letter_bytes(s.limits, t.context))
            for record, _ in unreadable:
                assert record.key is not None  # a restore passes over keyed records only
                held = handle.held(record.key)
                value = None if held is None else encode_timer(held)
                if value is not None and kept.row_limit.over(record.key, value):
                    kept.row_limit.note(p, record.key)  # deleted below: its tombstone next
                    continue
                txn.add(record.key, value, held)
            txn.stage(letters, {})
            txn.letters_staged = True
            txn.count(s.metrics.dead_letters.labels(t.timers_changelog), len(unreadable))
        # Rows its sink refused before (over what the changelog takes now): lettered and
        # deleted in p's next transaction, before its first cycle writes one again; noted
        # until that transaction commits.
        row_limit, now, letters_take = kept.row_limit, s.now(), letter_bytes(s.limits, t.context)
        too_large, deleted = await row_limit.letter_noted(handle, now, letters_take)
        if too_large:
            landed = functools.partial(_rows_deleted, row_limit, p, deleted)
            txn.stage(too_large, {}, committed=landed)
            txn.count(s.metrics.dead_letters.labels(t.timers_changelog), len(too_large))
    if t.timer_ops in topics:
        # Before its first cycle: a request sent again is a DUPLICATE on any owner of p.
        kept.applied_ops[p] = await read_applied_ops(
            s.reader,
            t.timer_ops,
            p,
            now=s.now(),
            window_ms=s.settings.request_id_window_ms,
            limits=s.limits,
            skew_ms=s.settings.clock_skew_ms,
        )
    # Read from its end from now on (idempotent): a type's task of p reads it already.
    s.reading_results.setdefault(p, set()).add(task.type_name)
    for results in s.results.values():
        await results.add_partition(p)
    # Noted by this take's restore, or by an earlier take of this node.
    if (noted := kept.marks.lost(p)) is None:
        return None
    end, why = noted
    if end is not None and await _written_since(s.reader, t.timers_changelog, p, end):
        # Another node ran p since, whatever it did: this node's note knows no more.
        kept.marks.clear_lost(p)
        return None
    return why


def _young_enough(mark: CleanMark, s: TaskShared, topic: str, p: int) -> bool:
    """Whether a clean copy so marked may be read on from now (`copy_usable`): one older
    than its changelog keeps tombstones (less a margin) may hold rows compaction deleted
    since, and is restored whole (said at INFO: a restore of the whole changelog)."""
    read = s.tombstones_kept(topic)
    kept_ms = UNKNOWN_DELETE_RETENTION_MS if read is None else read
    now = s.now()
    if copy_usable(mark.at, now, kept_ms):
        return True
    age = "of no known age" if mark.at is None or mark.at > now else f"{now - mark.at} ms old"
    logger.info(
        "%s[%d]: the clean local copy is %s, its tombstones kept %d ms%s: restored whole",
        topic,
        p,
        age,
        kept_ms,
        "" if read is not None else " (assumed: its delete.retention.ms not read)",
    )
    return False


async def _written_since(reader: LogReader, topic: str, p: int, start: int) -> bool:
    """Whether a record was committed to `topic[p]` at `start` or after (the markers of
    transactions, which take offsets too, are no records)."""
    async with aclosing(reader.read(topic, p, start)) as batches:
        async for batch in batches:
            if batch:
                return True
    return False


def _landing(
    handle: PartitionHandle, marks: CleanMarks, reader: LogReader, topic: str
) -> Callable[[int], Awaitable[None]]:
    """p's commits' landings told its store (`applied_through`), unless one landed at or
    before the offset its copy applied and the changelog now ends just past it: it was made
    again under the node (a topic's offsets never go back), holding none of the rows
    written before it, which a restore anywhere would then lose quietly. The loss is noted
    (as a restore notes it: this node's takes of p refuse until a replay of the log) and
    the commit fails p. An offset the client told wrong (aiokafka tells -1 and up for a
    batch the broker had taken already, DUPLICATE_SEQUENCE_NUMBER) is passed over: the
    changelog still ends past the copy's offset."""

    async def landed(offset: int) -> None:
        held = handle.changelog_offset()
        if held is None or offset > held:
            await handle.applied_through(offset)
            return
        p = handle.partition
        _, end = await reader.offsets(topic, p)
        # Intact, the changelog holds past the copy's offset the marker of the transaction
        # that wrote it, then this commit's rows and marker: it ends at held + 3 at least.
        # Made again, it ends at this commit's marker: offset + 2, at most held + 2.
        if end > held + 2:
            logger.warning(
                "%s[%d]: a commit's rows landed at offset %d said, though the copy applied "
                "them through %d and the changelog ends at %d: the offset not taken",
                topic,
                p,
                offset,
                held,
                end,
            )
            return
        why = (
            f"{topic}[{p}] took this node's timer rows at offset {offset} and ends at {end}, "
            f"though its copy had applied the changelog through offset {held}: the topic "
            "was deleted and made again under the node (or cut by an unclean leader "
            "election), without the rows written before"
        )
        marks.note_lost(p, why, end)
        raise ChangelogBehind(why)

    return landed


def _sink(txn: PartitionTransaction, task: PartitionTask) -> ChangelogSink:
    """p's changelog sink: each row buffered in its transaction (refused once abandoned;
    none of a write with a row over what the changelog takes: `app.node.row_limit`),
    and the rows that were PARKED noted for p's firing, whose round takes their names out
    of the ledger (`app.timers.unparked`: a cancel, a replace or an owner deleted would
    leave them named for ever)."""

    async def sink(records: list[ChangelogRecord]) -> None:
        task.kept.row_limit.check(task.p, records)  # before any joins the transaction
        for r in records:
            txn.add(r.key, r.value, r.before)
        if (firing := task.firing) is not None:
            firing.unparked.note(r.before for r in records)
        else:  # a take's, or a held partition's: noted once p fires (as many as it keeps)
            left = [b for r in records if (b := r.before) is not None and left_parked(b)]
            task.unparked_early += left[: MAX_NOTED - len(task.unparked_early)]

    return sink


def _rows_deleted(row_limit: RowLimit, p: int, keys: list[bytes], _: list[int]) -> None:
    row_limit.landed(p, keys)


def _committer(txn: PartitionTransaction) -> Commit:
    """The command path's commit: p's one transaction of the type."""

    async def commit(
        records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]
    ) -> list[int]:
        return await txn.commit(offsets, records)

    return commit


async def last_records(reader: LogReader, p: int, starts: Mapping[str, int]) -> dict[str, int]:
    """The last record of each topic's p that a take reads from before it (`starts`:
    where it reads each from now): where p's timers may fire again (`FailingPartitions.
    behind`). A rebuild's replay from the log's start, or a node far behind, would
    otherwise fire a timer set in that part of the log and cancelled later in it. Found
    from the partition's tail (its last stable offset may follow a transaction's marker:
    the committed records before it are read, the window growing until one is)."""
    last: dict[str, int] = {}
    for topic, start in starts.items():
        first, end = await reader.offsets(topic, p)
        start, window = max(start, first), 16
        while end > start:
            begin = max(start, end - window)
            async with aclosing(reader.read(topic, p, begin)) as batches:
                async for batch in batches:
                    if batch:
                        last[topic] = batch[-1].offset
            if topic in last or begin == start:
                break
            window *= 8
    return last
