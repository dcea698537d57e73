"""The timer table restored from its changelog, and the letters for what a restore could not
read.

A partition's local copy that holds committed writes only is read on from its last applied
offset; any other (uncommitted writes possible, unknown, older than what the changelog still
holds, or ahead of it) is dropped and restored from the changelog alone. So is a clean copy
older than the changelog keeps tombstones (its caller says it is not clean:
`app.node.copy_age`): compaction drops them without moving the log's first offset, so its
offset alone never tells. Its rows are
written by the partition's transaction (`app.node.partition_transaction`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import aclosing

from app.errors import BadRecord
from app.kafka import LogReader, OutRecord, Record
from app.kafka.records import RestoreProgress
from app.protocol.dead_letters import Stage, dead_letter
from tables import TimerStore
from tables.rocksdb_io import gc_paused

__all__ = ["restore_partition", "unreadable_letters"]

logger = logging.getLogger(__name__)


async def restore_partition(
    store: TimerStore,
    reader: LogReader,
    topic: str,
    partition: int,
    *,
    clean: bool = True,
    progress: RestoreProgress | None = None,
    unreadable: list[tuple[Record, str]] | None = None,
    lost: Callable[[str, int], None] | None = None,
    committed_only: Callable[[bool], None] | None = None,
) -> int:
    """Applies `topic[partition]` after the store's last applied offset; how many records.
    `progress` hears the offsets read and to read as it goes.

    A record that is no row of the partition's is passed over (the store keeps what its
    key held before); those that no later record of their key replaced are added to
    `unreadable` with the reason, for `unreadable_letters`. `lost` is told why, and where
    the changelog ends, when it ends before the offset this copy (clean or not) applied it
    through (before the copy is dropped: told later, a take cut short would forget it): the
    topic was recreated (or cut by an unclean leader election), and only a replay of the
    log from its start (a rebuild's) makes its rows again. (A changelog whose start moved
    past the copy is not told: compaction moves it too, once its first segments hold
    nothing live.)

    `committed_only` is told, as the restore goes, whether the copy holds the changelog's
    records alone through the offset it holds (each batch is written with its last
    offset), so that a take cut short (a stop, a revoke) may mark it clean and the next
    read on from there: not while a dirty copy is being dropped, nor after a store write
    that failed, nor while a record passed over waits for its letter (read on, the next
    restore would never meet it)."""
    told = committed_only or _untold
    held = store.changelog_offset(partition)
    begin, end = await reader.offsets(topic, partition)
    # A dirty copy too: whatever it holds besides, the offset it applied through is one
    # a commit landed (or a restore read), so the changelog held it once (a node stopped
    # on its writes failing while the topic was gone, then made again at its restart).
    if held is not None and held >= end and lost is not None:
        lost(
            f"{topic}[{partition}] holds offsets {begin} to {end}, and this node's local "
            f"copy of it applied its records through offset {held}",
            end,
        )
    if not clean or held is None or held < begin or held >= end:
        # The local copy may hold uncommitted writes, or is unknown, or older than what the
        # changelog still holds (a rebuild deleted it), or ahead of it (the topic was
        # recreated): start from the changelog alone.
        told(False)
        await store.drop(partition)
        await store.assign({partition})
        told(True)  # empty: a prefix of the changelog
        held = None
    start = 0 if held is None else held + 1
    began = time.monotonic()
    count = 0
    to_read = max(end - start, 0)
    if progress is not None:
        progress(0, to_read)
    # Each key's records passed over since its last good one: every one is lettered (two
    # bad records of one key are two letters), until a later record of the key replaces them.
    passed: dict[bytes, list[tuple[Record, str]]] = {}
    async with aclosing(reader.read(topic, partition, start)) as batches:
        async for batch in batches:
            # The cyclic GC held off while a batch is applied: ~10 acyclic objects a record
            # (measured: ~0.8 us a record of 6.4); on again before the next batch is awaited.
            with gc_paused():
                rows = [(r.offset, r.key, r.value) for r in batch if r.key is not None]
                if rows:
                    try:
                        applied = await store.apply_changelog(partition, rows)
                    except Exception:
                        told(False)  # the store failed in p: its copy is not trusted
                        raise
                    bad = {row.offset: row.reason for row in applied}
                    # Only while some record was passed over (rarely): a key's later record may
                    # replace it (with every record good and none passed, nothing to look at).
                    if bad or passed:
                        for r in batch:
                            if r.key is None:
                                continue
                            if r.offset in bad:
                                passed.setdefault(r.key, []).append((r, bad[r.offset]))
                            else:
                                passed.pop(r.key, None)  # replaced (or deleted) by a later record
                        told(not passed)
                    count += len(rows)
                if batch and progress is not None:
                    progress(min(batch[-1].offset + 1 - start, to_read), to_read)
    try:
        await store.end_restore(partition)
    except BaseException:
        # A cancel too: the flush it started runs on in its thread while the close flushes
        # and closes the DB; what the copy holds then is not known.
        told(False)
        raise
    if progress is not None:
        progress(to_read, to_read)
    if passed:
        found = sorted((item for items in passed.values() for item in items), key=_offset)
        logger.error(
            "%s[%d]: %d records are no timer rows; passed over (first at offset %d: %s)",
            topic,
            partition,
            len(found),
            found[0][0].offset,
            found[0][1],
        )
        if unreadable is not None:
            unreadable += found
    logger.info(
        "restored %s[%d]: %d records from offset %d in %.3f s",
        topic,
        partition,
        count,
        start,
        time.monotonic() - began,
    )
    return count


def _untold(committed_only: bool) -> None:
    pass


def _offset(item: tuple[Record, str]) -> int:
    return item[0].offset


def unreadable_letters(
    unreadable: Sequence[tuple[Record, str]], now: int, limit: int
) -> list[OutRecord]:
    """For each changelog record a restore passed over, its dead letter (one letter a
    record). The caller writes after it what the store held under its key before it, or a
    tombstone when it held none (`app.node.partition_open`), so that no later restore
    meets it again and another writer's garbage under a live timer's key never deletes
    the timer."""
    return [
        dead_letter(record, BadRecord(reason), Stage.RESTORE, now, limit=limit)
        for record, reason in unreadable
    ]
