"""JSON Schemas of the wire envelopes, for writers and readers in other languages.

The pydantic models are the one source of truth: `render_schemas()` renders each model's
schema, and every copy of the files is that rendering, checked by a test:

- `docs/schemas/` in the repository, for readers (`tickwheel schemas` writes it, run from
  the repository's root; `tickwheel schemas --check`, run by `scripts/test`, compares);
- `app/protocol/json_schemas/` (`SHIPPED_DIR`), shipped in the wheel as package data, so
  that an installed Tickwheel has them too (`tickwheel schemas --dir
  app/protocol/json_schemas` rewrites that copy).

Nothing here writes where no one asked: `write_schemas` takes its directory, and the
command's default (`default_dir()`) is the working directory's, never the installed
package's.
"""

from __future__ import annotations

from pathlib import Path

import orjson
from pydantic import BaseModel

from app.protocol.dead_letters import DeadLetterContext
from app.protocol.wire import (
    AggregateDeleted,
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    ScheduleCancelled,
    SchedulePaused,
    ScheduleResumed,
    ScheduleSet,
    ScheduleTriggered,
    TimerOp,
    TimerOpAnswer,
)
from tables import Timer
from tables.refs import NEW_IDENTIFIER_PATTERN

__all__ = [
    "SCHEMA_DIR",
    "SHIPPED_DIR",
    "default_dir",
    "render_schemas",
    "stale_schemas",
    "write_schemas",
]

SHIPPED_DIR = Path(__file__).resolve().parent / "json_schemas"
"""The copy the package ships (package data): in a source tree, the committed files; in an
installed Tickwheel, the wheel's. Read it; do not write into an installed package."""

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "docs" / "schemas"
"""`docs/schemas/` of the source tree this module was loaded from: meaningful only in a
checkout (an installed package has no docs/ beside it). Only read by default."""

_MODELS: dict[str, type[BaseModel]] = {
    "event": EventEnvelope,
    "wow.ScheduleSet": ScheduleSet,
    "wow.ScheduleCancelled": ScheduleCancelled,
    "wow.SchedulePaused": SchedulePaused,
    "wow.ScheduleResumed": ScheduleResumed,
    "wow.ScheduleTriggered": ScheduleTriggered,
    "wow.AggregateDeleted": AggregateDeleted,
    "command": CommandEnvelope,
    "command-result": CommandResult,
    "dead-letter-headers": DeadLetterContext,
    "timer": Timer,
    "timer-op": TimerOp,
    "timer-op-answer": TimerOpAnswer,
}


_NAMES_AS_STORED = frozenset({"timer", "timer-op", "timer-op-answer"})
"""The records that name what is stored: a timer's row, and an operator's op on a parked
timer and its answer (read with `new_names=False`), whose owner or target an older version
may have taken with a control character. Their names are not held to
`NEW_IDENTIFIER_PATTERN`, which the records of new input (an event, a command, a result)
are."""


def render_schemas() -> dict[str, bytes]:
    """File name → the schema's JSON text (stable: sorted keys, indented)."""
    rendered = {}
    for name, model in _MODELS.items():
        schema = model.model_json_schema(mode="validation")
        if name in _NAMES_AS_STORED:
            _drop_new_names(schema)
        rendered[f"{name}.schema.json"] = orjson.dumps(
            schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
        )
    return rendered


def _drop_new_names(schema: object) -> None:
    """Takes `NEW_IDENTIFIER_PATTERN` out of `schema`, wherever it is."""
    if isinstance(schema, dict):
        if schema.get("pattern") == NEW_IDENTIFIER_PATTERN:
            del schema["pattern"]
        for value in schema.values():
            _drop_new_names(value)
    elif isinstance(schema, list):
        for value in schema:
            _drop_new_names(value)


def default_dir(cwd: Path | None = None) -> Path:
    """Where `tickwheel schemas` writes and checks unless told: `docs/schemas` of the
    working directory when there is one (the repository's root), else the working
    directory itself."""
    here = Path.cwd() if cwd is None else cwd
    docs = here / "docs" / "schemas"
    return docs if docs.is_dir() else here


def write_schemas(directory: Path) -> list[Path]:
    """Writes every schema file into `directory` (made if missing); the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_schemas().items():
        path = directory / name
        path.write_bytes(text)
        written.append(path)
    return written


def stale_schemas(directory: Path = SCHEMA_DIR) -> list[str]:
    """The schema files of `directory` (the source tree's docs/schemas by default) that
    are missing or differ from the models."""
    return [
        name
        for name, text in render_schemas().items()
        if not (directory / name).is_file() or (directory / name).read_bytes() != text
    ]
