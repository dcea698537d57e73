"""The defaults of settings computed from another setting, when not given: read from the
settings as given, before they are validated (`Settings`' "before" validators call them).
May import the timer options."""

from __future__ import annotations

from typing import Any, Final

import orjson

from app.timers.runner.options import DAY_MS, YEAR_MS, TimerOptions

__all__ = [
    "DEFAULT_HANDLER_TIMEOUT_MS",
    "given_expiry",
    "handler_timeout_default",
    "window_default",
]

DEFAULT_HANDLER_TIMEOUT_MS: Final = 5_000


def handler_timeout_default(data: Any, session_default: int) -> Any:
    """`data` (the settings given) with `handler_timeout_ms`, when not given, the default
    or half the session timeout (given, else `session_default`), whichever is less."""
    # Not given, it fits a short session timeout (set alone, as tests and a fast
    # failover do) rather than refuse a start over a setting never touched.
    if not isinstance(data, dict) or data.get("handler_timeout_ms") is not None:
        return data
    try:
        session = int(data.get("session_timeout_ms", session_default))
    except (TypeError, ValueError):
        return data  # the field's own error says why
    return {**data, "handler_timeout_ms": min(DEFAULT_HANDLER_TIMEOUT_MS, session // 2)}


def window_default(data: Any, window: int) -> Any:
    """`data` (the settings given) with `request_id_window_ms`, when not given and the
    timers' `expires_after` given does not fit in `window` (the default), a day past it."""
    # Not given, it outlasts the timers' `expires_after` (a week, or a day past it): a
    # configuration with a long expiry, from before the window existed, still starts.
    if not isinstance(data, dict) or data.get("request_id_window_ms") is not None:
        return data
    expires = given_expiry(data.get("timers"))
    # Past `TimerOptions.expires_after`'s own bound, its error alone says why (a window
    # computed from it was out of the window's bound too, a second error).
    if type(expires) is not int or expires + DAY_MS <= window or expires > YEAR_MS:
        return data  # the default, or the field's own error says why
    # Past six days its margin is a day (`TimerOptions.request_id_margin`).
    return {**data, "request_id_window_ms": expires + DAY_MS}


def given_expiry(timers: object) -> int | None:
    """The timer options' `expires_after` as given, before they are validated (the
    variable's JSON, a mapping, or the options themselves); None when not told, or not a
    whole number (the options' own validation says why)."""
    if isinstance(timers, str | bytes):
        try:
            timers = orjson.loads(timers)
        except orjson.JSONDecodeError:
            return None
    if isinstance(timers, TimerOptions):
        return timers.expires_after
    expires = timers.get("expires_after") if isinstance(timers, dict) else None
    return expires if type(expires) is int else None
