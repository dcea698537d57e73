"""What the command groups share: option types, loading a service, settings from the
environment, running a coroutine with the project's errors as a message and exit code 1,
and the output formats."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import sys
from collections.abc import Coroutine, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import orjson
import typer

from app.errors import TickwheelError
from app.node.settings import Settings
from app.service import Service

__all__ = [
    "Bootstrap",
    "Json",
    "Partitions",
    "ServiceSpec",
    "fail",
    "json_line",
    "load_service",
    "quiet_client_library",
    "run",
    "settings_for",
    "time_iso",
]

T = TypeVar("T")

Bootstrap = Annotated[str | None, typer.Option(help="overrides KAFKA_BOOTSTRAP_SERVERS")]
Partitions = Annotated[
    int | None, typer.Option(min=1, max=1024, help="overrides TICKWHEEL_PARTITIONS")
]
ServiceSpec = Annotated[str, typer.Option(help="the service, as module:attribute")]
Json = Annotated[bool, typer.Option("--json", help="one JSON object per line")]


def fail(message: str) -> typer.Exit:
    """Says `message` on stderr; raise what it returns to end the command with exit 1."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def run(work: Coroutine[Any, Any, T]) -> T:
    """Runs `work`; the project's errors (a broker not there, a bad name) end the command
    with exit code 1 and their message, never a traceback."""
    try:
        with quiet_client_library():
            return asyncio.run(work)
    except TickwheelError as exc:
        raise fail(str(exc)) from exc


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


def settings_for(bootstrap: str | None, partitions: int | None) -> Settings:
    """The environment's settings, with the command's overrides; exit 1 when bad."""
    try:
        return Settings.from_env(None, bootstrap_servers=bootstrap, partitions=partitions)
    except TickwheelError as exc:
        raise fail(str(exc)) from exc


def load_service(spec: str) -> Service:
    """The `Service` at `module:attribute`; a clear error for anything else."""
    module_name, _, attr = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr or "service")
    except (ImportError, AttributeError, ValueError) as exc:
        raise typer.BadParameter(f"cannot load service {spec!r}: {exc}") from exc
    if not isinstance(found, Service):
        raise typer.BadParameter(f"{spec!r} is a {type(found).__name__}, not a Service")
    return found


def json_line(data: object) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode() + "\n")


def time_iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
