"""How `Settings.from_env` reads the settings (`app.node.settings`): where from
(`VariablesSource`: the variables already read, each under its own name; `all_utf8`), how
their text is read (`options_json`, `digits_alone`, `comma_separated`) and how a refusal of
them is said (`explain`: naming each variable, never a secret's value; `sendable_token`,
`cannot_connect`). May import pydantic, `app.node.variables` and `app.errors`.

`Settings.from_env()` reads, strongest first:

1. its keyword overrides (a command's options; None: not given);
2. the environment (the process's, or the mapping given);
3. a `.env` file: the one `TICKWHEEL_ENV_FILE` names (an error if it is not there), else,
   when reading the process's environment, `.env` in the working directory if there is
   one (a mapping given is read alone unless it names a file: tests stay hermetic);
4. the defaults.

In the environment and in the `.env` file alike, `X_FILE` names a file whose contents
(whitespace around them stripped) are the value of `X`, for every setting's variable `X`
(`TICKWHEEL_WEB_TOKEN_FILE=/run/secrets/web-token`); a file that cannot be read, that is
no regular file (a FIFO, `/dev/zero`) or that holds more than 64 KiB is an error naming
the variable (`app.node.variable_files.MAX_FILE_BYTES`), as is giving both `X` and `X_FILE` in
one place. Values are
stripped, and an empty one is no value (the default holds); a secret's
(`app.node.variables.BLANK_REFUSED`) of whitespace alone, as `X` or as `X_FILE`, is an
error.

A `TICKWHEEL_*` variable (in either place, in any case) that no setting knows is an error
naming the closest known one: a misspelt setting is never silently ignored. The few
`TICKWHEEL_*` variables of the project's own tooling (the test brokers', `scripts/`) are
known as such (`TOOLING_VARIABLES`). Every error is a `ConfigError` whose message names
the variables at fault; a secret's value is never shown.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Mapping, Set
from typing import Any

import orjson
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from app.errors import ConfigError
from app.node.variables import VARIABLES
from app.protocol.json_input import repeated_keys

__all__ = [
    "VariablesSource",
    "all_utf8",
    "cannot_connect",
    "comma_separated",
    "digits_alone",
    "explain",
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


def all_utf8(variables: Mapping[str, str]) -> None:
    """A `ConfigError` naming every setting's variable whose value is not valid UTF-8."""
    undecodable = [
        var
        for var in VARIABLES.values()
        if (value := variables.get(var)) is not None and not utf8(value)
    ]
    if undecodable:
        # os.environ holds bytes that are not UTF-8 as lone surrogates: every later use
        # (a login, a header) would fail on them, naming no setting (never shown here:
        # a secret's value among them).
        raise ConfigError(
            "; ".join(f"{var}: not valid UTF-8 (its value not shown)" for var in undecodable)
        )


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


def options_json(value: str) -> object:
    """The timer options' JSON read; `ValueError` for no JSON, or an option named twice at
    any depth (JSON readers keep the last silently: an option given twice by mistake)."""
    try:
        read = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from exc
    if twice := repeated_keys(value):
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


def comma_separated(value: object) -> object:
    """A list setting's text (`TICKWHEEL_AGGREGATE_TYPES`) as its items, stripped, the
    empty ones dropped; any other `value` as it is."""
    if isinstance(value, str):
        return tuple(p.strip() for p in value.split(",") if p.strip())
    return value


def cannot_connect(exc: ValidationError, bootstrap_servers: str, how: str) -> str:
    """The refusal of the Kafka connection's settings (`exc`) as one line: a wrong security
    setting (a missing file, a SASL protocol without credentials) said before anything
    connects."""
    said = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return f"cannot connect to {bootstrap_servers} ({how}): {said}"
