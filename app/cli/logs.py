"""The command line's log: on stderr, at the settings' level (`TICKWHEEL_LOG_LEVEL`,
`--log-level`), as text lines or JSON lines (`TICKWHEEL_LOG_FORMAT`, `--log-format`), for
every command.

A command run inside another program (a test, a notebook) leaves logging as it found it:
`configure_logging` returns what puts it back, and the command line calls that when the
command ends.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TextIO

import orjson

from app.node.settings import LogFormat, LogLevel

__all__ = ["TEXT_FORMAT", "JsonFormatter", "configure_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: `time` (UTC, ISO 8601, milliseconds), `level`,
    `logger`, `message`, and `exception` (its traceback's text) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            # Cached on the record as logging's own formatter does (other handlers use it).
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(line, default=str).decode()


class _CommandHandler(logging.StreamHandler[TextIO]):
    """The command line's own handler (told apart from anyone else's on the root)."""


def configure_logging(level: LogLevel, fmt: LogFormat) -> Callable[[], None]:
    """The root logger at `level`, its records on stderr in `fmt` (replacing a handler an
    earlier call put there, leaving others'); the client library at WARNING (it logs every
    retry at INFO). Returns what puts logging back as it was."""
    root = logging.getLogger()
    client = logging.getLogger("aiokafka")
    before = root.level, client.level
    replaced = [h for h in root.handlers if isinstance(h, _CommandHandler)]
    for h in replaced:
        root.removeHandler(h)
    handler = _CommandHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level)
    client.setLevel(logging.WARNING)

    def restore() -> None:
        root.removeHandler(handler)
        handler.close()
        for h in replaced:
            root.addHandler(h)
        root.setLevel(before[0])
        client.setLevel(before[1])

    return restore
