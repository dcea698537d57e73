"""The rule expressions `tickwheel rules next` reads, and the slots it prints. Pure: no I/O,
no clock (the caller passes "now").

An EXPR is a rule as the wire format spells it (`docs/wire-format.md`), either whole, as
its JSON object (`{"kind":"cron","expr":"0 9 * * MON-FRI","zone":"Europe/Berlin"}`), or
as a shorthand named by the same `kind`:

- `cron:<expression>`: five fields, or six with seconds first; its zone is `--zone`
  (default UTC), its `start` 0;
- `interval:<every>[@<start>]`: `every` in milliseconds (`900000`) or as a duration of
  whole units (`15m`, `1h30m`, `500ms`; units `d`, `h`, `m`, `s`, `ms`); `start` an
  INSTANT, by default the `--from` instant (slot 0 is then due at `--from`);
- `once:<at>`: one slot at the INSTANT `at`.

`--until INSTANT` and `--count N` end a recurring rule (its `until` and `count`);
`--jitter DURATION` (`30s`, or ms) is any rule's `jitter`: each timer fires each slot at
an offset in [0, jitter) after its due time, derived from the slot's request id.

An INSTANT is read by `app.protocol.instants`: ISO 8601 with its offset, or epoch ms.

The slots are the runner's own: `first_slot` of the rule at or after `--from`, then
`next_slot` each time (`tables.slots`), as a timer of this rule set at `--from` would fire.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import orjson
from pydantic import BaseModel, ConfigDict, Field

from app.protocol import instants
from app.protocol.instants import BadInstant
from tables.exceptions import InvalidRule
from tables.rules import CronRule, IntervalRule, OnceRule, parse_rule
from tables.slots import Slot, first_slot, next_slot

__all__ = [
    "BadExpression",
    "SlotLine",
    "check_zone",
    "next_slots",
    "parse_duration",
    "parse_expr",
    "parse_instant",
    "slot_line",
    "utc_text",
]

Rule = OnceRule | IntervalRule | CronRule

_UNITS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_PART = re.compile(r"([0-9]+)(ms|d|h|m|s)")
_MAX_DIGITS = 19
_KINDS = ("cron", "interval", "once")


class BadExpression(ValueError):
    """An EXPR or a zone that names no rule; the message says what (`BadInstant`, its
    subclass here, for an instant)."""


def parse_instant(text: str, what: str = "instant") -> int:
    """`app.protocol.instants.parse_instant`, its error a `BadExpression`."""
    try:
        return instants.parse_instant(text, what)
    except BadInstant as exc:
        raise BadExpression(str(exc)) from exc


def parse_duration(text: str, what: str = "interval") -> int:
    """Milliseconds of `900000` or of whole units, `1h30m`, `15m`, `500ms`."""
    shown = repr(text if len(text) <= 40 else text[:40] + "...")
    # ASCII digits alone: isdigit() and \d take "²" and other digits int() refuses or reads.
    bare = text.isascii() and text.isdigit()
    parts = [(text, "ms")] if bare else _PART.findall(text)
    if not bare and (not parts or "".join(n + u for n, u in parts) != text):
        raise BadExpression(
            f"{what} {shown} is neither milliseconds nor a duration like 15m, 1h30m, "
            "500ms (units d, h, m, s, ms)"
        )
    # int() refuses more than 4,300 digits; a rule's every and jitter fit in 64 bits.
    if any(len(n.lstrip("0")) > _MAX_DIGITS for n, _ in parts):
        raise BadExpression(f"{what} {shown} is too large")
    ms = sum(int(n) * _UNITS[u] for n, u in parts)
    if ms < 1:
        raise BadExpression(f"{what} {shown} must be at least 1 ms")
    return ms


def parse_expr(
    expr: str,
    zone: str | None,
    now: int,
    *,
    until: int | None = None,
    count: int | None = None,
    jitter: int | None = None,
) -> Rule:
    """The rule `expr` names (see the module's doc); `zone` is `--zone` (None: not given),
    `now` the `--from` instant an interval without a start starts at; `until` and `count`
    (`--until`, `--count`) end a recurring rule; `jitter` (`--jitter`, ms) spreads its
    slots."""
    text = expr.strip()
    ends = {k: v for k, v in (("until", until), ("count", count)) if v is not None}
    spread = {} if jitter is None else {"jitter": jitter}
    if text.startswith("{"):
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise BadExpression(f"rule {text!r} is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise BadExpression(f"rule {text!r} is not a JSON object")
        given = {"zone": zone, **ends} if data.get("kind") == "cron" and zone else ends
        given = {**given, **spread}
        for name, value in given.items():
            if name in data and data[name] != value:
                raise BadExpression(
                    f"the rule's {name} {data[name]!r} and --{name} {value!r} differ"
                )
        return _rule({**data, **given})
    kind, colon, rest = text.partition(":")
    if not colon or kind not in _KINDS:
        raise BadExpression(
            f"rule {expr!r} is none of cron:<expression>, interval:<every>[@<start>], "
            "once:<instant> or a rule's JSON object"
        )
    rest = rest.strip()
    if kind == "cron":
        return _rule({"kind": "cron", "expr": rest, "zone": zone or "UTC", **ends, **spread})
    if kind == "interval":
        every, at, start = rest.partition("@")
        begin = parse_instant(start, "start") if at else now
        return _rule(
            {
                "kind": "interval",
                "every": parse_duration(every.strip()),
                "start": begin,
                **ends,
                **spread,
            }
        )
    if ends:
        raise BadExpression(
            f"a once rule has one slot: --{next(iter(ends))} is for recurring rules"
        )
    return _rule({"kind": "once", "at": parse_instant(rest, "at"), **spread})


def _rule(data: object) -> Rule:
    try:
        return parse_rule(data, strict=True)  # as a record's rule is read
    except InvalidRule as exc:
        raise BadExpression(f"bad rule: {exc}") from exc


def check_zone(zone: str) -> ZoneInfo:
    """The zone of an IANA name, as a cron rule's zone is checked."""
    try:
        return CronRule(expr="* * * * *", zone=zone).tz
    except ValueError as exc:
        raise BadExpression(
            f"unknown time zone {zone!r} (use an IANA name, e.g. Europe/Berlin)"
        ) from exc


def next_slots(rule: Rule, not_before: int, n: int) -> list[Slot]:
    """The rule's first `n` slots due at or after `not_before`: `first_slot`, then
    `next_slot`, as the runner steps a timer of this rule set at `not_before`. A once rule
    due before `not_before` has none."""
    slots: list[Slot] = []
    slot = first_slot(rule, not_before)
    while slot is not None and len(slots) < n:
        if slot.due_at >= not_before:
            slots.append(slot)
        slot = next_slot(rule, slot)
    return slots


class SlotLine(BaseModel):
    """One slot as `rules next --json` prints it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int
    due_at: int
    utc: str
    local: str
    zone: str
    offset: str
    fires_at: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="a jittered rule's slot as one timer fires it (`--timer-id`): due_at "
        "plus the slot's jitter",
    )


def utc_text(ms: int) -> str:
    return instants.iso_text(ms).replace("+00:00", "Z")


def slot_line(slot: Slot, zone: ZoneInfo, fires_at: int | None = None) -> SlotLine:
    """`slot` with its UTC time and its local time in `zone`, with the offset then (which a
    daylight-saving change moves); `fires_at`, when one timer's jitter is shown."""
    moment = datetime.fromtimestamp(slot.due_at // 1000, UTC).replace(
        microsecond=(slot.due_at % 1000) * 1000
    )
    try:
        local = moment.astimezone(zone)
        local_text, offset = local.isoformat(timespec="milliseconds"), local.tzname() or ""
    except (OverflowError, ValueError):
        local_text, offset = instants.PAST_DATES, ""  # the zone's date is past 9999-12-31
    return SlotLine(
        index=slot.index,
        due_at=slot.due_at,
        utc=utc_text(slot.due_at),
        local=local_text,
        zone=str(zone.key),
        offset=offset,
        fires_at=fires_at,
    )
