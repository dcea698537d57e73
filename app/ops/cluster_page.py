"""The operator page's view of the whole group: pure, from the nodes' reports (#22).

The node's own report is made at the page's load (`collect_report`, live); the others'
come from `<context>.nodes` (`app.ops.cluster_status`). Partition p is shown as its owner
says: this node when it claims p, else the newest fresh report that claims it, else the
newest stale one (marked stale), else nobody (unowned). Counts, parked timers and
upcoming fires of p are taken from that one report only, so a partition handed over is
never counted twice.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import orjson

from app.node.settings import WEB_URL_PATTERN
from app.ops.node_report import NodeReport, PartitionReport, stale
from tables import Timer
from tables.bounds import MAX_INSTANT

__all__ = ["ClusterView", "cluster_view", "link", "span", "when"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

UPCOMING_ROWS = 20
"""Upcoming fires listed, the earliest of the whole group."""


@dataclass(frozen=True)
class PartitionRow:
    partition: int
    state: str
    detail: str
    node: str
    web: str | None = None
    stale: str = ""


@dataclass(frozen=True)
class CensusRow:
    type_name: str
    partition: int
    counts: tuple[int, int, int, int]
    overdue: str
    next_due: str
    node: str
    stale: str = ""


@dataclass(frozen=True)
class TimerRow:
    type_name: str
    timer: Timer
    due: str
    node: str
    here: bool


@dataclass(frozen=True)
class JobRow:
    timer: Timer
    due: str
    rule: str
    node: str


@dataclass(frozen=True)
class NodeRow:
    node: str
    web: str | None
    heard: str
    partitions: list[int]
    lateness: str
    stale: str
    here: bool


@dataclass
class ClusterView:
    partitions: list[PartitionRow] = field(default_factory=list)
    census: list[CensusRow] = field(default_factory=list)
    parked: list[TimerRow] = field(default_factory=list)
    upcoming: list[TimerRow] = field(default_factory=list)
    jobs: list[JobRow] = field(default_factory=list)
    nodes: list[NodeRow] = field(default_factory=list)
    owners: dict[int, NodeReport] = field(default_factory=dict)


def cluster_view(
    own: NodeReport,
    others: Sequence[NodeReport],
    partitions: int,
    now: int,
    *,
    known: bool = True,
) -> ClusterView:
    """`others`: the other nodes' reports, any order; `known`: whether the group's status
    is read at all (without it a partition not this node's is only 'elsewhere')."""
    others = sorted((r for r in others if r.node != own.node), key=lambda r: (-r.at, r.node))
    view = ClusterView()
    for p in range(partitions):
        claims = [r for r in (own, *others) if any(x.partition == p for x in r.partitions)]
        fresh = [r for r in claims if r is own or not stale(r, now)]
        if fresh or claims:
            view.owners[p] = (fresh or claims)[0]
    for p in range(partitions):
        holder = view.owners.get(p)
        if holder is None:
            state, node = ("unowned", "no node reports it") if known else ("elsewhere", "")
            view.partitions.append(
                PartitionRow(p, state, "", node or "another node of the group", None)
            )
            continue
        first = next(x for x in holder.partitions if x.partition == p)
        view.partitions.append(
            PartitionRow(
                p, first.state, first.why, holder.node, link(holder.web), _stale(holder, own, now)
            )
        )
    # A report cut to its rows' owners and states (`fit_report`) says no counts: none shown,
    # rather than zeros.
    rows: list[tuple[NodeReport, PartitionReport]] = [
        (r, x)
        for r in (own, *others)
        if not r.counts_cut
        for x in r.partitions
        if view.owners.get(x.partition) is r
    ]
    for r, x in sorted(rows, key=lambda rx: (rx[1].type, rx[1].partition)):
        counts = (x.pending, x.firing, x.parked, x.paused)
        view.census.append(
            CensusRow(
                x.type,
                x.partition,
                counts,
                when(x.oldest_overdue, now),
                when(x.next_due, now),
                r.node,
                _stale(r, own, now),
            )
        )
    reporting = {id(r): r for r in view.owners.values()}
    for r in reporting.values():
        here = r is own
        for t in r.parked:
            if view.owners.get(t.partition) is r:
                view.parked.append(
                    TimerRow(t.owner.type_name, t, when(t.slot_due_at, now), r.node, here)
                )
        for t in r.upcoming:
            if view.owners.get(t.partition) is r:
                view.upcoming.append(
                    TimerRow(t.owner.type_name, t, when(t.due_at, now), r.node, here)
                )
        for t in r.jobs:
            if view.owners.get(t.partition) is r:
                rule = orjson.dumps(t.rule.model_dump(mode="json", exclude_none=True)).decode()
                view.jobs.append(JobRow(t, when(t.slot_due_at, now), rule, r.node))
    view.jobs.sort(key=lambda row: (row.timer.owner.context, row.timer.owner.id, row.timer.key))
    view.parked.sort(key=lambda row: (row.type_name, row.timer.partition, str(row.timer.target)))
    view.upcoming.sort(key=lambda row: (row.timer.due_at, row.timer.id))
    del view.upcoming[UPCOMING_ROWS:]
    for r in (own, *others):
        late = "—" if r.lateness_p99_ms is None else f"{r.lateness_p99_ms:.1f} ms"
        view.nodes.append(
            NodeRow(
                r.node,
                link(r.web),
                when(r.at, now),
                sorted({x.partition for x in r.partitions}),
                late,
                _stale(r, own, now),
                r is own,
            )
        )
    return view


def link(web: str | None) -> str | None:
    """`web` when a page may link to it (http or https), else None: a report is checked
    when read, and this holds however a report was made."""
    return web if web is not None and re.fullmatch(WEB_URL_PATTERN, web) else None


def _stale(r: NodeReport, own: NodeReport, now: int) -> str:
    if r is own or not stale(r, now):
        return ""
    return f"stale: last report {span((now - r.at) / 1000)} ago"


def when(ms: int | None, now: int | None = None) -> str:
    """`2026-12-01 02:30:01.123 UTC`, and how far from now when `now` is given."""
    if ms is None:
        return "—"
    if 0 <= ms <= MAX_INSTANT:
        moment = _EPOCH + timedelta(milliseconds=ms)  # exact, where a float rounds up
        text = moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
    else:  # a deadline past what a date holds (an instant plus a delay): never an error
        text = "after 9999-12-31 UTC" if ms > 0 else f"{ms} ms before 1970"
    if now is None:
        return text
    delta = (ms - now) / 1000
    gap = span(abs(delta))
    return f"{text} ({'in ' + gap if delta > 0 else gap + ' ago'})"


def span(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
