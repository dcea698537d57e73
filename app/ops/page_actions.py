"""The operator page's action forms (#22): Pause, Resume, Trigger now and Cancel of a timer
of a timer book (in the owner search's results), Trigger, Enable and Disable of a declared
job (in the jobs section).

They are HTML forms (the page runs no JavaScript) posted to `POST /page/timer` and
`POST /page/job` under the same guard as Retry and Skip (`app.ops.action_guard`: the web
token, the page's own origin). Each is carried out as the JSON routes carry it out
(`app.ops.timer_api.key_command|cancel_command` and `submit`; `app.ops.job_api.
instance_commands` and `send_and_wait`): a command to the book's or the schedule's command
topic, in its owner's partition, taken by whichever node owns that partition, and the
answer read from the results topic. A good form is answered 303 back to the page with a
confirmation (the command's result code); a bad one with a 400 page naming the field, and
nothing sent; a Pause, Resume or Trigger of a timer this node's table holds FIRED or
CANCELLED with a 409 page, nothing sent (`timer_routes.ended_row`, as the JSON route).

Each form carries a request id (a hidden field, new at each rendering of the page); a
button's command goes under `<request id>.<action>` (a job's under `<action>:<request id>`,
`action_request_id`, as the CLI and the HTTP routes send a job's), so a form submitted
twice (a double click, a reload of the POST) is the same command twice, which the book or
the schedule answers DUPLICATE and writes nothing for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from multidict import MultiMapping
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.errors import BadInput, KafkaUnavailable
from app.jobs import SCHEDULE, action_request_id, instance_ids
from app.ops import job_api
from app.ops.cluster_page import JobRow
from app.ops.deadline import reader_for
from app.ops.forms import new_form_id, problems
from app.ops.job_api import JobInputError, json_field
from app.ops.timer_api import (
    DONE,
    BadRequest,
    cancel_command,
    is_book,
    key_command,
    owner_ref,
    submit,
)
from app.ops.timer_routes import ended_row, kept_row
from app.protocol.wire import CommandResult
from tables import DEFAULT_TENANT, TimerStatus

if TYPE_CHECKING:
    from app.node import Node
    from app.ops.page import Acted, OperatorPage

__all__ = [
    "JOB_BUTTONS",
    "JOB_FORM",
    "TIMER_BUTTONS",
    "TIMER_FORM",
    "DeclaredJob",
    "JobForm",
    "PageActions",
    "TimerForm",
    "buttons_of",
    "new_form_id",
]

logger = logging.getLogger(__name__)

TIMER_FORM = "/page/timer"
JOB_FORM = "/page/job"

TIMER_BUTTONS = ("pause", "resume", "trigger", "cancel")
JOB_BUTTONS = ("trigger", "enable", "disable")

_M = TypeVar("_M", bound=BaseModel)
_ENDED = frozenset({TimerStatus.FIRED, TimerStatus.CANCELLED})


class TimerForm(BaseModel):
    """A timer's form: which button, the book, its owner (id, tenant), the timer's key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["pause", "resume", "trigger", "cancel"]
    type: str = Field(min_length=1, description="the timer book, <context>.<book>")
    owner: str = Field(min_length=1)
    tenant: str = Field(default=DEFAULT_TENANT, min_length=1)
    key: str = Field(min_length=1)
    request_id: str = Field(min_length=1, max_length=100)
    back: str = "/"


class JobForm(BaseModel):
    """A job's form: which button, the job's context and name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["trigger", "enable", "disable"]
    context: str = Field(min_length=1)
    job: str = Field(min_length=1)
    request_id: str = Field(min_length=1, max_length=100)
    back: str = "/"


@dataclass(frozen=True)
class DeclaredJob:
    """A row of the jobs section: a job the service declares, and its instances' next slot
    as the group's reports show their timers."""

    context: str
    name: str
    scope: str
    rule: str
    instances: int
    next_due: str
    statuses: str
    nodes: str


def buttons_of(status: TimerStatus) -> list[tuple[str, str]]:
    """`(action, label)` of the buttons a timer in `status` gets: none once it ended."""
    if status in _ENDED:
        return []
    hold = ("resume", "Resume") if status is TimerStatus.PAUSED else ("pause", "Pause")
    return [hold, ("trigger", "Trigger now"), ("cancel", "Cancel")]


def read_form(model: type[_M], form: MultiMapping[object]) -> _M:
    """`form` as `model`; `BadInput` naming the field that is wrong (given twice, not text,
    missing, unknown or invalid)."""
    fields: dict[str, str] = {}
    for name in form:
        values = form.getall(name)
        if len(values) > 1:
            raise BadInput(f"form field {name!r} given more than once")
        if not isinstance(values[0], str):
            raise BadInput(f"form field {name!r} is not text")
        fields[name] = values[0].strip()
    if not fields.get("tenant") and model is TimerForm:
        fields.pop("tenant", None)
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise BadInput(f"bad form: {problems(exc)}") from exc


def declared_jobs(node: Node, rows: list[JobRow]) -> list[DeclaredJob]:
    """Every job of the node's service, with what the reports' job timers say of it."""
    n = node.settings.partitions
    out = []
    for context in sorted(node.service.jobs):
        for job in node.service.jobs[context]:
            ids = instance_ids(context, job, n)
            mine = [
                r
                for r in rows
                if r.timer.owner.context == context
                and r.timer.owner.aggregate == SCHEDULE
                and r.timer.owner.id in ids
            ]
            live = [r for r in mine if r.timer.status not in _ENDED]
            nearest = min(live, key=lambda r: r.timer.slot_due_at) if live else None
            counts: dict[str, int] = {}
            for r in mine:
                counts[r.timer.status.value] = counts.get(r.timer.status.value, 0) + 1
            out.append(
                DeclaredJob(
                    context=context,
                    name=job.name,
                    scope=job.scope.value,
                    rule=job.rule.model_dump_json(exclude_none=True),
                    instances=len(ids),
                    next_due=nearest.due if nearest is not None else "",
                    statuses=", ".join(f"{k} x{v}" for k, v in sorted(counts.items())),
                    nodes=", ".join(sorted({r.node for r in mine})),
                )
            )
    return out


class PageActions:
    """The forms' handlers over a node; `wait_s`: how long one waits for its answer."""

    def __init__(self, node: Node, page: OperatorPage, wait_s: float) -> None:
        self._node = node
        self._page = page
        self._wait_s = wait_s

    def books(self) -> frozenset[str]:
        return frozenset(n for n, a in self._node.aggregates.items() if is_book(a))

    async def context(self, jobs: list[JobRow]) -> Mapping[str, Any]:
        """What the page's template needs of the forms. The declared jobs in a thread: a
        SHARDED job's ids are found on their first listing, about partitions**2 hash calls
        (seconds for 1,024 partitions), which would hold up the loop."""
        return {
            "books": self.books(),
            "declared": await asyncio.to_thread(declared_jobs, self._node, jobs),
            "new_id": new_form_id,
            "buttons_of": buttons_of,
            "timer_form": TIMER_FORM,
            "job_form": JOB_FORM,
        }

    async def timer(self, form: MultiMapping[object]) -> Acted:
        try:
            f = read_form(TimerForm, form)
            if f.type not in self.books():
                known = ", ".join(sorted(self.books())) or "none"
                raise BadInput(f"type: {f.type} is no timer book of this node (its books: {known})")
            owner = owner_ref(f.type, f.owner, f.tenant)
            rid = f"{f.request_id}.{f.action}"
            now = self._node.clock.now()  # the node's, which decides the command
            if f.action == "cancel":
                cmd = cancel_command(owner, f.key, rid, now)
            else:
                cmd = key_command(f.action, owner, f.key, rid, now)
        except BadRequest as exc:
            return self._page.bad(f"bad form: {exc.field}: {exc.message}")
        except BadInput as exc:
            return self._page.bad(str(exc))
        what = f"{_LABELS[f.action]} of {owner}'s timer {f.key!r}"
        node = self._node
        # As the JSON route: a timer this node's table holds ended (a stale page's form,
        # another operator's skip or cancel since) is refused unsent; the book, which never
        # learns of a skip, would send a skipped timer's command again. A cancel goes (as
        # a DELETE does): it drops the key from the book too.
        held = None
        if f.action != "cancel":
            held = ended_row(node, owner, await kept_row(node, owner, f.key), cmd.request_id)
        if held is not None:
            return self._page.refused(
                409,
                f"{what}: {owner}'s timer {f.key!r} is {held.status}: nothing to "
                f"{f.action} (set it again to start it anew); nothing was sent.",
            )
        try:
            # The wait bounds the reader's stop too (`reader_for`), as the routes' does.
            async with reader_for(node.clients, self._wait_s) as reader:
                result = await submit(
                    node.producer, reader, cmd, node.settings.partitions, self._wait_s
                )
        except KafkaUnavailable as exc:
            return self._unsent(what, exc)
        return self._page.confirm(rid, _said(what, rid, [result], self._wait_s), f.back)

    async def job(self, form: MultiMapping[object]) -> Acted:
        node = self._node
        try:
            f = read_form(JobForm, form)
            job = job_api.find_job(node.service, f.context, f.job)
            # The action's own id, as the CLI and the HTTP routes make it: the form's id
            # reused for another action is not its DUPLICATE.
            rid = action_request_id(f.action, f.request_id)
            commands = job_api.instance_commands(
                f.action,
                f.context,
                job,
                partitions=node.settings.partitions,
                request_id=f.request_id,
                spell=json_field,
                now=node.clock.now(),
            )
        except JobInputError as exc:
            return self._page.bad(f"bad form: {exc.field}: {exc}")
        except BadInput as exc:
            return self._page.bad(str(exc))
        what = f"{_LABELS[f.action]} of job {f.context}/{f.job} ({len(commands)} instance(s))"
        try:
            async with reader_for(node.clients, self._wait_s) as reader:
                got = await job_api.send_and_wait(
                    node.producer, reader, node.settings.partitions, commands, self._wait_s
                )
        except KafkaUnavailable as exc:
            return self._unsent(what, exc)
        results = [got.get(c.request_id) for c in commands]
        return self._page.confirm(rid, _said(what, rid, results, self._wait_s), f.back)

    def _unsent(self, what: str, exc: Exception) -> Acted:
        logger.warning("operator page: %s failed: %s", what, exc)
        return self._page.unavailable(
            f"{what} not sent or not answered: {exc}; submit the form again (it is sent under "
            "the same request id, so it is carried out once)"
        )


_LABELS = {
    "pause": "Pause",
    "resume": "Resume",
    "trigger": "Trigger",
    "cancel": "Cancel",
    "enable": "Enable",
    "disable": "Disable",
}


def _said(what: str, rid: str, results: list[CommandResult | None], wait_s: float) -> str:
    """The confirmation of a form's commands by their results."""
    codes = [r.code.value if r is not None else "no answer yet" for r in results]
    summary = ", ".join(dict.fromkeys(codes))
    done = all(r is not None and r.code in DONE for r in results)
    refused = [r.reason for r in results if r is not None and r.code not in DONE and r.reason]
    text = f"{what}: {summary} (request {rid})"
    if done:
        return text + "; carried out by the owner of its partition."
    if any(r is None for r in results):
        text += f"; not answered in {wait_s:g} s, it may still be carried out"
    if refused:
        text += f"; {refused[0]}"
    return text + "."
