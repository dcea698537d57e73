"""The operator page: one server-rendered HTML page of a node, and its Retry/Skip forms.

`GET /` shows what the node owns and how its partitions are (restoring, running,
stalled), its timers per aggregate type, status and partition (read from its local
timer stores with `TimerStore.census`), its parked timers, the whole cluster's failure
ledger (every node follows the compacted ledger topic whole; the newest entries shown,
`app.ops.page_ledger`), each timer and entry with its last error (why it did not fire,
#22), a search by owner id (`?owner=<id>&tenant=<tenant>`, `app.ops.page_owner`: at most
`OWNER_LIMIT` of each type listed, live ones first) and a chart of timer lateness
over the last minutes.

Retry and Skip are HTML forms posted to `/timers/retry` and `/timers/skip`: they go
through Kafka exactly as `tickwheel timers retry|skip` does (`app.ops.op_answers`), to the
owners of the timers' partitions, whichever nodes they are, and wait for each one's answer.
A good form every partition carried out is answered 303 back to the page with what was
retried or skipped; one a partition FAILED or did not answer with a page of the outcome
(`app.ops.page_timer_ops`: 422, 504); a bad one with a 400 page, and nothing sent.
The timers' and jobs' buttons are `app.ops.page_actions`'s, the chart `app.ops.chart`'s.

Rendering is Jinja2 with autoescaping on: every owner id, key, type and message from the
data is escaped. No JavaScript; the chart is an inline SVG.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from multidict import MultiMapping
from yarl import URL

from app.errors import BadInput, KafkaUnavailable, TickwheelError
from app.kafka.ports import Clients
from app.ops.chart import CHART_SECONDS, lateness_chart
from app.ops.cluster_page import UPCOMING_ROWS, cluster_view, when
from app.ops.cluster_status import ChangelogBusy
from app.ops.forms import (
    TOKEN_FIELD,
    form_target,
    local_path,
    new_form_id,
    owner_query,
    parse_form,
)
from app.ops.letters import Letter
from app.ops.node_report import NodeReport, StatusSource, collect_report, recent_p99
from app.ops.op_answers import request_answered
from app.ops.page_ledger import ledger_rows
from app.ops.page_owner import OWNER_LIMIT, OWNER_SCAN_LIMIT, owner_parts
from app.ops.page_timer_ops import (
    AnsweredView,
    Asker,
    answered_status,
    answered_view,
    form_op,
    notice,
    unsettled_view,
)
from app.ops.timer_api import DEFAULT_WAIT_S
from app.protocol.wire import TimerAction
from tables import AggregateRef
from tables.ledger import FailureLedger
from tables.owner_pick import OwnerTimers

if TYPE_CHECKING:
    from app.node.metrics import NodeMetrics
    from app.ops.page_actions import PageActions

__all__ = [
    "CHART_SECONDS",
    "PARKED_LIMIT",
    "Acted",
    "Asker",
    "ClusterSource",
    "OperatorPage",
    "PageNode",
    "Rendered",
    "default_node_id",
]

logger = logging.getLogger(__name__)

PARKED_LIMIT = 50
"""Parked timers listed per type and partition (all of them are counted)."""

SCAN_LIMIT = 10_000
"""Due-index entries a page load reads per partition for the oldest overdue and next due
times (and parked entries for the list): the scan stays bounded however large the
partition. The counts are the store's own, kept with each write (`status_counts`)."""

LETTERS_LIMIT = 20
"""Records read from the end of each context's dead-letter topic for the page."""

_NOTICES = 100
"""Confirmations kept for the redirect after a POST (the oldest are dropped)."""


# --- what the page reads ------------------------------------------------------------------


class PageNode(StatusSource, Protocol):
    """What the page reads of a `Node` (a fake one in the unit tests): what its report is
    made of, and more."""

    @property
    def ledgers(self) -> list[FailureLedger]: ...

    @property
    def metrics(self) -> NodeMetrics: ...

    @property
    def clients(self) -> Clients:
        """The node's clients of its cluster: the forms' requests are written with them."""
        ...

    def owns(self, type_name: str, p: int) -> bool:
        """Whether the node runs `type_name`'s partition p (its store serves p)."""
        ...


class ClusterSource(Protocol):
    """The group's status as the page reads it (`app.ops.cluster_status.ClusterStatus`;
    `changelog_timers` may raise `ChangelogBusy`)."""

    @property
    def bad_reports(self) -> int: ...

    def reports(self) -> list[NodeReport]: ...

    async def changelog_timers(
        self, type_name: str, partition: int, owner: AggregateRef, limit: int
    ) -> OwnerTimers: ...

    async def recent_letters(self, limit: int) -> list[tuple[str, Letter]]: ...


def default_node_id(port: int) -> str:
    """How the page (and the cluster's status) names its node: host and HTTP port (where
    its page is; none without HTTP), and pid."""
    where = f"{socket.gethostname()}:{port}" if port else socket.gethostname()
    return f"{where} (pid {os.getpid()})"


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


# --- views (plain data handed to the template) --------------------------------------------


# --- the page ----------------------------------------------------------------------------


class OperatorPage:
    """Builds the page of `node` and carries out its forms; no HTTP here (see `app.ops.web`).
    `wait_s`: how long a Retry or Skip waits for the partitions' answers."""

    def __init__(
        self,
        node: PageNode,
        node_id: str,
        *,
        ask: Asker = request_answered,
        wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        self._node = node
        self.node_id = node_id
        self._ask = ask
        self._wait_s = wait_s
        self._notices: OrderedDict[str, str] = OrderedDict()
        self.cluster: ClusterSource | None = None
        """The group's status (set once the node publishes and reads it): without it the
        page shows this node's partitions only."""
        self.actions: PageActions | None = None
        """The timers' and jobs' forms (`app.ops.page_actions`; set by the web edge)."""

    # --- GET ---------------------------------------------------------------------------

    async def render(self, query: MultiMapping[str], here: str) -> Rendered:
        """The page; `here` is its path and query, where the forms redirect back to."""
        node = self._node
        now = node.clock.now()
        own = await collect_report(
            node,
            self.node_id,
            web=None,
            interval_ms=node.settings.status_interval_ms,
            lateness_p99_ms=recent_p99(node.metrics.recent_lateness, now),
            scan_limit=SCAN_LIMIT,
            parked_limit=PARKED_LIMIT,
            parked_total=None,  # never written: every listed one of this node's partitions
            upcoming_limit=UPCOMING_ROWS,
        )
        cluster = self.cluster
        others = cluster.reports() if cluster is not None else []
        view = cluster_view(own, others, node.settings.partitions, now, known=cluster is not None)
        try:
            owner = owner_query(query)
            parts = None if owner is None else await owner_parts(node, cluster, owner, view)
        except BadInput as exc:
            return self.error(400, str(exc))
        except ChangelogBusy as exc:
            return self.error(503, str(exc))
        health = node.health()
        back = str(URL(here).without_query_params("done"))
        notice = self._notices.get(query.get("done", ""))
        context = {
            "node_id": self.node_id,
            "group": node.settings.group_id,
            "partitions": node.settings.partitions,
            "health": health,
            "now": when(now),
            "notice": notice,
            "back": back,
            "rows": view.partitions,
            "census": view.census,
            "parked": view.parked,
            "upcoming": view.upcoming,
            "jobs": view.jobs,
            "nodes": view.nodes,
            "cluster_known": cluster is not None,
            "bad_reports": cluster.bad_reports if cluster is not None else 0,
            "types": sorted(node.types),
            "owner": owner,
            "owner_parts": parts,
            "chart": lateness_chart(node.metrics.recent_lateness, now),
            "chart_seconds": CHART_SECONDS,
            "parked_limit": PARKED_LIMIT,
            "owner_limit": OWNER_LIMIT,
            "owner_scan_limit": OWNER_SCAN_LIMIT,
            "new_id": new_form_id,
            **(await self.actions.context(view.jobs) if self.actions is not None else _NO_ACTIONS),
        }
        # The newest entries only (`app.ops.page_ledger`): the ledger may hold thousands.
        context["ledger"] = await ledger_rows(self._node.ledgers, sorted(node.types))
        context["letters"], context["letters_error"] = await self._letters()
        context["letters_limit"] = LETTERS_LIMIT
        return Rendered(200, _PAGE.render(context))

    def error(self, status: int, message: str) -> Rendered:
        return Rendered(status, _ERROR.render(status=status, message=message, node=self.node_id))

    def token_form(
        self, action: str, fields: Sequence[tuple[str, str]], *, wrong: bool
    ) -> Rendered:
        """The 401 page of a form posted without the node's web token (or a wrong one): it
        asks for the token and posts the same form to `action` again, with it."""
        html = _TOKEN.render(
            action=action,
            fields=fields,
            wrong=wrong,
            node=self.node_id,
            token_field=TOKEN_FIELD,
        )
        return Rendered(401, html)

    async def _letters(self) -> tuple[list[tuple[str, Letter, str]], str]:
        """The latest dead letters of the node's contexts (read from Kafka: any node's
        page shows them all), or why they could not be read."""
        if self.cluster is None:
            return [], ""
        try:
            found = await self.cluster.recent_letters(LETTERS_LIMIT)
        except KafkaUnavailable as exc:
            return [], f"the dead letters were not read: {exc}"
        return [(topic, x, when(x.timestamp)) for topic, x in found], ""

    # --- POST --------------------------------------------------------------------------

    async def act(self, action: str, form: MultiMapping[object]) -> Acted:
        """Carries out a Retry or Skip form: the request sent and the partitions' answers
        waited for, then a redirect back with what was done, or a page of the outcome
        (`app.ops.page_timer_ops`); a 400 page (nothing sent) for a bad form."""
        try:
            wanted = TimerAction(action)
            parsed = parse_form(form)
            if parsed.type not in self._node.types:
                known = ", ".join(sorted(self._node.types)) or "none"
                raise BadInput(f"unknown type {parsed.type!r}: this node keeps timers of {known}")
            op = form_op(parsed, wanted, form_target(parsed), self._node.clock.now())
        except (BadInput, ValueError) as exc:
            return Acted(rendered=self.error(400, str(exc)))
        partitions, back = self._node.settings.partitions, local_path(parsed.back)
        try:
            answered = await self._ask(
                self._node.clients, parsed.type, op, partitions, self._wait_s
            )
        except (TickwheelError, TimeoutError) as exc:
            logger.warning("operator page: %s of %s failed: %s", wanted, op.target, exc)
            why = str(exc) or type(exc).__name__
            return self._answered(unsettled_view(parsed.type, op, why, parsed, back))
        if answered_status(answered) == 200:
            return self.confirm(op.request_id, notice(parsed.type, answered), parsed.back)
        return self._answered(answered_view(parsed.type, answered, self._wait_s, parsed, back))

    def _answered(self, view: AnsweredView) -> Acted:
        html = _ANSWERED.render(view=view, node=self.node_id)
        return Acted(rendered=Rendered(view.status, html))

    def confirm(self, request_id: str, message: str, back: str) -> Acted:
        """A form's 303 back to the page (`back`, if it is this server's) with `message`."""
        self._notices[request_id] = message
        while len(self._notices) > _NOTICES:
            self._notices.popitem(last=False)
        return Acted(location=str(URL(local_path(back)).update_query(done=request_id)))

    def bad(self, message: str) -> Acted:
        return Acted(rendered=self.error(400, message))

    def refused(self, status: int, message: str) -> Acted:
        return Acted(rendered=self.error(status, message))

    def unavailable(self, message: str) -> Acted:
        return Acted(rendered=self.error(503, message))


_NO_ACTIONS: dict[str, Any] = {"books": frozenset(), "declared": []}


# --- templates (app/ops/templates: the page, the error page and their style) ---------

_ENV = Environment(
    loader=PackageLoader("app.ops", "templates"),
    autoescape=select_autoescape(["html"]),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_PAGE = _ENV.get_template("page.html")
_ERROR = _ENV.get_template("error.html")
_TOKEN = _ENV.get_template("token.html")
_ANSWERED = _ENV.get_template("answered.html")
