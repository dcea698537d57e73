"""What the command groups share: option types, loading a service, the settings of a
command (and its logging), running a coroutine with the project's errors as a message and
an exit code, and the output formats.

Exit codes, the same for every command:

- 0: done;
- 1: the command ran and failed: the broker is not there, a topic is missing, what it was
  asked about does not exist or is refused (a type's name, a job, a status, a target, a
  service that cannot be loaded), the workers refused or did not answer;
- 2: it could not start: its command line (an unknown option, a missing one, a value of
  the wrong type, out of range, not one of its choices: `--log-level foo`, not UTF-8) or the
  configuration (a `ConfigError` of the settings: a bad or unknown `TICKWHEEL_*`
  variable, a `.env` or `_FILE` that cannot be read);
- 130: interrupted;
- 141: stdout's reader went away (`tickwheel … | head`): the command ends at once and
  quietly (`READER_GONE`).

Each error is one line on stderr, `error: …` (`app.cli.text.error_line`: a long value
it repeats cut, control characters escaped), and never a traceback (an unexpected
exception's is logged at DEBUG).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import orjson
import typer

from app.cli.logs import configure_logging
from app.cli.text import error_line
from app.errors import ConfigError, MissingTopic, TickwheelError
from app.kafka.clients import KafkaClients
from app.kafka.connection import Connectable
from app.kafka.probe import check_access
from app.node.settings import LOG_FORMATS, LOG_LEVELS, Settings
from app.protocol.instants import iso_text
from app.service import Service
from tables.refs import unusable_request_id

__all__ = [
    "CONFIG_ERROR",
    "FAILED",
    "READER_GONE",
    "Bootstrap",
    "Json",
    "LogFormatOption",
    "LogLevelOption",
    "Partitions",
    "RootOptions",
    "ServiceSpec",
    "Unsettled",
    "a_path",
    "begin_invocation",
    "checked",
    "clients_for",
    "command_settings",
    "context_name",
    "fail",
    "json_line",
    "load_service",
    "not_utf8",
    "quiet_client_library",
    "reader_gone",
    "request_id_check",
    "run",
    "settings_for",
    "time_iso",
    "unsettled",
]

T = TypeVar("T")

FAILED = 1
"""Exit code of a command that ran and failed."""
CONFIG_ERROR = 2
"""Exit code of a command that could not start: its command line or its configuration."""

READER_GONE = 141
"""Exit code when stdout's reader went away (`tickwheel … | head`): 128 + SIGPIPE, as the
shell reports a program SIGPIPE ended, so that `set -o pipefail` treats it as it treats
`cat`; not 1, which says the command failed."""


def reader_gone() -> NoReturn:
    """Ends a command whose stdout's reader went away, quietly (Python's recipe): stdout
    and stderr pointed at /dev/null, so that nothing more written, nor the interpreter's
    last flush, fails again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # no file (a test's capture)
            os.dup2(devnull, stream.fileno())
    os.close(devnull)
    sys.exit(READER_GONE)


def _log_level(value: str | None) -> str | None:
    if value is None:
        return None
    # ASCII alone, as TICKWHEEL_LOG_LEVEL: "\u0131nfo" (a dotless i) upper-cased is INFO.
    if not value.isascii() or value.strip().upper() not in LOG_LEVELS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(LOG_LEVELS)} (any case)")
    return value.strip().upper()


def a_path(value: str) -> Path:
    """A directory option's parser (`typer.Option(parser=a_path)`): click makes Path("")
    of "", the working directory, which a directory given by mistake (an unset shell
    variable) silently became."""
    if not value.strip():
        raise typer.BadParameter("a directory path, not empty")
    if "\x00" in value:  # pathlib's checks take it for a missing directory, its writes fail
        raise typer.BadParameter("a directory path holds no NUL character")
    return Path(value)


def _log_format(value: str | None) -> str | None:
    if value is None:
        return None
    if value.strip().lower() not in LOG_FORMATS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(LOG_FORMATS)}")
    return value.strip().lower()


Bootstrap = Annotated[str | None, typer.Option(help="overrides KAFKA_BOOTSTRAP_SERVERS")]
Partitions = Annotated[
    int | None, typer.Option(min=1, max=1024, help="overrides TICKWHEEL_PARTITIONS")
]
ServiceSpec = Annotated[str, typer.Option(help="the service, as module:attribute")]
Json = Annotated[bool, typer.Option("--json", help="one JSON object per line on stdout")]
LogLevelOption = Annotated[
    str | None,
    typer.Option(
        "--log-level",
        callback=_log_level,
        metavar="[DEBUG|INFO|WARNING|ERROR]",
        help="overrides TICKWHEEL_LOG_LEVEL (default INFO)",
    ),
]
LogFormatOption = Annotated[
    str | None,
    typer.Option(
        "--log-format",
        callback=_log_format,
        metavar="[text|json]",
        help="overrides TICKWHEEL_LOG_FORMAT: text lines (default) or JSON lines",
    ),
]


@dataclass(frozen=True, slots=True)
class RootOptions:
    """`tickwheel`'s own options, before the command (`tickwheel --log-level DEBUG timers …`)."""

    log_level: str | None = None
    log_format: str | None = None


@dataclass(slots=True)
class _Invocation:
    options: RootOptions
    undo: list[Callable[[], None]] = field(default_factory=list)


_INVOCATION: ContextVar[_Invocation | None] = ContextVar("tickwheel_invocation", default=None)


def begin_invocation(options: RootOptions) -> Callable[[], None]:
    """Starts a run of `tickwheel` (its root callback): its commands' settings take
    `options`; what it returns ends the run, logging put back as it was before."""
    invocation = _Invocation(options)
    token = _INVOCATION.set(invocation)

    def end() -> None:
        while invocation.undo:
            invocation.undo.pop()()
        _INVOCATION.reset(token)

    return end


def fail(message: str, code: int = FAILED) -> typer.Exit:
    """Says `message` on stderr; raise what it returns to end the command with `code`."""
    typer.echo(error_line(message), err=True)
    return typer.Exit(code)


def not_utf8(args: Sequence[str]) -> str | None:
    """Where the first of `args` (a command line) that is not UTF-8 text is, as an error
    names it (`the value of --request-id`); None when all are."""
    for i, arg in enumerate(args):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            name, eq, _ = arg.partition("=")
            if arg.startswith("--") and eq and name.isascii():
                return f"the value of {name}"
            before = args[i - 1] if i else ""
            if before.startswith("-") and before != "--" and before.isascii():
                return f"the value after {before}"
            return f"argument {i + 1} of the command line"
    return None


_CONTEXT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]*")


def request_id_check(longest: int) -> Callable[[str | None], str | None]:
    """The callback of a `--request-id` of at most `longest` characters (a bound the command
    itself checks): the jobs' check (`app.ops.job_api.instance_commands`), and its message,
    for every command that sends a change. A blank id or one with surrounding spaces, or
    with a control character (C0, DEL, as `tables.refs.control_character` refuses in an
    id) anywhere, ends the command with exit code 2: a blank one was taken for none (a
    fresh id), and the id is printed on the one line that says how to send it again."""

    def check(value: str | None) -> str | None:
        if value is not None and unusable_request_id(value):
            raise fail(
                f"--request-id {value!r}: give 1-{longest} characters, no surrounding spaces "
                "or control characters",
                CONFIG_ERROR,
            )
        return value

    return check


def context_name(context: str) -> str:
    """`--context` as given, when it can name a context's topics; else the command ends
    with exit code 2 (a value it cannot take, as for any bad option)."""
    if not _CONTEXT.fullmatch(context):
        raise fail(f"context {context!r} must be letters, digits, '_' or '-'", CONFIG_ERROR)
    return context


def command_settings(*, log_level: str | None = None, **overrides: Any) -> Settings:
    """The command's settings: the environment's (its `.env`, `_FILE` variables) with the
    command's overrides (None: not given) over `tickwheel`'s own `--log-*` options; its
    logging configured by them until the run ends. A bad configuration ends the command
    with exit code 2 and a message naming the variable."""
    invocation = _INVOCATION.get()
    options = invocation.options if invocation is not None else RootOptions()
    try:
        settings = Settings.from_env(
            None,
            log_level=log_level or options.log_level,
            log_format=options.log_format,
            **overrides,
        )
    except ConfigError as exc:
        raise fail(str(exc), CONFIG_ERROR) from exc
    restore = configure_logging(settings.log_level, settings.log_format)
    if invocation is not None:
        invocation.undo.append(restore)
    return settings


def settings_for(bootstrap: str | None, partitions: int | None) -> Settings:
    """`command_settings` with the two overrides most commands take."""
    return command_settings(bootstrap_servers=bootstrap, partitions=partitions)


def clients_for(settings: Settings) -> KafkaClients:
    """The clients of the settings' cluster (none started): what the commands hand to the
    tools below the CLI, which reach Kafka through the ports only."""
    return KafkaClients(
        settings.kafka,
        replication=settings.replication,
        client=settings.kafka_client,
        producer_thread=settings.producer_thread,
    )


def run(work: Coroutine[Any, Any, T]) -> T:
    """Runs `work`; the project's errors (a broker not there, a bad name) end the command
    with exit code 1 and their message, never a traceback."""
    try:
        with quiet_client_library():
            return asyncio.run(work)
    except TickwheelError as exc:
        raise fail(str(exc)) from exc


class Unsettled(TickwheelError):
    """A change whose send, or the wait for its answer, failed: it may be written or not
    (`unsettled`)."""


async def unsettled(work: Awaitable[T], resend: str) -> T:
    """`work`: a change sent under a request id (the command's own when not given) and its
    answer waited for. Failing (the broker gone during or after the send, a send that
    timed out: written or not), it ends as `run` ends any error, its message followed by
    `resend`: how to send it again under the same request id, which applies it at most
    once; under a fresh one it could apply twice (a trigger would fire twice). A
    `MissingTopic` ends it as is: raised before a send, nothing was sent. Interrupted
    (Ctrl-C), it says the same, `interrupted: sent or not, …`, and the command exits 130
    as any interrupted one."""
    try:
        return await work
    except MissingTopic:
        raise  # a topic the change goes to is not there: found before anything is sent
    except (TickwheelError, TimeoutError) as exc:
        why = str(exc) or type(exc).__name__
        raise Unsettled(f"{why}: sent or not, {resend}") from exc
    except (asyncio.CancelledError, KeyboardInterrupt):
        # Ctrl-C: `asyncio.run` cancels the command's task (a second one raises
        # KeyboardInterrupt in it), and typer exits 130 without a word; the change may
        # be written all the same, so the resend under its request id is said first.
        typer.echo(error_line(f"interrupted: sent or not, {resend}"), err=True)
        raise


async def checked(kafka: Connectable, work: Coroutine[Any, Any, T]) -> T:
    """`work`, once one connection shows that the cluster lets this client in: wrong
    credentials or an untrusted certificate are one error saying so, not the client
    library's "Unable to bootstrap" after its retries."""
    try:
        await check_access(kafka)
    except BaseException:
        work.close()  # never started: closed, so nothing warns it was never awaited
        raise
    return await work


@contextlib.contextmanager
def quiet_client_library() -> Iterator[None]:
    """aiokafka logs every failed connection attempt and every retry of a topic whose
    leader is being elected; a command's own error says what matters once. Put back
    afterwards: a command may run inside another program (tests, a notebook)."""
    client_log = logging.getLogger("aiokafka")
    level = client_log.level
    client_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        client_log.setLevel(level)


def load_service(spec: str) -> Service:
    """The `Service` at `module:attribute`; exit code 1 and why for anything else."""
    module_name, _, attr = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr or "service")
    except Exception as exc:
        # Not found, a relative name ('../x': TypeError), or the module's own import
        # failing (a SyntaxError, whatever its top level raises): said, never a traceback.
        raise fail(f"cannot load service {spec!r}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(found, Service):
        raise fail(f"{spec!r} is a {type(found).__name__}, not a Service")
    return found


def json_line(data: object) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode() + "\n")


time_iso = iso_text
"""An instant as the commands print it (`app.protocol.instants.iso_text`)."""
