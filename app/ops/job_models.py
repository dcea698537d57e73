"""The JSON bodies the web edge's job routes take and answer (`app.ops.job_routes`); the
OpenAPI document (`app.ops.openapi`) is built from them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.jobs import MAX_JOB_EVERY_MS, MIN_JOB_EVERY_MS
from app.ops.whole_reads import STATE_FRESH_MS
from app.protocol.wire import MAX_REQUEST_ID, ResultCode
from tables import AggregateRef

__all__ = [
    "BackfillBody",
    "JobAnswer",
    "JobBody",
    "JobInstance",
    "JobList",
    "JobListed",
    "JobOutcome",
    "RescheduleBody",
    "job_paths",
]

_EVERY = (
    f"; an interval's every is {MIN_JOB_EVERY_MS} to {MAX_JOB_EVERY_MS} ms (a job ticks "
    "once a second at most), else a 400 naming rule"
)


class JobBody(BaseModel):
    """A trigger's, enable's or disable's body: which instances (all of them when empty)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    tenants: list[str] | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="a TENANT job's tenants; the default tenant when absent (an empty list is "
        "refused: it named no instance)",
    )
    partition: int | None = Field(
        None, ge=0, description="a SHARDED job's one shard (log partition); all when absent"
    )
    request_id: str | None = Field(
        None,
        min_length=1,
        # 200 of the caller's; one an answer named (its action's prefix, and an instance's
        # `@<tenant>/<instance id>` when several shared it) as long as a request id may be,
        # sent again as the answer said (`instance_commands` holds each to its bound).
        max_length=MAX_REQUEST_ID,
        description="names this request: sent again with it, it changes nothing more",
    )
    rule: dict[str, Any] | None = Field(
        None,
        description="enable only: the instances' own rule parts (their override)" + _EVERY,
    )


class RescheduleBody(JobBody):
    """A reschedule's body: `rule` is required (null: follow the job's default again)."""

    rule: dict[str, Any] | None = Field(
        description='the instances\' own rule parts, e.g. {"every": 60000}; null: none' + _EVERY
    )


class BackfillBody(BaseModel):
    """A backfill's body: the past range, inclusive, and the instances."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=True)

    from_: str | int = Field(alias="from", description="ISO 8601 with offset, or epoch ms")
    until: str | int = Field(description="ISO 8601 with offset, or epoch ms; past")
    tenants: list[str] | None = Field(None, min_length=1, max_length=1000)
    partition: int | None = Field(None, ge=0)
    dry_run: bool = Field(False, description="answer the slots; send nothing")


class JobOutcome(BaseModel):
    """One command of a request: its instance, request id and result."""

    model_config = ConfigDict(frozen=True)

    instance: AggregateRef
    request_id: str
    code: ResultCode | None = Field(description="None: no answer in time (or a dry run)")
    duplicate: bool = Field(description="done before by this request id: nothing written")
    message: str = ""
    version: int | None = None
    slot: int | None = Field(None, description="a backfill's slot")
    due_at: int | None = Field(None, description="a backfill's slot's due time, epoch ms")


class JobAnswer(BaseModel):
    """What became of a job request: one outcome per command sent."""

    model_config = ConfigDict(frozen=True)

    action: Literal["trigger", "enable", "disable", "reschedule", "backfill"]
    context: str
    job: str
    outcomes: list[JobOutcome]
    answered: bool = Field(description="every command was answered")
    dry_run: bool = False


class JobInstance(BaseModel):
    id: str
    partition: int


class JobListed(BaseModel):
    context: str
    job: str
    scope: str
    rule: dict[str, Any]
    instances: list[JobInstance]
    state: list[dict[str, Any]] | None = Field(
        None, description="with ?state=true: each instance as its schedule log has it"
    )


class JobList(BaseModel):
    """`GET /jobs`: the node's service's jobs."""

    partitions: int
    jobs: list[JobListed]


def job_paths(
    ref: Callable[[type[BaseModel]], dict[str, str]],
    json: Callable[[str, dict[str, Any]], dict[str, Any]],
    error: Callable[[str], dict[str, Any]],
    unavailable: Callable[..., dict[str, Any]],
    path_of: Callable[[str], str],
) -> dict[str, Any]:
    """The OpenAPI paths of the job routes (`app.ops.openapi` gives its helpers;
    `unavailable(description[, schema])` is a 503 with Retry-After)."""

    def param(name: str, where: str, description: str, **schema: Any) -> dict[str, Any]:
        return {
            "name": name,
            "in": where,
            "required": where == "path",
            "description": description,
            "schema": schema or {"type": "string"},
        }

    answered = {
        "200": json("each command done (COMMITTED, DUPLICATE or UNCHANGED)", ref(JobAnswer)),
        "400": error("not a JSON object, a wrong field, job or range (field names it)"),
        "401": error("the node's web token is missing or wrong"),
        "422": json("a command refused (REJECTED, SCHEDULE_JOB_INVALID)", ref(JobAnswer)),
        "502": json("a command failed (ERROR)", ref(JobAnswer)),
        "503": unavailable(
            "a partition busy (a JobAnswer), the broker did not take the commands, or (a "
            "backfill) another read of schedule logs held the node's turn (an ApiError): "
            "send it again with the same request id after Retry-After",
            {"oneOf": [ref(JobAnswer), {"$ref": "#/components/schemas/ApiError"}]},
        ),
        "504": json("a command not answered in time: send it again as it was", ref(JobAnswer)),
    }
    idempotency = param("Idempotency-Key", "header", "the request id (as the body's request_id)")
    summaries: dict[str, tuple[str, type[BaseModel]]] = {
        "trigger": ("runs the job's instances once now; the schedule is unchanged", JobBody),
        "enable": ("enables (resumes) the job's instances, with their override", JobBody),
        "disable": ("disables (pauses) the job's instances", JobBody),
        "reschedule": ("sets the instances' override (null: the default)", RescheduleBody),
        "backfill": ("runs each slot of a past range once, as its live tick", BackfillBody),
    }
    paths: dict[str, Any] = {
        "/jobs": {
            "get": {
                "summary": "the service's jobs and their instances (reads; creates nothing)",
                "parameters": [
                    param("context", "query", "only this context's jobs"),
                    param("job", "query", "only this job"),
                    param(
                        "state",
                        "query",
                        "true: each instance as its log has it, read at most "
                        f"{STATE_FRESH_MS / 1000:g} s before (lists asked meanwhile share one "
                        "read)",
                    ),
                ],
                "responses": {
                    "200": json("the jobs", ref(JobList)),
                    "400": error("a bad parameter, named"),
                    "503": unavailable(
                        "state=true: a backfill or a list of other contexts held the node's "
                        "one read of schedule logs past the wait (STATE_WAIT_S), or the broker "
                        "did not answer: ask again after Retry-After"
                    ),
                },
            }
        }
    }
    for action, (summary, body) in summaries.items():
        paths[path_of(action)] = {
            "parameters": [
                param("context", "path", "the context the job is declared in"),
                param("job", "path", "the job's name"),
            ],
            "post": {
                "summary": summary,
                "security": [{"webToken": []}],
                "parameters": [] if action == "backfill" else [idempotency],
                "requestBody": {
                    "required": action in ("reschedule", "backfill"),
                    "content": {"application/json": {"schema": ref(body)}},
                },
                "responses": answered,
            },
        }
    return paths
