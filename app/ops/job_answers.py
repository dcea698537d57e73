"""What the web edge's job routes (`app.ops.job_routes`) answer: a `JobAnswer`'s HTTP status
by its commands' codes (`answer_status`), each command's outcome in it (`command_outcome`),
and an error as a JSON `ApiError` naming the wrong field (`job_error`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from app.ops.job_models import JobOutcome
from app.ops.json_answers import json_response
from app.ops.timer_api import DONE, ApiError
from app.protocol.wire import CommandEnvelope, CommandResult, ResultCode

__all__ = ["answer_status", "command_outcome", "job_error"]

_REFUSED = frozenset({ResultCode.REJECTED, ResultCode.SCHEDULE_JOB_INVALID})


def job_error(status: int, error: str, field: str | None = None, **more: Any) -> web.Response:
    return json_response(ApiError(error=error, field=field, **more).model_dump(mode="json"), status)


def answer_status(codes: Iterable[ResultCode | None]) -> int:
    """A `JobAnswer`'s HTTP status by its commands' codes (None: not answered): the worst
    one decides, a refusal before a failure before a busy partition before a wait."""
    got = set(codes)
    if got & _REFUSED or not got <= DONE | {ResultCode.ERROR, ResultCode.BUSY, None}:
        return 422
    if ResultCode.ERROR in got:
        return 502
    if ResultCode.BUSY in got:
        return 503
    return 504 if None in got else 200


def command_outcome(cmd: CommandEnvelope, result: CommandResult | None) -> JobOutcome:
    slot, due_at = cmd.body.get("slot"), cmd.body.get("due_at")
    return JobOutcome(
        instance=cmd.aggregate,
        request_id=cmd.request_id,
        code=None if result is None else result.code,
        duplicate=result is not None and result.code is ResultCode.DUPLICATE,
        message="" if result is None else result.reason,
        version=None if result is None else result.version,
        slot=slot if isinstance(slot, int) else None,
        due_at=due_at if isinstance(due_at, int) else None,
    )
