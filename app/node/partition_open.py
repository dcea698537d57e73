"""Opening a partition, as its task takes it (`open_partition`): per type, its
transactional producer started (fencing the previous owner), its command processor made
and its aggregate states folded from the log, and its timer table restored from its
changelog (read on from a clean local copy, else dropped and restored whole), and the
handle its cycles write its timers through made (`PartitionHandle`: p's lock alone, and
refused once p is let go, so each take makes its own), with p's transaction attached to
it as p's changelog sink (p's rows go to it directly); then the results readers follow it.
What is opened is the task's (`transactions`, `processors`, `stores`), for its close to
let go (`partition_release`) however far the take got."""

from __future__ import annotations

from collections.abc import Sequence

from app.commands.processor import CommandProcessor, Commit
from app.kafka import OutRecord, Record
from app.node.partition_transaction import PartitionTransaction
from app.node.task_shared import TaskShared
from app.timers.restore import restore_partition, unreadable_letters
from tables.partition_handle import PartitionHandle
from tables.store import ChangelogRecord, ChangelogSink

__all__ = ["open_partition"]


async def open_partition(
    s: TaskShared,
    p: int,
    topics: set[str],
    transactions: dict[str, PartitionTransaction],
    processors: dict[str, CommandProcessor],
    stores: dict[str, PartitionHandle],
) -> None:
    """Opens p of every type whose log is in `topics` (see the module)."""
    for kept in s.types.values():
        t = kept.topics
        if t.events not in topics:
            continue
        # One producer per partition and type: starting it fences the previous owner,
        # before anything of p is read.
        txn = transactions[kept.name] = await kept.transactions.open(p)
        if t.commands in topics and kept.agg is not None and kept.states is not None:
            processor = CommandProcessor(
                kept.agg,
                p,
                partitions=s.settings.partitions,
                states=kept.states,
                commit=_committer(txn),
                now=s.now,
                busy_backlog=s.settings.busy_backlog,
                limits=s.limits,
                request_id_window=s.settings.request_id_window_ms,
                targets=s.targets,
            )
            processors[kept.name] = processor
            progress = s.metrics.restore_progress(t.type_name, p, "states")
            with s.metrics.restore_duration.labels(t.type_name, "states").time():
                await processor.restore(s.reader, progress)
        clean = kept.marks.take(p)
        await kept.store.assign({p})
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
            )
            # Counted whole once, here, where a restore is waited for anyway: from now
            # on each write keeps the count (the /metrics gauges scan nothing).
            kept.store.status_counts(p)
        # After the restore (a full one drops p: a handle made before it is refused).
        handle = stores[kept.name] = kept.store.partition(p)
        handle.attach(_sink(txn))
        if unreadable:
            # Their letters and tombstones commit in p's next transaction.
            letters = unreadable_letters(unreadable, s.now(), s.limits.dead_letter_bytes)
            txn.stage(letters, {})
            s.metrics.dead_letters.labels(t.timers_changelog).inc(len(unreadable))
    for results in s.results.values():
        await results.add_partition(p)


def _sink(txn: PartitionTransaction) -> ChangelogSink:
    """p's changelog sink: each row buffered in its transaction (refused once abandoned)."""

    async def sink(records: list[ChangelogRecord]) -> None:
        for r in records:
            txn.add(r.key, r.value)

    return sink


def _committer(txn: PartitionTransaction) -> Commit:
    """The command path's commit: p's one transaction of the type."""

    async def commit(
        records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]
    ) -> list[int]:
        return await txn.commit(offsets, records)

    return commit
