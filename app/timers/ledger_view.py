"""The failure ledger's records and the ledger as read (`LedgerView`), for
`app.timers.ledger` (which writes and follows the topic) and the CLI (`read_ledger`).

One record per `(subscription, target)`: its key the JSON of both (orjson, sorted keys),
its value the `LedgerEntry` as JSON, a tombstone once resolved. Which record of a key is
newer is told by its offset (all records of one key sit in one partition); each open
entry keeps its record's timestamp too, so that a page can show the newest first.

Every node reads the whole topic at each start and holds it, whoever wrote it, so what a
record read makes it hold is bounded: a record is taken only in its key's partition (where
the writers put it: `partition_of` the key over the context's count), an entry names at
most what a writer names (`MAX_NAMED`, `MAX_NAMED_BYTES`; cut to them and `truncated`
past them), and the view holds `MAX_HELD_PAIRS` pairs and `MAX_HELD_NAMES_BYTES` of names
at most. This node's own writes are always taken (a writer's bounds hold for them).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import defaultdict
from contextlib import aclosing
from typing import Final, NamedTuple

import orjson
from pydantic import ValidationError

from app.errors import BadRecord, KafkaUnavailable
from app.kafka import Clients, Record
from app.kafka.cluster import require_topic
from app.log_limit import LogLimit
from app.protocol.topics import ContextTopics
from tables.ledger import LedgerEntry, first_named
from tables.partitioner import partition_of
from tables.refs import AggregateRef

__all__ = [
    "MAX_HELD_NAMES_BYTES",
    "MAX_HELD_PAIRS",
    "MAX_SUBSCRIPTION",
    "NAME_COST",
    "LedgerKey",
    "LedgerView",
    "decode_key",
    "decode_value",
    "encode_entry",
    "ledger_key",
    "read_ledger",
]

logger = logging.getLogger(__name__)

MAX_HELD_PAIRS: Final = 100_000
"""Pairs (open entries, and tombstones not read past yet) a view takes from the topic at
most, ~2 KB each for an entry naming a few timers: past it, a record of a pair not held is
passed over, counted and logged (its entry not shown, nor resolved by this node); records
of pairs held are still taken. A ledger holds one pair per parked target."""

MAX_HELD_NAMES_BYTES: Final = 64 * 1024 * 1024
"""The names of the entries a view takes from the topic, at most, each counted as its
JSON and `NAME_COST` (about what holding it takes): ~220,000 names of a usual ~230 bytes.
Past it, an entry read names those that fit (`truncated`), and the cut is logged."""

NAME_COST: Final = 64
"""What holding a name takes beside its text (the string's header, the tuple's slot)."""

MAX_SUBSCRIPTION: Final = 200
"""A key's subscription at most (the nodes write `tickwheel.timers`): a longer one is an
unreadable record, not a string held twice per entry."""


class LedgerKey(NamedTuple):
    subscription: str
    target: AggregateRef


def ledger_key(subscription: str, target: AggregateRef) -> bytes:
    """The record key of `(subscription, target)`: the same bytes for the same pair."""
    return orjson.dumps(
        {"subscription": subscription, "target": target.model_dump(mode="json")},
        option=orjson.OPT_SORT_KEYS,
    )


def encode_entry(entry: LedgerEntry) -> bytes:
    return orjson.dumps(entry.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


def decode_key(key: bytes | None) -> LedgerKey:
    """The pair a record key names; `BadRecord` for anything else."""
    if key is None:
        raise BadRecord("ledger record without a key")
    try:
        raw = orjson.loads(key)
        if not isinstance(raw, dict) or set(raw) != {"subscription", "target"}:
            raise BadRecord(f"ledger key is not {{subscription, target}}: {key[:200]!r}")
        subscription = raw["subscription"]
        if not isinstance(subscription, str) or not subscription:
            raise BadRecord(f"ledger key without a subscription: {key[:200]!r}")
        if len(subscription) > MAX_SUBSCRIPTION:
            raise BadRecord(f"ledger key's subscription over {MAX_SUBSCRIPTION}: {key[:200]!r}")
        return LedgerKey(subscription, AggregateRef.model_validate(raw["target"]))
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise BadRecord(f"unreadable ledger key {key[:200]!r}: {exc}") from exc


def decode_value(key: LedgerKey, value: bytes | None) -> LedgerEntry | None:
    """The entry a record holds, None for a tombstone; `BadRecord` if it is unreadable or
    names another pair than its key."""
    if value is None:
        return None
    try:
        entry = LedgerEntry.model_validate_json(value)
    except ValidationError as exc:
        raise BadRecord(f"unreadable ledger entry for {key.target}: {exc}") from exc
    if (entry.subscription, entry.target) != key:
        raise BadRecord(
            f"ledger entry of {entry.subscription}/{entry.target} under the key of "
            f"{key.subscription}/{key.target}"
        )
    return entry


class _Held(NamedTuple):
    partition: int
    offset: int
    entry: LedgerEntry | None
    at: int = 0
    """When its record was written (epoch ms: the record's timestamp): newest first."""
    names: int = 0
    """What its entry's names count against the view's `names_room` (`first_named`)."""


class LedgerView:
    """The ledger as read so far: per pair, the newest record by offset. No I/O.

    A tombstone is kept (as None) until the follower read past it (`read_past`), so that
    an older record read late (the read to the end and the follower overlap at start; a
    node's own write is applied before the follower reads what came before it) cannot
    bring a resolved entry back. Past it, the follower only reads newer records, so the
    view holds the open entries and the tombstones still ahead of the follower.

    `partitions`: the context's count, where the writers put each key (`partition_of`); a
    record of a key found in another partition is passed over: a copy there (another
    producer's, or partitions added to the topic) read after a tombstone in the key's own
    would bring the resolved entry back at every start, and no tombstone is ever written
    beside it. None: not checked (a view fed by hand). `max_held` and `names_room`: what it
    takes from the topic at most (`MAX_HELD_PAIRS`, `MAX_HELD_NAMES_BYTES`). `log_limit`
    bounds the lines about the records skipped, cut or passed over (by default, one a
    minute of each kind after the first).
    """

    def __init__(
        self,
        partitions: int | None = None,
        *,
        max_held: int = MAX_HELD_PAIRS,
        names_room: int = MAX_HELD_NAMES_BYTES,
        log_limit: LogLimit | None = None,
    ) -> None:
        self._partitions = partitions
        self._max_held = max_held
        self._names_room = names_room
        # What the entries held count against `names_room`, in all.
        self._names = 0
        # Records passed over as the view was full (a count for the log lines and tests).
        self.passed_over = 0
        self._held: dict[LedgerKey, _Held] = {}
        # Every node reads every bad record, again at each start (the topic is compacted,
        # not emptied): the first in full, then a count, whoever wrote them.
        self._bad_log = log_limit or LogLimit()
        # Per partition, the tombstones held, by offset (a heap: own writes come early),
        # then by when taken (a recreated topic's offsets repeat; keys do not compare).
        self._tombstones: dict[int, list[tuple[int, int, LedgerKey]]] = defaultdict(list)
        self._seq = itertools.count()
        # How many of `_held` are open entries (not tombstones): counted as they are taken,
        # so that a scrape (`open_count`) does not list a ledger of thousands each time.
        self._open = 0

    def apply(
        self, key: LedgerKey, partition: int, offset: int, entry: LedgerEntry | None, at: int = 0
    ) -> bool:
        """Takes a record of `key` (written at `at`, epoch ms) unless one as new or newer
        is held; whether it did."""
        held = self._held.get(key)
        # Offsets compare within one partition; a key's records are all in one (a record
        # read elsewhere is passed over by `apply_record`), save in a view fed by hand or
        # a topic recreated with another count.
        if _newer(held, partition, offset):
            return False
        names = 0 if entry is None else _names_cost(entry.timers)
        self._held[key] = _Held(partition, offset, entry, at, names)
        self._names += names - (0 if held is None else held.names)
        self._open += (entry is not None) - (held is not None and held.entry is not None)
        if entry is None:
            heapq.heappush(self._tombstones[partition], (offset, next(self._seq), key))
        return True

    def read_past(self, partition: int, offset: int) -> None:
        """The follower read `partition` up to `offset`: what it reads next is newer than
        the tombstones up to there, which are forgotten."""
        heap = self._tombstones.get(partition)
        while heap and heap[0][0] <= offset:
            offset_at, _, key = heapq.heappop(heap)
            held = self._held.get(key)
            # Still that tombstone (not a newer record of the key): its `at` aside.
            if held is not None and held.entry is None and held[:2] == (partition, offset_at):
                del self._held[key]

    def __len__(self) -> int:
        """How many pairs it holds (open entries and tombstones)."""
        return len(self._held)

    @property
    def open_count(self) -> int:
        """How many open entries it holds (`entries()` lists them)."""
        return self._open

    def apply_record(self, record: Record) -> bool:
        """Takes a record read from the topic, within the view's bounds (see the class);
        an unreadable one is logged and skipped."""
        try:
            key = decode_key(record.key)
            entry = decode_value(key, record.value)
        except BadRecord as exc:
            # Every node reads the whole ledger: a dead letter from each would be noise.
            self._log(logging.ERROR, "skipping", record, str(exc))
            return False
        if self._partitions is not None and record.key is not None:  # decoded: not None
            # By the key's own bytes, as the writer places it (`KafkaFailureLedger._write`).
            own = partition_of(record.key.decode(), self._partitions)
            if own != record.partition:
                why = f"{key.subscription}/{key.target} belongs in partition {own}"
                self._log(logging.WARNING, "passing over", record, why)
                return False
        held = self._held.get(key)
        if _newer(held, record.partition, record.offset):
            return False
        if held is None and len(self._held) >= self._max_held:
            self.passed_over += 1
            why = f"{self._max_held} pairs held already ({self.passed_over} passed over)"
            self._log(logging.WARNING, "passing over", record, why, kind="full")
            return False
        if entry is not None:
            entry = self._bounded(entry, held, record)
        return self.apply(key, record.partition, record.offset, entry, record.timestamp)

    def _bounded(self, entry: LedgerEntry, held: _Held | None, record: Record) -> LedgerEntry:
        """`entry` naming what a writer names at most, and what the room left takes."""
        room = self._names_room - self._names + (0 if held is None else held.names)
        names, cut = first_named(entry.timers, max(room, 0), NAME_COST)
        if not cut:
            return entry
        # Past a writer's bounds it is another producer's; past the room, the view is full.
        why = f"naming {len(names)} of its {len(entry.timers)} timer(s)"
        self._log(logging.WARNING, "cutting", record, why)
        return entry.model_copy(update={"timers": names, "truncated": True})

    def _log(
        self, level: int, what: str, record: Record, why: str, kind: str | None = None
    ) -> None:
        # Each kind at its own rate: a flood of one does not hide the first of another.
        if (more := self._bad_log.check(kind or what)) is not None:
            logger.log(
                level,
                "%s %s[%d]@%d: %s%s",
                what,
                record.topic,
                record.partition,
                record.offset,
                why,
                more,
            )

    def get(self, key: LedgerKey) -> LedgerEntry | None:
        held = self._held.get(key)
        return None if held is None else held.entry

    def entries(self) -> list[LedgerEntry]:
        """The open entries, by subscription and target."""
        open_ = [h.entry for h in self._held.values() if h.entry is not None]
        return sorted(open_, key=lambda e: (e.subscription, str(e.target)))

    def dated(self, limit: int | None = None) -> list[tuple[int, LedgerEntry]]:
        """The open entries with when their records were written (epoch ms: the records'
        timestamps, as the offsets of two partitions do not compare), the newest first,
        ties by subscription and target; the first `limit` of them only, when given."""
        dated = [(h.at, h.entry) for h in self._held.values() if h.entry is not None]
        if limit is None or limit >= len(dated):
            return sorted(dated, key=_newest_first)
        if limit <= 0:
            return []
        # A page shows the newest few of a ledger of up to every parked target: of those
        # dated at or after the `limit`-th newest (ties included), the first `limit` in
        # that order (a stable selection: as the whole sorted), not all sorted.
        since = heapq.nlargest(limit, (at for at, _ in dated))[-1]
        return heapq.nsmallest(limit, (d for d in dated if d[0] >= since), key=_newest_first)


def _newest_first(dated: tuple[int, LedgerEntry]) -> tuple[int, str, str]:
    at, entry = dated
    return -at, entry.subscription, str(entry.target)


def _newer(held: _Held | None, partition: int, offset: int) -> bool:
    """Whether `held` is as new as a record at `offset` of `partition`, or newer."""
    return held is not None and held.partition == partition and held.offset >= offset


def _names_cost(names: tuple[str, ...]) -> int:
    """What `names` count against a view's room: as `first_named` counts them."""
    return sum(len(orjson.dumps(name)) + 1 + NAME_COST for name in names)


async def read_ledger(
    clients: Clients, context: str, partitions: int | None = None
) -> list[LedgerEntry]:
    """The open entries of `context`'s ledger as the topic has them now (for the CLI).

    Creates no topic: `MissingTopic` when no worker of the context has run on this
    broker. `partitions`, when given, is the count the topic must have.
    """
    topic = ContextTopics(context).ledger
    why = f"no worker of context {context} has run there"
    have = await require_topic(clients.admin(), topic, why)
    if partitions is not None and have != partitions:
        raise KafkaUnavailable(f"topic {topic} has {have} partitions, expected {partitions}")
    # The topic's count is the context's: a node refuses to start on one of another count.
    view = LedgerView(have)
    async with clients.reader() as reader:
        for p in range(have):
            async with aclosing(reader.read(topic, p, 0)) as batches:
                async for batch in batches:
                    for record in batch:
                        view.apply_record(record)
    return view.entries()
