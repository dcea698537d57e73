"""The settings' variables: each setting's name in the environment (`VARIABLES`), the
project tooling's own `TICKWHEEL_*` variables, and reading them (`read_variables`) from
the environment, a `.env` file and `<VARIABLE>_FILE` files (one such file read by
`app.node.variable_files`), as `app.node.settings_sources` describes.
"""

from __future__ import annotations

import difflib
import logging
import os
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from dotenv.parser import parse_stream
from dotenv.variables import Variable, parse_variables

from app.errors import ConfigError
from app.node.variable_files import file_value, unread_reason

__all__ = [
    "ENV_FILE_VARIABLE",
    "TOOLING_VARIABLES",
    "VARIABLES",
    "read_variables",
]

VARIABLES: Final[Mapping[str, str]] = {
    "bootstrap_servers": "KAFKA_BOOTSTRAP_SERVERS",
    "aggregate_types": "TICKWHEEL_AGGREGATE_TYPES",
    "partitions": "TICKWHEEL_PARTITIONS",
    "data_dir": "TICKWHEEL_DATA_DIR",
    "group_id": "TICKWHEEL_GROUP_ID",
    "session_timeout_ms": "TICKWHEEL_SESSION_TIMEOUT_MS",
    "group_instance_id": "TICKWHEEL_GROUP_INSTANCE_ID",
    "web_port": "TICKWHEEL_WEB_PORT",
    "web_host": "TICKWHEEL_WEB_HOST",
    "web_token": "TICKWHEEL_WEB_TOKEN",
    "web_url": "TICKWHEEL_WEB_URL",
    "web_max_connections": "TICKWHEEL_WEB_MAX_CONNECTIONS",
    "web_idle_timeout_ms": "TICKWHEEL_WEB_IDLE_TIMEOUT_MS",
    "status_interval_ms": "TICKWHEEL_STATUS_INTERVAL_MS",
    "busy_backlog": "TICKWHEEL_BUSY_BACKLOG",
    "commit_interval_ms": "TICKWHEEL_COMMIT_INTERVAL_MS",
    "clock_skew_ms": "TICKWHEEL_CLOCK_SKEW_MS",
    "request_id_window_ms": "TICKWHEEL_REQUEST_ID_WINDOW_MS",
    "gc_threshold": "TICKWHEEL_GC_THRESHOLD",
    "timers": "TICKWHEEL_TIMER_OPTIONS",
    "max_key_bytes": "TICKWHEEL_MAX_KEY_BYTES",
    "max_record_bytes": "TICKWHEEL_MAX_RECORD_BYTES",
    "max_state_bytes": "TICKWHEEL_MAX_STATE_BYTES",
    "handler_timeout_ms": "TICKWHEEL_HANDLER_TIMEOUT_MS",
    "kafka_client": "TICKWHEEL_KAFKA_CLIENT",
    "producer_thread": "TICKWHEEL_PRODUCER_THREAD",
    "log_level": "TICKWHEEL_LOG_LEVEL",
    "log_format": "TICKWHEEL_LOG_FORMAT",
    "security_protocol": "KAFKA_SECURITY_PROTOCOL",
    "sasl_mechanism": "KAFKA_SASL_MECHANISM",
    "sasl_username": "KAFKA_SASL_USERNAME",
    "sasl_password": "KAFKA_SASL_PASSWORD",
    "sasl_oauthbearer_token_endpoint_url": "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL",
    "sasl_oauthbearer_client_id": "KAFKA_SASL_OAUTHBEARER_CLIENT_ID",
    "sasl_oauthbearer_client_secret": "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
    "sasl_oauthbearer_scope": "KAFKA_SASL_OAUTHBEARER_SCOPE",
    "sasl_oauthbearer_cafile": "KAFKA_SASL_OAUTHBEARER_CAFILE",
    "ssl_cafile": "KAFKA_SSL_CAFILE",
    "ssl_certfile": "KAFKA_SSL_CERTFILE",
    "ssl_keyfile": "KAFKA_SSL_KEYFILE",
    "ssl_key_password": "KAFKA_SSL_KEY_PASSWORD",
    "replication_factor": "TICKWHEEL_REPLICATION_FACTOR",
    "min_insync_replicas": "TICKWHEEL_MIN_INSYNC_REPLICAS",
}
"""Each setting's environment variable (each also as `<variable>_FILE`)."""

ENV_FILE_VARIABLE: Final = "TICKWHEEL_ENV_FILE"

TOOLING_VARIABLES: Final = frozenset(
    {
        "TICKWHEEL_BOOTSTRAP",  # tests/kafka_broker.py (the Docker broker's address)
        "TICKWHEEL_BROKER",  # tests/kafka_broker.py: auto, docker or local
        "TICKWHEEL_CACHE",  # scripts/kafka_local.py: where Kafka's jars are cached
        "TICKWHEEL_DOCS_SCREENSHOT",  # tests/integration/test_operator_page.py
        "TICKWHEEL_KAFKA_IMAGE",  # tests/kafka_broker.py
        "TICKWHEEL_KAFKA_JVM_OPTS",  # scripts/kafka_local.py
        "TICKWHEEL_KAFKA_VERSION",  # scripts/kafka_local.py, scripts/test, the README
        "TICKWHEEL_RUN_DIR",  # scripts/run
        "TICKWHEEL_STATE",  # scripts/kafka_local.py: the local broker's state directory
    }
)
"""`TICKWHEEL_*` variables that are no setting of a node but the project's tools' own:
a node's environment may hold them (a test run exports them to every worker it starts)."""

logger = logging.getLogger(__name__)

_FILE = "_FILE"
_PREFIX = "TICKWHEEL_"
MAX_PROBLEMS: Final = 20
"""The unknown variables a `ConfigError` names at most (then how many more): each is
matched against every setting's name for a suggestion, a second for thousands."""
MAX_ENV_FILE_BYTES: Final = 1024 * 1024
"""The most a `.env` file may hold (it is read whole, slowly: ~1 s a MB)."""


def read_variables(env: Mapping[str, str] | None = None) -> Variables:
    """The settings' variables (`VARIABLES`' names) with their values: from `env` (the
    process's environment by default) over those of its `.env` file, `_FILE` variables
    read, empty values dropped. `ConfigError` for an unknown `TICKWHEEL_*` variable, a
    file that cannot be read, a variable given twice."""
    process = env is None
    environ: Mapping[str, str] = os.environ if env is None else env
    layers: list[tuple[str, Mapping[str, str | None]]] = [("in the environment", environ)]
    env_file = (environ.get(ENV_FILE_VARIABLE) or "").strip()
    if env_file:
        path = Path(env_file)
        if not _is_file(path, ENV_FILE_VARIABLE):
            raise ConfigError(f"{ENV_FILE_VARIABLE}: no file {env_file!r}")
        _not_too_large(path, ENV_FILE_VARIABLE)
        layers.append((f"in {env_file}", _dotenv(path, ENV_FILE_VARIABLE, environ)))
    elif process and _is_file(Path(".env"), ".env"):
        _not_too_large(Path(".env"), ".env")
        layers.append(("in .env", _dotenv(Path(".env"), ".env", environ)))
    problems = [p for where, values in layers for p in _unknown(values, where)]
    for where, values in layers[1:]:
        if ENV_FILE_VARIABLE in values:  # never read there: a file names no other
            problems.append(f"{ENV_FILE_VARIABLE} ({where}) is read from the environment only")
    if problems:
        more = len(problems) - MAX_PROBLEMS
        shown = problems[:MAX_PROBLEMS] + ([f"and {more} more"] if more > 0 else [])
        raise ConfigError("; ".join(shown))
    merged = Variables()
    for where, values in reversed(layers):  # the .env file first, the environment over it
        _resolved(values, where, merged)
    return merged


def _is_file(path: Path, name: str) -> bool:
    """Whether `path` is a file; `ConfigError` naming `name` when that cannot be told
    (`Path.is_file` raises a name too long, a directory not searchable: ENAMETOOLONG,
    EACCES)."""
    try:
        return path.is_file()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {str(path)!r}: {unread_reason(exc)}") from exc


def _not_too_large(path: Path, name: str) -> None:
    try:
        size = path.stat().st_size
    except OSError as exc:  # gone, or its directory made unsearchable, since
        raise ConfigError(f"{name}: cannot read {str(path)!r}: {unread_reason(exc)}") from exc
    if size > MAX_ENV_FILE_BYTES:
        raise ConfigError(
            f"{name}: {str(path)!r} is larger than {MAX_ENV_FILE_BYTES} bytes, far more than "
            "any settings file holds"
        )


def _dotenv(path: Path, name: str, environ: Mapping[str, str]) -> Mapping[str, str | None]:
    """The variables of a `.env` file as python-dotenv's `dotenv_values` reads them, with
    `${VAR}` (`${VAR:-default}`) in a value the file's own `VAR` above it, else
    `environ`'s. In one pass: `dotenv_values` copies the whole environment for each
    variable it reads, minutes for a file of many short lines.

    A line that is no `VARIABLE=value` (an unclosed quote, a blank in a name) and names
    TICKWHEEL or KAFKA (a setting's variable, mistyped or not) is a `ConfigError`
    (python-dotenv passes it over: the setting silently unset); another program's is
    passed over with a warning."""
    values: dict[str, str | None] = {}
    unread: list[int] = []
    try:
        with path.open(encoding="utf-8") as stream:
            for binding in parse_stream(stream):
                line = binding.original.line
                if binding.error and _names_ours(binding.original.string):
                    unread.append(line)
                elif binding.error:
                    logger.warning(
                        "%s: line %d of %s is no VARIABLE=value: passed over", name, line, path
                    )
                if binding.key is None:
                    continue
                value = binding.value
                if value is not None and (value := _expanded(value, values, environ)) is None:
                    raise ConfigError(
                        f"{name}: cannot read {path}: line {line}'s value, its ${{…}} replaced, "
                        f"is longer than {MAX_ENV_FILE_BYTES} characters"
                    )
                values[binding.key] = value
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{name}: cannot read {path}: {unread_reason(exc)}") from exc
    if unread:
        # Its text is not shown: a password's line among them.
        lines = ", ".join(map(str, unread))
        which = f"line {lines} is" if len(unread) == 1 else f"lines {lines} are"
        raise ConfigError(
            f"{name}: cannot read {path}: {which} no VARIABLE=value (an unclosed quote, a "
            "blank in a name?) naming a setting, which would be left unset"
        )
    return values


def _names_ours(text: str) -> bool:
    """Whether a line names a setting's variable, however mistyped (`TICKWHEEL GROUP_ID`)."""
    return "TICKWHEEL" in text.upper() or "KAFKA" in text.upper()


def _expanded(
    value: str, above: Mapping[str, str | None], environ: Mapping[str, str]
) -> str | None:
    """`value` with each `${VAR}` replaced as python-dotenv replaces it: by `above[VAR]`,
    else `environ[VAR]`, else its default (`${VAR:-default}`), else nothing; None once it
    is longer than the file may be (`A=${B}${B}` doubles `B`: 30 such lines of a few
    bytes, and python-dotenv filled the memory until the process was killed)."""
    parts = []
    size = 0
    for atom in parse_variables(value):
        if not isinstance(atom, Variable):
            part = atom.resolve(above)  # a literal
        elif atom.name in above:
            part = above[atom.name] or ""
        else:
            part = environ.get(atom.name, atom.default or "")
        size += len(part)
        if size > MAX_ENV_FILE_BYTES:
            return None
        parts.append(part)
    return "".join(parts)


def _known() -> frozenset[str]:
    settings = set(VARIABLES.values())
    return frozenset(
        {*settings, *(v + _FILE for v in settings), ENV_FILE_VARIABLE, *TOOLING_VARIABLES}
    )


_KNOWN = _known()


_KAFKA_PREFIX = "KAFKA_"
_KAFKA_KNOWN = sorted(v for v in _KNOWN if v.startswith(_KAFKA_PREFIX))


_INVISIBLE: Final = frozenset({"Cf", "Cc", "Zs", "Zl", "Zp"})
"""Unicode categories a reader does not see in a name: format marks, controls, spaces."""


def _forms(var: str) -> set[str]:
    """`var` and its other form (`X` and `X_FILE`)."""
    base = var.removesuffix(_FILE)
    return {base, base + _FILE}


def _unknown(values: Iterable[str], where: str) -> list[str]:
    problems: list[str] = []
    given = set(values)
    for name in values:
        if len(problems) >= MAX_PROBLEMS:  # counted, not matched (`MAX_PROBLEMS`)
            problems.append(f"{name} ({where})")
            continue
        visible = "".join(c for c in name if unicodedata.category(c) not in _INVISIBLE)
        if visible != name and visible.upper().startswith((_PREFIX, _KAFKA_PREFIX)):
            # A zero-width or direction mark before a name: no setting as written, and
            # silently left to other programs it was (a pasted line).
            problems.append(f"{name!r} ({where}) holds invisible characters: {visible}?")
            continue
        if name.upper().startswith(_KAFKA_PREFIX) and name not in _KNOWN:
            # Other programs read KAFKA_* too: only a near miss of ours (a letter or two
            # off) that is not given itself is an error (a missing S sent the node to the
            # default broker, 127.0.0.1:9092).
            near = difflib.get_close_matches(name.upper(), _KAFKA_KNOWN, n=1, cutoff=0.9)
            if near and abs(len(near[0]) - len(name)) <= 2 and not given & _forms(near[0]):
                problems.append(f"{name} ({where}) is no setting: did you mean {near[0]}?")
            continue
        if not name.upper().startswith(_PREFIX) or name in _KNOWN:
            continue
        # Suggest a setting's variable, as a file one when the name looks like one.
        candidates = [*VARIABLES.values(), ENV_FILE_VARIABLE]
        if name.upper().endswith(_FILE):
            candidates = [v + _FILE for v in VARIABLES.values()] + [ENV_FILE_VARIABLE]
        (closest,) = difflib.get_close_matches(name.upper(), candidates, n=1, cutoff=0.0)
        problems.append(f"{name} ({where}) is no setting: did you mean {closest}?")
    return problems


BLANK_REFUSED: Final = frozenset(
    {
        "TICKWHEEL_WEB_TOKEN",
        "KAFKA_SASL_PASSWORD",
        "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
        "KAFKA_SSL_KEY_PASSWORD",
    }
)
"""Secrets given as whitespace alone (as `X` or as `X_FILE`) are refused, not taken as not
given: a web token of nothing turns the HTTP edge's token check off."""


class Variables(dict[str, str]):
    """The settings' variables with their values; `from_files`: those read from an
    `X_FILE` variable's file (their values never shown in an error: a file named by
    mistake may hold anything, a secret or the whole environment)."""

    def __init__(self) -> None:
        super().__init__()
        self.from_files: set[str] = set()


def _resolved(values: Mapping[str, str | None], where: str, into: Variables) -> None:
    """The settings' variables of one place, stripped, empty ones dropped, `X_FILE` read
    into `X`, put in `into`."""
    for var in VARIABLES.values():
        raw = values.get(var) or ""
        value = raw.strip()
        if raw and not value and var in BLANK_REFUSED:
            raise ConfigError(f"{var} ({where}) is only whitespace: unset it, or give its value")
        file_var = var + _FILE
        raw_path = values.get(file_var) or ""
        path = raw_path.strip()
        if raw_path and not path and var in BLANK_REFUSED:
            # As the secret's own variable: taken as not given, it turned the check off.
            raise ConfigError(
                f"{file_var} ({where}) is only whitespace: unset it, or name the file "
                f"holding {var}'s value"
            )
        if path and value:
            raise ConfigError(f"{var} and {file_var} are both given ({where}): give one")
        if path:
            value = file_value(path, f"{file_var} ({where})")
            if not value:
                # A secret's mount not filled yet, say: the setting would be silently unset.
                raise ConfigError(
                    f"{file_var} ({where}): {path!r} is empty; it must hold {var}'s value"
                )
            into.from_files.add(var)
        elif value:
            into.from_files.discard(var)  # the environment's value over the .env file's
        if value:
            into[var] = value
