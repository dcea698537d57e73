"""The web edge's OpenAPI 3.1 document (`GET /openapi.json`), built from the pydantic
models its JSON routes take and answer (aiohttp has no generator of its own). A unit test
checks that every JSON route the server registers is described here, and every `$ref`
found."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.ops.job_models import (
    BackfillBody,
    JobAnswer,
    JobBody,
    JobList,
    RescheduleBody,
    job_paths,
)
from app.ops.job_routes import JOB_ACTIONS, job_path
from app.ops.page_ledger import LEDGER_LIMIT, LEDGER_LIMIT_MAX
from app.ops.timer_api import ApiError, TimerAnswer, TimerPut
from app.ops.timer_routes import ACTION_PATHS, IDEMPOTENCY_HEADER, TIMER_PATH
from app.ops.upcoming import DEFAULT_LIMIT, MAX_LIMIT, UpcomingAnswer
from tables.timer import Timer

__all__ = ["JSON_ROUTES", "openapi_document"]

_MODELS: tuple[type[BaseModel], ...] = (
    ApiError,
    Timer,
    TimerAnswer,
    UpcomingAnswer,
    JobAnswer,
    JobList,
)
_BODIES: tuple[type[BaseModel], ...] = (TimerPut, JobBody, RescheduleBody, BackfillBody)

JSON_ROUTES = frozenset(
    {
        ("GET", "/livez"),
        ("GET", "/readyz"),
        ("GET", "/healthz"),
        ("GET", "/ledger"),
        ("GET", "/timers/upcoming"),
        ("GET", TIMER_PATH),
        ("PUT", TIMER_PATH),
        ("DELETE", TIMER_PATH),
        *(("POST", path) for path in ACTION_PATHS.values()),
        ("GET", "/openapi.json"),
        ("GET", "/jobs"),
        *(("POST", job_path(a)) for a in JOB_ACTIONS),
    }
)
"""(method, path) of every route answering JSON: the document describes each."""


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(description, _ref(ApiError))


RETRY_AFTER: dict[str, Any] = {
    "Retry-After": {
        "description": "seconds to wait before asking again",
        "schema": {"type": "integer", "minimum": 0},
    }
}
"""The header every 503 but a health check's carries."""


def _unavailable(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """A 503 with `Retry-After`: the request may be sent again as it was."""
    return {**_json(description, schema or _ref(ApiError)), "headers": RETRY_AFTER}


_STORE_OR_BROKER = (
    "the broker did not answer, a partition was handed over while it was read, or its "
    "store failed: ask again after Retry-After"
)


_OBJECT: dict[str, Any] = {"type": "object"}


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema or {"type": "string"},
    }


def _path(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string"},
    }


def _health(summary: str) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "responses": {"200": _json("yes", _OBJECT), "503": _json("no, and why", _OBJECT)},
        }
    }


def openapi_document(version: str) -> dict[str, Any]:
    """The document, for the package's `version`."""
    _, defs = models_json_schema(
        [(m, "serialization") for m in _MODELS] + [(m, "validation") for m in _BODIES],
        ref_template="#/components/schemas/{model}",
    )
    timer_params = [
        _path("type", "a timer book of the node's service, <context>.<book>"),
        _path("owner", "the book's id (the timer's owner)"),
        _path("key", "the timer's key, unique per owner"),
        _query("tenant", "the owner's tenant (the default tenant when absent)"),
    ]
    written = {
        "200": _json(
            "done now (COMMITTED) or before by this request id (DUPLICATE)", _ref(TimerAnswer)
        ),
        "400": _error(
            "a request that cannot be sent (field names it): not JSON, a body that does "
            "not validate or that the book would refuse (a rule with no slot left, a target "
            "of the book's own type), or a wrong path"
        ),
        "401": _error("the node's web token is missing or wrong"),
        "404": _error("no timer book of this type here"),
        "422": _json("the command refused: REJECTED by the book", _ref(TimerAnswer)),
        "502": _json("the book answered ERROR", _ref(TimerAnswer)),
        "503": _unavailable(
            "the book's partition is busy (a TimerAnswer BUSY) or the broker did not take the "
            "command (an ApiError): retry with the same request id (Retry-After)",
            {"oneOf": [_ref(TimerAnswer), _ref(ApiError)]},
        ),
        "504": _error("no answer in time: retry with its request_id"),
    }
    idempotency = {
        "name": IDEMPOTENCY_HEADER,
        "in": "header",
        "required": False,
        "description": "the change's request id (a PUT's body may say it as request_id)",
        "schema": {"type": "string", "minLength": 1, "maxLength": 300},
    }
    actions = {
        "pause": "pauses the timer (PAUSED: it keeps its rule and fires nothing), through "
        "the book; UNCHANGED when paused already",
        "resume": "resumes a paused timer, caught up by its rule's catch-up policy, through "
        "the book; UNCHANGED when it runs",
        "trigger": "sends the timer's command once now, through the book (its request id is "
        "<its scoped request id>>0@<digest>, so a trigger sent again fires nothing more, and "
        "a trigger's request id is at most 298 characters); its rule and next slot are left "
        "as they were",
    }
    acted = {
        **{k: v for k, v in written.items() if k not in ("404", "422")},
        "200": _json(
            "done now (COMMITTED), before by this request id (DUPLICATE), or already so "
            "(UNCHANGED)",
            _ref(TimerAnswer),
        ),
        "400": _error("a body given (other than {}), or a wrong path (field names it)"),
        "404": _error(
            "no timer book of this type here (field type), or the book has no "
            "timer under the key: never set, cancelled, or ended more than the book's "
            "retention ago (field key)"
        ),
        "409": _error(
            "this node's table holds the timer FIRED or CANCELLED, or (a trigger) "
            "the timer's rule ended (field key)"
        ),
    }
    action_paths: dict[str, Any] = {
        path: {
            "parameters": timer_params,
            "post": {
                "summary": actions[action],
                "security": [{"webToken": []}],
                "parameters": [idempotency, _query("request_id", "as Idempotency-Key")],
                "responses": acted,
            },
        }
        for action, path in ACTION_PATHS.items()
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Tickwheel node", "version": version},
        "paths": {
            "/livez": _health("liveness: the process answers"),
            "/readyz": _health("readiness: every partition given to the node runs"),
            "/healthz": _health("readiness (as /readyz)"),
            "/ledger": {
                "get": {
                    "summary": "the newest open entries of the failure ledgers, whole",
                    "parameters": [
                        _query(
                            "limit",
                            "how many entries, the newest first (`more` counts the others)",
                            {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": LEDGER_LIMIT_MAX,
                                "default": LEDGER_LIMIT,
                            },
                        ),
                    ],
                    "responses": {
                        "200": _json("entries", _OBJECT),
                        "400": _error("a bad limit, or another parameter"),
                    },
                }
            },
            "/timers/upcoming": {
                "get": {
                    "summary": "PENDING and FIRING timers of the node's partitions by due time",
                    "parameters": [
                        _query("type", "the owner's type, <context>.<aggregate>"),
                        _query("owner", "the owner's id"),
                        _query("tenant", "the owner's tenant"),
                        _query("target", "the target's id"),
                        _query("target_type", "the target's type"),
                        _query("due_from", "ISO 8601 with offset, or epoch ms"),
                        _query("due_until", "ISO 8601 with offset, or epoch ms"),
                        _query(
                            "limit",
                            "page size",
                            {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": MAX_LIMIT,
                                "default": DEFAULT_LIMIT,
                            },
                        ),
                        _query("cursor", "a page's next_cursor"),
                    ],
                    "responses": {
                        "200": _json(
                            "a page, and what was read of the node's partitions",
                            _ref(UpcomingAnswer),
                        ),
                        "400": _error("a bad parameter, named"),
                        "503": _unavailable(
                            "another request's read was under way for too long (one at a "
                            "time per node), a partition was handed over while it was read, "
                            "or its store failed: ask again after Retry-After"
                        ),
                    },
                }
            },
            TIMER_PATH: {
                "parameters": timer_params,
                "get": {
                    "summary": "the timer's row, when this node keeps its partition",
                    "responses": {
                        "200": _json("the timer", _ref(Timer)),
                        "400": _error("a wrong path"),
                        "404": _error("no such timer book or timer"),
                        "409": _error("another node of the group keeps the partition"),
                        "503": _unavailable(_STORE_OR_BROKER),
                    },
                },
                "put": {
                    "summary": "sets the timer (creates or replaces it), through the book",
                    "security": [{"webToken": []}],
                    "parameters": [idempotency],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref(TimerPut)}},
                    },
                    "responses": written,
                },
                "delete": {
                    "summary": "cancels the timer, through the book",
                    "security": [{"webToken": []}],
                    "parameters": [idempotency, _query("request_id", "as Idempotency-Key")],
                    "responses": {k: v for k, v in written.items() if k != "422"},
                },
            },
            **job_paths(_ref, _json, _error, _unavailable, job_path),
            **action_paths,
            "/openapi.json": {
                "get": {
                    "summary": "this document",
                    "responses": {"200": _json("OpenAPI 3.1", _OBJECT)},
                }
            },
        },
        "components": {
            "schemas": defs["$defs"],
            "securitySchemes": {"webToken": {"type": "http", "scheme": "bearer"}},
        },
    }
