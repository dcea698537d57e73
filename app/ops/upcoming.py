"""Upcoming fires: the timers that will fire next, sorted by due time, filtered and paged.
Pure: `tickwheel timers upcoming` (rows read from the changelog) and the node's
`GET /timers/upcoming` (rows of its own partitions' stores) both page with `upcoming_page`;
the node's answer adds what it read (`UpcomingAnswer`).

Upcoming means PENDING or FIRING: the timers the runner will hand out (a FIRING timer's
`due_at` is its claim's deadline, when it is sent again unless its outcome comes first).
PARKED timers fire nothing until retried; FIRED and CANCELLED ones are done.

Sorted by `(due_at, id, owner, key)`. A page holds up to `limit` timers; its `next_cursor`
(opaque text) asks for the timers after its last one, so a page never repeats or skips a
timer that stays put between requests (one rescheduled meanwhile moves to its new place).

A store's due index is in `(due_at, id, row key)` order: a node's page reads each partition
from where the page starts (`scan_start`) a chunk at a time (`app.ops.upcoming_reads`),
keeping what the page may take of each (`taken`), and stops once no row left can be on it
(`past_page`, `read_until`).
"""

from __future__ import annotations

import base64
import binascii
import heapq
from collections.abc import Iterable, Mapping

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.protocol.instants import BadInstant, parse_instant
from tables.bounds import Instant
from tables.store import DuePosition
from tables.timer import Timer, TimerStatus

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "UPCOMING",
    "BadQuery",
    "UpcomingAnswer",
    "UpcomingPage",
    "UpcomingQuery",
    "decode_cursor",
    "encode_cursor",
    "page_share",
    "past_page",
    "query_of",
    "read_until",
    "scan_start",
    "sort_key",
    "taken",
    "upcoming_page",
]

UPCOMING = frozenset({TimerStatus.PENDING, TimerStatus.FIRING})
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000

SortKey = tuple[int, str, str, str]


class BadQuery(ValueError):
    """A filter, window, limit or cursor that cannot be used; the message names it."""


class UpcomingQuery(BaseModel):
    """What to list: each filter given narrows it (None: any)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str | None = Field(None, description="the owner's type, <context>.<aggregate>")
    owner: str | None = Field(None, description="the owner's id")
    tenant: str | None = Field(None, description="the owner's tenant")
    target: str | None = Field(None, description="the target's id")
    target_type: str | None = Field(None, description="the target's type")
    due_from: Instant | None = Field(None, description="due at or after, epoch ms")
    due_until: Instant | None = Field(None, description="due at or before, epoch ms")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
    cursor: str | None = Field(None, description="a page's next_cursor: the timers after it")

    def matches(self, t: Timer) -> bool:
        return (
            t.status in UPCOMING
            and (self.type is None or t.owner.type_name == self.type)
            and (self.owner is None or t.owner.id == self.owner)
            and (self.tenant is None or t.owner.tenant == self.tenant)
            and (self.target is None or t.target.id == self.target)
            and (self.target_type is None or t.target.type_name == self.target_type)
            and (self.due_from is None or t.due_at >= self.due_from)
            and (self.due_until is None or t.due_at <= self.due_until)
        )


class UpcomingPage(BaseModel):
    """One page: the timers in order, and the cursor of the next page (None: the last)."""

    model_config = ConfigDict(frozen=True)

    timers: list[Timer]
    next_cursor: str | None


class UpcomingAnswer(UpcomingPage):
    """`GET /timers/upcoming`'s answer: a page of the node's own partitions, and what it
    read of them (the command's page, which reads the changelog whole, has none of this)."""

    partitions: list[int] = Field(description="the partitions the node owns, read")
    scanned_all: bool = Field(
        description="every scan read its partition whole and no store failed; false: the "
        "pages end where a stopped scan did, or a partition named in unread is missing"
    )
    unread: dict[str, str] = Field(
        description="the partitions whose store failed as they were read (<type>[<partition>]"
        "), with why: their timers are missing from this answer"
    )


def sort_key(t: Timer) -> SortKey:
    return (t.due_at, t.id, str(t.owner), t.key)


def encode_cursor(key: SortKey) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(key))).decode().rstrip("=")


def decode_cursor(text: str) -> SortKey:
    """The sort key a cursor holds; `BadQuery` for text no page gave out."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        due, timer_id, owner, key = orjson.loads(raw)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise BadQuery(f"cursor {text[:40]!r} is not a next_cursor of this listing") from exc
    if not (
        isinstance(due, int)
        and not isinstance(due, bool)
        and all(isinstance(s, str) for s in (timer_id, owner, key))
    ):
        raise BadQuery(f"cursor {text[:40]!r} is not a next_cursor of this listing")
    return (due, timer_id, owner, key)


def page_share(rows: Iterable[Timer], query: UpcomingQuery) -> list[Timer]:
    """What a page of `query` may take of `rows` (one partition's scan): the ones it
    matches after its cursor, its `limit` + 1 first by sort key (the page holds `limit`
    at most, and one more says there is a next page). A page of the shares of several
    scans is the page of their rows: a request keeps each share, not each scan whole."""
    after = None if query.cursor is None else decode_cursor(query.cursor)
    found = (t for t in rows if query.matches(t) and (after is None or sort_key(t) > after))
    return heapq.nsmallest(query.limit + 1, found, key=sort_key)


def scan_start(query: UpcomingQuery) -> DuePosition | None:
    """The place in a due index a page of `query` reads each partition after: its cursor's
    due time and id (the rows of both are read again: the index orders them by row key,
    the cursor by owner and key), or its `due_from`, whichever is later; None: the first.
    A place due after every due time (a cursor's) is after the caller's `until`."""
    places: list[DuePosition] = []
    if query.due_from is not None and query.due_from > 0:
        places.append((query.due_from, "", b""))
    if query.cursor is not None:
        due, timer_id, _, _ = decode_cursor(query.cursor)
        if due >= 0:  # no index holds a due time before 0
            places.append((due, timer_id, b""))
    return max(places, default=None)


def taken(kept: list[Timer], got: list[Timer], query: UpcomingQuery) -> list[Timer]:
    """What a page may take (`page_share`) of `kept` (its rows read so far) and `got` (a
    partition's rows read next): a timer in both was written between the reads (moved
    later, or claimed), and is kept as read last."""
    again = {(t.owner, t.key) for t in got}
    return page_share([*(t for t in kept if (t.owner, t.key) not in again), *got], query)


def past_page(kept: list[Timer], last: Timer, limit: int) -> bool:
    """Whether a partition read up to `last` need be read no further: the rows after it
    (due no earlier, and of a later id when as due) sort after the `limit` + 1 the page
    keeps already, all it may show and the one that says a next page follows."""
    if len(kept) <= limit:
        return False
    edge = kept[limit]
    return (last.due_at, last.id) > (edge.due_at, edge.id)


def read_until(kept: list[Timer], limit: int, until: int) -> int:
    """How late a read for the page need go: `until`, or once it keeps `limit` + 1 rows,
    the last one's due time (a row due later can be neither on the page nor the sign of a
    next one)."""
    return until if len(kept) <= limit else min(until, kept[limit].due_at)


def upcoming_page(
    rows: Iterable[Timer], query: UpcomingQuery, horizon: SortKey | None = None
) -> UpcomingPage:
    """The page of `rows` that `query` asks for (its cursor checked: `BadQuery`).

    `horizon`: the rows are all there are only up to this key (a scan that stopped there);
    rows past it are left out, so that no page lists a later timer before an earlier one
    the scan did not reach.
    """
    after = None if query.cursor is None else decode_cursor(query.cursor)
    found = sorted(
        (
            t
            for t in rows
            if query.matches(t)
            and (after is None or sort_key(t) > after)
            and (horizon is None or sort_key(t) <= horizon)
        ),
        key=sort_key,
    )
    page = found[: query.limit]
    more = len(found) > query.limit
    return UpcomingPage(
        timers=page, next_cursor=encode_cursor(sort_key(page[-1])) if more else None
    )


_FIELDS = ("type", "owner", "tenant", "target", "target_type", "limit", "cursor")


def query_of(params: Mapping[str, str]) -> UpcomingQuery:
    """A query from text parameters (an HTTP query's, the CLI's options): `due_from` and
    `due_until` as ISO 8601 with offset or epoch ms; `BadQuery` naming the field."""
    unknown = sorted(set(params) - {*_FIELDS, "due_from", "due_until"})
    if unknown:
        raise BadQuery(f"{unknown[0]}: no such parameter (known: {', '.join(_ALL)})")
    data: dict[str, object] = {k: v for k, v in params.items() if k in _FIELDS}
    for name in ("due_from", "due_until"):
        if name in params:
            try:
                data[name] = parse_instant(params[name], name)
            except BadInstant as exc:
                raise BadQuery(str(exc)) from exc
    if "cursor" in params:
        decode_cursor(params["cursor"])
    limit = params.get("limit")
    if limit is not None and not (limit.isascii() and limit.isdigit()):
        # As the ledger's page and the settings read a count: pydantic took "1_0" as 10
        # and "1.0" as 1.
        raise BadQuery(f"limit: a whole number in digits alone (got {limit!r})")
    try:
        return UpcomingQuery.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise BadQuery(f"{where}: {err['msg']} (got {err.get('input')!r})") from exc


_ALL = (*_FIELDS[:5], "due_from", "due_until", *_FIELDS[5:])
