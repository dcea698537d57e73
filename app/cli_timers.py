"""`tickwheel timers …`: operator commands on timers and the failure ledger.

The read-only commands (`list`, `show`, `ledger`, and `tickwheel jobs list --state`,
`tickwheel rebuild --dry-run`) never create a topic: one that is not there is an error
that names it (exit code 1). `retry` and `skip` write requests, and create the timer-ops
topic as a worker would.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import orjson
import typer
from pydantic import ValidationError

from app.exceptions import TickwheelError
from app.ledger import read_ledger
from app.operator import (
    TimerHistory,
    TimerOp,
    read_timer_history,
    read_timers,
    request_retry,
    request_skip,
)
from app.settings import Settings
from app.topics import parse_aggregate_type
from tables.ledger import LedgerEntry
from tables.refs import DEFAULT_TENANT, AggregateRef
from tables.timer import Timer, TimerStatus

__all__ = ["timers_cli"]

timers_cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
logger = logging.getLogger(__name__)

T = TypeVar("T")

Bootstrap = Annotated[str | None, typer.Option(help="overrides KAFKA_BOOTSTRAP_SERVERS")]
Partitions = Annotated[
    int | None, typer.Option(min=1, max=1024, help="overrides TICKWHEEL_PARTITIONS")
]
TypeName = Annotated[
    str, typer.Option("--type", help="the timers' owner type, <context>.<aggregate>")
]
Json = Annotated[bool, typer.Option("--json", help="one JSON object per line")]

_CONTEXT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]*$")


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _settings(bootstrap: str | None, partitions: int | None) -> Settings:
    try:
        return Settings.from_env(None, bootstrap_servers=bootstrap, partitions=partitions)
    except TickwheelError as exc:
        raise _fail(str(exc)) from exc


def _run(work: Coroutine[Any, Any, T]) -> T:
    """Runs `work`; the project's errors (a broker not there, a bad name) end the command
    with exit code 1 and their message, never a traceback."""
    # aiokafka logs every failed connection attempt; the error below says it once.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        return asyncio.run(work)
    except TickwheelError as exc:
        raise _fail(str(exc)) from exc


def _type(name: str) -> str:
    try:
        return parse_aggregate_type(name).type_name
    except TickwheelError as exc:
        raise _fail(str(exc)) from exc


def _target(type_name: str, target_id: str, tenant: str, target_type: str | None) -> AggregateRef:
    topics = parse_aggregate_type(_type(target_type or type_name))
    try:
        return AggregateRef(
            context=topics.context, aggregate=topics.aggregate, tenant=tenant, id=target_id
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise _fail(f"bad target: {problems}") from exc


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _json_line(data: object) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode() + "\n")


@timers_cli.command()
def ledger(
    context: Annotated[str, typer.Option(help="the bounded context whose ledger to read")],
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    as_json: Json = False,
) -> None:
    """Prints the open entries of a context's failure ledger: the parked targets."""
    settings = _settings(bootstrap, partitions)
    if not _CONTEXT.match(context):
        raise _fail(f"context {context!r} must be letters, digits, '_' or '-'")
    entries: list[LedgerEntry] = _run(read_ledger(settings.bootstrap_servers, context))
    for e in entries:
        if as_json:
            _json_line(e.model_dump(mode="json"))
        else:
            typer.echo(
                f"{e.subscription}\t{e.target}\t{len(e.timers)} timer(s): {', '.join(e.timers)}"
            )
    if not as_json:
        typer.echo(f"{len(entries)} open entr{'y' if len(entries) == 1 else 'ies'}", err=True)


def _request(action: str, type_name: str, target: AggregateRef, settings: Settings) -> None:
    request = request_retry if action == "retry" else request_skip
    op: TimerOp = _run(request(settings.bootstrap_servers, type_name, target, settings.partitions))
    typer.echo(
        f"{action} of the timers of {type_name} parked on {target} requested "
        f"(request {op.request_id}, {settings.partitions} partition(s)); "
        "the owner of each partition carries it out"
    )


@timers_cli.command()
def retry(
    type_name: TypeName,
    target_id: Annotated[str, typer.Option(help="the id of the target the timers send to")],
    tenant: Annotated[str, typer.Option(help="the target's tenant")] = DEFAULT_TENANT,
    target_type: Annotated[
        str | None, typer.Option(help="the target's type when not --type, <context>.<aggregate>")
    ] = None,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
) -> None:
    """Sends the PARKED timers of a target again, due now with their attempts reset."""
    settings = _settings(bootstrap, partitions)
    type_name = _type(type_name)
    _request("retry", type_name, _target(type_name, target_id, tenant, target_type), settings)


@timers_cli.command()
def skip(
    type_name: TypeName,
    target_id: Annotated[str, typer.Option(help="the id of the target the timers send to")],
    tenant: Annotated[str, typer.Option(help="the target's tenant")] = DEFAULT_TENANT,
    target_type: Annotated[
        str | None, typer.Option(help="the target's type when not --type, <context>.<aggregate>")
    ] = None,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
) -> None:
    """Cancels the PARKED timers of a target with the outcome SKIPPED."""
    settings = _settings(bootstrap, partitions)
    type_name = _type(type_name)
    _request("skip", type_name, _target(type_name, target_id, tenant, target_type), settings)


@timers_cli.command("list")
def list_(
    type_name: TypeName,
    status: Annotated[
        str | None, typer.Option(help="only timers in this status, e.g. PARKED")
    ] = None,
    bootstrap: Bootstrap = None,
    partitions: Partitions = None,
    as_json: Json = False,
) -> None:
    """Prints the timers of an owner type as its timer table's changelog has them."""
    settings = _settings(bootstrap, partitions)
    type_name = _type(type_name)
    wanted: TimerStatus | None = None
    if status is not None:
        try:
            wanted = TimerStatus(status.upper())
        except ValueError as exc:
            known = ", ".join(s.value for s in TimerStatus)
            raise _fail(f"unknown status {status!r}: one of {known}") from exc
    timers: list[Timer] = _run(read_timers(settings.bootstrap_servers, type_name, status=wanted))
    for t in timers:
        if as_json:
            _json_line(t.model_dump(mode="json"))
        else:
            typer.echo(
                f"{t.partition}\t{t.status}\t{t.owner}\t{t.key}\t{t.request_id}\t"
                f"due {_time(t.due_at)}\tslot due {_time(t.slot_due_at)}\t"
                f"attempts {t.attempts}\t{t.outcome or '-'}\t-> {t.target} {t.command.type}"
            )
    if not as_json:
        typer.echo(f"{len(timers)} timer(s)", err=True)


def _version_line(offset: int, timestamp: int, row: Timer | None) -> str:
    if row is None:
        return f"  @{offset}\t{_time(timestamp)}\tdeleted"
    return (
        f"  @{offset}\t{_time(timestamp)}\t{row.status}\tslot {row.slot}\t"
        f"slot due {_time(row.slot_due_at)}\tdue {_time(row.due_at)}\t"
        f"attempts {row.attempts}\t{row.outcome or '-'}\tid {row.id}"
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
    settings = _settings(bootstrap, None)
    topics = parse_aggregate_type(_type(type_name))
    try:
        owner = AggregateRef(
            context=topics.context, aggregate=topics.aggregate, tenant=tenant, id=owner_id
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise _fail(f"bad owner: {problems}") from exc
    history: TimerHistory = _run(read_timer_history(settings.bootstrap_servers, owner, key))
    if as_json:
        for versions in history.versions.values():
            for v in versions:
                _json_line(v.model_dump(mode="json"))
        return
    typer.echo(
        f"{owner}: {len(history.versions)} timer(s) in {history.topic}[{history.partition}] "
        "(committed records; compaction keeps each timer's last version, older ones until "
        "it runs)"
    )
    for name, versions in history.versions.items():
        now = history.current(name)
        if now is None:
            typer.echo(f"{name}: deleted")
        else:
            typer.echo(
                f"{name}: {now.status}\tslot {now.slot}\tdue {_time(now.due_at)}\t"
                f"attempts {now.attempts}\t{now.outcome or '-'}\t-> {now.target} "
                f"{now.command.type}\trule {now.rule.model_dump_json()}"
            )
        for v in versions:
            typer.echo(_version_line(v.offset, v.timestamp, v.row))
