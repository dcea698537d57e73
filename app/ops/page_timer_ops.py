"""What the operator page's Retry and Skip (`POST /timers/retry|skip`) say of the owners'
answers: the request is sent and every partition's answer waited for as by `tickwheel
timers retry|skip` (`app.ops.op_answers.request_answered`), for the page's wait for its
actions (`WebServer`'s `timer_wait_s`, 30 s by default).

Every partition answered and none FAILED: a 303 back to the page, whose confirmation says
what was retried or skipped in all and where (`notice`). Else a page of the outcome, each
partition's answer in a row (`answered_view`): 422 when a partition FAILED (its message:
dead-lettered, perhaps carried out in part, its request id used), 504 when one did not
answer within the wait (the request may still be carried out there), 503 when the broker
did not take it or its answers could not be read (`unsettled_view`). A page where a
partition may not have carried it out holds the form again, under its request id: sent
again, a partition that carried it out answers DUPLICATE and does nothing again.

The form's request id is a hidden field, new at each rendering of the page; a button's
request goes under `<request id>.<action>` (Retry and Skip share the form), as the timers'
and jobs' buttons' commands do (`app.ops.page_actions`). A form without one (a page an
older node rendered) gets a fresh one, which the page of its outcome carries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.kafka.ports import Clients
from app.ops.forms import OperatorForm, new_form_id
from app.ops.op_answers import DONE_WORDS, Answered, changed, partitions_named, timers
from app.protocol.wire import OpOutcome, TimerAction, TimerOp
from app.timers.operator import new_op
from tables import AggregateRef

__all__ = [
    "AnsweredView",
    "Asker",
    "answered_status",
    "answered_view",
    "form_op",
    "notice",
    "unsettled_view",
]

Asker = Callable[[Clients, str, TimerOp, int, float], Awaitable[Answered]]
"""`(clients, owner type, op, partitions, wait_s) -> what came of it`: `request_answered`
of `app.ops.op_answers` (a fake one in some unit tests)."""


@dataclass(frozen=True)
class AnsweredView:
    """The page of a request not answered DONE everywhere (plain text: the template
    escapes it all)."""

    status: int
    title: str
    summary: str
    rows: list[tuple[int, str, str]]
    """(partition, what it answered, its message) of each partition."""
    failed: str
    missing: str
    action: str
    """Where the form is sent again (none when nothing is left to learn)."""
    resend: list[tuple[str, str]]
    """The form's fields, its request id among them."""
    back: str


def form_op(form: OperatorForm, action: TimerAction, target: AggregateRef, now: int) -> TimerOp:
    """The request a form's button sends: under `<form's request id>.<action>` (a fresh
    request id's when the form carries none), `.past-window` after it for a Retry with its
    "past the request-id window" box ticked: the same form sent without it first was
    another request (its refusals are no DUPLICATE of this one). Asked `now` (the node's
    clock)."""
    past = form.past_window and action is TimerAction.RETRY
    base = f"{form.request_id or new_form_id()}.{action}"
    rid = f"{base}.past-window" if past else base
    return new_op(action, target, now, request_id=rid, past_window=past)


def answered_status(answered: Answered) -> int:
    """200 when every partition answered and none FAILED; else, the worst one deciding as
    on the timer and job routes, 422 when one FAILED, 504 when one did not answer."""
    if answered.failed:
        return 422
    return 504 if answered.missing else 200


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def notice(type_name: str, answered: Answered) -> str:
    """The confirmation of a request every partition answered, none FAILED (and how to
    send what a retry refused, if it did)."""
    op = answered.op
    said = _capital(answered.summary(type_name, str(op.target), op.request_id)) + "."
    if answered.refused:
        said += ' Tick "past the request-id window" by Retry to send them.'
    return said


def _title(type_name: str, op: TimerOp) -> str:
    return f"{_capital(op.action.value)} of the timers of {type_name} parked on {op.target}"


def _resend(form: OperatorForm, op: TimerOp) -> list[tuple[str, str]]:
    """The form's fields, under the request id `op` went under (less its `.<action>` and
    `.past-window`)."""
    base = op.request_id.removesuffix(".past-window").removesuffix(f".{op.action}")
    # The box left out unticked, as a browser sends it.
    unset = {"request_id"} if form.past_window else {"request_id", "past_window"}
    fields = form.model_dump(exclude=unset, exclude_none=True)
    return [*((k, str(v)) for k, v in fields.items()), ("request_id", base)]


def _row(answered: Answered, p: int, wait_s: float) -> tuple[int, str, str]:
    a = answered.answers.get(p)
    if a is None:
        return p, f"no answer within {wait_s:g} s", ""
    if a.outcome is OpOutcome.DONE:
        return p, f"DONE: {DONE_WORDS[a.action]} {timers(changed(a))}", ""
    return p, a.outcome.value, a.message


def answered_view(
    type_name: str, answered: Answered, wait_s: float, form: OperatorForm, back: str
) -> AnsweredView:
    """The page of a request a partition FAILED or did not answer (`answered_status`)."""
    op = answered.op
    failed = ""
    if answered.failed:
        failed = (
            f"Failed in {partitions_named(answered.failed)}: dead-lettered, perhaps carried "
            "out in part. Its request id is used: to try again, submit the page's form anew "
            "(it goes under a new request id)."
        )
    missing = ""
    if answered.missing:
        why = f" ({answered.unread})" if answered.unread is not None else ""
        missing = (
            f"No answer within {wait_s:g} s from {partitions_named(answered.missing)} of "
            f"{answered.partitions}{why}: the request may still be carried out there. " + _AGAIN
        )
    return AnsweredView(
        status=answered_status(answered),
        title=_title(type_name, op),
        summary=_capital(answered.summary(type_name, str(op.target), op.request_id)) + ".",
        rows=[_row(answered, p, wait_s) for p in range(answered.partitions)],
        failed=failed,
        missing=missing,
        action=f"/timers/{op.action}" if answered.missing else "",
        resend=_resend(form, op),
        back=back,
    )


def unsettled_view(
    type_name: str, op: TimerOp, why: str, form: OperatorForm, back: str
) -> AnsweredView:
    """The page of a request the broker did not take, or whose answers could not be read
    (503): sent or not, in part perhaps."""
    return AnsweredView(
        status=503,
        title=_title(type_name, op),
        summary=f"{op.action} not sent, or sent and not answered: {why} (request {op.request_id}).",
        rows=[],
        failed="",
        missing="It may have reached some partitions and be carried out there. " + _AGAIN,
        action=f"/timers/{op.action}",
        resend=_resend(form, op),
        back=back,
    )


_AGAIN = (
    "Sending the same form again is safe: it goes under the same request id, so each "
    "partition carries it out at most once, and one that carried it out answers DUPLICATE."
)
