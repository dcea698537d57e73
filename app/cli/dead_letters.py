"""`tickwheel dead-letters …`: a context's dead letters (`<context>.dead-letters`), read and
replayed (`app.ops.letters`).

`list` and `show` are read-only: they create nothing, and a dead-letter topic that is not
there is an error naming it (exit code 1). `replay` writes the letter's original record
back to its topic, once: a second replay of the same letter writes nothing and says so. It
writes only to an input topic of the context (`app.ops.letters.replay_refusal`); a letter
naming another is refused (exit code 1), nothing written.
"""

from __future__ import annotations

import base64
import time
from typing import Annotated, Any

import typer

from app.cli.common import (
    Bootstrap,
    Json,
    checked,
    clients_for,
    context_name,
    json_line,
    run,
    settings_for,
    time_iso,
)
from app.cli.text import printable
from app.ops.letters import (
    LIST_LIMIT,
    MAX_LIST_LIMIT,
    Letter,
    Replayed,
    list_letters,
    replay,
    show_letter,
)
from app.protocol.dead_letters import DeadLetterContext, Stage

__all__ = ["dead_letters_cli"]

dead_letters_cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)

Context = Annotated[str, typer.Option(help="the bounded context whose dead letters to read")]
Offset = Annotated[int, typer.Option(min=0, help="the letter's offset on the dead-letter topic")]
Partition = Annotated[
    int, typer.Option(min=0, help="the letter's partition on the dead-letter topic")
]


def _bytes(data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {"text": None, "base64": None}
    try:
        text: str | None = data.decode()
    except UnicodeDecodeError:
        text = None
    return {"text": text, "base64": base64.b64encode(data).decode()}


def letter_json(x: Letter, *, whole: bool = False) -> dict[str, Any]:
    """A letter as `dead-letters list|show --json` print it (`whole`: with its bytes)."""
    data: dict[str, Any] = {
        "partition": x.partition,
        "offset": x.offset,
        "timestamp": x.timestamp,
        "error": x.letter.context.model_dump(mode="json"),
        "replayed": None if x.replayed is None else x.replayed.model_dump(mode="json"),
    }
    if whole:
        data["key"] = _bytes(x.letter.key)
        data["value"] = _bytes(x.letter.value)
        data["headers"] = [[k, _bytes(v)] for k, v in x.letter.headers]
    return data


def _line(x: Letter) -> str:
    c = x.letter.context
    replayed = (
        "-"
        if x.replayed is None
        else f"replayed {time_iso(x.replayed.time)} to "
        f"{printable(x.replayed.topic)}[{x.replayed.partition}]"
    )
    message = " ".join(c.exception_message.split())
    if len(message) > 160:
        message = message[:159] + "…"
    return (
        f"{x.partition}:{x.offset}\t{time_iso(c.time)}\t{c.stage}\t{printable(c.topic)}"
        f"[{c.partition}]@"
        f"{c.offset}\t{printable(c.exception_class)}: {printable(message)}\t{replayed}"
    )


@dead_letters_cli.command("list")
def list_(
    context: Context,
    stage: Annotated[
        Stage | None, typer.Option(case_sensitive=False, help="only letters of this stage")
    ] = None,
    topic: Annotated[str | None, typer.Option(help="only letters of records of this topic")] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=MAX_LIST_LIMIT, help="the newest so many letters")
    ] = LIST_LIMIT,
    bootstrap: Bootstrap = None,
    as_json: Json = False,
) -> None:
    """Prints a context's newest dead letters (--limit), oldest first: where each sits
    (partition:offset), when it was written, the stage that refused its record, the
    record's topic, partition and offset, the error, and whether it was replayed. The
    topic is read back from its end, never whole: the last line says when older records
    were left out."""

    def want(c: DeadLetterContext) -> bool:
        return (stage is None or c.stage is stage) and (topic is None or c.topic == topic)

    settings = settings_for(bootstrap, None)
    listed = list_letters(clients_for(settings), context_name(context), limit, want)
    where, book = run(checked(settings.kafka, listed))
    for x in book.letters:
        if as_json:
            json_line(letter_json(x))
        else:
            typer.echo(_line(x))
    unreadable = (
        f"; {book.unreadable} record(s) of {where} are no dead letter" if book.unreadable else ""
    )
    older = (
        f"; {book.older} older record(s) not listed (--limit, up to {MAX_LIST_LIMIT}, lists more)"
        if book.older
        else ""
    )
    typer.echo(f"{len(book.letters)} dead letter(s) in {where}{unreadable}{older}", err=True)


@dead_letters_cli.command()
def show(
    context: Context,
    offset: Offset,
    partition: Partition = 0,
    bootstrap: Bootstrap = None,
    as_json: Json = False,
) -> None:
    """Prints one dead letter whole: why and where from, its record's headers, key and
    value (as text when UTF-8, else base64), and its replay if any."""
    settings = settings_for(bootstrap, None)
    shown = show_letter(clients_for(settings), context_name(context), partition, offset)
    x = run(checked(settings.kafka, shown))
    data = letter_json(x, whole=True)
    if as_json:
        json_line(data)
        return
    typer.echo(_line(x))
    for name, value in data["error"].items():
        typer.echo(f"  {name}: {printable(str(value))}")
    for name, value in data["headers"]:
        typer.echo(f"  header {printable(name)}: {printable(_shown(value))}")
    typer.echo(f"  key: {printable(_shown(data['key']))}")
    typer.echo(f"  value: {printable(_shown(data['value']))}")


def _shown(data: dict[str, str | None]) -> str:
    if data["base64"] is None:
        return "null"
    if data["text"] is not None:
        return data["text"]
    return f"(base64) {data['base64']}"


@dead_letters_cli.command("replay")
def replay_(
    context: Context,
    offset: Offset,
    partition: Partition = 0,
    bootstrap: Bootstrap = None,
    as_json: Json = False,
) -> None:
    """Writes a dead letter's original record (key, value, headers) back to its topic and
    partition, once, and marks the letter replayed; a letter replayed before is left as
    it is (exit 0, nothing written). Only to an events, commands or timer-ops topic of the
    context, in a partition it has: a letter naming any other (the timer changelog, another
    context's topic) is refused, nothing written (exit 1)."""
    settings = settings_for(bootstrap, None)
    now = time.time_ns() // 1_000_000
    done: Replayed = run(
        checked(
            settings.kafka,
            replay(
                clients_for(settings),
                settings.group_id,
                context_name(context),
                partition,
                offset,
                now,
            ),
        )
    )
    if as_json:
        json_line(
            {
                **letter_json(done.letter),
                "replayed": done.mark.model_dump(mode="json"),
                "written": done.written,
            }
        )
        return
    m = done.mark
    if done.written is None:
        typer.echo(
            f"{partition}:{offset} was replayed before ({time_iso(m.time)}, to "
            f"{printable(m.topic)}[{m.partition}]): nothing written"
        )
    else:
        typer.echo(
            f"{partition}:{offset} replayed to {printable(m.topic)}[{m.partition}]@{done.written}"
        )
