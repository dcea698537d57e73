"""TimerOptions' upper bounds: every number of them has one, a value past it is refused at
load naming it, and at their bounds a claim, a retry or a park at the last instant writes
a row the store reads back (a claim_timeout of 2**63 - 1 loaded, then every claim wrote a
due time past 64 bits that the store refused for ever)."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from fakes import slot_timer
from pydantic import BaseModel

from app.errors import ConfigError
from app.node.settings import Settings
from app.timers.runner.decision_types import Action
from app.timers.runner.decisions import TIMEOUT, SendResult, expire_or_claim, on_outcome
from app.timers.runner.options import MAX_COUNT, MAX_WAIT, YEAR_MS, RetryPolicy, TimerOptions
from tables.bounds import MAX_INSTANT
from tables.rules import OnceRule
from tables.timer import Timer


def bounds(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Each number field's path (`retry.max_attempts`) and its upper bound (None: none)."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            out |= bounds(info.annotation, f"{prefix}{name}.")
        else:
            le = [m.le for m in info.metadata if getattr(m, "le", None) is not None]
            out[prefix + name] = le[0] if le else None
    return out


BOUNDS = bounds(TimerOptions)


def test_every_option_has_an_upper_bound() -> None:
    assert len(BOUNDS) == 13
    assert [name for name, le in BOUNDS.items() if le is None] == []


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_an_option_past_its_bound_is_refused_at_load_naming_it(name: str) -> None:
    *parents, leaf = name.split(".")
    options: dict[str, Any] = {leaf: BOUNDS[name] + 1}
    for parent in reversed(parents):
        options = {parent: options}
    env = {"TICKWHEEL_TIMER_OPTIONS": orjson.dumps(options).decode()}
    message = rf"TICKWHEEL_TIMER_OPTIONS\.{re.escape(name)}: Input should be less than or equal"
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


def test_the_reviewers_claim_timeout_is_refused() -> None:
    env = {"TICKWHEEL_TIMER_OPTIONS": '{"claim_timeout": 9223372036854775807}'}
    with pytest.raises(ConfigError, match=r"claim_timeout: Input should be less than or equal"):
        Settings.from_env(env)


def test_at_the_bounds_a_claim_a_retry_and_a_park_at_the_last_instant_write_rows() -> None:
    retry = RetryPolicy(
        initial_backoff_ms=MAX_WAIT, multiplier=100.0, max_backoff_ms=MAX_WAIT, max_attempts=2
    )
    options = TimerOptions(
        expires_after=YEAR_MS,
        claim_timeout=MAX_WAIT,
        send_timeout=MAX_WAIT,
        retry=retry,
        max_busy_retries=MAX_COUNT,
        finished_retention=2 * YEAR_MS,
    )
    claim = expire_or_claim(slot_timer(OnceRule(at=MAX_INSTANT)), MAX_INSTANT, options)
    assert claim.action is Action.CLAIM and claim.change is not None
    claimed = Timer.model_validate(claim.change.next.model_dump())
    rows = [claimed]
    for attempts in (0, 1):
        outcome = on_outcome(
            claimed.model_copy(update={"attempts": attempts}),
            SendResult(TIMEOUT),
            MAX_INSTANT,
            options,
        )
        assert outcome.action is (Action.RETRY, Action.PARK)[attempts]
        rows += [c.next for c in (outcome.change, outcome.fallback) if c is not None]
    for row in rows:  # as the store reads them back
        assert Timer.model_validate(row.model_dump()) == row
    assert max(r.due_at for r in rows) == MAX_INSTANT + MAX_WAIT
