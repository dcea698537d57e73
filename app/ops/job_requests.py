"""How the web edge's job routes (`app.ops.job_routes`) read a request: its body, a JSON
object (`request_body`), validated into its model (`validated`), its instants
(`body_instant`); input that is wrong is a `JobInputError` naming the field (a 400)."""

from __future__ import annotations

from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from app.ops.job_api import JobInputError
from app.protocol.instants import BadInstant, parse_instant
from app.protocol.json_input import load_json

__all__ = ["body_instant", "request_body", "validated"]

_M = TypeVar("_M", bound=BaseModel)


async def request_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        data = load_json(raw)
    except ValueError as exc:
        raise JobInputError("body", f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise JobInputError("body", "must be a JSON object")
    return data


def validated(model: type[_M], data: dict[str, Any]) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = err["loc"]
        # The field and any list index: a union's member tag (`until.str`) names no field.
        field = ".".join([str(loc[0]), *(str(p) for p in loc[1:] if isinstance(p, int))])
        message = err["msg"]
        if field in ("from", "until") and err["type"] != "missing":
            message = "give ISO 8601 with its offset (a string) or epoch ms (an integer)"
        raise JobInputError(field, f"{field}: {message}") from exc


def body_instant(value: str | int, field: str) -> int:
    try:
        return parse_instant(str(value), field)
    except BadInstant as exc:
        raise JobInputError(field, str(exc)) from exc
