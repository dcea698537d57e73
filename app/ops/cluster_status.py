"""The cluster's status on Kafka: what every node of the group owns and how it is (#22).

Each node publishes, every `TICKWHEEL_STATUS_INTERVAL_MS` and whenever the partitions it
owns change, one record keyed by its node id to each of its contexts' compacted topic
`<context>.nodes` (one partition): a `NodeReport`, its web address when it has one, the
time, and per type and partition it owns the state (running, stalled, restoring, failed),
the PENDING, FIRING and PARKED counts, the oldest overdue and next due times; and a few of
its parked timers and of its upcoming fires. A clean stop writes its tombstone.

Every node reads those topics whole (from their start, then follows them; no group, no
commit), so that any node's operator page shows every partition of the group: its owner
by the newest report that claims it, stale once that report is older than
`STALE_INTERVALS` of its node's interval, unowned when no report claims it. A report older
than `FORGET_MS` is shown no more, and one older than `PURGE_MS` (its node died without its
tombstone) is tombstoned by the live nodes, so that the topic holds the nodes heard of in
the last day, not every node id that ever ran. A record that
is not a report of its key (another producer's, a broken one) is skipped and counted
(`tickwheel_cluster_status_bad_records_total`); it never stops the reading.

No node talks to another over HTTP: the status travels through Kafka, as the operators'
retry and skip do (`app.timers.operator`), and a search of an owner whose partition lives
elsewhere reads that partition of the timer table's changelog (`changelog_timers`, carried
out by `app.ops.changelog_search`). A running node's is made by `for_node`
(`app.ops.status_for_node`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Final

from app.errors import KafkaUnavailable
from app.kafka.ports import Clients, Follower, Publisher
from app.kafka.records import Record, refused
from app.ops.changelog_search import (
    CHANGELOG_READS,
    CHANGELOG_WAIT_S,
    ChangelogBusy,
    search_changelog,
)
from app.ops.letters import Letter, recent_letters
from app.ops.node_report import (
    NodeReport,
    StatusSource,
    collect_report,
    encode_report,
    fit_report,
)
from app.ops.status_view import FORGET_MS, MAX_HELD_KEYS, PURGE_MS, StatusView
from app.protocol.topics import ContextTopics, parse_aggregate_type
from app.task_ends import cancelled_here, how_ended
from tables import AggregateRef
from tables.owner_pick import OwnerTimers

__all__ = [
    "FORGET_MS",
    "MAX_HELD_KEYS",
    "PURGE_BATCH",
    "PURGE_MS",
    "ChangelogBusy",
    "ClusterStatus",
    "StatusView",
]

logger = logging.getLogger(__name__)

_SEND_TIMEOUT_S: Final = 10.0

PURGE_BATCH: Final = 100
"""Tombstones of silent nodes' keys a publish writes at most (the rest at the next ones): a
topic holding thousands of dead node ids does not hold up the node's own report."""

PUBLISH_SCAN: Final = 1_000
"""Due-index entries a report reads per partition for its oldest overdue and next due
times (they are at the index's start; the counts are the store's own, kept with each
write): a report every few seconds costs little however large the partition."""


# --- on Kafka ----------------------------------------------------------------------------


@dataclass
class _Context:
    topic: str
    follower: Follower


class ClusterStatus:
    """Publishes this node's reports and follows the group's, on each context's topic.

    `start()` reads the topics to their ends and publishes a first report; `run()` then
    publishes and follows until cancelled (it ends only on a bug: its owner stops the
    node); `stop()` writes this node's tombstones. A write or read the broker does not
    take is logged and tried again at the next interval: the page shows the node stale
    meanwhile.
    """

    def __init__(
        self,
        clients: Clients,
        producer: Publisher,
        node: StatusSource,
        node_id: str,
        *,
        web: str | None = None,
        interval_ms: int = 3000,
        lateness: Callable[[], float | None] | None = None,
        on_bad: Callable[[], None] | None = None,
        on_report_error: Callable[[], None] | None = None,
    ) -> None:
        self._clients = clients
        self._producer = producer
        self._node = node
        self.node_id = node_id
        self._web = web
        self.interval_ms = interval_ms
        self._lateness = lateness or (lambda: None)
        settings = node.settings
        self.view = StatusView(settings.group_id, settings.partitions, node.clock.now)
        self.view.on_bad = on_bad
        contexts = sorted({parse_aggregate_type(n).context for n in node.types})
        self._contexts = {
            ctx: _Context(ContextTopics(ctx).nodes, clients.follower(ContextTopics(ctx).nodes))
            for ctx in contexts
        }
        self._mine: frozenset[int] = frozenset()
        self.published = 0
        self._changelog_reads = asyncio.Semaphore(CHANGELOG_READS)
        self.changelog_wait_s = CHANGELOG_WAIT_S
        self._failing = False
        self.report_errors = 0
        self._on_report_error = on_report_error

    @property
    def topics(self) -> list[str]:
        return [c.topic for c in self._contexts.values()]

    async def start(self) -> None:
        """Reads every context's topic to its end (its follower placed first: a record
        written meanwhile is read by one or both, and applying it twice changes nothing),
        then publishes this node's first report."""
        for c in self._contexts.values():
            await c.follower.start()
            await c.follower.add(0)
        reader = self._clients.reader()
        await reader.start()
        try:
            for c in self._contexts.values():
                async with aclosing(reader.read(c.topic, 0, 0)) as batches:
                    async for batch in batches:
                        await _apply(self.view, batch)
        finally:
            await reader.stop()
        await self.publish()

    async def publish(self) -> bool:
        """Writes this node's report to each context's topic; whether the broker took all."""
        health = self._node.health()
        self._mine = frozenset(health["owned"]) | frozenset(health["restoring"])
        took = True
        for ctx, c in self._contexts.items():
            try:
                report = await collect_report(
                    self._node,
                    self.node_id,
                    scan_limit=PUBLISH_SCAN,
                    web=self._web,
                    interval_ms=self.interval_ms,
                    lateness_p99_ms=self._lateness(),
                    contexts={ctx},
                )
                report = fit_report(report)  # under what every reader reads
            except Exception as exc:
                # A report that cannot be made is a bug to see, never the node's end: the
                # node goes stale on the pages until the next one is made.
                self.report_errors += 1
                if self._on_report_error is not None:
                    self._on_report_error()
                logger.error(
                    "the node's status report for %s failed: %r", c.topic, exc, exc_info=exc
                )
                took = False
                continue
            key = self.node_id.encode()
            try:
                offset = await asyncio.wait_for(
                    self._producer.send(c.topic, key, encode_report(report), 0), _SEND_TIMEOUT_S
                )
            except (KafkaUnavailable, TimeoutError) as exc:
                # Once per run of failures: the broker watch already says it is away.
                log = logger.debug if self._failing else logger.warning
                log("publishing the node's status to %s failed: %r", c.topic, exc)
                took = False
                continue
            self.view.apply(c.topic, key, offset, encode_report(report))
        if took and self._failing:
            logger.info("publishing the node's status again")
        self._failing = not took
        self.published += took
        if took:
            await self.purge()
        return took

    async def purge(self) -> int:
        """Writes the tombstones of up to `PURGE_BATCH` keys silent past `PURGE_MS`
        (`StatusView.silent`); how many. Every live node does, at each publish: a dead
        node's record goes a day after its last report, and two tombstones of a key (two
        nodes purging at once) do no harm."""
        silent = self.view.silent(self._node.clock.now())[:PURGE_BATCH]
        if not silent:
            return 0
        try:
            offsets = await asyncio.wait_for(
                self._producer.send_many([(t, 0, k, None) for t, k in silent]), _SEND_TIMEOUT_S
            )
        except (KafkaUnavailable, TimeoutError) as exc:
            logger.debug("the silent nodes' tombstones were not written: %r", exc)
            return 0  # tried again at the next publish
        for (topic, key), offset in zip(silent, offsets, strict=True):
            self.view.apply(topic, key, offset, None)
        logger.info(
            "tombstoned %d status record(s) of nodes silent for over %d h: %s",
            len(silent),
            PURGE_MS // 3_600_000,
            ", ".join(sorted({k.decode(errors="replace")[:100] for _, k in silent})[:10]),
        )
        return len(silent)

    def reports(self) -> list[NodeReport]:
        return self.view.reports(self._node.clock.now())

    @property
    def bad_reports(self) -> int:
        return self.view.bad

    async def run(self) -> None:
        """Publishes every interval, and soon after the node's partitions change, and
        follows the topics, until cancelled. Any end of one of them (returned, failed, or
        cancelled while `run` is not: leaked out of a client call) ends `run` with a
        `RuntimeError` naming it (a `TaskGroup` passes over a child ended cancelled)."""
        children = [asyncio.create_task(self._publishing(), name="publishing the node's status")]
        children += [
            asyncio.create_task(self._follow(c), name=f"following {c.topic}")
            for c in self._contexts.values()
        ]
        try:
            done, _ = await asyncio.wait(children, return_when=asyncio.FIRST_COMPLETED)
            ended = next(t for t in children if t in done)
            why = None if ended.cancelled() else ended.exception()
            raise RuntimeError(f"{ended.get_name()} {how_ended(ended)}") from why
        finally:
            for t in children:
                t.cancel()
            await asyncio.gather(*children, return_exceptions=True)

    async def _publishing(self) -> None:
        waited = 0.0
        while True:
            await asyncio.sleep(0.2)
            waited += 0.2
            health = self._node.health()
            now_mine = frozenset(health["owned"]) | frozenset(health["restoring"])
            if waited * 1000 >= self.interval_ms or now_mine != self._mine:
                await self.publish()
                waited = 0.0

    async def _follow(self, c: _Context) -> None:
        failing = False
        while True:
            try:
                records = await c.follower.poll()
            except KafkaUnavailable as exc:
                if refused(exc):
                    raise  # an ACL of the node's own topic: no retry passes it
                log = logger.debug if failing else logger.warning
                log("following %s failed, trying again: %s", c.topic, exc)
                failing = True
                await asyncio.sleep(1)
                continue
            failing = False
            await _apply(self.view, records)

    async def stop(self) -> None:
        """Writes this node's tombstones (its partitions go to their next owners' reports),
        then stops following; raises nothing but its own task's cancellation (one leaked
        out of a client call is logged like an error)."""
        for c in self._contexts.values():
            try:
                await asyncio.wait_for(
                    self._producer.send(c.topic, self.node_id.encode(), None, 0), _SEND_TIMEOUT_S
                )
            except (Exception, asyncio.CancelledError) as exc:
                _raise_if_cancelled(exc)
                logger.warning("the node's tombstone in %s was not written: %r", c.topic, exc)
            try:
                await c.follower.stop()
            except (Exception, asyncio.CancelledError) as exc:
                _raise_if_cancelled(exc)
                logger.warning("following %s did not stop cleanly: %r", c.topic, exc)

    async def recent_letters(self, limit: int) -> list[tuple[str, Letter]]:
        """The last `limit` records' dead letters of each context, newest first."""
        found: list[tuple[str, Letter]] = []
        reader = self._clients.reader()
        await reader.start()
        try:
            for ctx in self._contexts:
                topic = ContextTopics(ctx).dead_letters
                found += [(topic, x) for x in (await recent_letters(reader, topic, limit)).letters]
        finally:
            await reader.stop()
        return sorted(found, key=lambda tx: -tx[1].timestamp)

    async def changelog_timers(
        self, type_name: str, partition: int, owner: AggregateRef, limit: int
    ) -> OwnerTimers:
        """Up to `limit` of `owner`'s timers (live ones first) and how many it keeps, as
        the changelog of its partition has them, for a search of an owner on another node:
        one such read at a time (`ChangelogBusy` after `changelog_wait_s`)."""
        return await search_changelog(
            self._clients,
            self._changelog_reads,
            self.changelog_wait_s,
            type_name,
            partition,
            owner,
            limit,
        )


async def _apply(view: StatusView, records: Iterable[Record]) -> None:
    """Each of `records` into `view`, the loop let go after each (a report's decode)."""
    for r in records:
        view.apply(r.topic, r.key, r.offset, r.value)
        await asyncio.sleep(0)


def _raise_if_cancelled(exc: BaseException) -> None:
    """Re-raises `exc` when it is the cancellation of the running task itself."""
    if isinstance(exc, asyncio.CancelledError) and cancelled_here():
        raise exc
