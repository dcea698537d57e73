"""The node's compacted topics' policy, and its topics' replication, read again while it
runs. The start refuses a
table (a timer changelog, a failure ledger, the nodes' statuses) whose `cleanup.policy`
or retention deletes rows (`app.kafka.topic_policy`); one changed on a running cluster
(`kafka-configs --alter`) went unseen until the next start, and a restore meanwhile (a
partition moved, a lost disk) silently lost what the retention had deleted.

The start also warns about each topic replicated less safely than configured
(`app.kafka.replication`), said in `/healthz` as `topics`; one made so while it ran (its
`min.insync.replicas` lowered, a reassignment to fewer replicas) went unsaid, and one fixed
stayed said until the next start.

Every `interval` s (`CHECK_INTERVAL_S`) a `TopicPolicyWatch` reads their configs again,
one DescribeConfigs of every topic of the node, then their replicas (`Admin.replicas`), and
judges them as the start does:

- a table that deletes rows is `refused` with the start's own message: the node stops on
  it (`Node.fail`), as it stops on the other faults no retry passes (an ACL taken away
  mid-run), and as its next start would refuse it anyway. Kept running, not ready, it
  would only hold its partitions from the nodes of the group that could not take them
  either;
- an aggregate's log that drops records is warned about, as at the start, once each time
  what is wrong with it changes (not every check; the first check says again what the
  start said);
- the replication's findings (`findings`, what `/healthz` says; the start's to begin
  with) are those of the topics read: a finding that appears is a WARNING, one that
  clears an INFO, once each (not every check); each topic's count is told to `counted`
  (the `tickwheel_topic_replication_findings` gauge). A topic whose replicas or configs
  were not read keeps its findings;
- each table's `delete.retention.ms` read is kept (`tombstones_kept`, the start's to
  begin with): how long a clean local copy of a timer changelog is read on from
  (`app.node.copy_age`), a change on the topic followed within a minute;
- the partition count of every topic of the node (`PartitionCounts`, read after the
  configs), those the group assigns and the others alike, is compared with the count the
  node reads and writes it by (the start refused another): partitions added while it runs
  are a WARNING once for the topic, and said in `findings` until the count is the node's
  again. A topic the group assigns stops the node too once the group gives it a partition
  past the count (`app.node.partition_tasks`); for the others (the context's results,
  failure ledger, nodes and dead letters) the WARNING is all that tells before the next
  start refuses the topic; a topic of the node's missing at two checks in a row (deleted
  while it ran) stops the node (`Node.fail`): a partition writing to it would fail its
  commit at every retake while the rest went on, and the next start makes it again;
- a read that fails, whole (the broker away, the client refused) or for a topic (no
  DescribeConfigs ACL on it), is one WARNING for the check, and read again at the next:
  never a reason to stop the node, nor to clear a finding. A failure of any other kind, a
  cancellation leaking out of the client library included, is a failed read too: the
  watch never ends but by its own cancellation (its owner supervises it all the same).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from app.kafka.ports import Admin
from app.kafka.records import Replication, TopicConfigs, TopicSpec
from app.kafka.replication import MIN_INSYNC, replication_findings, warn_replication
from app.kafka.topic_policy import POLICY_CONFIGS, policy_findings
from app.node.copy_age import DELETE_RETENTION, tombstones_kept
from app.node.metrics import NodeMetrics
from app.task_ends import cancelled_here

__all__ = [
    "CHECK_INTERVAL_S",
    "PartitionCounts",
    "ReplicationRead",
    "TopicPolicyWatch",
    "count_finding",
    "finding_changes",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

CHECK_INTERVAL_S: Final = 60.0
"""How often a running node reads its tables' policy again: one small request a minute; a
broker deletes by retention every 5 minutes (`log.retention.check.interval.ms`), so a
change is often seen before it deleted anything."""

ReadConfigs = Callable[[Sequence[str], Sequence[str]], Awaitable[TopicConfigs]]
"""(topics, config names) → what the cluster tells of them (`Admin.topic_configs`)."""
ReadReplicas = Callable[[Sequence[str]], Awaitable[tuple[int, dict[str, int]]]]
"""topics → (the cluster's live brokers, each topic's replicas) (`Admin.replicas`)."""


@dataclass(frozen=True, slots=True)
class ReplicationRead:
    """Whose replication a `TopicPolicyWatch` judges again, and how: `read` the replicas of
    `topics`, compared with `asked` (`TICKWHEEL_REPLICATION_FACTOR`); `counted(topic, n)`
    told each topic's findings (0: none) whenever they are set."""

    read: ReadReplicas
    topics: Sequence[str]
    asked: Replication
    counted: Callable[[str, int], None] = lambda topic, n: None

    @classmethod
    def of(
        cls, admin: Admin, specs: Iterable[TopicSpec], asked: Replication, metrics: NodeMetrics
    ) -> ReplicationRead:
        """A node's: every topic of it, read through its admin, counted in its metrics."""
        gauge = metrics.replication_findings
        return cls(
            admin.replicas, [s.name for s in specs], asked, lambda t, n: gauge.labels(t).set(n)
        )


@dataclass(frozen=True, slots=True)
class PartitionCounts:
    """Whose partition counts a `TopicPolicyWatch` reads again: `read` (`Admin.existing_topics`)
    those of the topics of `asked`, each with the count the node reads and writes it by."""

    read: Callable[[Iterable[str]], Awaitable[dict[str, int]]]
    asked: Mapping[str, int]
    listed: Callable[[], Awaitable[set[str]]] | None = None
    """The cluster's topics (`Admin.topic_names`): one of `asked` not among them was
    deleted (a topic described with an error, its leader away, is not)."""


def count_finding(topic: str, have: int, asked: int) -> str:
    """What `findings` says of a topic of `have` partitions the node uses `asked` of."""
    return (
        f"topic {topic} has {have} partitions, the node's {asked}: partitions were added to "
        f"it while the node ran. The node reads and writes partitions 0..{asked - 1} only, "
        "and its next start refuses the topic; a topic's partition count never changes "
        "(see docs/operations.md, Scaling)"
    )


def finding_changes(
    before: Mapping[str, Sequence[str]], now: Mapping[str, Sequence[str]], judged: Iterable[str]
) -> tuple[dict[str, list[str]], list[str]]:
    """Of the topics `judged` (read again), the findings `now` has that `before` had not
    (by topic) and those `before` had that are gone."""
    appeared = {
        t: new
        for t, faults in now.items()
        if (new := [f for f in faults if f not in before.get(t, ())])
    }
    cleared = [f for t in judged for f in before.get(t, ()) if f not in now.get(t, ())]
    return appeared, cleared


class TopicPolicyWatch:
    """Reads the policy of `tables` (compacted, deleting nothing) and `logs` (keeping every
    record), the replication of `replication`'s topics and the partition counts of
    `counts`' (every topic of the node), every `interval` s; `refused` is told why a table
    deletes rows, at each check that finds it so."""

    def __init__(
        self,
        read: ReadConfigs,
        *,
        tables: Sequence[str],
        logs: Sequence[str] = (),
        refused: Callable[[str], None],
        replication: ReplicationRead | None = None,
        counts: PartitionCounts | None = None,
        interval: float = CHECK_INTERVAL_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._read = read
        self.tables, self.logs = list(tables), list(logs)
        self._refused = refused
        self.replication = replication
        self.counts = counts
        # What is wrong with each topic's replication; each topic's partition count found
        # not the node's (`findings` says both).
        self._replicated: dict[str, list[str]] = {}
        self._miscounted: dict[str, str] = {}
        # The topics found missing at the last check (`_check_counts`).
        self._missing: set[str] = set()
        self.interval = interval
        self.sleep = sleep
        """How it waits between checks (a test's fake clock)."""
        # Each log's warning last given: said again only once it changes.
        self._warned: dict[str, str] = {}
        self.tombstones_kept: dict[str, int] = {}
        """Each table's `delete.retention.ms` as last read (the start's, then each
        check's); a table not read (yet) is not in it."""

    @property
    def findings(self) -> dict[str, list[str]]:
        """What is wrong with each topic (`/healthz`'s `topics`): its replication, and a
        partition count not the node's."""
        found = {t: list(faults) for t, faults in self._replicated.items()}
        for topic, finding in self._miscounted.items():
            found.setdefault(topic, []).append(finding)
        return found

    def found_at_start(self, findings: Mapping[str, Sequence[str]]) -> None:
        """The start's findings (`check_replication`): said already, the checks say what
        changes of them."""
        self._replicated = {t: list(faults) for t, faults in findings.items() if faults}
        self._count()

    def kept_read(self, configs: TopicConfigs) -> None:
        """Keeps the tables' `delete.retention.ms` that `configs` read (one read without it
        forgets the value: not known, assumed short)."""
        for table in self.tables:
            if table in configs.read:
                kept = tombstones_kept(configs.read[table])
                if kept is None:
                    self.tombstones_kept.pop(table, None)
                else:
                    self.tombstones_kept[table] = kept

    async def run(self) -> None:
        """Checks every `interval` s (the start checked just before) until cancelled."""
        while True:
            await self.sleep(self.interval)
            await self.check()

    async def check(self) -> str | None:
        """Reads the configs (and replicas) once and acts on them; the refusal found (None:
        none)."""
        r = self.replication
        asked = list(dict.fromkeys([*self.tables, *self.logs, *(r.topics if r else ())]))
        if not asked:
            return None
        names = (*POLICY_CONFIGS, DELETE_RETENTION, *((MIN_INSYNC,) if r is not None else ()))
        configs = await self._reading("configs", lambda: self._read(asked, names))
        if configs is None:
            # The counts all the same: a topic deleted may fail the configs' read whole.
            gone = None if self.counts is None else await self._check_counts(self.counts)
            if gone is not None:
                self._refused(gone)
            return gone
        self.kept_read(configs)
        if configs.unread:
            logger.warning(
                "cannot read the configs of %s (read again in %g s): %s",
                ", ".join(configs.unread),
                self.interval,
                "; ".join(sorted(set(configs.unread.values()))),
            )
        refusal, warnings = policy_findings(configs, self.tables, self.logs)
        for log, warning in warnings.items():
            if self._warned.get(log) != warning:
                logger.warning("%s", warning)
        # A log read and found well again is warned about again if it changes back.
        for log in self.logs:
            if log in configs.read:
                if log in warnings:
                    self._warned[log] = warnings[log]
                else:
                    self._warned.pop(log, None)
        if r is not None:
            await self._check_replication(r, configs)
        if self.counts is not None:  # the configs read: the broker answers
            refusal = await self._check_counts(self.counts) or refusal
        if refusal is not None:
            self._refused(refusal)
        return refusal

    async def _check_replication(self, r: ReplicationRead, configs: TopicConfigs) -> None:
        answer = await self._reading("replicas", lambda: r.read(r.topics))
        if answer is None:
            return
        brokers, replicas = answer
        judged = {t: n for t, n in replicas.items() if t in configs.read}
        now = replication_findings(judged, configs, r.asked)
        appeared, cleared = finding_changes(
            self._replicated, now, [t for t in r.topics if t in judged]
        )
        warn_replication(appeared, brokers, replicas, r.asked)
        for finding in cleared:
            # Its first sentence, before the why and the fix: "topic t has …".
            logger.info("no longer so: %s", finding.split(": ", 1)[0])
        kept = {t: f for t, f in self._replicated.items() if t not in judged}
        self._replicated = {t: f for t in r.topics if (f := now.get(t) or kept.get(t))}
        self._count()

    async def _check_counts(self, c: PartitionCounts) -> str | None:
        """Judges the counts read; the refusal of a topic deleted while the node ran (None:
        none): missing at two checks in a row (not a listing caught mid-change), it stops
        the node, whose partitions writing to it would otherwise fail their commits and be
        taken afresh for good while the rest went on; its next start makes it again."""
        listed = None if c.listed is None else await self._reading("names", c.listed)
        # Missing at this check: none when the listing failed (two checks in a row or none).
        missing = set() if listed is None else {t for t in c.asked if t not in listed}
        gone, self._missing = sorted(missing & self._missing), missing
        have = await self._reading("partition counts", lambda: c.read(list(c.asked)))
        for topic, n in sorted((have or {}).items()):
            asked = c.asked.get(topic)
            if asked is None or n == asked:  # one deleted and made again: the node's count
                self._miscounted.pop(topic, None)
                continue
            finding = count_finding(topic, n, asked)
            if self._miscounted.get(topic) != finding:
                logger.warning("%s", finding)
            self._miscounted[topic] = finding
        if not gone:
            return None
        return (
            f"topic(s) {', '.join(gone)} of the node's were deleted while it ran: a write "
            "to one fails its partition's transaction at every retake; the node stops, and "
            "its next start makes them again (a timer changelog made again has lost its "
            "rows: see docs/operations.md)"
        )

    async def _reading(self, what: str, read: Callable[[], Awaitable[_T]]) -> _T | None:
        """What `read` answers; None when it failed (one WARNING, read again next check)."""
        try:
            return await read()
        except asyncio.CancelledError:
            if cancelled_here():
                raise
            why = "cancelled inside the client library"
        except Exception as exc:  # any failed read: tried again at the next check
            why = str(exc) or repr(exc)
        logger.warning(
            "reading the %s of the node's topics failed (read again in %g s): %s",
            what,
            self.interval,
            why,
        )
        return None

    def _count(self) -> None:
        if self.replication is not None:
            for topic in self.replication.topics:
                self.replication.counted(topic, len(self._replicated.get(topic, ())))
