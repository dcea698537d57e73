"""The web edge's job routes, over the node's service's jobs (`app.ops.job_api`, as
`tickwheel jobs` does):

- `GET /jobs` lists the jobs (context, name, scope, default rule) and their instances (id,
  log partition); `?context=`, `?job=` narrow it, `?state=true` adds each instance as its
  schedule log has it (enabled, override, rule, last slot run). Lists of the same contexts
  share one fold of the logs, and its result for `STATE_FRESH_MS` after it ended
  (`app.ops.whole_reads`); a fold whose turn did not come within `STATE_WAIT_S` is a 503
  with Retry-After. It reads, and creates nothing;
- `POST /jobs/{context}/{job}/trigger` runs the job's instances once now (the schedule
  left as it is);
- `POST /jobs/{context}/{job}/enable` (resume), `.../disable` (pause), and
  `.../reschedule` (set the instances' override; `"rule": null` follows the default);
- `POST /jobs/{context}/{job}/backfill` runs each slot due in `[from, until]` (a past range)
  once, under the request id its live tick has, so a slot that ran live, or was backfilled
  before, is a DUPLICATE; `"dry_run": true` answers the slots and sends nothing. Its plan
  reads the schedule logs whole, as a state=true list's fold does, one at a time on a node:
  a backfill's turn comes before any fold not begun.

A write's JSON body names the instances: `tenants` (a TENANT job's), `partition` (a
SHARDED job's one shard; all of them when absent). Its request id is the body's
`request_id`, or the `Idempotency-Key` header, or a fresh one, made the action's own:
`<action>:<request id>` (`action_request_id`: one id reused for another action is not its
DUPLICATE); with several instances each command's is `<action>:<request id>@<tenant>/
<instance id>`. The same request sent again with the same id changes nothing more: every
command is answered DUPLICATE (a backfill's ids are its slots' own, so it needs none).

The answer is a `JobAnswer`, one outcome per command: 200 when each is done (COMMITTED,
DUPLICATE, UNCHANGED), 422 when one was refused (REJECTED, SCHEDULE_JOB_INVALID), 502 when
one failed (ERROR), 503 when a partition was busy (BUSY, `Retry-After`), 504 when one had
no answer in time (send it again with the same request id). Errors are JSON `ApiError`s
naming the wrong `field`, 400: a body that is not a JSON object, a field of the wrong type,
a context or job not declared, instances the job does not have, a bad range (not an
instant, ending before it starts or after now, more than `MAX_BACKFILL_SLOTS` slots an
instance or `MAX_BACKFILL_TOTAL_SLOTS` in all, or
older than the de-duplication window allows); 503 when the broker did not take the
commands. The writes need the web token, as every action does.

A request's body is read by `app.ops.job_requests`; the answers and errors are made by
`app.ops.job_answers`.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

from aiohttp import web

from app.errors import KafkaUnavailable
from app.jobs import (
    MAX_BACKFILL_SLOTS,
    MAX_BACKFILL_TOTAL_SLOTS,
    Job,
    JobScope,
    backfill_command,
    instance_ids,
)
from app.ops import job_api
from app.ops.deadline import reader_for
from app.ops.job_answers import answer_status, command_outcome, job_error
from app.ops.job_api import JobInputError, json_field
from app.ops.job_models import (
    BackfillBody,
    JobAnswer,
    JobBody,
    JobInstance,
    JobList,
    JobListed,
    RescheduleBody,
)
from app.ops.job_requests import body_instant, request_body, validated
from app.ops.json_answers import json_response
from app.ops.timer_api import ApiError
from app.ops.whole_reads import StateFolds, Turns
from app.protocol.wire import CommandEnvelope
from tables.partitioner import partition_of

if TYPE_CHECKING:
    from app.node import Node

__all__ = [
    "IDEMPOTENCY_HEADER",
    "JOB_ACTIONS",
    "STATE_WAIT_S",
    "JobRoutes",
    "job_path",
]

JOB_ACTIONS = ("trigger", "enable", "disable", "reschedule", "backfill")
IDEMPOTENCY_HEADER = "Idempotency-Key"

STATE_WAIT_S = 5.0
"""How long a `GET /jobs?state=true` fold or a backfill waits for its turn to read the
schedule logs on the node before it is a 503 (Retry-After)."""


def job_path(action: str) -> str:
    return f"/jobs/{{context}}/{{job}}/{action}"


def _folding_busy(or_else: str) -> web.Response:
    """503: another read of schedule logs whole (a state=true list, a backfill's plan) held
    the node's turn for `STATE_WAIT_S`."""
    return json_response(
        ApiError(
            error="another state=true list or backfill is being read on this node (for over "
            f"{STATE_WAIT_S:g} s): ask again later{', ' + or_else if or_else else ''}"
        ).model_dump(mode="json"),
        503,
        {"Retry-After": str(math.ceil(STATE_WAIT_S))},  # whole seconds, as HTTP has it
    )


_TRUE, _FALSE = frozenset({"true", "1", "yes"}), frozenset({"false", "0", "no", ""})


class JobRoutes:
    """The job routes over a node; `wait_s`: how long a request waits for its answers."""

    def __init__(self, node: Node, wait_s: float) -> None:
        self._node = node
        self._wait_s = wait_s
        # A `?state=true` list folds a whole schedule log, kept for good, on the node's
        # event loop, and a backfill plans from it: one at a time, shared by the lists.
        self._turns = Turns()
        # The node's clock read when a fold ends, not looked up here: the routes may be
        # built over a stand-in for the node that has none (the worker's start, in tests).
        self._folds: StateFolds[dict[str, list[job_api.InstanceState]]] = StateFolds(
            self._turns, lambda: node.clock.now()
        )

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/jobs", self.list_jobs)
        for action in JOB_ACTIONS:
            app.router.add_post(job_path(action), self._handler(action))

    def _handler(self, action: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            try:
                return await self.act(action, request)
            except JobInputError as exc:
                return job_error(400, str(exc), exc.field)

        return handle

    # --- reads ---------------------------------------------------------------------------

    async def list_jobs(self, request: web.Request) -> web.Response:
        service, n = self._node.service, self._node.settings.partitions
        query = request.query
        unknown = sorted(set(query) - {"context", "job", "state"})
        if unknown:
            return job_error(400, f"unknown query parameter {unknown[0]!r}", unknown[0])
        state = query.get("state", "").lower()
        if state not in _TRUE | _FALSE:
            return job_error(400, f"state {state!r}: give true or false", "state")
        contexts = sorted(c for c, jobs in service.jobs.items() if jobs)
        listed: list[tuple[str, Job]] = [(c, j) for c in contexts for j in service.jobs[c]]
        try:
            if "context" in query:
                listed = [(c, j) for c, j in listed if c == query["context"]]
                if not listed:
                    job_api.find_job(service, query["context"], "")  # raises, naming them
            if "job" in query:
                named = [(c, j) for c, j in listed if j.name == query["job"]]
                if not named:
                    known = ", ".join(sorted({j.name for _, j in listed})) or "none"
                    raise JobInputError("job", f"unknown job {query['job']!r} (jobs: {known})")
                listed = named
        except JobInputError as exc:
            return job_error(400, str(exc), exc.field)
        states: dict[str, list[job_api.InstanceState]] = {}
        if state in _TRUE:
            got = await self._states(sorted({c for c, _ in listed}))
            if got is None:
                return _folding_busy("or leave state out")
            states = got
        out = []
        for ctx, job in listed:
            # A thread: a SHARDED job's ids are found on their first listing, about n**2
            # hash calls (seconds for 1,024 partitions), which would hold up the loop.
            found = await asyncio.to_thread(instance_ids, ctx, job, n)
            ids = sorted(found, key=lambda i: partition_of(i, n))
            seen = [s.as_json() for s in states.get(ctx, []) if s.id in ids]
            out.append(
                JobListed(
                    context=ctx,
                    job=job.name,
                    scope=job.scope.value,
                    rule=job.rule.model_dump(mode="json"),
                    instances=[JobInstance(id=i, partition=partition_of(i, n)) for i in ids],
                    state=seen if state in _TRUE else None,
                )
            )
        return json_response(JobList(partitions=n, jobs=out).model_dump(mode="json"))

    async def _states(self, contexts: list[str]) -> dict[str, list[job_api.InstanceState]] | None:
        """The instances of `contexts`' jobs as their schedule logs have them, folded for
        this list or shared with others (`StateFolds`); None when the fold's turn did not
        come within `STATE_WAIT_S` (a queue of folds would answer ever later while holding
        their connections; a 503 says when to come back instead)."""
        service, n = self._node.service, self._node.settings.partitions

        async def fold() -> dict[str, list[job_api.InstanceState]]:
            states = {}
            for ctx in contexts:
                reader = self._node.clients.reader()
                await reader.start()
                try:
                    states[ctx] = await job_api.read_instances(
                        reader, ctx, service.jobs[ctx], n, n, self._node.limits
                    )
                finally:
                    await reader.stop()
            return states

        return await self._folds.get(tuple(contexts), fold, STATE_WAIT_S)

    # --- writes --------------------------------------------------------------------------

    async def act(self, action: str, request: web.Request) -> web.Response:
        node = self._node
        n = node.settings.partitions
        context, name = request.match_info["context"], request.match_info["job"]
        job = job_api.find_job(node.service, context, name)
        data = await request_body(request)
        if job.scope is JobScope.SHARDED:
            # Its ids are found once per process, about partitions**2 hash calls (seconds
            # at 1,024 partitions): the first time off the loop, as the list does.
            await asyncio.to_thread(instance_ids, context, job, n)
        if action == "backfill":
            return await self._backfill(context, job, data)
        header = request.headers.get(IDEMPOTENCY_HEADER)
        if header is not None:
            if data.get("request_id") not in (None, header):
                raise JobInputError("request_id", f"differs from the {IDEMPOTENCY_HEADER} header")
            data = {**data, "request_id": header}
        model = RescheduleBody if action == "reschedule" else JobBody
        body = validated(model, data)
        if body.rule is not None and action not in ("enable", "reschedule"):
            raise JobInputError("rule", f"a {action} takes no rule")
        commands = job_api.instance_commands(
            action,
            context,
            job,
            partitions=n,
            tenants=body.tenants or (),
            partition=body.partition,
            rule=job_api.rule_override(body.rule, job),
            request_id=body.request_id,
            spell=json_field,
            now=node.clock.now(),
        )
        return await self._send(action, context, job, commands)

    async def _backfill(self, context: str, job: Job, data: dict[str, Any]) -> web.Response:
        node = self._node
        n = node.settings.partitions
        body = validated(BackfillBody, data)
        start, end = body_instant(body.from_, "from"), body_instant(body.until, "until")
        now = node.clock.now()
        job_api.check_range(start, end, now)
        refs = job_api.instance_refs(
            context,
            job,
            partitions=n,
            tenants=body.tenants or (),
            partition=body.partition,
            spell=json_field,
        )
        if not await self._turns.take(backfill=True, wait_s=STATE_WAIT_S):
            return _folding_busy("")
        try:
            reader = node.clients.reader()
            await reader.start()
            try:
                planned = await job_api.plan_backfill(
                    job_api.InstanceEvents(reader, refs, n, self._node.limits),
                    refs,
                    start,
                    end,
                    now=now,
                    window_ms=node.settings.request_id_window_ms,
                    limit=MAX_BACKFILL_SLOTS,
                    total=MAX_BACKFILL_TOTAL_SLOTS,
                )
            finally:
                await reader.stop()
        finally:
            self._turns.release()
        commands = [backfill_command(ref, s, now=now) for ref, slots in planned for s in slots]
        if body.dry_run:
            outcomes = [command_outcome(c, None) for c in commands]
            answer = JobAnswer(
                action="backfill",
                context=context,
                job=job.name,
                outcomes=outcomes,
                answered=False,
                dry_run=True,
            )
            return json_response(answer.model_dump(mode="json"))
        return await self._send("backfill", context, job, commands)

    async def _send(
        self, action: str, context: str, job: Job, commands: list[CommandEnvelope]
    ) -> web.Response:
        node = self._node
        try:
            try:
                # The wait bounds the reader's stop too (`reader_for`): librdkafka's,
                # stopped plainly, held the answer up to 30 s past it.
                async with reader_for(node.clients, self._wait_s) as reader:
                    results = await job_api.send_and_wait(
                        node.producer, reader, node.settings.partitions, commands, self._wait_s
                    )
            finally:
                self._folds.forget()  # written, or maybe: the next list reads it
        except KafkaUnavailable as exc:
            # Sent or not: the same request ids, sent again, change nothing more.
            ids = ", ".join(c.request_id for c in commands)
            return json_response(
                ApiError(
                    error=f"the broker did not take or answer the commands ({exc}): send them "
                    f"again with the same request ids ({ids})",
                    request_id=commands[0].request_id if len(commands) == 1 else None,
                ).model_dump(mode="json"),
                503,
                {"Retry-After": "5"},
            )
        outcomes = [command_outcome(c, results.get(c.request_id)) for c in commands]
        answer = JobAnswer(
            action=action,
            context=context,
            job=job.name,
            outcomes=outcomes,
            answered=len(results) == len(commands),
        )
        status = answer_status([o.code for o in outcomes])
        headers = {"Retry-After": "1"} if status == 503 else None
        return json_response(answer.model_dump(mode="json"), status, headers)
