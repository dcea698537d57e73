"""Where `Settings.from_env` reads the settings' values from (`VariablesSource`: the
variables already read, each under its own name), how their text is read (`options_json`,
`digits_alone`) and how a refusal of them is said (`explain`: naming each variable, never
a secret's value; `sendable_token`), and what a default computed from another setting
reads of it before validation (`given_expiry`). May import pydantic, `app.node.variables`
and the timer options."""

from __future__ import annotations

import json
import re
import reprlib
from collections.abc import Mapping, Set
from typing import Any

import orjson
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from app.node.variables import VARIABLES
from app.timers.runner.options import TimerOptions

__all__ = [
    "VariablesSource",
    "digits_alone",
    "explain",
    "given_expiry",
    "options_json",
    "sendable_token",
    "utf8",
]


def utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class VariablesSource(PydanticBaseSettingsSource):
    """The settings' values as text, from variables already read (the environment over the
    `.env` file, `_FILE` variables read), each under its own variable's name (`VARIABLES`);
    the fields' validators parse them."""

    def __init__(self, settings_cls: type[BaseSettings], variables: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self._variables = variables

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        var = VARIABLES[field_name]
        return self._variables.get(var), var, False

    def __call__(self) -> dict[str, Any]:
        return {
            name: self._variables[var] for name, var in VARIABLES.items() if var in self._variables
        }


_SHOWN = reprlib.Repr()
"""A value shown in an error: bounded in length and depth (a value nested a thousand deep
broke the built-in repr)."""
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlevel = 3


def explain(exc: ValidationError, secrets: Set[str], from_files: Set[str] = frozenset()) -> str:
    """`exc` as one line naming each variable at fault; the values of `secrets` (field
    names) never shown, nor those read from `from_files` (variables: an `X_FILE`'s)."""
    parts = []
    for err in exc.errors():
        if not err["loc"]:
            # The settings as a whole (their consistency): the message names the variables,
            # and the input is every value, secrets too: never shown.
            parts.append(str(err["msg"]).removeprefix("Value error, "))
            continue
        field = str(err["loc"][0])
        var = VARIABLES.get(field, field)
        where = ".".join(str(p) for p in err["loc"][1:])
        if var in from_files:
            # pydantic's own messages never quote the value; a check of ours may (an
            # address, a name), so its message is not shown either.
            said = "not a valid value" if err["type"] == "value_error" else err["msg"]
            parts.append(f"{var}: {said} (read from {var}_FILE; the value not shown)")
            continue
        got = "a secret, not shown" if field in secrets else _SHOWN.repr(err.get("input"))
        parts.append(f"{var}{'.' + where if where else ''}: {err['msg']} (got {got})")
    return "bad configuration: " + "; ".join(parts)


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


def options_json(value: str) -> object:
    """The timer options' JSON read; `ValueError` for no JSON, or an option named twice at
    any depth (JSON readers keep the last silently: an option given twice by mistake)."""
    try:
        read = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from exc
    twice: dict[str, None] = {}

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                twice[key] = None
            seen.add(key)
        return dict(items)

    try:
        json.loads(value, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return read  # what orjson reads and json does not: no key of it is looked at
    if twice:
        named = ", ".join(map(repr, list(twice)[:5]))
        raise ValueError(f"{named} given more than once (the last would silently win)")
    return read


_DIGITS = re.compile(r"[+-]?[0-9]+", re.ASCII)


def digits_alone(value: object) -> object:
    """An integer setting's `value` unless it is text that is no whole number in digits:
    pydantic reads `"1500.0"` and `"1_500"` as 1500, but a default computed from the
    setting before it is validated (`int()` of it) did not, and blamed another setting.
    Its error quotes nothing: shown for a value read from a file too (`explain`)."""
    if isinstance(value, str) and not _DIGITS.fullmatch(value.strip()):
        raise PydanticCustomError(
            "int_parsing",
            "Input should be a valid integer, in digits alone (no decimal point, exponent or '_')",
        )
    return value


def sendable_token(token: str) -> None:
    """A web token no client could send (an `Authorization` header holds no control
    character: a newline, a tab) is refused: every action would be. Its error quotes
    nothing: shown for a token read from its file too (`explain`)."""
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in token):  # C0, DEL, C1
        raise PydanticCustomError(
            "control_character",
            "a control character (a newline, a tab) in the token: no Authorization header "
            "can carry it",
        )
