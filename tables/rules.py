"""ScheduleRule: when a timer fires. The model and its validation; arithmetic is in `slots`."""

from __future__ import annotations

import functools
import operator
from datetime import UTC, datetime
from typing import Annotated, Final, Literal
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from tables.bounds import MAX_INT64, Instant, Interval
from tables.exceptions import InvalidRule
from tables.zones import zone as tz_zone

__all__ = ["MAX_JITTER", "CronRule", "IntervalRule", "OnceRule", "ScheduleRule", "parse_rule"]


MAX_JITTER: Final = 86_400_000
"""The largest jitter, a day: a spread wider than that is a schedule of its own."""


_absent: Final = functools.partial(operator.is_, None)
"""Whether a field's value is None: `exclude_if`'s test, called by the serializer for every
row and record written. A C callable, not a Python function: no frame per call."""


def _kind_required(schema: JsonDict) -> None:
    # Python builds a rule without its `kind` (`OnceRule(at=...)`, its class says it), but
    # JSON is read by the discriminator, which refuses a rule without one: the published
    # schema must not take what the reader refuses.
    properties = schema.get("properties")
    if isinstance(properties, dict) and isinstance(kind := properties.get("kind"), dict):
        kind.pop("default", None)
        required = schema.get("required")
        schema["required"] = ["kind", *(required if isinstance(required, list) else [])]


class _Rule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_kind_required)

    coalesce: bool = True
    """On catch-up, send only the latest slot due and count the others as skipped."""

    jitter: Annotated[int, Field(ge=1, le=MAX_JITTER)] | None = Field(
        default=None,
        exclude_if=_absent,
        description="milliseconds: each slot of a timer fires at an offset in [0, jitter) "
        "after its due time, derived from the slot's request id (`tables.slots.jitter_offset`); "
        "absent: none (left out of the JSON, as before it existed)",
    )


class OnceRule(_Rule):
    """One slot, at `at` (epoch ms, UTC)."""

    kind: Literal["once"] = "once"
    at: Instant


class _Recurring(_Rule):
    """What ends a recurring rule: its last slot due by `until`, or its `count`-th slot.
    Absent (the default) they are left out of the rule's JSON, so a rule without them is
    written exactly as before they existed (and an older reader never meets them)."""

    until: Instant | None = Field(
        default=None,
        exclude_if=_absent,
        description="epoch ms: no slot due after it (the last slot is due at or before it)",
    )
    count: Annotated[int, Field(ge=1, le=MAX_INT64)] | None = Field(
        default=None,
        exclude_if=_absent,
        description="how many slots the rule has at most (slot indexes 0 to count - 1)",
    )

    @model_validator(mode="after")
    def _ends_after_start(self) -> _Recurring:
        start = getattr(self, "start", 0)
        if self.until is not None and self.until < start:
            raise ValueError(f"until {self.until} is before the rule's start {start}: no slot")
        return self


class IntervalRule(_Recurring):
    """Slot n at `start + n * every` (epoch ms)."""

    kind: Literal["interval"] = "interval"
    start: Instant
    every: Interval = Field(description="milliseconds between slots; must be positive")

    @model_validator(mode="after")
    def _jitter_within_a_slot(self) -> IntervalRule:
        # A slot jittered past the next one's due time would be caught up by it.
        if self.jitter is not None and self.jitter > self.every:
            raise ValueError(f"jitter {self.jitter} is more than every {self.every}")
        return self


class CronRule(_Recurring):
    """The times a cron expression (five fields, or six with seconds first) matches in `zone`,
    at or after `start`."""

    kind: Literal["cron"] = "cron"
    expr: str = Field(min_length=1, max_length=200)
    zone: str = "UTC"
    start: Instant = 0

    @field_validator("zone")
    @classmethod
    def _known_zone(cls, zone: str) -> str:
        # The tzdata package's zones alone (`tables.zones`): no directory ("America"), no
        # non-portable name ("localtime"), nothing of the system's database.
        tz_zone(zone)  # an `UnknownZone` is a ValueError: pydantic reports it
        return zone

    @field_validator("expr")
    @classmethod
    def _valid_cron(cls, expr: str) -> str:
        if (why := _cron_error(expr)) is not None:
            raise ValueError(why)
        return expr

    @property
    def tz(self) -> ZoneInfo:
        return tz_zone(self.zone)


@functools.lru_cache(maxsize=4096)
def _cron_error(expr: str) -> str | None:
    """Why `expr` is no cron expression, or None; remembered, as a restore validates the
    same few expressions on every row."""
    try:
        CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        return f"invalid cron expression {expr!r}: {exc}"
    return None


ScheduleRule = Annotated[OnceRule | IntervalRule | CronRule, Field(discriminator="kind")]

_RULE: TypeAdapter[OnceRule | IntervalRule | CronRule] = TypeAdapter(ScheduleRule)


def parse_rule(data: object, *, strict: bool = False) -> OnceRule | IntervalRule | CronRule:
    """A rule from its JSON form (a dict); `InvalidRule` with the reason otherwise.

    `strict`: as a record's rule is read (`app.protocol.wire.decode`), an integer must be
    a JSON integer and a boolean a JSON boolean (`"3"`, `3.0` or `true` for 3 refused); for
    new input. Lax (the default) for a rule stored before, which an older version took."""
    try:
        return _RULE.validate_python(data, strict=strict)
    except ValidationError as exc:
        raise InvalidRule(_reason(exc)) from exc


def _reason(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'rule'}: {err['msg']}" for err in exc.errors()
    )
