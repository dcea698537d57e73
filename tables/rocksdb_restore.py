"""The RocksDB store as a copy of its changelog: the on-disk format marker that has an
older copy thrown away and restored (`check_format`), a copy's removal (`remove_copy`),
and the WriteBatch a restore writes of a batch of changelog records (`restore_batch`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from typing import Any, cast

from rocksdict import Rdict, WriteBatch

from tables.exceptions import StoreError
from tables.keys import DUE, FINISHED, HELD, OFFSET_KEY, PARKED, ROW
from tables.owners import TableOwners
from tables.rocksdb_io import read_fault, rocksdb_fault
from tables.rowcheck import restored_index_as_is, restored_model_index
from tables.store import UnreadableRow, unreadable_reason

__all__ = [
    "FORMAT",
    "INDEXES",
    "RESTORED_KEYS_LIMIT",
    "check_format",
    "remove_copy",
    "restore_batch",
]

logger = logging.getLogger(__name__)

INDEXES = (DUE, PARKED, FINISHED, HELD)
"""The first bytes of the index entries (an ``r`` entry holding one points to it)."""
_PAST_INDEXES = b"\xff"
"""A key past every index entry (`tables.keys`' prefixes are all below it)."""
_META = "STORE.json"
FORMAT = 2
"""2: finished rows in the ``f`` index (1 kept them under ``r``): a store of format 1 is
thrown away on open and restored from the changelog (it is only ever a copy of it)."""


def check_format(path: str, partitions: int, db_path: Callable[[int], str]) -> None:
    """Makes `path` a store of `partitions` partitions in this `FORMAT`: an older format's
    partition DBs (`db_path`) are removed, to be restored from the changelog, and so are
    those of an unreadable format file; `ValueError` if it holds another partition count
    or a newer format, `StoreError` naming the file if it cannot be read or written."""
    os.makedirs(path, exist_ok=True)
    meta = os.path.join(path, _META)
    try:
        with open(meta, "rb") as file:
            raw: bytes | None = file.read()
    except FileNotFoundError:
        raw = None
    except OSError as exc:
        raise StoreError(f"cannot read {meta}: {exc}") from exc
    if raw is not None:
        held = _format_of(raw)
        if held is None:
            # Cut short (a full disk, a crash: written in place by earlier versions) or
            # damaged: the copies' format is unknown, and they are only copies of the
            # changelog (no offsets left: each is restored whole).
            logger.error("%s is unreadable (%r): the timer store's copies are dropped and "
                         "restored from the changelog", meta, raw[:60])  # fmt: skip
        else:
            if held.get("partitions") != partitions or held.get("format", 0) > FORMAT:
                raise ValueError(
                    f"{path} holds a timer store of {held.get('partitions')} partitions "
                    f"(format {held.get('format')}), not {partitions} (format {FORMAT}): "
                    "drop it or open it with its own partition count and version"
                )
            if held.get("format") == FORMAT:
                return
            # An older layout: the copy goes, the changelog restores it (no offsets left).
            logger.warning("%s: timer store format %s is replaced by %d, restored from the "
                           "changelog", path, held.get("format"), FORMAT)  # fmt: skip
        for partition in range(partitions):
            remove_copy(db_path(partition), partition)
    _write_format(meta, {"format": FORMAT, "partitions": partitions})


def _format_of(raw: bytes) -> dict[str, Any] | None:
    """What a format file holds, or None if it is no format file's JSON."""
    try:
        held = json.loads(raw)
    except (ValueError, RecursionError):  # JSON or UTF-8 that does not decode; nested deep
        return None
    if not isinstance(held, dict) or not isinstance(held.get("format", 0), int):
        return None
    return held


def _write_format(meta: str, held: dict[str, Any]) -> None:
    """Writes the format file whole or not at all: a temporary file beside it, synced, put
    in its place, so that a full disk or a crash leaves the old file (or none), never an
    empty or half-written one."""
    temp = f"{meta}.tmp"
    try:
        with open(temp, "w", encoding="utf-8") as file:
            json.dump(held, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, meta)
        directory = os.open(os.path.dirname(meta), os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power loss
        finally:
            os.close(directory)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise StoreError(
            f"cannot write {meta}: {exc}; the timer store opens once it can be written "
            "(disk space, permissions)"
        ) from exc


def remove_copy(db: str, partition: int) -> None:
    """Removes a partition's DB directory `db` (none there is fine); `StoreError` naming it
    if it cannot: a copy that failed to go must not be opened again as if it had."""

    def missing_is_fine(function: object, name: str, exc_info: Any) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    try:
        shutil.rmtree(db, onerror=missing_is_fine)
    except OSError as exc:
        raise StoreError(f"cannot drop {db}: {exc}", partition=partition) from exc


def restore_batch(
    db: Rdict | Callable[[], Rdict],
    partition: int,
    records: list[tuple[int, bytes, bytes | None]],
    restored: set[int] | None = None,
    owners: TableOwners | None = None,
) -> tuple[WriteBatch, list[UnreadableRow], list[bytes]]:
    """The batch that writes `records` (changelog `(offset, key, value)`) of `partition`
    over what `db` holds, with the last offset; the records that are no row (of an owner
    `owners` puts in `partition`, given them); and the batch's first due and finished
    entries (for the store's low-water marks).

    `restored`, if given, holds the `hash` of every key `db` holds a row of (it held none
    before its restore began); the batch's keys are added to it. Their old index entries
    are read back in one multi-get (~0.85 µs a row), but with `restored` only those of
    keys whose hash an earlier batch wrote: none, unless the changelog holds a key twice
    or two hashes collide (an entry read that is not there is None, which is right too).

    `db` may be a function returning the DB to read, called only when an entry is read
    (the store's DB of a bulk restore is not read: `RocksDBTimerStore._bulk`)."""
    if restored is None:
        held = _multi_get(_readable(db), partition, records, None)
    else:
        hashes = set(map(hash, [key for _, key, _ in records]))
        again = restored.intersection(hashes)
        restored |= hashes
        if not again and len(hashes) == len(records):
            # Keys none before held, each once.
            return _rows_over(partition, records, None, owners)
        held = _multi_get(_readable(db), partition, records, again)
    return _rows_over(partition, records, held, owners)


def _readable(db: Rdict | Callable[[], Rdict]) -> Rdict:
    return db if isinstance(db, Rdict) else db()


RESTORED_KEYS_LIMIT = 2_000_000
"""The most key hashes a store keeps for restores into emptied partitions (~70 bytes
each: ~140 MB at most); past it, a restore reads every key's old entry back instead."""


def _multi_get(
    db: Rdict,
    partition: int,
    records: list[tuple[int, bytes, bytes | None]],
    hashes: set[int] | None,
) -> list[bytes | None]:
    """The records' ``r`` entries as `db` holds them (None: no row): of every key, or only
    of those whose hash is in `hashes` (None for the others). RocksDB failing to read them
    is a `StoreError` of `partition` (not the plain `Exception` rocksdict raises)."""
    if hashes is None:
        return _get(db, partition, [ROW + key for _, key, _ in records])
    held: list[bytes | None] = [None] * len(records)
    at = [i for i, (_, key, _) in enumerate(records) if hash(key) in hashes]
    got = _get(db, partition, [ROW + records[i][1] for i in at])
    for i, entry in zip(at, got, strict=True):
        held[i] = entry
    return held


def _get(db: Rdict, partition: int, keys: list[bytes]) -> list[bytes | None]:
    try:
        return cast(list[bytes | None], db.get(cast(Any, keys)))
    except Exception as exc:
        if rocksdb_fault(exc):
            raise read_fault(exc, partition) from exc
        raise


def _rows_over(
    partition: int,
    records: list[tuple[int, bytes, bytes | None]],
    held: list[bytes | None] | None,
    owners: TableOwners | None,
) -> tuple[WriteBatch, list[UnreadableRow], list[bytes]]:
    """`restore_batch` over rows whose ``r`` entries were `held`, a key maybe twice; or,
    `held` None, of keys that held no row before, each once (a fresh restore's common
    batch: no old entry to look up nor delete)."""
    unreadable: list[UnreadableRow] = []
    batch = WriteBatch(raw_mode=True)
    put, delete, as_is = batch.put, batch.delete, restored_index_as_is
    indexed: dict[bytes, bytes | None] = {}
    """The index entry of each row this batch has written so far (with `held` only)."""
    first_due = first_finished = _PAST_INDEXES
    new: bytes | None
    old: bytes | None = None
    for i, (offset, key, value) in enumerate(records):
        new = None
        if value is not None and (new := as_is(partition, key, value, owners)) is None:
            try:
                new, value = restored_model_index(partition, key, value, owners)
            except ValueError as exc:
                # No row: the key keeps what it held before, in the store or earlier in
                # this batch (another writer's garbage under a live timer's key never
                # deletes it), as the row written again after its dead letter says
                # (`unreadable_letters`; a tombstone when it held none).
                unreadable.append(UnreadableRow(offset, key, value, unreadable_reason(exc)))
                continue
        if held is not None:
            if key in indexed:
                old = indexed[key]
            elif (raw := held[i]) is not None and raw[:1] in INDEXES:
                old = raw
            else:
                old = None
            indexed[key] = new
        if new is None:
            delete(ROW + key)
        else:
            put(new, value)
            put(ROW + key, new)
            if new < first_due and new[:1] == DUE:
                first_due = new
            elif new < first_finished and new[:1] == FINISHED:
                first_finished = new
        if old is not None and old != new:
            delete(old)
    batch.put(OFFSET_KEY, records[-1][0].to_bytes(8, "big", signed=True))
    firsts = [first for first in (first_due, first_finished) if first is not _PAST_INDEXES]
    return batch, unreadable, firsts
