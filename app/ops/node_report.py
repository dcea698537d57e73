"""A node's status report: what it owns and how (#22), as `<context>.nodes` carries it.

`collect_report` makes the report of a node now (its partitions' states from `health()`,
its stores' counts, due times, parked timers, upcoming fires and its jobs' timers);
`encode_report` and `decode_report` are its wire form (the JSON of a `NodeReport`, keyed
by the node id).
Written and read by `app.ops.cluster_status`, shown by `app.ops.cluster_page`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Annotated, Any, Final, Protocol

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from app.jobs.declaration import SCHEDULE
from app.node.lateness import LatenessWindow
from app.node.settings import WEB_URL_PATTERN, Settings
from app.ops.report_reads import due_timers, partition_state
from app.protocol.topics import parse_aggregate_type
from app.timers.runner import Clock
from tables import CommandSpec, StoreClosed, Timer, TimerStatus, TimerStore
from tables.bounds import Count, Deadline, Instant

__all__ = [
    "AHEAD_INTERVALS",
    "HELD_PER_BYTE",
    "JOBS_IN_REPORT",
    "MAX_HELD_ROWS",
    "MAX_INTERVAL_MS",
    "MAX_REPORT_BYTES",
    "PARKED_IN_REPORT",
    "STALE_INTERVALS",
    "TEXT_IN_REPORT",
    "UPCOMING_IN_REPORT",
    "NodeReport",
    "PartitionReport",
    "StatusSource",
    "clip",
    "collect_report",
    "decode_report",
    "encode_report",
    "fit_report",
    "from_the_future",
    "held_rows",
    "partition_state",
    "recent_p99",
    "stale",
]

logger = logging.getLogger(__name__)

TEXT_IN_REPORT: Final = 2000
"""A partition's `why` holds at most this many characters: a failure's text (the raw
exception and every topic@offset its cycle read) is cut to it, never refused."""

AHEAD_INTERVALS: Final = 3
"""A report dated more than this many of its intervals past the reader's clock is no report
(a forged one, or a node's clock far ahead): it would never go stale, owning its
partitions on every page for as long as it claims."""

MAX_INTERVAL_MS: Final = 60_000
"""The longest interval a report may give (`TICKWHEEL_STATUS_INTERVAL_MS`'s bound): a longer
one would keep a silent node's report fresh for that long."""

STALE_INTERVALS: Final = 3
"""A report older than this many of its node's intervals is stale: the node is gone or
cannot write (its partitions are then shown as last heard of, marked stale)."""


MAX_REPORT_BYTES: Final = 384 * 1024
"""The largest status record a node reads (larger ones are skipped unread, as bad) and
writes (`fit_report`). A report is held decoded, at up to ~15 times its bytes (a row of a
partition is ~40 bytes on the wire, ~600 held): what bounds a reader is `MAX_HELD_ROWS`."""

MAX_HELD_ROWS: Final = 200_000
"""Rows a reader holds across all its reports (`status_view`), past which the oldest
written is dropped: ~120 MB at worst, whatever another producer writes (a row ~600 bytes
held; `held_rows` counts each report's). 50 nodes of 3 types at 1,024 partitions, their
lists full, count ~125,000 (hold ~55 MB)."""

HELD_PER_BYTE: Final = 5
"""What `held_rows` counts of a record's bytes besides its rows, in bytes held a byte: a
text held decoded takes up to 4 bytes a byte of its JSON (one character past U+FFFF makes
all of it 4 bytes a character: a row of a 2,000-character `why` ~8 KB), and a row of all
its fields set more than a bare one (~1.2 KB held, ~150 bytes on the wire)."""

PARKED_IN_REPORT: Final = 100
UPCOMING_IN_REPORT: Final = 50
JOBS_IN_REPORT: Final = 100
"""Parked timers and upcoming fires a report carries at most (the earliest): a report of
a node of many partitions stays far below a topic's 1 MiB record limit."""


class PartitionReport(BaseModel):
    """One type's partition on its owner: its state and its timers' counts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str = Field(min_length=3, max_length=300)
    partition: int = Field(ge=0, le=1023)
    state: str = Field(max_length=40)
    why: str = Field(default="", max_length=TEXT_IN_REPORT)
    pending: Count = 0
    firing: Count = 0
    parked: Count = 0
    paused: Count = 0
    oldest_overdue: Deadline | None = None
    next_due: Deadline | None = None


def _bodiless(timer: Any) -> Any:
    """A listed timer without its command's body: no page shows it (its command's type
    alone), and another producer's body is any JSON, held decoded at ~25 times its bytes
    (a record of 384 KiB held 9.4 MB and took 313 ms to validate). A node writes none; an
    older node's bodies are dropped as they are read, unvalidated."""
    if isinstance(timer, Timer):
        if not timer.command.body:
            return timer
        return timer.model_copy(update={"command": CommandSpec(type=timer.command.type)})
    if isinstance(timer, dict) and isinstance(command := timer.get("command"), dict):
        return timer | {"command": {k: v for k, v in command.items() if k != "body"}}
    return timer


Listed = Annotated[Timer, BeforeValidator(_bodiless)]
"""A timer a report lists: its command's body left out (`_bodiless`)."""


class NodeReport(BaseModel):
    """A node's status record (the value of its key, its node id, in `<context>.nodes`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str = Field(min_length=1, max_length=300)
    group: str = Field(min_length=1)
    web: str | None = Field(default=None, max_length=500, pattern=WEB_URL_PATTERN)
    """The node's page: http(s) only (another producer's `javascript:` is no report)."""
    at: Instant = Field(description="epoch ms when it was written")
    interval_ms: int = Field(ge=1, le=MAX_INTERVAL_MS)
    lateness_p99_ms: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="over the last minute"
    )
    partitions: tuple[PartitionReport, ...] = ()
    # Bounded when read (`decode_report`), not here: a page's own report lists more.
    parked: tuple[Listed, ...] = ()
    upcoming: tuple[Listed, ...] = ()
    jobs: tuple[Listed, ...] = ()
    """The timers of the jobs' instances (the `<context>.schedule` types) it keeps."""
    counts_cut: bool = False
    """Its rows hold their owner and state only (`fit_report`): counts not said, not 0.
    Written only when true (a reader of the version before refuses the field)."""


def encode_report(report: NodeReport) -> bytes:
    """Its JSON, each partition's row without the fields at their defaults (a reader fills
    them in): a row is a third shorter, so that a node of three types at 1,024 partitions
    each fits `MAX_REPORT_BYTES` (its rows in full did not, and it published none)."""
    left_out = {"partitions"} if report.counts_cut else {"partitions", "counts_cut"}
    data = report.model_dump(mode="json", exclude=left_out)
    data["partitions"] = [
        p.model_dump(mode="json", exclude_defaults=True) for p in report.partitions
    ]
    return orjson.dumps(data)


def fit_report(report: NodeReport) -> NodeReport:
    """`report` cut to fit `MAX_REPORT_BYTES` once encoded: fewer listed timers first, then
    shorter failure texts, then each partition's counts and due times (its owner and
    state kept); never a partition (its owner would vanish from the pages). ValueError
    when even that is too large, or when it lists what a reader refuses (`_check_rows`)."""
    _check_rows(report)
    for why in (TEXT_IN_REPORT, 200, 0):
        parts = tuple(p.model_copy(update={"why": clip(p.why, why)}) for p in report.partitions)
        report = report.model_copy(update={"partitions": parts})
        while len(encode_report(report)) > MAX_REPORT_BYTES:
            lists = {k: getattr(report, k) for k in ("parked", "upcoming", "jobs")}
            if not any(lists.values()):
                break
            report = report.model_copy(update={k: v[: len(v) // 2] for k, v in lists.items()})
        else:
            return report
    bare = tuple(
        PartitionReport(type=p.type, partition=p.partition, state=p.state)
        for p in report.partitions
    )
    report = report.model_copy(update={"partitions": bare, "counts_cut": True})
    if len(encode_report(report)) <= MAX_REPORT_BYTES:
        return report
    raise ValueError(f"{len(report.partitions)} partitions' report past {MAX_REPORT_BYTES} bytes")


def decode_report(key: bytes | None, value: bytes | None) -> NodeReport | None:
    """The report a record holds (None: a tombstone); ValueError when it is none: larger
    than `MAX_REPORT_BYTES` (unread), or listing more timers than a node writes."""
    if not key:
        raise ValueError("a status record without a key")
    if value is None:
        return None
    if len(value) > MAX_REPORT_BYTES:
        raise ValueError(f"{len(value)} bytes, past a report's {MAX_REPORT_BYTES}")
    try:
        report = NodeReport.model_validate_json(value)
    except ValidationError as exc:
        raise ValueError(f"not a node report: {exc.error_count()} problem(s)") from exc
    # Checked here, not on the model: a page's own report (never written) lists more.
    for name, most in (
        ("parked", PARKED_IN_REPORT),
        ("upcoming", UPCOMING_IN_REPORT),
        ("jobs", JOBS_IN_REPORT),
    ):
        if len(getattr(report, name)) > most:
            raise ValueError(f"more than {most} {name} timers")
    _check_rows(report)
    if report.node.encode() != key:
        raise ValueError(f"the report of {report.node!r} under the key {key[:100]!r}")
    return report


def _check_rows(report: NodeReport) -> None:
    """A node lists each of its partitions once per type: more rows are another
    producer's (the same row 9,800 times over)."""
    if len({(p.type, p.partition) for p in report.partitions}) != len(report.partitions):
        raise ValueError("a partition listed twice")


def held_rows(report: NodeReport, size: int = 0) -> int:
    """What a reader counts against `MAX_HELD_ROWS` of `report`, read from a record of
    `size` bytes: one for the report, one a partition's row, six a listed timer (~3.8 KB
    decoded, without its body: `Listed`), and `HELD_PER_BYTE` bytes a byte of the record."""
    listed = len(report.parked) + len(report.upcoming) + len(report.jobs)
    return 1 + len(report.partitions) + 6 * listed + -(-HELD_PER_BYTE * size // 600)


def clip(text: str, limit: int = TEXT_IN_REPORT) -> str:
    """`text` cut to `limit` characters, marked when cut (none left when `limit` is 0)."""
    if len(text) <= limit:
        return text
    if limit < 60:
        return text[:limit]
    mark = f" … (cut, {len(text)} characters in all)"
    return text[: limit - len(mark)] + mark


def from_the_future(report: NodeReport, now: int) -> bool:
    return report.at - now > AHEAD_INTERVALS * report.interval_ms


def stale(report: NodeReport, now: int) -> bool:
    return now - report.at > STALE_INTERVALS * report.interval_ms


# --- a node's own report -----------------------------------------------------------------


class _Kept(Protocol):
    @property
    def store(self) -> TimerStore: ...


class StatusSource(Protocol):
    """What a report is made of (a `Node`; a fake one in the unit tests)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def types(self) -> Mapping[str, _Kept]: ...

    def health(self) -> dict[str, Any]: ...


async def collect_report(
    node: StatusSource,
    node_id: str,
    *,
    web: str | None,
    interval_ms: int,
    lateness_p99_ms: float | None = None,
    contexts: set[str] | None = None,
    scan_limit: int = 10_000,
    parked_limit: int = PARKED_IN_REPORT,
    parked_total: int | None = PARKED_IN_REPORT,
    upcoming_limit: int = UPCOMING_IN_REPORT,
) -> NodeReport:
    """The node's report now, of its types in `contexts` (all when None): up to
    `parked_limit` parked timers per partition and `parked_total` in all (None: no bound),
    the `upcoming_limit` next fires and the jobs' timers (`JOBS_IN_REPORT`). The event
    loop is let go after each partition's census (the bound of a stall is one partition's
    `scan_limit` entries, not the node's)."""
    now = node.clock.now()
    health = node.health()
    parts: list[PartitionReport] = []
    parked: list[Timer] = []
    upcoming: list[Timer] = []
    jobs: list[Timer] = []
    # Read once: the node's health may change while the report yields.
    states = {p: partition_state(p, health) for p in range(node.settings.partitions)}
    mine = {p: state for p, state in states.items() if state is not None}
    for name, kept in sorted(node.types.items()):
        if contexts is not None and parse_aggregate_type(name).context not in contexts:
            continue
        read: set[int] = set()
        for p, state in mine.items():
            row: dict[str, Any] = {
                "type": name,
                "partition": p,
                "state": state[0],
                "why": clip(state[1]),
            }
            if state[0] in ("running", "stalled"):
                # Only as many parked timers decoded as the report still has room for.
                room = parked_limit if parked_total is None else parked_total - len(parked)
                try:
                    c = await kept.store.census(
                        p, now, limit=scan_limit, parked_limit=max(min(parked_limit, room), 0)
                    )
                    counts = kept.store.status_counts(p)
                except StoreClosed:
                    # Let go while the report yielded: its row as the node says of it now.
                    if (now_row := _closed_row(node, name, p)) is not None:
                        parts.append(now_row)
                    continue
                except Exception as exc:
                    # The store's trouble is the partition's own: shown, never the report's end.
                    logger.warning("census of %s[%d] failed: %r", name, p, exc, exc_info=exc)
                    row |= {"state": "unknown", "why": clip(f"its census failed: {exc!r}")}
                    parts.append(PartitionReport.model_validate(row))
                    continue
                row |= {
                    "pending": counts[TimerStatus.PENDING],
                    "firing": counts[TimerStatus.FIRING],
                    "parked": counts[TimerStatus.PARKED],
                    "paused": counts.get(TimerStatus.PAUSED, 0),
                    "oldest_overdue": c.oldest_overdue,
                    "next_due": c.next_due,
                }
                parked += c.parked_timers
                read.add(p)
                if parse_aggregate_type(name).aggregate == SCHEDULE:
                    jobs += c.parked_timers
                # One partition's census at a time: the runners fire in between. Not in a
                # thread: neither store's reads are safe beside its writes and a revoke's
                # close (the memory store's lists, a RocksDB closed under its iterator).
                await asyncio.sleep(0)
            parts.append(PartitionReport.model_validate(row))
        if not read:
            continue
        try:
            upcoming += await due_timers(kept.store, read, upcoming_limit)
            if parse_aggregate_type(name).aggregate == SCHEDULE:
                jobs += await due_timers(kept.store, read, JOBS_IN_REPORT)
        except Exception as exc:
            logger.warning("the next fires of %s were not read: %r", name, exc, exc_info=exc)
    upcoming.sort(key=lambda t: (t.due_at, t.id))
    return NodeReport(
        node=node_id,
        group=node.settings.group_id,
        web=web,
        at=now,
        interval_ms=interval_ms,
        lateness_p99_ms=lateness_p99_ms,
        partitions=tuple(parts),
        parked=tuple(parked[:parked_total]),
        upcoming=tuple(upcoming[:upcoming_limit]),
        jobs=tuple(sorted(jobs, key=lambda t: (t.slot_due_at, t.id))[:JOBS_IN_REPORT]),
    )


def _closed_row(node: StatusSource, name: str, p: int) -> PartitionReport | None:
    """The row of a partition whose store closed during the report: none when the node has
    let it go (its next owner reports it), else its state now, its counts unread."""
    state = partition_state(p, node.health())
    if state is None:
        logger.debug("%s[%d] was let go during the report: left out", name, p)
        return None
    what, why = state
    if what in ("running", "stalled"):  # closed and taken again between two looks
        what, why = "unknown", "its store closed while the report was read"
    return PartitionReport(type=name, partition=p, state=what, why=clip(why))


def recent_p99(window: LatenessWindow, now_ms: int) -> float | None:
    """The worst second's p99 lateness of the last minute (ms); None when nothing fired."""
    points = window.recent(60, now_ms / 1000)
    return max((p.p99_ms for p in points), default=None)
