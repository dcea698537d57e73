"""The failure ledger's records and the ledger as read (`LedgerView`), for
`app.timers.ledger` (which writes and follows the topic) and the CLI (`read_ledger`).

One record per `(subscription, target)`: its key the JSON of both (orjson, sorted keys),
its value the `LedgerEntry` as JSON, a tombstone once resolved. Which record of a key is
newer is told by its offset (all records of one key sit in one partition); each open
entry keeps its record's timestamp too, so that a page can show the newest first.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import defaultdict
from contextlib import aclosing
from typing import NamedTuple

import orjson
from pydantic import ValidationError

from app.errors import BadRecord, KafkaUnavailable
from app.kafka import Clients, Record
from app.kafka.cluster import require_topic
from app.log_limit import LogLimit
from app.protocol.topics import ContextTopics
from tables.ledger import LedgerEntry
from tables.refs import AggregateRef

__all__ = [
    "LedgerKey",
    "LedgerView",
    "decode_key",
    "decode_value",
    "encode_entry",
    "ledger_key",
    "read_ledger",
]

logger = logging.getLogger(__name__)


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


class LedgerView:
    """The ledger as read so far: per pair, the newest record by offset. No I/O.

    A tombstone is kept (as None) until the follower read past it (`read_past`), so that
    an older record read late (the read to the end and the follower overlap at start; a
    node's own write is applied before the follower reads what came before it) cannot
    bring a resolved entry back. Past it, the follower only reads newer records, so the
    view holds the open entries and the tombstones still ahead of the follower.

    `log_limit` bounds the lines about unreadable records (by default, one a minute after
    the first).
    """

    def __init__(self, *, log_limit: LogLimit | None = None) -> None:
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
        # Offsets compare within one partition; a key found in another (the topic was
        # recreated, or a foreign writer picked the partition) is taken as it comes.
        if held is not None and held.partition == partition and held.offset >= offset:
            return False
        self._held[key] = _Held(partition, offset, entry, at)
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
        """Takes a record read from the topic; an unreadable one is logged and skipped."""
        try:
            key = decode_key(record.key)
            entry = decode_value(key, record.value)
        except BadRecord as exc:
            # Every node reads the whole ledger: a dead letter from each would be noise.
            if (more := self._bad_log.check()) is not None:
                logger.error(
                    "skipping %s[%d]@%d: %s%s",
                    record.topic,
                    record.partition,
                    record.offset,
                    exc,
                    more,
                )
            return False
        return self.apply(key, record.partition, record.offset, entry, record.timestamp)

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


async def read_ledger(
    clients: Clients, context: str, partitions: int | None = None
) -> list[LedgerEntry]:
    """The open entries of `context`'s ledger as the topic has them now (for the CLI).

    Creates no topic: `MissingTopic` when no worker of the context has run on this
    broker. `partitions`, when given, is the count the topic must have.
    """
    view = LedgerView()
    topic = ContextTopics(context).ledger
    why = f"no worker of context {context} has run there"
    have = await require_topic(clients.admin(), topic, why)
    if partitions is not None and have != partitions:
        raise KafkaUnavailable(f"topic {topic} has {have} partitions, expected {partitions}")
    async with clients.reader() as reader:
        for p in range(have):
            async with aclosing(reader.read(topic, p, 0)) as batches:
                async for batch in batches:
                    for record in batch:
                        view.apply_record(record)
    return view.entries()
