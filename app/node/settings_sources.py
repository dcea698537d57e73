"""Where `Settings.from_env` reads the settings' values from (`VariablesSource`: the
variables already read, each under its own name), and how a refusal of them is said
(`explain`: naming each variable, never a secret's value), and what a default computed
from another setting reads of it before validation (`given_expiry`). May import pydantic,
`app.node.variables` and the timer options."""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Set
from typing import Any

import orjson
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from app.node.variables import VARIABLES
from app.timers.runner.options import TimerOptions

__all__ = ["VariablesSource", "explain", "given_expiry", "utf8"]


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
