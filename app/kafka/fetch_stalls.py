"""A partition whose fetches the broker answers, again and again, with an error aiokafka
0.14 has no branch for (CORRUPT_MESSAGE: a batch header corrupt on the broker's disk;
UNKNOWN_SERVER_ERROR; KAFKA_STORAGE_ERROR): its fetcher logs "Unexpected error while
fetching data" (a WARNING naming no partition) and fetches the same position again, many
times a second, for ever; `getmany` never raises it. A poll then hands nothing of that
partition out while the others go on: no poll fails (`POLL_FAILING_S` never counts), no
refusal is seen (`InLogRefusals` counts out-of-range ones), and the node says it is ready.

`FetchStalls` watches, as the polls go (`app.kafka.fetch_watch` looks once a second at
most), every partition read (assigned and not paused) for a sign of progress: a record of
it handed out or fetched and waiting in the client to be (aiokafka fetches a partition
again only once its last batch is all handed out: one behind a backlog waits so), a move
(a seek, an assignment), or a fetch of it answered without an error (aiokafka's
`last_poll_timestamp`, set by every such response, an empty one too: a partition read to
its end, or held at the last stable offset by another producer's open transaction, is
answered each time). None for `STALL_S` (`POLL_FAILING_S`): it is due for a look at the
broker, its position against its end as read_committed sees it (the last stable offset,
which a first fetch that failed never told). Behind it: `FetchStalled`, which stops the
node loudly as `FetchRefused` does (`app.node.polling`, `app.timers.sender.FollowerPolls`).
At it (nothing to read), moved or answered while the broker was asked, or either not known
(the position being reset, the broker not answering): the watch starts over. The normal
path asks the broker nothing. No I/O; may import `app.errors`, the port's bound and
`FetchRefused`."""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass
from typing import Final

from app.kafka.in_log_refusals import FetchRefused
from app.kafka.ports import POLL_FAILING_S

__all__ = ["STALL_S", "FetchStalled", "FetchStalls", "Key", "Still"]

STALL_S: Final = POLL_FAILING_S
"""How long a partition read may go with no fetch of it answered, nothing of it handed
out and nothing moving it, before its position is compared with its end: as long as polls
failing for good may (a broker or a leader in flux answers well within it)."""

Key = tuple[str, int]
"""(topic, partition)."""


class FetchStalled(FetchRefused):
    """A partition's fetches unanswered past `STALL_S` while records wait to be read: no
    poll again reads it, and the node must not go on as if it did."""


@dataclass(frozen=True, slots=True)
class Still:
    """A partition's progress as last seen (`marker`: its moves and its last fetch
    answered), unchanged since `since` (clock seconds), nothing of it handed out."""

    marker: Hashable
    since: float


class FetchStalls:
    """Per partition read, since when it made no progress. One thread's."""

    def __init__(self, stall_s: float = STALL_S) -> None:
        self.stall_s = stall_s
        self._of: dict[Key, Still] = {}

    def seen(
        self, markers: Mapping[Key, Hashable], handed: Collection[Key], now: float
    ) -> list[Key]:
        """At a look: `markers`, each partition read (assigned, not paused) and the sign
        of its progress (its moves, its last fetch answered: a value that never comes back,
        so that a change between two looks is seen at the second), `handed`, those some of
        whose records were handed out since the last look or wait fetched in the client.
        The others are forgotten (a paused partition is
        not fetched: its time does not count). Those with no progress for `stall_s`: due
        for a look (`looked`)."""
        for key in [k for k in self._of if k not in markers]:
            del self._of[key]
        due: list[Key] = []
        for key, marker in markers.items():
            last = self._of.get(key)
            if (
                last is None
                or key in handed
                or last.marker != marker
                or now < last.since  # a clock gone back: never stalled by it
            ):
                self._of[key] = Still(marker, now)
            elif now - last.since >= self.stall_s:
                due.append(key)
        return due

    def looked(
        self, key: Key, marker: Hashable, position: int | None, end: int | None, now: float
    ) -> FetchStalled | None:
        """A due partition's `marker` once looked at (the look awaits the broker: a seek,
        a fetch answered meanwhile is progress), its `position` and its `end`
        (read_committed: the last stable offset) as the broker says them now, None where
        not known: the error to raise when records wait behind its position and it made no
        progress; else (moved, read to its end, or not known) its watch starts over at
        `now`."""
        last = self._of.get(key)
        if last is None:
            return None
        if last.marker != marker or position is None or end is None or position >= end:
            self._of[key] = Still(marker, now)
            return None
        topic, partition = key
        return FetchStalled(
            f"{topic}[{partition}]: no fetch of it was answered for {now - last.since:.0f} s "
            f"while records wait (its position {position}, its end {end}): the broker answers "
            "them with an error the client only logs (aiokafka's WARNING \"Unexpected error "
            'while fetching data: ..."; CorruptRecordException: a batch corrupt on the '
            "broker's disk; KafkaStorageError; UnknownError), and the partition's records "
            "are read no further here. Look at the log of the partition's leader "
            "(kafka-topics --describe names it) for that partition and offset"
        )
