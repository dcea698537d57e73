"""What a client of a timer book sends: the book's commands on one key's timers (set,
cancel, pause, resume, trigger), each checked before anything is sent, and the request id
that makes a command sent again for the same event a DUPLICATE.

A client without an aggregate of its own (the faust client, `app.clients.faust_client`)
sends these to the book's command topic rather than writing the book's events
(`app.clients.timer_book` says why). The HTTP edge and the CLI build the same commands
(`app.ops.timer_api`), with request ids their callers name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any, Final, Protocol

from app.clients.book_state import BookState
from app.clients.timer_book import (
    CANCEL_TIMER,
    PAUSE_TIMER,
    RESUME_TIMER,
    SET_TIMER,
    TRIGGER_TIMER,
    TimerKey,
    book_reason,
)
from app.errors import BadRecord
from app.model.aggregate import MAX_TRIGGER_REQUEST_ID, AggregateType, send_fits
from app.protocol.instants import iso_text
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics
from app.protocol.wire import (
    MAX_REQUEST_ID,
    CommandEnvelope,
    ScheduleCancelled,
    ScheduleSet,
    encode,
)
from tables import AggregateRef, CommandSpec, CronRule, IntervalRule, OnceRule
from tables.bounds import MAX_DEPTH
from tables.refs import NEW_INPUT

__all__ = [
    "KEY_ACTIONS",
    "MAX_COMMAND_BODY_DEPTH",
    "SECONDS_BELOW",
    "BookCommands",
    "Delivered",
    "Rule",
    "command_body_reason",
    "request_id_for",
    "scoped_request_id",
    "seconds_reason",
    "unreadable",
    "unscoped_request_id",
]

Rule = OnceRule | IntervalRule | CronRule

KEY_ACTIONS: Final[dict[str, str]] = {
    "pause": PAUSE_TIMER,
    "resume": RESUME_TIMER,
    "trigger": TRIGGER_TIMER,
}
"""The actions on one timer by its key, and the book's command each sends (as
`tickwheel timers pause|resume|trigger` and `POST .../{key}/pause|resume|trigger`)."""


SECONDS_BELOW: Final = 10**11
"""Epoch ms 1973-03-03T09:46:40Z. A once rule's `at` below it that reads as a date past it
in seconds (from 10**8) is taken for seconds by the client edges (`seconds_reason`)."""


def seconds_reason(rule: Rule) -> str | None:
    """Why a once rule's `at` looks like epoch seconds where milliseconds are meant, or
    None: a client (a CLI line, an HTTP body, a faust app) giving 1733400000 for
    2024-12-05 would set a timer in January 1970, which fires at once. An `at` that no
    reading makes a date after 1973 (0, 5: what a test or a script gives for "now") is no
    unit mistake. Only the clients refuse it: the node takes any `at` the wire allows.

    A recurring rule's `start` or `until` in seconds fires nothing at once (a start only
    shifts its slots; an until long past leaves no slot, which `book_reason` refuses)."""
    if not isinstance(rule, OnceRule) or not SECONDS_BELOW // 1000 <= rule.at < SECONDS_BELOW:
        return None
    return (
        f"at is in epoch milliseconds; {rule.at} looks like seconds (as milliseconds it is "
        f"{_utc(rule.at)}, long past: it would fire at once; as seconds "
        f"{_utc(rule.at * 1000)}: give {rule.at * 1000})"
    )


def _utc(ms: int) -> str:
    return iso_text(ms).replace("+00:00", "Z")


MAX_COMMAND_BODY_DEPTH: Final = MAX_DEPTH - 2
"""How deep a timer's command's body set through a book may nest: a `wow.SetTimer`'s body
(and its `wow.ScheduleSet` event's) holds it two levels down (`command.body`), and a
record's body nests at most `MAX_DEPTH` (`tables.bounds.check_json`). A deeper one (a
`CommandSpec` alone takes `MAX_DEPTH`) makes a record the node drops unread, unanswered."""


def command_body_reason(body: object) -> str | None:
    """Why a timer's command's `body` (as given: JSON, or a `CommandSpec`'s) nests deeper
    than a set through a book carries it (`MAX_COMMAND_BODY_DEPTH`), or None. Checked
    before the command's own validation where the body comes as JSON, so the one bound
    said is this one."""
    stack: list[tuple[object, int]] = [(body, 1)]
    while stack:  # iterative: a body as given may nest far past any bound
        value, level = stack.pop()
        if isinstance(value, dict | list):
            if level > MAX_COMMAND_BODY_DEPTH:
                return (
                    f"nested more than {MAX_COMMAND_BODY_DEPTH} levels deep (a {SET_TIMER} "
                    f"holds it two levels down its body, which nests at most {MAX_DEPTH})"
                )
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, level + 1) for item in items)
    return None


class Delivered(Protocol):
    """Where the record an agent processes was read (a faust `Message`)."""

    @property
    def topic(self) -> str | None: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...


def request_id_for(op: str, key: str, message: Delivered | None) -> str:
    """The request id of a command sent while an agent processes `message`: the same each
    time that message is processed again, so the book applies the command once.

    `<topic>[<partition>]@<offset>:<op>:<key>`, or its SHA-256 when longer than a request
    id may be (a trigger's: longer than `MAX_TRIGGER_REQUEST_ID`).
    Without a message (outside an agent), or of one read from no topic (an `app.channel()`'s:
    no topic, offset -1), a `ValueError`: the caller must name the request itself.
    """
    if message is None:
        raise ValueError(
            f"{op} {key!r} outside an agent's event: pass request_id= (a retry must send "
            "the same one, so that the timer book applies it once)"
        )
    if not message.topic or message.offset < 0:
        # Every such event would give the same id: each command after the first on a key
        # would be answered DUPLICATE and dropped.
        raise ValueError(
            f"{op} {key!r} in an event read from no topic (topic {message.topic!r}, offset "
            f"{message.offset}: an app.channel()'s?): pass request_id= (one per command, the "
            "same when the event is processed again)"
        )
    rid = f"{message.topic}[{message.partition}]@{message.offset}:{op}:{key}"
    if len(rid) > (MAX_TRIGGER_REQUEST_ID if op == "trigger" else MAX_REQUEST_ID):
        rid = "sha256:" + hashlib.sha256(rid.encode()).hexdigest()
    return rid


def scoped_request_id(op: str, timer: str, given: str) -> str:
    """The request id of `op` on the timer `timer` asked under a caller's `given` one (the
    HTTP edge's, the CLI's `--request-id`): `<op>:<16 hex digits of timer's hash>:<given>`,
    or `<op>:<digits>:sha256:<hex of given>` when that is longer than a request id may be
    (a trigger's: `MAX_TRIGGER_REQUEST_ID`). The book de-duplicates request ids per owner:
    used as given, an id a caller reused for another change (a cancel after a set, a set of
    another timer) was that change's DUPLICATE, answered as done, nothing done. Scoped,
    two changes differ; the same change sent again is the same id. The timer's hash has a
    fixed width, so no two timers' ids meet (a name with a `:` included). An id that
    begins with its scope already (one an answer named, sent again as it said) is kept.
    `ValueError` for a `given` longer than a request id may be, as before ids were scoped."""
    limit = MAX_TRIGGER_REQUEST_ID if op == "trigger" else MAX_REQUEST_ID
    if len(given) > limit:
        what = "a trigger's request id" if op == "trigger" else "a request id"
        raise ValueError(f"{what} is at most {limit} characters, got {len(given)}")
    digest = hashlib.blake2b(timer.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    prefix = f"{op}:{digest}:"
    # Kept only when the caller's part it names, scoped again, is it (not empty, nor
    # scoped twice): so the id an answer names (`unscoped_request_id`) is this change.
    if given.startswith(prefix) and (rest := given[len(prefix) :]) and not rest.startswith(prefix):
        return given
    made = prefix + given
    if len(made) <= limit:
        return made
    return f"{prefix}sha256:{hashlib.sha256(given.encode('utf-8', 'surrogatepass')).hexdigest()}"


_SCOPE = re.compile(r"[a-z]+:[0-9a-f]{16}:")


def unscoped_request_id(request_id: str) -> str:
    """The id a caller names to send a change again: `request_id` without the scope
    `scoped_request_id` put before it (what the caller gave, or `sha256:<hex>` of it when it
    was hashed, which scoped again is the same id)."""
    scope = _SCOPE.match(request_id)
    return request_id[scope.end() :] if scope else request_id


def unreadable(cmd: CommandEnvelope, limits: InputLimits) -> tuple[str, str] | None:
    """Which part of `cmd`'s record ("key": its aggregate's id; "value": the command) the
    node would refuse to read (`InputLimits.check`, with its `limits`), and why; None when
    it reads it. Checked before the send: such a record is dead-lettered at read with no
    result, so its sender would wait for an answer that never comes."""
    for part, key, value in (
        ("key", cmd.aggregate.id.encode(), None),
        ("value", None, encode(cmd)),
    ):
        try:
            limits.check(key, value)
        except BadRecord as exc:
            return part, f"the {cmd.type}'s {exc}: the node would drop it unread, unanswered"
    return None


class BookCommands:
    """The commands on the timers of the book `book`'s keys, whose timers fire into
    `target`'s aggregate of the same id unless told otherwise; `now`: epoch ms, their
    `issued_at`. Each raises `ValueError` for what the book would refuse or the wire
    cannot carry, so that nothing is sent. `limits`: the record sizes the book's nodes read
    (their `TICKWHEEL_MAX_KEY_BYTES`, `TICKWHEEL_MAX_RECORD_BYTES`; the defaults unless
    given)."""

    def __init__(
        self,
        book: AggregateType[BookState],
        target: AggregateTopics,
        now: Callable[[], int],
        limits: InputLimits | None = None,
        *,
        sendable: tuple[int, str] | None = None,
    ) -> None:
        self.book = book
        self.target = target
        self._now = now
        self.limits = limits or InputLimits()
        self.sendable = sendable
        """The most bytes of a command's key and value together its carrier's producer sends
        (its request bound less a record's overhead), and that bound's name; None: no
        bound but `limits`."""

    def book_ref(self, key: str) -> AggregateRef:
        return _new_ref(self.book.context, self.book.name, key)

    def target_ref(self, key: str) -> AggregateRef:
        return _new_ref(self.target.context, self.target.aggregate, key)

    def set_command(
        self,
        key: str,
        timer: str,
        rule: Rule,
        command: CommandSpec,
        request_id: str,
        target: AggregateRef | None = None,
    ) -> CommandEnvelope:
        """The `wow.SetTimer` of `key`'s timer `timer` (replacing one of that name)."""
        # Validated as the book will read it: a name with a control character is refused.
        to = (target or self.target_ref(key)).model_dump()
        fields = {"key": timer, "rule": rule, "target": to, "command": command}
        body = ScheduleSet.model_validate(fields, context=NEW_INPUT)
        if (why := book_reason(self.book, body)) is not None:
            raise ValueError(why)
        if (why := seconds_reason(body.rule)) is not None:
            raise ValueError(why)
        if (why := command_body_reason(command.body)) is not None:
            raise ValueError(f"command.body: {why}")
        return self._command(key, SET_TIMER, body.model_dump(mode="json"), request_id)

    def cancel_command(self, key: str, timer: str, request_id: str) -> CommandEnvelope:
        """The `wow.CancelTimer` of `key`'s timer `timer` (nothing to cancel is no error)."""
        body = ScheduleCancelled(key=timer)
        return self._command(key, CANCEL_TIMER, body.model_dump(mode="json"), request_id)

    def key_command(self, action: str, key: str, timer: str, request_id: str) -> CommandEnvelope:
        """The book's command of `action` (`KEY_ACTIONS`) on `key`'s timer `timer`. The
        book answers it as it answers the CLI's and the HTTP edge's: COMMITTED, UNCHANGED
        (a pause of a paused timer, a resume of a running one: nothing written), REJECTED
        (no timer under that name, or a trigger of one whose rule ended), or
        DUPLICATE when its request id was decided before."""
        if action not in KEY_ACTIONS:
            raise ValueError(f"not one of {', '.join(sorted(KEY_ACTIONS))}: {action!r}")
        if action == "trigger" and not send_fits(request_id):
            raise ValueError(
                f"a trigger's request id is at most {MAX_TRIGGER_REQUEST_ID} characters, "
                f"got {len(request_id)}"
            )
        body = TimerKey(key=timer)
        return self._command(key, KEY_ACTIONS[action], body.model_dump(mode="json"), request_id)

    def _command(
        self, key: str, type_: str, body: dict[str, Any], request_id: str
    ) -> CommandEnvelope:
        cmd = CommandEnvelope(
            request_id=request_id,
            type=type_,
            aggregate=self.book_ref(key),
            body=body,
            issued_at=self._now(),
        )
        if (bad := unreadable(cmd, self.limits)) is not None:
            raise ValueError(bad[1])
        if self.sendable is not None:
            most, bound = self.sendable
            size = len(cmd.aggregate.id.encode()) + len(encode(cmd))
            if size > most:
                # Refused here: the producer's own refusal is no ValueError, and a caller
                # that retries a failed send (docs/faust.md's `durably`) would for ever.
                raise ValueError(
                    f"the {cmd.type}'s record of {size} bytes (key and value) exceeds the "
                    f"{most} its producer sends ({bound}, less a record's overhead)"
                )
        return cmd


def _new_ref(context: str, aggregate: str, key: str) -> AggregateRef:
    """The aggregate of `key`, a name the book's node will refuse (a control character in
    it, `tables.refs`) refused here: `ValueError` (a pydantic `ValidationError`)."""
    fields = {"context": context, "aggregate": aggregate, "id": key}
    return AggregateRef.model_validate(fields, context=NEW_INPUT)
