"""JSON Schemas of the wire envelopes, published under `docs/schemas/` for other languages."""

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
    ScheduleSet,
    TimerOp,
)
from tables import Timer

__all__ = ["SCHEMA_DIR", "render_schemas", "stale_schemas", "write_schemas"]

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "docs" / "schemas"

_MODELS: dict[str, type[BaseModel]] = {
    "event": EventEnvelope,
    "wow.ScheduleSet": ScheduleSet,
    "wow.ScheduleCancelled": ScheduleCancelled,
    "wow.AggregateDeleted": AggregateDeleted,
    "command": CommandEnvelope,
    "command-result": CommandResult,
    "dead-letter-headers": DeadLetterContext,
    "timer": Timer,
    "timer-op": TimerOp,
}


def render_schemas() -> dict[str, bytes]:
    """File name → the schema's JSON text (stable: sorted keys, indented)."""
    return {
        f"{name}.schema.json": orjson.dumps(
            model.model_json_schema(mode="validation"),
            option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE,
        )
        for name, model in _MODELS.items()
    }


def write_schemas(directory: Path = SCHEMA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_schemas().items():
        path = directory / name
        path.write_bytes(text)
        written.append(path)
    return written


def stale_schemas(directory: Path = SCHEMA_DIR) -> list[str]:
    """The schema files that are missing or differ from the models."""
    return [
        name
        for name, text in render_schemas().items()
        if not (directory / name).is_file() or (directory / name).read_bytes() != text
    ]
