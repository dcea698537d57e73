"""`tickwheel timers set|cancel|pause|resume|trigger`: a timer of a timer book
(`app.clients.timer_book`) set, cancelled, paused, resumed or fired once now by command,
as a service's client would (`app.ops.timer_api`): the node owning the book's partition
appends the event, and a command sent again with the same `--request-id` changes nothing
(answered DUPLICATE; a trigger sent again fires nothing more).

All need the book's command and results topics (made by a worker running the book) and
create none. Exit 0 once the book answered COMMITTED or DUPLICATE, or UNCHANGED (a pause
of a paused timer, a resume of a running one); 1 when it refused (REJECTED: a key it has
no timer under; ERROR, BUSY), did not answer within `--wait`, or the broker failed during
or after the send (send it again with the request id printed to learn what became of it;
under a fresh one a trigger would fire again); 2 for a bad option (a rule that does not
parse, a target that is the book itself, a rule with no slot left, a once rule's `at` in
epoch seconds, `app.clients.book_commands.seconds_reason`, a `--body` nested deeper than
a set carries it, `command_body_reason`, a set larger than the node reads:
`TICKWHEEL_MAX_RECORD_BYTES`, whose record it would drop unanswered).
"""

from __future__ import annotations

import shlex
import time
from typing import Annotated

import typer
from pydantic import ValidationError

from app.cli.common import (
    CONFIG_ERROR,
    Bootstrap,
    Json,
    checked,
    clients_for,
    fail,
    json_line,
    request_id_check,
    run,
    settings_for,
    unsettled,
)
from app.cli.rule_expr import BadExpression, parse_duration, parse_expr
from app.cli.text import printable
from app.cli.timers import TypeName, _type, timers_cli
from app.clients.book_commands import command_body_reason
from app.clients.timer_book import timer_book
from app.kafka.cluster import require_topics
from app.kafka.ports import Clients
from app.model.aggregate import MAX_TRIGGER_REQUEST_ID
from app.ops.deadline import reader_for
from app.ops.timer_api import (
    DEFAULT_WAIT_S,
    DONE,
    BadRequest,
    TargetSpec,
    TimerPut,
    answer_of,
    asked_id,
    cancel_command,
    field_of,
    key_command,
    owner_ref,
    set_command,
    submit,
)
from app.protocol.json_input import load_json
from app.protocol.topics import ContextTopics, parse_aggregate_type
from app.protocol.wire import MAX_REQUEST_ID, CommandEnvelope, CommandResult, ResultCode
from tables import DEFAULT_TENANT, CommandSpec

__all__ = ["cancel", "pause", "resume", "set_", "trigger"]

Owner = Annotated[str, typer.Option("--owner", help="the book's id: the timer's owner")]
Key = Annotated[str, typer.Option(help="the timer's key, unique per owner")]
Tenant = Annotated[str, typer.Option(help="the owner's tenant")]
RequestId = Annotated[
    str | None,
    typer.Option(
        callback=request_id_check(MAX_REQUEST_ID),
        help="names this change: sent again with it, nothing more is written (new)",
    ),
]
TriggerRequestId = Annotated[
    str | None,
    typer.Option(
        callback=request_id_check(MAX_TRIGGER_REQUEST_ID),
        help="names this change: sent again with it, nothing more is written (new)",
    ),
]
Wait = Annotated[float, typer.Option(min=0, max=600, help="seconds to wait for the book's answer")]


def _now() -> int:
    return time.time_ns() // 1_000_000


async def send_change(
    clients: Clients, cmd: CommandEnvelope, wait_s: float
) -> CommandResult | None:
    """Sends a book's command and waits for its result. Creates no topic: the book's
    command and results topics must be there (a worker running the book made them)."""
    topics = parse_aggregate_type(cmd.aggregate.type_name)
    results = ContextTopics(cmd.aggregate.context).results
    why = f"no worker has run the timer book {topics.type_name} against this cluster"
    found = await require_topics(clients.admin(), {topics.commands: why, results: why})
    # From the clients' start on, a failure may follow the send: it names the request id
    # (the user's retry under a fresh one would apply the change again).
    return await unsettled(_send(clients, cmd, found[topics.commands], wait_s), _resend(cmd))


async def _send(
    clients: Clients, cmd: CommandEnvelope, partitions: int, wait_s: float
) -> CommandResult | None:
    publisher = clients.publisher()
    await publisher.start()
    try:
        # `--wait` bounds the reader's stop too (`reader_for`).
        async with reader_for(clients, wait_s) as reader:
            return await submit(publisher, reader, cmd, partitions, wait_s)
    finally:
        await publisher.stop()


def _resend(cmd: CommandEnvelope) -> str:
    return (
        f"send it again with --request-id {shlex.quote(asked_id(cmd))} to learn what became "
        "of it (under its request id it is written at most once)"
    )


def _answer(action: str, cmd: CommandEnvelope, result: CommandResult | None, as_json: bool) -> None:
    if result is None:
        raise fail(
            f"no answer from the book in time: send it again with --request-id "
            f"{shlex.quote(asked_id(cmd))} to learn it (that writes nothing more)"
        )
    answer = answer_of(cmd, result)
    if result.code not in DONE:
        # The refusal's typed code (the book's RULE_ENDED) before its text, as the web
        # edge's 409 says it.
        # `reason`: the message, naming a code this version does not know (read as ERROR).
        why = result.reason if result.refusal is None else f"{result.refusal}: {result.reason}"
        raise fail(f"{action} refused: {result.code} {why}".rstrip())
    if as_json:
        json_line(answer.model_dump(mode="json"))
        return
    before = " before by this request id: nothing written" if answer.duplicate else ""
    if result.code is ResultCode.UNCHANGED:
        before = " already so: nothing written"
    # The owner and request id as given (a C1 control or U+2028 passes the check of new
    # input), the key as `repr` quotes it, which escapes them.
    owner, request_id = printable(str(answer.owner)), printable(answer.request_id)
    typer.echo(
        f"{action} {owner} {answer.key!r}: {result.code}{before} "
        f"(request {request_id}, version {answer.version})"
    )


@timers_cli.command("set")
def set_(
    type_name: TypeName,
    owner: Owner,
    key: Key,
    rule: Annotated[
        str,
        typer.Option(
            metavar="EXPR",
            # `\\[`: typer renders help as rich markup, where `[@<start>]` is a tag.
            help="cron:<expression>, interval:<every>\\[@<start>], once:<instant>, or the "
            "rule's JSON object (as `tickwheel rules next` reads it)",
        ),
    ],
    target_type: Annotated[
        str, typer.Option(help="the type the command goes to, <context>.<aggregate>")
    ],
    command: Annotated[str, typer.Option(help="the command's type the timer sends")],
    body: Annotated[str, typer.Option(help="the command's body, a JSON object")] = "{}",
    target: Annotated[
        str | None, typer.Option(help="the id the command goes to (the owner's)")
    ] = None,
    zone: Annotated[str | None, typer.Option(help="a cron rule's IANA zone (UTC)")] = None,
    jitter: Annotated[
        str | None,
        typer.Option(help="the rule's jitter: each slot fires up to this much later (30s, ms)"),
    ] = None,
    tenant: Tenant = DEFAULT_TENANT,
    request_id: RequestId = None,
    wait: Wait = DEFAULT_WAIT_S,
    bootstrap: Bootstrap = None,
    as_json: Json = False,
) -> None:
    """Sets a timer of a timer book (creates it, or replaces the one of that key): the
    book's owner sends --command to --target-type by --rule."""
    settings = settings_for(bootstrap, None)
    now = _now()
    try:
        book = parse_aggregate_type(_type(type_name))
        spread = None if jitter is None else parse_duration(jitter, "--jitter")
        parsed = parse_expr(rule, zone, now, jitter=spread)
        if zone is not None and parsed.kind != "cron":
            # It was dropped without a word: a once or interval rule keeps no zone.
            raise BadRequest("--zone", f"is a cron rule's zone; a {parsed.kind} rule has none")
        try:
            data = load_json(body)
        except ValueError as exc:
            raise fail(f"--body is not JSON: {exc}", CONFIG_ERROR) from exc
        if not isinstance(data, dict):
            raise BadRequest("--body", "must be a JSON object")
        if (why := command_body_reason(data)) is not None:
            # Before the command's own (looser) bound: the one a set carries is said.
            raise BadRequest("--body", why)
        try:
            put = TimerPut(
                rule=parsed,
                target=TargetSpec(type=target_type, id=target),
                command=CommandSpec(type=command, body=data),
                request_id=request_id,
            )
        except ValidationError as exc:
            raise _option_of(exc) from exc
        cmd = set_command(
            timer_book(book.context, book.aggregate),
            owner_ref(book.type_name, owner, tenant),
            key,
            put,
            now,
            limits=settings.limits,
        )
    except BadRequest as exc:
        raise fail(str(_as_option(exc)), CONFIG_ERROR) from exc
    except BadExpression as exc:
        raise fail(str(exc), CONFIG_ERROR) from exc
    result = run(checked(settings.kafka, send_change(clients_for(settings), cmd, wait)))
    _answer("set", cmd, result, as_json)


_SET_OPTIONS = {
    ("TargetSpec", "type"): "--target-type",
    ("TargetSpec", "id"): "--target",
    ("CommandSpec", "type"): "--command",
    # `set_command`'s, of the target it makes of them (its tenant is the owner's).
    (None, "target.context"): "--target-type",
    (None, "target.aggregate"): "--target-type",
    (None, "target.id"): "--target",
}
"""The option of `set` that gave a model's field: named by the field, `type` would read
as `--type` and `id` as the owner's (`--owner`)."""


def _option_of(exc: ValidationError) -> BadRequest:
    """`field_of` naming the option at fault."""
    bad = field_of(exc)
    return BadRequest(_SET_OPTIONS.get((exc.title, bad.field), bad.field), bad.message)


def _as_option(exc: BadRequest) -> BadRequest:
    return BadRequest(_SET_OPTIONS.get((None, exc.field), exc.field), exc.message)


@timers_cli.command()
def cancel(
    type_name: TypeName,
    owner: Owner,
    key: Key,
    tenant: Tenant = DEFAULT_TENANT,
    request_id: RequestId = None,
    wait: Wait = DEFAULT_WAIT_S,
    bootstrap: Bootstrap = None,
    as_json: Json = False,
) -> None:
    """Cancels a timer of a timer book (a key with no timer: nothing to cancel, no error)."""
    settings = settings_for(bootstrap, None)
    try:
        book = parse_aggregate_type(_type(type_name))
        cmd = cancel_command(owner_ref(book.type_name, owner, tenant), key, request_id, _now())
    except BadRequest as exc:
        raise fail(str(exc), CONFIG_ERROR) from exc
    result = run(checked(settings.kafka, send_change(clients_for(settings), cmd, wait)))
    _answer("cancel", cmd, result, as_json)


def _act(
    action: str,
    type_name: str,
    owner: str,
    key: str,
    tenant: str,
    request_id: str | None,
    wait: float,
    bootstrap: str | None,
    as_json: bool,
) -> None:
    settings = settings_for(bootstrap, None)
    try:
        book = parse_aggregate_type(_type(type_name))
        cmd = key_command(action, owner_ref(book.type_name, owner, tenant), key, request_id, _now())
    except BadRequest as exc:
        raise fail(str(exc), CONFIG_ERROR) from exc
    result = run(checked(settings.kafka, send_change(clients_for(settings), cmd, wait)))
    _answer(action, cmd, result, as_json)


@timers_cli.command()
def pause(
    type_name: TypeName,
    owner: Owner,
    key: Key,
    tenant: Tenant = DEFAULT_TENANT,
    request_id: RequestId = None,
    wait: Wait = DEFAULT_WAIT_S,
    bootstrap: Bootstrap = None,
    as_json: Json = False,
) -> None:
    """Pauses a timer of a timer book: it keeps its rule and fires nothing until resumed
    (paused already: UNCHANGED, no error)."""
    _act("pause", type_name, owner, key, tenant, request_id, wait, bootstrap, as_json)


@timers_cli.command()
def resume(
    type_name: TypeName,
    owner: Owner,
    key: Key,
    tenant: Tenant = DEFAULT_TENANT,
    request_id: RequestId = None,
    wait: Wait = DEFAULT_WAIT_S,
    bootstrap: Bootstrap = None,
    as_json: Json = False,
) -> None:
    """Resumes a paused timer of a timer book, caught up by its rule's catch-up policy
    (running already: UNCHANGED, no error)."""
    _act("resume", type_name, owner, key, tenant, request_id, wait, bootstrap, as_json)


@timers_cli.command()
def trigger(
    type_name: TypeName,
    owner: Owner,
    key: Key,
    tenant: Tenant = DEFAULT_TENANT,
    request_id: TriggerRequestId = None,
    wait: Wait = DEFAULT_WAIT_S,
    bootstrap: Bootstrap = None,
    as_json: Json = False,
) -> None:
    """Sends a timer's command once now, its rule and next slot left as they were (sent
    again with its --request-id, it fires nothing more)."""
    _act("trigger", type_name, owner, key, tenant, request_id, wait, bootstrap, as_json)
