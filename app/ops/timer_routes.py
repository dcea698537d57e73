"""The web edge's timer routes, on a timer book (`app.ops.timer_api`):

- `PUT /timers/{type}/{owner}/{key}` sets the timer (creates it, or replaces the one set
  under that key): a JSON `TimerPut` in, a `TimerAnswer` out (200), once the node owning
  the book's partition has appended its event;
- `DELETE /timers/{type}/{owner}/{key}` cancels it (200, a `TimerAnswer`; a key with no
  timer is cancelled all the same: nothing to cancel is no error);
- `POST /timers/{type}/{owner}/{key}/pause` holds the timer (PAUSED: it keeps its rule
  and fires nothing), `.../resume` runs it again (caught up by its rule's policy), and
  `.../trigger` sends its command once now (its rule and next slot as they were), each a
  `TimerAnswer` (200; UNCHANGED: a paused timer paused again, a running one resumed); a
  key the book has no timer under (never set, cancelled, or ended more than the book's
  retention ago) is a 404, and a timer this node's table holds FIRED or CANCELLED a 409
  (unless the book applied its request id: a retry of what was done is its DUPLICATE),
  both naming `key`, as is a trigger of a timer whose rule ended (the book refuses it, on
  any node: `app.clients.timer_book.ended_refusal`; a pause goes to the table, which holds
  a PARKED row);
- `GET /timers/{type}/{owner}/{key}` shows the timer's row (a `Timer`) when this node
  keeps the owner's partition; 404 when it keeps no such timer, 409 naming the partition
  when another node of the group keeps it (`tickwheel timers show` reads any).

`{type}` is a timer book of this node's service (`<context>.<book>`), `{owner}` the book's
id, `?tenant=` its tenant (the default tenant when absent). A change's request id is the
body's `request_id`, or the `Idempotency-Key` header (or `?request_id=`: a DELETE's or a
POST's, which take no body), or a new one: the same
request id sent again writes nothing and is answered DUPLICATE (200), so a client retries
a change that timed out (504, with the request id) with the same id.

Errors are JSON `ApiError`s naming the wrong `field`: 400 for a request that cannot be
sent (a body that is not JSON, does not validate or that the book would refuse: its rule
has no slot left, its target is the book; a once rule's `at` in epoch seconds,
`rule.once.at`; or the node would not read: `command.body` nested deeper than a set
carries it, `command` for a set past `TICKWHEEL_MAX_RECORD_BYTES`, `owner` past
`TICKWHEEL_MAX_KEY_BYTES`; a wrong path), as on the job routes, 404 for a type that is no
timer book here, 503 (with `Retry-After`) when the book's partition is busy or the broker
did not take the command, 504 when no answer came in time (with the request id to send
again). A command the book answered is a `TimerAnswer`: 422 when it REJECTED it, 502 when
it answered ERROR. The writes need the web token, as every action does.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from aiohttp import web

from app.clients.timer_book import RULE_ENDED
from app.errors import KafkaUnavailable
from app.ops.deadline import reader_for
from app.ops.json_answers import json_response
from app.ops.timer_api import (
    ACTIONS,
    DONE,
    ApiError,
    BadRequest,
    answer_of,
    asked_id,
    cancel_command,
    is_book,
    key_command,
    owner_ref,
    put_of,
    set_command,
    submit,
)
from app.protocol.json_input import load_json
from app.protocol.wire import CommandEnvelope, ResultCode
from tables import DEFAULT_TENANT, Timer, TimerStatus
from tables.exceptions import StoreError
from tables.partitioner import partition_of

if TYPE_CHECKING:
    from app.node import Node

__all__ = ["ACTION_PATHS", "TIMER_PATH", "TimerRoutes", "ended_row", "kept_row"]

TIMER_PATH = "/timers/{type}/{owner}/{key}"

ACTION_PATHS = {action: f"{TIMER_PATH}/{action}" for action in ACTIONS}
"""`POST` routes of the actions on one timer, by action."""

_DONE_WITH = frozenset({TimerStatus.FIRED, TimerStatus.CANCELLED})

IDEMPOTENCY_HEADER = "Idempotency-Key"


def _error(status: int, error: str, field: str | None = None, **more: Any) -> web.Response:
    return json_response(ApiError(error=error, field=field, **more).model_dump(mode="json"), status)


async def kept_row(node: Node, owner: Any, key: str) -> Timer | None:
    """The timer's row when `node` keeps its partition (None: it keeps no such row, or
    another node keeps the partition: the book decides alone then)."""
    p = partition_of(owner.id, node.settings.partitions)
    kept = node.types.get(owner.type_name)
    if kept is None or not node.owns(kept.name, p):
        return None
    return await kept.store.find(owner, key)


def given_id(request: web.Request) -> str | None:
    """The request id an action names: its `Idempotency-Key` header, even empty (refused by
    `given_request_id`, not taken for none), else `?request_id=`; None: neither."""
    header = request.headers.get(IDEMPOTENCY_HEADER)
    return header if header is not None else request.query.get("request_id")


def ended_row(node: Node, owner: Any, held: Timer | None, request_id: str) -> Timer | None:
    """`held` (`kept_row`) when it is FIRED or CANCELLED and the book has not applied
    `request_id`: an action on it is refused (409) unsent. One the book applied before
    the timer ended is a client's retry (or a form submitted again) of what was carried
    out: sent, it is answered DUPLICATE, not "nothing to do" (it was done)."""
    if held is None or held.status not in _DONE_WITH:
        return None
    kept = node.types.get(owner.type_name)
    p = partition_of(owner.id, node.settings.partitions)
    if kept is not None:
        with contextlib.suppress(StoreError):  # unread: refused as ended, as before
            if kept.applied(p, owner, request_id):
                return None
    return held


class TimerRoutes:
    """The three routes over a node; `wait_s`: how long a change waits for its answer."""

    def __init__(self, node: Node, wait_s: float) -> None:
        self._node = node
        self._wait_s = wait_s

    def add_to(self, app: web.Application) -> None:
        app.router.add_put(TIMER_PATH, self.put)
        app.router.add_delete(TIMER_PATH, self.delete)
        app.router.add_get(TIMER_PATH, self.get)
        for action, path in ACTION_PATHS.items():
            app.router.add_post(path, self._action_route(action))

    def _now(self) -> int:
        # The node's clock, which decides the commands: a command is dated by it.
        return self._node.clock.now()

    def _book(self, request: web.Request) -> Any:
        name = request.match_info["type"]
        agg = self._node.aggregates.get(name)
        if not is_book(agg):
            books = sorted(n for n, a in self._node.aggregates.items() if is_book(a))
            known = ", ".join(books) or "none"
            raise _NotBook(f"{name} is no timer book of this node (its books: {known})")
        return agg

    def _owner(self, request: web.Request) -> Any:
        tenant = request.query.get("tenant", DEFAULT_TENANT)
        return owner_ref(request.match_info["type"], request.match_info["owner"], tenant)

    async def put(self, request: web.Request) -> web.Response:
        try:
            book = self._book(request)
            owner = self._owner(request)
            try:
                data = load_json(await request.read())
            except ValueError as exc:
                raise BadRequest("body", f"not JSON: {exc}") from exc
            if not isinstance(data, dict):
                raise BadRequest("body", "must be a JSON object")
            header = request.headers.get(IDEMPOTENCY_HEADER)
            given = data.get("request_id")
            if header is not None and given is not None and header != given:
                raise BadRequest("request_id", f"differs from the {IDEMPOTENCY_HEADER} header")
            if header is not None:
                data = {**data, "request_id": header}
            put = put_of(data)
            key = request.match_info["key"]
            limits = self._node.settings.limits
            cmd = set_command(book, owner, key, put, self._now(), limits=limits)
        except _NotBook as exc:
            return _error(404, str(exc), "type")
        except BadRequest as exc:
            return _error(400, exc.message, exc.field)
        return await self._send(cmd)

    async def delete(self, request: web.Request) -> web.Response:
        try:
            self._book(request)
            owner = self._owner(request)
            cmd = cancel_command(
                owner,
                request.match_info["key"],
                given_id(request),
                self._now(),
            )
        except _NotBook as exc:
            return _error(404, str(exc), "type")
        except BadRequest as exc:
            return _error(400, exc.message, exc.field)
        return await self._send(cmd)

    def _action_route(self, action: str) -> Any:
        async def route(request: web.Request) -> web.Response:
            return await self.act(action, request)

        return route

    async def act(self, action: str, request: web.Request) -> web.Response:
        """A pause, resume or trigger of one timer (`ACTIONS`)."""
        try:
            self._book(request)
            owner = self._owner(request)
            if not _no_body(await request.read()):
                raise BadRequest(
                    "body",
                    f"takes no body: its request id goes in the {IDEMPOTENCY_HEADER} header "
                    "or ?request_id=",
                )
            key = request.match_info["key"]
            given = given_id(request)
            cmd = key_command(action, owner, key, given, self._now())
        except _NotBook as exc:
            return _error(404, str(exc), "type")
        except BadRequest as exc:
            return _error(400, exc.message, exc.field)
        held = ended_row(self._node, owner, await self._held(owner, key), cmd.request_id)
        if held is not None:
            return _error(
                409,
                f"{owner}'s timer {key!r} is {held.status}: nothing to {action} "
                "(set it again to start it anew)",
                "key",
                request_id=asked_id(cmd),
            )
        return await self._send(cmd, refused=404)

    async def _held(self, owner: Any, key: str) -> Timer | None:
        return await kept_row(self._node, owner, key)

    async def get(self, request: web.Request) -> web.Response:
        try:
            self._book(request)
            owner = self._owner(request)
        except _NotBook as exc:
            return _error(404, str(exc), "type")
        except BadRequest as exc:
            return _error(400, exc.message, exc.field)
        key = request.match_info["key"]
        p = partition_of(owner.id, self._node.settings.partitions)
        kept = self._node.types.get(owner.type_name)
        if kept is None or not self._node.owns(kept.name, p):
            return _error(
                409,
                f"partition {p} of {owner.type_name} is kept by another node of the group "
                "(`tickwheel timers show` reads any partition)",
                "owner",
            )
        timer = await kept.store.find(owner, key)
        if timer is None:
            return _error(404, f"{owner} has no timer {key!r}", "key")
        return json_response(timer.model_dump(mode="json"))

    async def _send(self, cmd: CommandEnvelope, refused: int = 422) -> web.Response:
        node = self._node
        try:
            # The wait bounds the reader's stop too (`reader_for`).
            async with reader_for(node.clients, self._wait_s) as reader:
                result = await submit(
                    node.producer, reader, cmd, node.settings.partitions, self._wait_s
                )
        except KafkaUnavailable as exc:
            # Sent or not: the same request id, sent again, changes nothing more.
            return json_response(
                ApiError(
                    error=f"the broker did not take or answer the change ({exc}): send it "
                    "again with the same request id",
                    request_id=asked_id(cmd),
                ).model_dump(mode="json"),
                503,
                {"Retry-After": "5"},
            )
        if result is None:
            return _error(
                504,
                f"no answer in {self._wait_s:g} s: send it again with the same request id "
                "to learn it (that changes nothing more)",
                request_id=asked_id(cmd),
            )
        answer = answer_of(cmd, result).model_dump(mode="json")
        if result.code in DONE:
            return json_response(answer)
        if result.code is ResultCode.BUSY:
            return json_response(answer, 503, {"Retry-After": "1"})
        if result.code is ResultCode.ERROR:
            return json_response(answer, 502)
        if refused != 422:
            # An action on a key the book has no timer under: the path's key is wrong; on a
            # timer whose rule ended: a 409, as this node says of a FIRED row it keeps. By
            # the result's typed code, never by its text (which holds the caller's key); a
            # code this version does not know was read as none: a plain refusal.
            if result.code is ResultCode.REJECTED and result.refusal is RULE_ENDED:
                error = f"{result.refusal}: {result.message}"
                return _error(409, error, "key", request_id=asked_id(cmd))
            return _error(refused, result.message, "key", request_id=asked_id(cmd))
        return json_response(answer, 422)


class _NotBook(Exception):
    pass


def _no_body(raw: bytes) -> bool:
    """Whether an action's body is none: empty, or an empty JSON object however spaced
    (what a client posting `json={}` sends; `{ }` is as empty, as the docs promise)."""
    if not raw.strip():
        return True
    try:
        return bool(load_json(raw) == {})
    except ValueError:
        return False
