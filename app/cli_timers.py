"""`tickwheel timers …`: operator commands on timers and the failure ledger.

The read-only commands (`list`, `ledger`, and `tickwheel jobs list --state`) never create
a topic: one that is not there is an error that names it (exit code 1). `retry` and
`skip` write requests, and create the timer-ops topic as a worker would.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from collections.abc import Coroutine, Iterable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import orjson
import typer
from pydantic import ValidationError

from app.exceptions import TickwheelError
from app.kafka import KafkaUnavailable, read_partitions
from app.ledger import LedgerView
from app.operator import TimerOp, request_retry, request_skip
from app.settings import Settings
from app.topics import ContextTopics, parse_aggregate_type
from tables.ledger import LedgerEntry
from tables.refs import DEFAULT_TENANT, AggregateRef
from tables.timer import Timer, TimerStatus

__all__ = [
    "MissingTopic",
    "existing_topics",
    "read_ledger_entries",
    "read_timer_rows",
    "require_topic",
    "timers_cli",
]

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


class MissingTopic(TickwheelError):
    """A topic a read-only command reads is not there: nothing is created for it."""


async def existing_topics(bootstrap: str, names: Iterable[str]) -> dict[str, int]:
    """The partition counts of those of `names` the broker has; never creates a topic.

    The broker is first asked for all of its topics: a metadata request that names a
    topic creates it on a broker with `auto.create.topics.enable`. Only the topics found
    are then described.
    """
    # aiokafka is app.kafka's alone; this belongs there (held by another change for now).
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    wanted = list(names)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        await admin.start()
        have = set(await admin.list_topics())
        present = [n for n in wanted if n in have]
        if not present:
            return {}
        described = await admin.describe_topics(present)
        return {t["topic"]: len(t["partitions"]) for t in described if not t.get("error_code")}
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot read the topics at {bootstrap}: {exc!r}") from exc
    finally:
        await admin.close()


async def require_topic(bootstrap: str, topic: str, why: str) -> int:
    """The partition count of `topic`; `MissingTopic` (saying `why` it may be missing) when
    the broker does not have it."""
    found = await existing_topics(bootstrap, [topic])
    if topic not in found:
        raise MissingTopic(
            f"topic {topic} does not exist at {bootstrap}: {why} "
            "(nothing was created; is KAFKA_BOOTSTRAP_SERVERS or --bootstrap the cluster's?)"
        )
    return found[topic]


async def read_timer_rows(
    bootstrap: str, type_name: str, status: TimerStatus | None = None
) -> list[Timer]:
    """The timer table of `type_name` as its changelog has it (the latest row per key,
    deleted rows left out), by partition then due time; only those in `status` if given.
    `MissingTopic` when no worker has kept that type's timers on this broker."""
    topic = parse_aggregate_type(type_name).timers_changelog
    partitions = await require_topic(
        bootstrap, topic, f"no worker has kept timers of {type_name} there"
    )
    rows: dict[tuple[int, bytes], Timer] = {}
    async for batch in read_partitions(bootstrap, topic, range(partitions)):
        for r in batch:
            if r.key is None:
                continue
            if r.value is None:
                rows.pop((r.partition, r.key), None)
                continue
            try:
                rows[(r.partition, r.key)] = Timer.model_validate(orjson.loads(r.value))
            except (orjson.JSONDecodeError, ValidationError) as exc:
                logger.warning("unreadable row at %s[%d]@%d: %s", topic, r.partition, r.offset, exc)
    timers = [t for t in rows.values() if status is None or t.status is status]
    return sorted(timers, key=lambda t: (t.partition, t.due_at, t.id))


async def read_ledger_entries(bootstrap: str, context: str) -> list[LedgerEntry]:
    """The open entries of `context`'s failure ledger as the topic has them now;
    `MissingTopic` when no worker of the context has run on this broker."""
    topic = ContextTopics(context).ledger
    partitions = await require_topic(
        bootstrap, topic, f"no worker of context {context} has run there"
    )
    view = LedgerView()
    async for batch in read_partitions(bootstrap, topic, range(partitions)):
        for record in batch:
            view.apply_record(record)
    return view.entries()


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
    entries: list[LedgerEntry] = _run(read_ledger_entries(settings.bootstrap_servers, context))
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
    timers: list[Timer] = _run(read_timer_rows(settings.bootstrap_servers, type_name, wanted))
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
