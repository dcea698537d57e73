"""The node's data directory is a cache of one Kafka cluster's topics: a copy made against
another cluster (TICKWHEEL_DATA_DIR reused, a broker replaced) is dropped before anything
of it is read, and restored from the topics. It is one worker's alone (`DataDirLock`),
and within it, which partitions' local copies hold committed writes only (`CleanMarks`)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from app.errors import ConfigError, TickwheelError
from app.protocol.topics import parse_aggregate_type

__all__ = ["CleanMark", "CleanMarks", "DataDirLock", "keep_for_cluster"]

logger = logging.getLogger(__name__)

_MARK = "cluster-id"


def keep_for_cluster(data_dir: Path, cluster_id: str) -> list[Path]:
    """Drops every type's local state when it was written against another cluster than
    `cluster_id`, and marks the directory as this cluster's; the directories dropped.

    Every type's, not only those the node runs now: the mark is the whole directory's, so
    a type run again later would otherwise read its old copy on (its clean marks, its
    offsets) as the new cluster's, and fire the old cluster's timers there. What is not a
    type's directory (`<context>.<aggregate>` holding `timers` or `states`) is left as it
    is. A directory without a
    mark (first run, or made by an older version) is kept: the restores still drop a copy
    ahead of its topic's end."""
    if not cluster_id.strip():
        raise ValueError("a cluster id must not be empty")
    data_dir.mkdir(parents=True, exist_ok=True)
    mark = data_dir / _MARK
    before = mark.read_text().strip() if mark.exists() else None
    dropped: list[Path] = []
    if before is not None and before != cluster_id:
        for directory in sorted(data_dir.iterdir()):
            if _is_type_copy(directory):
                shutil.rmtree(directory)
                dropped.append(directory)
        logger.warning(
            "%s was written against cluster %s, the broker is cluster %s: local state of "
            "%d type(s) dropped, restored from the topics",
            data_dir,
            before,
            cluster_id,
            len(dropped),
        )
    if before != cluster_id:
        tmp = mark.with_suffix(".tmp")
        tmp.write_text(cluster_id + "\n")
        tmp.replace(mark)
    return dropped


def _is_type_copy(directory: Path) -> bool:
    """Whether `directory` is a type's local state as a node makes it (`<context>.<aggregate>`
    holding its `timers` or `states`): another directory of that shape (`backup.2026-12-01`)
    is not Tickwheel's to drop."""
    try:
        parse_aggregate_type(directory.name)
    except TickwheelError:
        return False
    return directory.is_dir() and any((directory / part).is_dir() for part in _PARTS)


_PARTS = ("timers", "states")
"""What a node keeps in a type's directory (`app.node.opening.open_type`)."""


class DataDirLock:
    """The data directory held by one worker while it runs (an advisory `flock` on
    `<data dir>/.lock`, released when the worker stops or its process ends, however).

    RocksDB's own lock is taken only as each store opens, after a start dropped a copy made
    against another cluster (`keep_for_cluster`): a second worker given the directory (a
    copied configuration, another cluster's broker) deleted the first's live stores, and
    both wrote into one copy. The lock is taken first, and a second worker is refused."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Holds the directory; `ConfigError` naming it when another worker holds it."""
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except (OSError, ValueError) as exc:
            raise self._unusable(exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The holder's pid, which a second worker's refusal names. A full disk fails
            # here too: said as the directory's, never an unexpected OSError at start.
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"the data directory {self.path.parent} is in use by another worker (pid "
                f"{holder}): each worker needs its own (TICKWHEEL_DATA_DIR)"
            ) from None
        except OSError as exc:
            os.close(fd)  # the lock let go with it
            raise self._unusable(exc) from exc
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _unusable(self, exc: OSError | ValueError) -> ConfigError:
        return ConfigError(
            f"the data directory {self.path.parent} cannot be used: "
            f"{getattr(exc, 'strerror', None) or exc} (TICKWHEEL_DATA_DIR)"
        )

    def release(self) -> None:
        """Lets the directory go (the file stays: removing it would race a next holder)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True, slots=True)
class CleanMark:
    """A clean copy's mark, as a take found it: `at`, when the copy was last in step with
    its changelog (epoch ms, this node's clock; None: not known, a mark of an older version
    or one unreadable), which says whether it may still be read on from
    (`app.node.copy_age`)."""

    at: int | None


class CleanMarks:
    """Which partitions' local copies hold committed writes only (files beside the store),
    and since when each was last in step with its changelog (the mark's text).

    A mark is removed when the node takes a partition and written back only after its last
    transaction committed when it lets the partition go; a partition without a mark is
    restored from the changelog alone.
    """

    def __init__(self, directory: Path) -> None:
        self._dir = directory

    def _path(self, partition: int) -> Path:
        return self._dir / f"clean-p{partition}"

    def take(self, partition: int) -> CleanMark | None:
        """The local copy's mark if it was clean (None: not); it is not from now on,
        durably: the mark's removal is synced before the take writes (without a WAL), or a
        power loss could keep a mark vouching for a copy that holds uncommitted writes. A
        sync that fails raises (the take fails: the disk's fault)."""
        path = self._path(partition)
        try:
            text = path.read_text(errors="replace").strip()
        except FileNotFoundError:
            return None
        path.unlink(missing_ok=True)
        _sync_dir(self._dir)
        # isdecimal, not isdigit: '²' is a digit int() refuses (every take would fail).
        return CleanMark(int(text) if text.isdecimal() else None)

    def mark(self, partition: int, in_step_at: int) -> None:
        """Marks the copy clean, last in step with its changelog at `in_step_at` (epoch
        ms), durably: the mark and its directory entry synced, so that a power loss never
        leaves a mark without the writes it vouches for having been synced before it (the
        store's close syncs them)."""
        path = self._path(partition)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, f"{in_step_at}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            _sync_dir(self._dir)
        except OSError:
            # Not marked after all: a mark left by a failed sync would be trusted next.
            with contextlib.suppress(OSError):
                path.unlink()
            raise

    def lost(self, partition: int) -> tuple[int | None, str] | None:
        """Where the partition's changelog ended (None: not known) and why it lost rows its
        copy had applied, as a take of this node found it (`note_lost`); None: no take did,
        or the log was replayed since (`clear_lost`)."""
        path = self._lost(partition)
        if not path.exists():
            return None
        noted, _, why = path.read_text().partition("\n")
        return (int(noted) if noted.isdecimal() else None), why or noted

    def note_lost(self, partition: int, why: str, end: int) -> None:
        """Kept until a take sees the log read from its start, or records written to the
        changelog after `end` (where it ended then): the copy is restored from the
        changelog's remains at that take, and every later take of this node must still
        refuse, not run without the timers."""
        path = self._lost(partition)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{end}\n{why}")
        tmp.replace(path)

    def clear_lost(self, partition: int) -> None:
        self._lost(partition).unlink(missing_ok=True)

    def _lost(self, partition: int) -> Path:
        return self._dir / f"lost-p{partition}"


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
