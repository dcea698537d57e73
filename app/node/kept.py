"""What a node keeps for each aggregate type (its store, runner, and the registry of its
partitions' transactions; each partition's transaction and command processor are its
task's), and the topics a node of some types reads and writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.commands.records import state_key
from app.errors import Fenced
from app.kafka import TopicSpec
from app.kafka.records import causes
from app.model.aggregate import AggregateType
from app.node.copy_age import CHANGELOG_DELETE_RETENTION_MS
from app.node.local_state import CleanMarks
from app.node.row_limit import RowLimit
from app.node.type_transactions import TypeTransactions
from app.protocol.dead_letters import DEAD_LETTER_TOPIC_BYTES
from app.protocol.topics import AggregateTopics, ContextTopics
from app.timers.applied_ops import AppliedOps
from app.timers.runner import TimerRunner
from tables import AggregateRef, TimerStore
from tables.aggregate_store import RocksAggregateStore

if TYPE_CHECKING:
    from app.node.in_process import NodeTimerLoop

__all__ = ["KeptType", "is_fenced", "node_topics"]


@dataclass
class KeptType:
    """What the node keeps for one aggregate type."""

    topics: AggregateTopics
    agg: AggregateType[Any] | None  # None: timers only (the type is decided elsewhere)
    store: TimerStore
    runner: TimerRunner
    loop: NodeTimerLoop
    states: RocksAggregateStore | None
    # Its partitions' transactions (each held by the task of its partition), opened here,
    # and the store's changelog sink that routes each timer row to its partition's.
    transactions: TypeTransactions
    marks: CleanMarks
    row_limit: RowLimit
    """What its changelog takes, and the rows its partitions' sinks refused for it."""
    batch_topics: set[str] = field(default_factory=set)
    """Topics other than its own that a transaction of one of its partitions wrote, and the
    broker refused as too large (another type's or context's commands, sent by a decision):
    its producers' batches are sized under their limits too (`open_type`)."""
    applied_ops: dict[int, AppliedOps] = field(default_factory=dict)
    """Per partition, the operators' requests it carried out within the window, read again
    by each take of it (`open_partition`) and noted by its cycles (`_operate`)."""

    @property
    def name(self) -> str:
        return self.topics.type_name

    def applied(self, p: int, aggregate: AggregateRef, request_id: str) -> bool:
        """Whether `aggregate` (of partition p) applied `request_id`, as the states this node
        committed hold it; False when it keeps none of the type or p's are not open here."""
        if self.states is None:
            return False
        return self.states.seen(p, state_key(aggregate), request_id)


def is_fenced(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it wraps) says another node took the partition over."""
    return any(isinstance(cause, Fenced) for cause in causes(exc))


NODES_SEGMENT_MS = 3_600_000
"""`segment.ms` of `<ctx>.nodes` when a node creates it."""


def node_topics(types: list[AggregateTopics], partitions: int) -> list[TopicSpec]:
    """Every topic a node of these aggregate types reads or writes."""
    specs: list[TopicSpec] = []
    for t in types:
        specs += [
            # The aggregates' log: their states are folded from it again, whole.
            TopicSpec(t.events, partitions, retained=True),
            TopicSpec(t.commands, partitions),
            # A clean local copy is read on from while younger than its tombstones'
            # retention (`app.node.copy_age`): set, not the broker's default, whatever it is.
            TopicSpec(
                t.timers_changelog,
                partitions,
                compacted=True,
                delete_retention_ms=CHANGELOG_DELETE_RETENTION_MS,
            ),
            TopicSpec(t.timer_ops, partitions),
        ]
    for ctx in sorted({t.context for t in types}):
        c = ContextTopics(ctx)
        specs += [
            TopicSpec(c.results, partitions),
            # A letter holds a whole record of the topics it serves, and its headers.
            TopicSpec(c.dead_letters, 1, max_message_bytes=DEAD_LETTER_TOPIC_BYTES),
            TopicSpec(c.ledger, partitions, compacted=True),
            # One small record per node: one partition keeps them in the order written. A
            # report every few seconds a node, and the segment being written is never
            # compacted: rolled hourly, not weekly, a node's start reads an hour's reports
            # and the nodes' last ones, not up to a week's (~1 GiB).
            TopicSpec(c.nodes, 1, compacted=True, segment_ms=NODES_SEGMENT_MS),
        ]
    return specs
