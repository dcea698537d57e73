"""The node's data directory is a cache of one Kafka cluster's topics: a copy made against
another cluster (TICKWHEEL_DATA_DIR reused, a broker replaced) is dropped before anything
of it is read, and restored from the topics. Within it, which partitions' local copies hold
committed writes only (`CleanMarks`)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

__all__ = ["CleanMarks", "keep_for_cluster"]

logger = logging.getLogger(__name__)

_MARK = "cluster-id"


def keep_for_cluster(data_dir: Path, cluster_id: str, type_names: Iterable[str]) -> list[Path]:
    """Drops the types' local state when it was written against another cluster than
    `cluster_id`, and marks the directory as this cluster's; the directories dropped.

    A directory without a mark (first run, or made by an older version) is kept: the
    restores still drop a copy ahead of its topic's end."""
    if not cluster_id.strip():
        raise ValueError("a cluster id must not be empty")
    data_dir.mkdir(parents=True, exist_ok=True)
    mark = data_dir / _MARK
    before = mark.read_text().strip() if mark.exists() else None
    dropped: list[Path] = []
    if before is not None and before != cluster_id:
        for name in type_names:
            directory = data_dir / name
            if directory.exists():
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


class CleanMarks:
    """Which partitions' local copies hold committed writes only (files beside the store).

    A mark is removed when the node takes a partition and written back only after its last
    transaction committed when it lets the partition go; a partition without a mark is
    restored from the changelog alone.
    """

    def __init__(self, directory: Path) -> None:
        self._dir = directory

    def _path(self, partition: int) -> Path:
        return self._dir / f"clean-p{partition}"

    def take(self, partition: int) -> bool:
        """Whether the local copy was clean; it is not from now on."""
        path = self._path(partition)
        clean = path.exists()
        path.unlink(missing_ok=True)
        return clean

    def mark(self, partition: int) -> None:
        self._path(partition).touch()

    def lost(self, partition: int) -> tuple[int | None, str] | None:
        """Where the partition's changelog ended (None: not known) and why it lost rows its
        copy had applied, as a take of this node found it (`note_lost`); None: no take did,
        or the log was replayed since (`clear_lost`)."""
        path = self._lost(partition)
        if not path.exists():
            return None
        noted, _, why = path.read_text().partition("\n")
        return (int(noted) if noted.isdigit() else None), why or noted

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
