"""A node's Prometheus metrics: one registry per node, so tests can run several nodes.

Names follow Prometheus' conventions: the unit in the name (`_seconds`), counters exported
with `_total`, histograms for durations. What each measures, and where:

- `tickwheel_timer_lateness_seconds{type}`: applied - due, for each timer command decided
  for good (committed, unchanged or rejected by its handler), observed when the
  transaction that applied it COMMITTED, on the node that owns the target aggregate
  (`type` is the target's type; for in-process fires, the timer's own). Due is the slot's
  due time (`not_before`), so a slot retried after failures counts its retries' wait.
  Measured at the commit, not at the decision: only then can anyone read its events.
  A target outside Tickwheel (another context's own service) is not measured.
- `tickwheel_timer_actions_total{type,action}`: what the firing loop did (`RoundStats`):
  fired, sent, claimed, retried, busy, parked, expired, lapsed (claims that lapsed), ...
- `tickwheel_timer_puts_total{type}`: timers written PENDING from the log.
- `tickwheel_unknown_result_codes_total{context}`: results this node's results reader read
  with a code its version does not know (a newer Tickwheel's or another implementation's),
  each read as ERROR: the send it answers is a failed attempt, retried by its timer's
  policy, the code in the row's `error_text` (`app.timers.sender.ResultsReader`).
- `tickwheel_timers{type,partition,status}`: PENDING, FIRING and PARKED timers of each
  partition taken here (fired or held, its restore done), counts the store keeps with each
  write (`TimerStore.status_counts`).
- `tickwheel_timer_backlog{type}`, `tickwheel_timer_backlog_oldest_seconds{type}`: due and
  neither sent nor fired yet (`TimerRunner.backlog`, and of the partitions taken here but
  not fired, held, their due rows: `HELD_BACKLOG_LIMIT`), and how long the oldest has waited.
- `tickwheel_records_deleted_unread_total{topic}`: records the group consumer read past,
  deleted before it read them (`app.kafka.resume_offset`), at a take or while it ran.
- `tickwheel_topic_replication_findings{topic}`: what is wrong with a topic's replication
  (`app.kafka.replication`), found at the start and every minute since (`topic_watch`).
- `tickwheel_ledger_entries{context}`: open failure-ledger entries (every node reads the
  whole ledger: take the max across nodes, not the sum).
- `tickwheel_misplaced_events_total{type,partition,where}`: events outside their
  aggregate's partition, found by a restore of the states (`where="restore"`, not folded)
  or by the subscription (`"log"`, dead-lettered): what partitions added to the topics leave.
- `tickwheel_commit_duration_seconds{type}`: one partition transaction's commit.
- `tickwheel_restore_records_read`, `tickwheel_restore_records_to_read{type,partition,store}`
  and `tickwheel_restore_duration_seconds{type,store}`: restores of the timer table
  (`store="timers"`, from its changelog) and of the aggregate states (`"states"`, from the
  log), in log offsets; a partition's series go when it is let go (`let_go_of`).
- `tickwheel_build_info{version,python,aiokafka,kafka_client_api,tzdata}`: always 1; what
  runs (`app.node.build_info`): Tickwheel's version, Python's, aiokafka's, how the client
  picks the Kafka protocol's API versions (`auto`: from each broker's ApiVersions answer),
  and the IANA release of the zones rules are stepped in (`tables.zones`). Joined on in
  queries (`* on(instance) group_left(version) tickwheel_build_info`) it shows which
  release each node runs, as during a rolling upgrade.
- `tickwheel_http_connections`, `tickwheel_http_connections_shed_total{why}`: the HTTP
  edge's open connections, and those its cap closed or refused (`app.ops.connection_cap`).
- `tickwheel_kafka_client_cert_expiry_timestamp_seconds{file}`: the notAfter of the Kafka
  client certificate loaded (`app.kafka.tls_reload`), set at the start and at each renewal.

The gauges read from the store, the runners and the ledgers are set by `refresh`
(`app.node.scrape_gauges`), which the node's `/metrics` handler awaits before each
scrape; everything it reads is kept current by the writes themselves, so a scrape scans
nothing of the store but one bounded due scan a type of its held partitions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.kafka.tls_expiry import Validity
from app.node.build_info import BUILD_LABELS, KAFKA_CLIENT_API, build_info, build_info_gauge
from app.node.lateness import LatenessWindow
from app.node.metric_parts import (
    COMMIT_BUCKETS,
    LATENESS_BUCKETS,
    RESTORE_BUCKETS,
    RestoreGauges,
    observe_all,
)
from app.node.scrape_gauges import TimerSource, refresh_gauges
from app.timers.runner import RoundStats
from tables.ledger import FailureLedger

__all__ = [
    "BUILD_LABELS",
    "COMMIT_BUCKETS",
    "KAFKA_CLIENT_API",
    "LATENESS_BUCKETS",
    "NodeMetrics",
    "build_info",
    "observe_all",
]

_ROUND_FIELDS = [
    f.name
    for f in fields(RoundStats)
    if f.name not in ("full", "next_due", "reload_at", "loaded", "written")
]


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.build_info = build_info_gauge(r)
        self.commands = Counter(
            "tickwheel_commands",
            "Commands decided, by aggregate type and result code",
            ["type", "code"],
            registry=r,
        )
        self.dead_letters = Counter(
            "tickwheel_dead_letters",
            "Records skipped as unreadable, by topic",
            ["topic"],
            registry=r,
        )
        self.timers = Counter(
            "tickwheel_timer_actions",
            "What the firing loop did, by aggregate type and action (sent, fired, parked, …)",
            ["type", "action"],
            registry=r,
        )
        self.followed = Counter(
            "tickwheel_followed_events",
            "Events another writer appended to a log this node decides, folded into its "
            "aggregates (ahead of their versions), by aggregate type",
            ["type"],
            registry=r,
        )
        self.deleted_unread = Counter(
            "tickwheel_records_deleted_unread",
            "Records the group read past because retention or DeleteRecords deleted them "
            "before it read them (never applied), by topic",
            ["topic"],
            registry=r,
        )
        self.no_target = Counter(
            "tickwheel_no_target_sends",
            "Commands not sent because their topic does not exist (NO_TARGET): a decision's "
            "answered ERROR, a timer's attempt failed",
            registry=r,
        )
        self.misplaced = Counter(
            "tickwheel_misplaced_events",
            "Events found outside their aggregate's partition (murmur2 of the id over the "
            "partition count), by aggregate type, partition and where: restore (not folded "
            "into the states) or log (dead-lettered by the subscription)",
            ["type", "partition", "where"],
            registry=r,
        )
        self.unknown_result_codes = Counter(
            "tickwheel_unknown_result_codes",
            "Results read on a context's results topic with a code this version does not "
            "know (a newer writer's), each read as ERROR (its send a failed attempt), by "
            "context",
            ["context"],
            registry=r,
        )
        self.owned = Gauge("tickwheel_owned_partitions", "Partitions this node owns", registry=r)
        self.operator_requests = Counter(
            "tickwheel_operator_requests",
            "Operators' retry/skip requests carried out on this node's parked timers, by "
            "aggregate type, action and partition",
            ["type", "action", "partition"],
            registry=r,
        )
        self.let_go = Counter(
            "tickwheel_partitions_let_go",
            "Partitions this node stopped working on, by why: revoked (a rebalance), fenced "
            "(a newer owner took it over), failed (its transaction or store failed: taken "
            "afresh)",
            ["reason"],
            registry=r,
        )
        self.lateness = Histogram(
            "tickwheel_timer_lateness_seconds",
            "Applied minus due time of timer commands, observed when the transaction that "
            "applied them committed, by the target's aggregate type",
            ["type"],
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.puts = Counter(
            "tickwheel_timer_puts",
            "Timers written PENDING from the log (set or rescheduled), by aggregate type",
            ["type"],
            registry=r,
        )
        self.active = Gauge(
            "tickwheel_timers",
            "Timers of the partitions this node owns, by aggregate type, partition and "
            "status (pending, firing, parked, paused)",
            ["type", "partition", "status"],
            registry=r,
        )
        self.backlog = Gauge(
            "tickwheel_timer_backlog",
            "Timers due and neither sent nor fired yet (at most one load of the wheel is "
            "seen), by aggregate type",
            ["type"],
            registry=r,
        )
        self.backlog_oldest = Gauge(
            "tickwheel_timer_backlog_oldest_seconds",
            "How long the oldest timer due and not sent or fired yet has waited (0: none)",
            ["type"],
            registry=r,
        )
        self.replication_findings = Gauge(
            "tickwheel_topic_replication_findings",
            "What is wrong with a topic's replication (fewer replicas than configured, "
            "min.insync.replicas 1 on 3 or more, or above them), by topic (0: nothing), read "
            "at the start and every minute",
            ["topic"],
            registry=r,
        )
        self.ledger_entries = Gauge(
            "tickwheel_ledger_entries",
            "Open failure-ledger entries (targets with parked timers), by context; every "
            "node reads the whole ledger",
            ["context"],
            registry=r,
        )
        self.commit_duration = Histogram(
            "tickwheel_commit_duration_seconds",
            "Duration of a partition transaction's commit (records sent, offsets, commit), "
            "by aggregate type",
            ["type"],
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.restore_read = Gauge(
            "tickwheel_restore_records_read",
            "Log offsets read by the partition's last or current restore",
            ["type", "partition", "store"],
            registry=r,
        )
        self.restore_to_read = Gauge(
            "tickwheel_restore_records_to_read",
            "Log offsets the partition's last or current restore has to read",
            ["type", "partition", "store"],
            registry=r,
        )
        self.restore_duration = Histogram(
            "tickwheel_restore_duration_seconds",
            "Duration of a partition's restore, by aggregate type and store (timers, states)",
            ["type", "store"],
            buckets=RESTORE_BUCKETS,
            registry=r,
        )
        self.http_connections = Gauge(
            "tickwheel_http_connections",
            "Connections open to the HTTP edge (at most TICKWHEEL_WEB_MAX_CONNECTIONS and the "
            "probes' room)",
            registry=r,
        )
        self.http_connections_shed = Counter(
            "tickwheel_http_connections_shed",
            "HTTP connections the edge's cap closed or refused, by why: idle (closed to let a "
            "new one in), refused (a new one answered 503), probe_only (a request other than "
            "a probe's on the probes' room, answered 503)",
            ["why"],
            registry=r,
        )
        self.client_cert_expiry = Gauge(
            "tickwheel_kafka_client_cert_expiry_timestamp_seconds",
            "When the Kafka client certificate loaded expires (notAfter, Unix time), by file",
            ["file"],
            registry=r,
        )
        # Per-second lateness of the last minutes, read by the operator page's chart.
        self.recent_lateness = LatenessWindow()
        # The partitions taken here, by type: from their timers' restore (`restore_progress`)
        # to their let-go (`let_go_of`). A store serves every partition until one is let go,
        # and a runner knows only those it fires: a held one is neither's.
        self._taken: dict[tuple[str, int], RestoreGauges] = {}

    def client_cert_loaded(self, path: Path, validity: Validity) -> None:
        """`app.kafka.tls_reload`'s: a client certificate loaded (at the start, renewed)."""
        self.client_cert_expiry.labels(str(path)).set(validity.not_after)

    def round(self, type_name: str, stats: RoundStats) -> None:
        for name in _ROUND_FIELDS:
            value = getattr(stats, name)
            if value:
                self.timers.labels(type_name, name).inc(value)

    def fired(self, type_name: str, due: Sequence[int], now_ms: int) -> None:
        """Timer commands whose transaction committed at `now_ms`, by their due times (ms):
        once per committed batch, O(1) per timer."""
        if not due:
            return
        latenesses = [(now_ms - d) / 1000 for d in due]
        observe_all(self.lateness.labels(type_name), latenesses)
        self.recent_lateness.observe_many(latenesses, now_ms / 1000)

    def restore_progress(self, type_name: str, partition: int, store: str) -> RestoreGauges:
        """The `RestoreProgress` callback of one partition's restore."""
        gauges = RestoreGauges(
            self.restore_read.labels(type_name, str(partition), store),
            self.restore_to_read.labels(type_name, str(partition), store),
        )
        if store == "timers":
            self._taken[(type_name, partition)] = gauges
        return gauges

    def let_go_of(self, type_name: str, partition: int) -> None:
        """`partition` of `type_name` let go: its restore series removed (its next owner
        reports its restores; stale finished ones would dilute a sum of them)."""
        self._taken.pop((type_name, partition), None)
        for store in ("timers", "states"):
            self.restore_read.remove(type_name, str(partition), store)
            self.restore_to_read.remove(type_name, str(partition), store)

    async def refresh(
        self,
        now_ms: int,
        sources: Iterable[TimerSource],
        ledgers: Mapping[str, FailureLedger],
    ) -> None:
        """Sets the gauges read from the stores, runners and ledgers (`refresh_gauges`)."""
        await refresh_gauges(self, self._taken, now_ms, sources, ledgers)
