"""The operator page: one server-rendered HTML page of a node, and its Retry/Skip forms.

`GET /` shows what the node owns and how its partitions are (restoring, running,
stalled), its timers per aggregate type, status and partition (read from its local
timer stores with `TimerStore.census`), its parked timers, the whole cluster's failure
ledger (every node follows the compacted ledger topic whole), a search by owner id
(`?owner=<id>&tenant=<tenant>`) and a chart of timer lateness over the last minutes.

Retry and Skip are HTML forms posted to `/timers/retry` and `/timers/skip`: they go
through Kafka exactly as `tickwheel timers retry|skip` does (`app.timers.operator`), to the
owners of the timers' partitions, whichever nodes they are. A good form is answered
303 back to the page with a confirmation; a bad one with a 400 page, and nothing sent.

Rendering is Jinja2 with autoescaping on: every owner id, key, type and message from the
data is escaped. No JavaScript; the chart is an inline SVG.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from jinja2 import Environment, StrictUndefined
from multidict import MultiMapping
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from yarl import URL

from app.errors import BadInput, TickwheelError
from app.node.lateness import LatenessPoint
from app.node.settings import Settings
from app.protocol.topics import parse_aggregate_type
from app.protocol.wire import (
    TimerAction,
    TimerOp,
)
from app.timers.operator import (
    request_retry,
    request_skip,
)
from app.timers.runner import Clock
from tables import DEFAULT_TENANT, AggregateRef, StoreClosed, Timer, TimerStatus, TimerStore
from tables.ledger import FailureLedger, LedgerEntry
from tables.partitioner import partition_of

if TYPE_CHECKING:
    from app.node.metrics import NodeMetrics

__all__ = [
    "CHART_SECONDS",
    "PARKED_LIMIT",
    "Acted",
    "OperatorPage",
    "PageNode",
    "Rendered",
    "Requester",
    "default_node_id",
]

logger = logging.getLogger(__name__)

CHART_SECONDS = 300
"""The lateness chart's span: the last five minutes."""

PARKED_LIMIT = 50
"""Parked timers listed per type and partition (all of them are counted)."""

SCAN_LIMIT = 10_000
"""Due-index entries a page load reads per partition for the oldest overdue and next due
times (and parked entries for the list): the scan stays bounded however large the
partition. The counts are the store's own, kept with each write (`status_counts`)."""

_NOTICES = 100
"""Confirmations kept for the redirect after a POST (the oldest are dropped)."""


# --- what the page reads ------------------------------------------------------------------


class _Kept(Protocol):
    @property
    def store(self) -> TimerStore: ...


class PageNode(Protocol):
    """What the page reads of a `Node` (a fake one in the unit tests)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def types(self) -> Mapping[str, _Kept]: ...

    @property
    def ledgers(self) -> list[FailureLedger]: ...

    @property
    def metrics(self) -> NodeMetrics: ...

    def health(self) -> dict[str, Any]: ...


Requester = Callable[[str, str, AggregateRef, int], Awaitable[TimerOp]]
"""`(bootstrap, owner type, target, partitions) -> the op written`: `request_retry` or
`request_skip` of `app.timers.operator` (a fake one in the unit tests)."""

_REQUESTS: dict[TimerAction, Requester] = {
    TimerAction.RETRY: request_retry,
    TimerAction.SKIP: request_skip,
}


def default_node_id(port: int) -> str:
    """How the page names its node: host and HTTP port (where its page is), and pid."""
    return f"{socket.gethostname()}:{port} (pid {os.getpid()})"


# --- what the page answers ----------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    status: int
    html: str


@dataclass(frozen=True)
class Acted:
    """A POST's answer: a redirect to `location` (303), or a page (`rendered`)."""

    location: str | None = None
    rendered: Rendered | None = None


class OperatorForm(BaseModel):
    """A Retry or Skip form: the owner type of the parked timers and their target."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str = Field(min_length=1, description="the timers' owner type, <context>.<aggregate>")
    target_type: str = Field(min_length=1, description="the target's type")
    target_tenant: str = Field(default=DEFAULT_TENANT, min_length=1)
    target_id: str = Field(min_length=1)
    back: str = "/"


# --- views (plain data handed to the template) --------------------------------------------


@dataclass(frozen=True)
class _PartitionRow:
    partition: int
    state: str
    detail: str
    node: str


@dataclass(frozen=True)
class _CensusRow:
    type_name: str
    partition: int
    counts: dict[TimerStatus, int]
    overdue: str
    next_due: str


@dataclass(frozen=True)
class _ParkedRow:
    type_name: str
    timer: Timer
    slot_due: str


@dataclass(frozen=True)
class _LedgerRow:
    entry: LedgerEntry
    types: list[str]
    default_type: str


@dataclass(frozen=True)
class _OwnerPart:
    type_name: str
    partition: int
    here: bool
    timers: list[tuple[Timer, str]]


@dataclass
class _Chart:
    width: int = 720
    height: int = 180
    left: int = 64
    bottom: int = 22
    p50: str = ""
    p99: str = ""
    maxes: list[tuple[float, float]] = field(default_factory=list)
    p99s: list[tuple[float, float]] = field(default_factory=list)
    top: str = ""
    points: int = 0
    fired: int = 0
    worst: str = ""


# --- the page ----------------------------------------------------------------------------


class OperatorPage:
    """Builds the page of `node` and carries out its forms; no HTTP here (see `app.ops.web`)."""

    def __init__(
        self,
        node: PageNode,
        node_id: str,
        *,
        requests: Mapping[TimerAction, Requester] | None = None,
    ) -> None:
        self._node = node
        self.node_id = node_id
        self._requests = dict(requests or _REQUESTS)
        self._notices: OrderedDict[str, str] = OrderedDict()

    # --- GET ---------------------------------------------------------------------------

    async def render(self, query: MultiMapping[str], here: str) -> Rendered:
        """The page; `here` is its path and query, where the forms redirect back to."""
        try:
            owner = _owner_query(query)
            owner_parts = await self._owner(owner) if owner is not None else None
        except BadInput as exc:
            return self.error(400, str(exc))
        node = self._node
        now = node.clock.now()
        health = node.health()
        back = str(URL(here).without_query_params("done"))
        notice = self._notices.get(query.get("done", ""))
        context = {
            "node_id": self.node_id,
            "group": node.settings.group_id,
            "partitions": node.settings.partitions,
            "health": health,
            "now": _time(now),
            "notice": notice,
            "back": back,
            "rows": self._partitions(health),
            "types": sorted(node.types),
            "owner": owner,
            "owner_parts": owner_parts,
            "chart": self._chart(now),
            "chart_seconds": CHART_SECONDS,
            "parked_limit": PARKED_LIMIT,
            "statuses": (TimerStatus.PENDING, TimerStatus.FIRING, TimerStatus.PARKED),
        }
        census, parked = await self._census(set(health["owned"]), now)
        context["census"] = census
        context["parked"] = parked
        context["ledger"] = await self._ledger()
        return Rendered(200, _PAGE.render(context))

    def error(self, status: int, message: str) -> Rendered:
        return Rendered(status, _ERROR.render(status=status, message=message, node=self.node_id))

    def _partitions(self, health: Mapping[str, Any]) -> list[_PartitionRow]:
        owned = set(health["owned"])
        restoring = set(health["restoring"])
        stalled: dict[str, str] = health["stalled"]
        rows = []
        for p in range(self._node.settings.partitions):
            why = stalled.get(str(p), "")
            if p in restoring:
                state, node = ("failed, taken again" if why else "restoring"), self.node_id
            elif p in owned:
                state, node = ("stalled" if why else "running"), self.node_id
            elif why:
                state, node = "failed", self.node_id
            else:
                state, node = "elsewhere", "another node of the group"
            rows.append(_PartitionRow(p, state, why, node))
        return rows

    async def _census(self, owned: set[int], now: int) -> tuple[list[_CensusRow], list[_ParkedRow]]:
        rows: list[_CensusRow] = []
        parked: list[_ParkedRow] = []
        for type_name, kept in sorted(self._node.types.items()):
            for p in sorted(owned):
                try:
                    c = await kept.store.census(p, now, limit=SCAN_LIMIT, parked_limit=PARKED_LIMIT)
                    counts = kept.store.status_counts(p)
                except StoreClosed:
                    continue  # let go while the page was built
                overdue, upcoming = _time(c.oldest_overdue, now), _time(c.next_due, now)
                rows.append(_CensusRow(type_name, p, counts, overdue, upcoming))
                parked += [
                    _ParkedRow(type_name, t, _time(t.slot_due_at, now)) for t in c.parked_timers
                ]
        return rows, parked

    async def _ledger(self) -> list[_LedgerRow]:
        types = sorted(self._node.types)
        rows = []
        for ledger in self._node.ledgers:
            for entry in await ledger.entries():
                name = entry.target.type_name
                # The ledger names the target, not the owner type of the parked timers:
                # the operator picks it (the target's own type first, the usual case).
                default = name if name in types or not types else types[0]
                rows.append(_LedgerRow(entry, types, default))
        return sorted(rows, key=lambda r: (r.entry.subscription, str(r.entry.target)))

    async def _owner(self, owner: tuple[str, str]) -> list[_OwnerPart]:
        owner_id, tenant = owner
        now = self._node.clock.now()
        owned = set(self._node.health()["owned"])
        parts = []
        for type_name, kept in sorted(self._node.types.items()):
            topics = parse_aggregate_type(type_name)
            try:
                ref = AggregateRef(
                    context=topics.context, aggregate=topics.aggregate, tenant=tenant, id=owner_id
                )
            except ValidationError as exc:
                raise BadInput(f"bad owner: {_problems(exc)}") from exc
            p = partition_of(owner_id, self._node.settings.partitions)
            here = p in owned
            timers: list[Timer] = []
            if here:
                try:
                    timers = await kept.store.timers_of(ref)
                except StoreClosed:
                    here = False
            parts.append(
                _OwnerPart(type_name, p, here, [(t, _time(t.slot_due_at, now)) for t in timers])
            )
        return parts

    def _chart(self, now: int) -> _Chart:
        chart = _Chart()
        points: Sequence[LatenessPoint] = self._node.metrics.recent_lateness.recent(
            CHART_SECONDS, now / 1000
        )
        if not points:
            return chart
        top = max(max(p.max_ms for p in points), 1.0)
        plot_w = chart.width - chart.left - 8
        plot_h = chart.height - chart.bottom - 8
        start = now // 1000 - CHART_SECONDS + 1

        def x(second: int) -> float:
            return round(chart.left + (second - start) / (CHART_SECONDS - 1) * plot_w, 1)

        def y(ms: float) -> float:
            return round(8 + plot_h - max(ms, 0.0) / top * plot_h, 1)

        chart.p50 = " ".join(f"{x(p.second)},{y(p.p50_ms)}" for p in points)
        chart.p99 = " ".join(f"{x(p.second)},{y(p.p99_ms)}" for p in points)
        chart.maxes = [(x(p.second), y(p.max_ms)) for p in points]
        # Marks as well as lines: a second alone (no neighbour to draw a line to) shows.
        chart.p99s = [(x(p.second), y(p.p99_ms)) for p in points]
        chart.top = _ms(top)
        chart.points = len(points)
        chart.fired = sum(p.count for p in points)
        chart.worst = _ms(max(p.max_ms for p in points))
        return chart

    # --- POST --------------------------------------------------------------------------

    async def act(self, action: str, form: MultiMapping[object]) -> Acted:
        """Carries out a Retry or Skip form: the request written to Kafka, then a redirect
        back with a confirmation; a 400 page (nothing written) for a bad form."""
        try:
            wanted = TimerAction(action)
            parsed = _form(form)
            if parsed.type not in self._node.types:
                known = ", ".join(sorted(self._node.types)) or "none"
                raise BadInput(f"unknown type {parsed.type!r}: this node keeps timers of {known}")
            target = _target(parsed)
        except (BadInput, ValueError) as exc:
            return Acted(rendered=self.error(400, str(exc)))
        settings = self._node.settings
        try:
            op = await self._requests[wanted](
                settings.bootstrap_servers, parsed.type, target, settings.partitions
            )
        except TickwheelError as exc:
            logger.warning("operator page: %s of %s failed: %s", wanted, target, exc)
            return Acted(rendered=self.error(503, f"{wanted} not requested: {exc}"))
        message = (
            f"{wanted.value.capitalize()} of the timers of {parsed.type} parked on {target} "
            f"requested (request {op.request_id}, {settings.partitions} partition(s)); "
            "the owner of each partition carries it out."
        )
        self._notices[op.request_id] = message
        while len(self._notices) > _NOTICES:
            self._notices.popitem(last=False)
        back = URL(_local(parsed.back)).update_query(done=op.request_id)
        return Acted(location=str(back))


def _owner_query(query: MultiMapping[str]) -> tuple[str, str] | None:
    """`(owner id, tenant)` of an owner search, None when there is none."""
    for name in ("owner", "tenant"):
        if len(query.getall(name, [])) > 1:
            raise BadInput(f"{name} given more than once")
    owner = query.get("owner", "").strip()
    if not owner:
        return None
    tenant = query.get("tenant", "").strip() or DEFAULT_TENANT
    return owner, tenant


def _form(form: MultiMapping[object]) -> OperatorForm:
    fields: dict[str, str] = {}
    for name in form:
        values = form.getall(name)
        if len(values) > 1:
            raise BadInput(f"form field {name!r} given more than once")
        value = values[0]
        if not isinstance(value, str):
            raise BadInput(f"form field {name!r} is not text")
        fields[name] = value.strip()
    if not fields.get("target_tenant"):
        fields.pop("target_tenant", None)
    try:
        return OperatorForm.model_validate(fields)
    except ValidationError as exc:
        raise BadInput(f"bad form: {_problems(exc)}") from exc


def _target(form: OperatorForm) -> AggregateRef:
    try:
        topics = parse_aggregate_type(form.target_type)
    except TickwheelError as exc:
        raise BadInput(f"bad target_type: {exc}") from exc
    try:
        return AggregateRef(
            context=topics.context,
            aggregate=topics.aggregate,
            tenant=form.target_tenant,
            id=form.target_id,
        )
    except ValidationError as exc:
        raise BadInput(f"bad target: {_problems(exc)}") from exc


def _local(back: str) -> str:
    """`back` if it is a path of this server, else the page: a form cannot send the
    browser elsewhere."""
    url = URL(back)
    if url.is_absolute() or not back.startswith("/") or back.startswith("//"):
        return "/"
    return back


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())


def _time(ms: int | None, now: int | None = None) -> str:
    """`2026-12-01 02:30:01.123 UTC`, and how far from now when `now` is given."""
    if ms is None:
        return "—"
    text = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
    if now is None:
        return text
    delta = (ms - now) / 1000
    span = _span(abs(delta))
    return f"{text} ({'in ' + span if delta > 0 else span + ' ago'})"


def _ms(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"


def _span(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


# --- templates ----------------------------------------------------------------------------

_ENV = Environment(autoescape=True, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;margin:.3em 0}
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n{text-align:right}
.notice{background:#e7f6e7;border:1px solid #6b6;padding:.5em;margin:.6em 0}
.error{background:#fbe9e9;border:1px solid #c66;padding:.5em;margin:.6em 0}
.running{color:#060}.restoring{color:#a60}.stalled,.failed,.failed_taken_again{color:#b00}
.elsewhere{color:#777}.muted{color:#777}
form.inline{display:inline;margin:0}button{margin-right:.3em}td.ops{white-space:nowrap}
"""

_PAGE = _ENV.from_string(
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Tickwheel node {{ node_id }}</title><style>"""
    + _STYLE
    + """</style></head><body>
<h1>Tickwheel node {{ node_id }}</h1>
<div class="muted">group {{ group }} · {{ partitions }} partitions · broker
{{ "reachable" if health.broker.reachable else "NOT reachable" }} ·
{{ "ready" if health.ready else "not ready" }} · {{ now }}</div>
{% if notice %}<div class="notice" id="notice">{{ notice }}</div>{% endif %}
{% if health.failed is defined %}<div class="error">failed: {{ health.failed }}</div>{% endif %}

<h2>Find an owner's timers</h2>
<form method="get" action="/" id="search">
<label>owner id <input name="owner" value="{{ owner[0] if owner else '' }}"></label>
<label>tenant <input name="tenant" value="{{ owner[1] if owner else '' }}"
 placeholder="(0)"></label>
<button type="submit">Search</button></form>
{% if owner_parts is not none %}
<table id="owner-timers"><tr><th>type</th><th>partition</th><th>owned by</th><th>key</th>
<th>status</th><th>slot due</th><th>slot</th><th>attempts</th><th>outcome</th>
<th>target</th></tr>
{% for part in owner_parts %}
{% if not part.here %}
<tr><td>{{ part.type_name }}</td><td class="n">{{ part.partition }}</td>
<td colspan="8">another node of group {{ group }} (not this one)</td></tr>
{% elif not part.timers %}
<tr><td>{{ part.type_name }}</td><td class="n">{{ part.partition }}</td><td>{{ node_id }}</td>
<td colspan="7" class="muted">no timers of {{ owner[0] }}</td></tr>
{% else %}
{% for t, due in part.timers %}
<tr><td>{{ part.type_name }}</td><td class="n">{{ part.partition }}</td><td>{{ node_id }}</td>
<td>{{ t.key }}</td><td>{{ t.status.value }}</td><td>{{ due }}</td><td class="n">{{ t.slot }}</td>
<td class="n">{{ t.attempts }}</td><td>{{ t.outcome.value if t.outcome else "—" }}</td>
<td>{{ t.target }}</td></tr>
{% endfor %}
{% endif %}
{% endfor %}
</table>
{% endif %}

<h2>Partitions</h2>
<table id="partitions"><tr><th>partition</th><th>state</th><th>node</th><th>why</th></tr>
{% for r in rows %}
<tr><td class="n">{{ r.partition }}</td>
<td class="{{ r.state.replace(' ', '_').replace(',', '') }}">{{ r.state }}</td>
<td>{{ r.node }}</td><td>{{ r.detail }}</td></tr>
{% endfor %}
</table>

<h2>Timers of this node's partitions</h2>
{% if census %}
<table id="timers"><tr><th>type</th><th>partition</th><th>pending</th><th>firing</th>
<th>parked</th><th>oldest overdue</th><th>next due</th></tr>
{% for r in census %}
<tr><td>{{ r.type_name }}</td><td class="n">{{ r.partition }}</td>
{% for status in statuses %}<td class="n">{{ r.counts[status] }}</td>{% endfor %}
<td>{{ r.overdue }}</td><td>{{ r.next_due }}</td></tr>
{% endfor %}
</table>
{% else %}<p class="muted">This node owns no partition now.</p>{% endif %}

<h2>Parked timers</h2>
{% if parked %}
<table id="parked"><tr><th>type</th><th>partition</th><th>owner</th><th>key</th>
<th>target</th><th>command</th><th>slot due</th><th>attempts</th><th>outcome</th>
<th>operator</th></tr>
{% for r in parked %}
{% set t = r.timer %}
<tr class="parked-timer"><td>{{ r.type_name }}</td><td class="n">{{ t.partition }}</td>
<td>{{ t.owner }}</td><td>{{ t.key }}</td><td>{{ t.target }}</td><td>{{ t.command.type }}</td>
<td>{{ r.slot_due }}</td><td class="n">{{ t.attempts }}</td>
<td>{{ t.outcome.value if t.outcome else "—" }}</td>
<td class="ops"><form class="inline" method="post">
<input type="hidden" name="type" value="{{ r.type_name }}">
<input type="hidden" name="target_type" value="{{ t.target.type_name }}">
<input type="hidden" name="target_tenant" value="{{ t.target.tenant }}">
<input type="hidden" name="target_id" value="{{ t.target.id }}">
<input type="hidden" name="back" value="{{ back }}">
<button type="submit" formaction="/timers/retry">Retry</button>
<button type="submit" formaction="/timers/skip">Skip</button></form></td></tr>
{% endfor %}
</table>
<p class="muted">Retry and Skip act on every timer of the type parked on that target,
in every partition (up to {{ parked_limit }} are listed per partition).</p>
{% else %}<p class="muted">No parked timers in this node's partitions.</p>{% endif %}

<h2>Failure ledger (the whole cluster's)</h2>
{% if ledger %}
<table id="ledger"><tr><th>subscription</th><th>target</th><th>timers</th><th>operator</th></tr>
{% for r in ledger %}
<tr class="ledger-entry"><td>{{ r.entry.subscription }}</td><td>{{ r.entry.target }}</td>
<td>{{ r.entry.timers | join(", ") }}</td>
<td class="ops"><form class="inline" method="post">
<label>owner type <select name="type">
{% for name in r.types %}
<option value="{{ name }}"{{ " selected" if name == r.default_type else "" }}>{{ name }}</option>
{% endfor %}
</select></label>
<input type="hidden" name="target_type" value="{{ r.entry.target.type_name }}">
<input type="hidden" name="target_tenant" value="{{ r.entry.target.tenant }}">
<input type="hidden" name="target_id" value="{{ r.entry.target.id }}">
<input type="hidden" name="back" value="{{ back }}">
<button type="submit" formaction="/timers/retry">Retry</button>
<button type="submit" formaction="/timers/skip">Skip</button></form></td></tr>
{% endfor %}
</table>
{% else %}<p class="muted">The ledger is empty: no parked target.</p>{% endif %}

<h2>Lateness, last {{ chart_seconds // 60 }} minutes</h2>
{% if chart.points %}
<svg id="lateness" xmlns="http://www.w3.org/2000/svg" width="{{ chart.width }}"
 height="{{ chart.height }}" role="img" aria-label="timer lateness per second">
<rect x="{{ chart.left }}" y="8" width="{{ chart.width - chart.left - 8 }}"
 height="{{ chart.height - chart.bottom - 8 }}" fill="#fafafa" stroke="#ccc"/>
<text x="{{ chart.left - 4 }}" y="16" text-anchor="end" font-size="11">{{ chart.top }}</text>
<text x="{{ chart.left - 4 }}" y="{{ chart.height - chart.bottom }}" text-anchor="end"
 font-size="11">0</text>
<text x="{{ chart.left }}" y="{{ chart.height - 6 }}" font-size="11">
-{{ chart_seconds // 60 }} min</text>
<text x="{{ chart.width - 8 }}" y="{{ chart.height - 6 }}" text-anchor="end"
 font-size="11">now</text>
<polyline points="{{ chart.p50 }}" fill="none" stroke="#2a6" stroke-width="1.5"/>
<polyline points="{{ chart.p99 }}" fill="none" stroke="#d62" stroke-width="1.5"/>
{% for cx, cy in chart.maxes %}<circle cx="{{ cx }}" cy="{{ cy }}" r="1.6" fill="#888"/>{% endfor %}
{% for cx, cy in chart.p99s %}<circle cx="{{ cx }}" cy="{{ cy }}" r="1.6" fill="#d62"/>{% endfor %}
</svg>
<div class="muted"><span style="color:#2a6">p50</span> · <span style="color:#d62">p99</span>
· <span style="color:#888">max</span> per second; {{ chart.fired }} timers fired in
{{ chart.points }} second{{ "" if chart.points == 1 else "s" }}, {{ chart.worst }} late at worst.
</div>
{% else %}<p class="muted" id="lateness-empty">No timer fired here in the last
{{ chart_seconds // 60 }} minutes.</p>{% endif %}
</body></html>
"""
)

_ERROR = _ENV.from_string(
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ status }}: Tickwheel node {{ node }}</title>
<style>"""
    + _STYLE
    + """</style></head><body>
<h1>{{ status }}: {{ "bad request" if status == 400 else "not done" }}</h1>
<div class="error" id="error">{{ message }}</div>
<p>Nothing was changed. <a href="/">Back to the page</a></p>
</body></html>
"""
)
