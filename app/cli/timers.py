"""`tickwheel timers …`: operator commands on timers and the failure ledger.

The read-only commands (`list`, `upcoming`, `show`, `ledger`, and `tickwheel jobs list --state`,
`tickwheel rebuild --dry-run`) never create a topic: one that is not there is an error
that names it (exit code 1). `retry` and `skip` write requests to the timer-ops topic the
workers make and create none either (not there: an error naming it, exit 1, nothing sent);
one sent again under its `--request-id` within the workers' de-duplication window is
carried out once (`app.timers.applied_ops`). They wait
(`--wait`) for each partition's owner to answer what it did (`app.cli.timer_op_answers`).
`set` and `cancel` (`app.cli.timer_changes`) send a timer book its commands and create nothing.
"""

from __future__ import annotations

import logging
import shlex
import uuid
from typing import Annotated

import orjson
import typer
from pydantic import ValidationError

from app.cli.common import (
    CONFIG_ERROR,
    Bootstrap,
    Json,
    Partitions,
    checked,
    clients_for,
    context_name,
    fail,
    json_line,
    request_id_check,
    run,
    settings_for,
    time_iso,
    unsettled,
)
from app.cli.text import printable
from app.cli.timer_op_answers import say_answered
from app.errors import TickwheelError
from app.node.settings import Settings
from app.ops.op_answers import Answered, request_answered
from app.ops.timer_api import DEFAULT_WAIT_S
from app.ops.upcoming import DEFAULT_LIMIT, MAX_LIMIT, BadQuery, query_of, upcoming_page
from app.protocol.instants import BadInstant, parse_instant
from app.protocol.topics import parse_aggregate_type
from app.protocol.wire import TimerAction
from app.timers.ledger import read_ledger
from app.timers.operator import (
    TimerHistory,
    new_op,
    read_timer_history,
    read_timers,
)
from tables.ledger import LedgerEntry
from tables.refs import DEFAULT_TENANT, AggregateRef
from tables.timer import Timer, TimerStatus

__all__ = ["timers_cli"]

timers_cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
logger = logging.getLogger(__name__)


TypeName = Annotated[
    str, typer.Option("--type", help="the timers' owner type, <context>.<aggregate>")
]


def _error(holder: Timer | LedgerEntry) -> str:
    """A row's (or a ledger entry's) last error as a tab-led column, its text quoted as
    JSON (it may hold tabs and newlines); nothing when it has none (#22)."""
    if holder.error_code is None:
        return ""
    text = "" if holder.error_text is None else " " + orjson.dumps(holder.error_text).decode()
    # JSON leaves DEL, C1 controls and U+2028 as they are.
    return f"\terror {printable(holder.error_code + text)}"


def _shown(*fields: object) -> list[str]:
    """`fields` as text to print: what a row or an entry holds is another writer's (or an
    older version's, before new input was checked), and its control characters, a line
    break or an escape sequence, would forge a line or act on the terminal."""
    return [printable(str(f)) for f in fields]


def _type(name: str) -> str:
    try:
        return parse_aggregate_type(name).type_name
    except TickwheelError as exc:  # a value --type cannot take, as a bad option
        raise fail(str(exc), CONFIG_ERROR) from exc


def _target(type_name: str, target_id: str, tenant: str, target_type: str | None) -> AggregateRef:
    topics = parse_aggregate_type(_type(target_type or type_name))
    try:
        return AggregateRef(
            context=topics.context, aggregate=topics.aggregate, tenant=tenant, id=target_id
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise fail(f"bad target: {problems}", CONFIG_ERROR) from exc


@timers_cli.command()
def ledger(
    context: Annotated[str, typer.Option(help="the bounded context whose ledger to read")],
    bootstrap: Bootstrap = None,
    as_json: Json = False,
) -> None:
    """Prints the open entries of a context's failure ledger: the parked targets (every
    partition of its topic, however many it has)."""
    settings = settings_for(bootstrap, None)
    entries: list[LedgerEntry] = run(
        checked(settings.kafka, read_ledger(clients_for(settings), context_name(context)))
    )
    for e in entries:
        if as_json:
            json_line(e.model_dump(mode="json"))
        else:
            subscription, target, timers = _shown(e.subscription, e.target, ", ".join(e.timers))
            typer.echo(
                f"{subscription}\t{target}\t{len(e.timers)}{'+' if e.truncated else ''}"
                f" timer(s): {timers}{', and more' if e.truncated else ''}{_error(e)}"
            )
    if not as_json:
        typer.echo(f"{len(entries)} open entr{'y' if len(entries) == 1 else 'ies'}", err=True)


def _request(
    action: str,
    type_name: str,
    target: AggregateRef,
    settings: Settings,
    as_json: bool,
    request_id: str | None,
    wait: float,
    past_window: bool = False,
) -> None:
    if request_id is not None and not 1 <= len(request_id) <= MAX_OP_REQUEST_ID:
        raise fail(f"--request-id must be 1-{MAX_OP_REQUEST_ID} characters", CONFIG_ERROR)
    # Made here, so that a send that fails can say it: sent again under it, the workers
    # carry it out once (`app.timers.applied_ops`); under a fresh one, twice.
    op = new_op(
        TimerAction(action),
        target,
        request_id=request_id or uuid.uuid4().hex,
        past_window=past_window,
    )
    sent = request_answered(clients_for(settings), type_name, op, settings.partitions, wait)
    resend = (
        f"send it again with --request-id {shlex.quote(op.request_id)} (under its request id "
        "each partition carries it out at most once)"
    )
    answered: Answered = run(checked(settings.kafka, unsettled(sent, resend)))
    say_answered(type_name, answered, wait, as_json)


TargetId = Annotated[str, typer.Option(help="the id of the target the timers send to")]
TargetTenant = Annotated[str, typer.Option(help="the target's tenant")]
TargetType = Annotated[
    str | None, typer.Option(help="the target's type when not --type, <context>.<aggregate>")
]
MAX_OP_REQUEST_ID = 200
"""A timer-op's request id's longest (`TimerOp.request_id`)."""
OpRequestId = Annotated[
    str | None,
    typer.Option(
        callback=request_id_check(MAX_OP_REQUEST_ID),
        help="names this request: sent again with it (within the workers' de-duplication "
        "window), each partition carries it out once (new)",
    ),
]
OpWait = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        max=600,
        help="seconds to wait for every partition's answer; 0: send and do not wait",
    ),
]


PastWindow = Annotated[
    bool,
    typer.Option(
        "--past-window",
        help="also the timers whose slot was due longer ago than "
        "TICKWHEEL_REQUEST_ID_WINDOW_MS less expires_after (at most a day), which are "
        "otherwise left parked: their target may have applied the slot and forgotten its "
        "request id, and then applies it again",
    ),
]


@timers_cli.command()
def retry(
    type_name: TypeName,
    target_id: TargetId,
    tenant: TargetTenant = DEFAULT_TENANT,
    target_type: TargetType = None,
    request_id: OpRequestId = None,
    wait: OpWait = DEFAULT_WAIT_S,
    past_window: PastWindow = False,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    as_json: Json = False,
) -> None:
    """Sends the PARKED timers of a target again, due now with their attempts reset; those
    whose slot is past the request-id window only with --past-window (exit 1 otherwise)."""
    settings = settings_for(bootstrap, partitions)
    type_name = _type(type_name)
    target = _target(type_name, target_id, tenant, target_type)
    _request("retry", type_name, target, settings, as_json, request_id, wait, past_window)


@timers_cli.command()
def skip(
    type_name: TypeName,
    target_id: TargetId,
    tenant: TargetTenant = DEFAULT_TENANT,
    target_type: TargetType = None,
    request_id: OpRequestId = None,
    wait: OpWait = DEFAULT_WAIT_S,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    as_json: Json = False,
) -> None:
    """Cancels the PARKED timers of a target with the outcome SKIPPED."""
    settings = settings_for(bootstrap, partitions)
    type_name = _type(type_name)
    target = _target(type_name, target_id, tenant, target_type)
    _request("skip", type_name, target, settings, as_json, request_id, wait)


@timers_cli.command("list")
def list_(
    type_name: TypeName,
    status: Annotated[
        str | None, typer.Option(help="only timers in this status, e.g. PARKED")
    ] = None,
    bootstrap: Bootstrap = None,
    as_json: Json = False,
) -> None:
    """Prints the timers of an owner type as its timer table's changelog has them (every
    partition of the changelog, however many it has)."""
    settings = settings_for(bootstrap, None)
    type_name = _type(type_name)
    wanted: TimerStatus | None = None
    if status is not None:
        try:
            wanted = TimerStatus(status.upper())
        except ValueError as exc:
            known = ", ".join(s.value for s in TimerStatus)
            raise fail(f"unknown status {status!r}: one of {known}", CONFIG_ERROR) from exc
    timers: list[Timer] = run(
        checked(settings.kafka, read_timers(clients_for(settings), type_name, status=wanted))
    )
    for t in timers:
        if as_json:
            json_line(t.model_dump(mode="json"))
        else:
            owner, key, request_id, target, command = _shown(
                t.owner, t.key, t.request_id, t.target, t.command.type
            )
            typer.echo(
                f"{t.partition}\t{t.status}\t{owner}\t{key}\t{request_id}\t"
                f"due {time_iso(t.due_at)}\tslot due {time_iso(t.slot_due_at)}\t"
                f"attempts {t.attempts}\t{t.outcome or '-'}\t-> {target} {command}{_error(t)}"
            )
    if not as_json:
        typer.echo(f"{len(timers)} timer(s)", err=True)


@timers_cli.command()
def upcoming(
    type_name: TypeName,
    owner: Annotated[str | None, typer.Option(help="only this owner's (its id)")] = None,
    tenant: Annotated[str | None, typer.Option(help="only owners of this tenant")] = None,
    target: Annotated[str | None, typer.Option(help="only timers sending to this id")] = None,
    target_type: Annotated[
        str | None, typer.Option(help="only timers sending to this type, <context>.<aggregate>")
    ] = None,
    due_from: Annotated[
        str | None, typer.Option(help="due at or after: ISO 8601 with offset, or epoch ms")
    ] = None,
    due_until: Annotated[
        str | None, typer.Option(help="due at or before: ISO 8601 with offset, or epoch ms")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=MAX_LIMIT)] = DEFAULT_LIMIT,
    cursor: Annotated[
        str | None, typer.Option(help="a page's next cursor: the page after it")
    ] = None,
    bootstrap: Bootstrap = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="the page as one JSON object: timers and next_cursor"),
    ] = False,
) -> None:
    """Prints the PENDING and FIRING timers of an owner type by due time, earliest first
    (every partition of its changelog): a page of --limit, and the cursor of the next."""
    settings = settings_for(bootstrap, None)
    type_name = _type(type_name)
    given = {
        "type": type_name,
        "owner": owner,
        "tenant": tenant,
        "target": target,
        "target_type": None if target_type is None else _type(target_type),
        "due_from": due_from,
        "due_until": due_until,
        "limit": str(limit),
        "cursor": cursor,
    }
    try:
        for option, value in (("--due-from", due_from), ("--due-until", due_until)):
            if value is not None:  # named as the command line spells it
                given[option[2:].replace("-", "_")] = str(parse_instant(value, option))
        query = query_of({k: v for k, v in given.items() if v is not None})
    except (BadQuery, BadInstant) as exc:
        raise fail(str(exc), CONFIG_ERROR) from exc
    timers: list[Timer] = run(
        checked(settings.kafka, read_timers(clients_for(settings), type_name))
    )
    page = upcoming_page(timers, query)
    if as_json:
        json_line(page.model_dump(mode="json"))
        return
    for t in page.timers:
        owner, key, target, command, id_ = _shown(t.owner, t.key, t.target, t.command.type, t.id)
        typer.echo(
            f"{time_iso(t.due_at)}\t{t.status}\t{owner}\t{key}\t-> {target} "
            f"{command}\tslot {t.slot}\tattempts {t.attempts}\t{t.partition}\t{id_}"
        )
    more = f"; next page: --cursor {page.next_cursor}" if page.next_cursor else ""
    typer.echo(f"{len(page.timers)} timer(s){more}", err=True)


def _version_line(offset: int, timestamp: int, row: Timer | None) -> str:
    if row is None:
        return f"  @{offset}\t{time_iso(timestamp)}\tdeleted"
    return (
        f"  @{offset}\t{time_iso(timestamp)}\t{row.status}\tslot {row.slot}\t"
        f"slot due {time_iso(row.slot_due_at)}\tdue {time_iso(row.due_at)}\t"
        f"attempts {row.attempts}\t{row.outcome or '-'}\tid {printable(row.id)}{_error(row)}"
    )


@timers_cli.command()
def show(
    type_name: TypeName,
    owner_id: Annotated[str, typer.Option("--owner", help="the id of the timers' owner")],
    key: Annotated[str | None, typer.Option(help="only the owner's timer of this key")] = None,
    tenant: Annotated[str, typer.Option(help="the owner's tenant")] = DEFAULT_TENANT,
    bootstrap: Bootstrap = None,
    as_json: Json = False,
) -> None:
    """Prints an owner's timers (or one): each one's row now and the versions its
    changelog's committed records hold, oldest first."""
    settings = settings_for(bootstrap, None)
    topics = parse_aggregate_type(_type(type_name))
    try:
        owner = AggregateRef(
            context=topics.context, aggregate=topics.aggregate, tenant=tenant, id=owner_id
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise fail(f"bad owner: {problems}", CONFIG_ERROR) from exc
    history: TimerHistory = run(
        checked(settings.kafka, read_timer_history(clients_for(settings), owner, key))
    )
    if as_json:
        for versions in history.versions.values():
            for v in versions:
                json_line(v.model_dump(mode="json"))
        return
    typer.echo(
        f"{printable(str(owner))}: {len(history.versions)} timer(s) in "
        f"{history.topic}[{history.partition}] "
        "(committed records; compaction keeps each timer's last version, older ones until "
        "it runs)"
    )
    for name, versions in history.versions.items():
        now = history.current(name)
        if now is None:
            typer.echo(f"{printable(name)}: deleted")
        else:
            key, target, command, rule = _shown(
                name, now.target, now.command.type, now.rule.model_dump_json()
            )
            typer.echo(
                f"{key}: {now.status}\tslot {now.slot}\tdue {time_iso(now.due_at)}\t"
                f"attempts {now.attempts}\t{now.outcome or '-'}\t-> {target} "
                f"{command}\trule {rule}{_error(now)}"
            )
        for v in versions:
            typer.echo(_version_line(v.offset, v.timestamp, v.row))
