"""Node settings, read from the environment (`TICKWHEEL_*`, `KAFKA_BOOTSTRAP_SERVERS`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.errors import ConfigError
from app.protocol.limits import DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_RECORD_BYTES, InputLimits
from app.protocol.topics import parse_aggregate_type
from app.timers.runner.options import TimerOptions

__all__ = ["Settings"]

_ENV = {
    "bootstrap_servers": "KAFKA_BOOTSTRAP_SERVERS",
    "aggregate_types": "TICKWHEEL_AGGREGATE_TYPES",
    "partitions": "TICKWHEEL_PARTITIONS",
    "data_dir": "TICKWHEEL_DATA_DIR",
    "group_id": "TICKWHEEL_GROUP_ID",
    "session_timeout_ms": "TICKWHEEL_SESSION_TIMEOUT_MS",
    "web_port": "TICKWHEEL_WEB_PORT",
    "web_host": "TICKWHEEL_WEB_HOST",
    "busy_backlog": "TICKWHEEL_BUSY_BACKLOG",
    "commit_interval_ms": "TICKWHEEL_COMMIT_INTERVAL_MS",
    "timers": "TICKWHEEL_TIMER_OPTIONS",
    "max_key_bytes": "TICKWHEEL_MAX_KEY_BYTES",
    "max_record_bytes": "TICKWHEEL_MAX_RECORD_BYTES",
}


class Settings(BaseModel):
    """What a node needs to know; every field has an environment variable (see README)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = "127.0.0.1:9092"
    aggregate_types: tuple[str, ...] = ()
    """Types whose timers the node keeps besides its service's (decided by other services)."""
    partitions: int = Field(default=12, ge=1, le=1024)
    data_dir: Path = Path("./state")
    group_id: str = Field(default="tickwheel", min_length=1)
    session_timeout_ms: int = Field(default=10_000, ge=1_000, le=300_000)
    web_port: int = Field(default=0, ge=0, le=65535)
    """HTTP port of /healthz, /metrics and /ledger (on `web_host`); 0: no HTTP."""
    web_host: str = Field(default="127.0.0.1", min_length=1)
    """Address the HTTP edge listens on: loopback unless a scraper elsewhere needs it (a
    container's Prometheus: 0.0.0.0)."""
    commit_interval_ms: int = Field(default=100, ge=1, le=60_000)
    """How often the timer runners' changelog writes are committed."""
    busy_backlog: int = Field(default=50_000, ge=1)
    """Commands waiting in a partition beyond which the node answers BUSY."""
    max_key_bytes: int = Field(default=DEFAULT_MAX_KEY_BYTES, ge=16, le=1024 * 1024)
    """A record of an input topic with a longer key is dead-lettered."""
    max_record_bytes: int = Field(default=DEFAULT_MAX_RECORD_BYTES, ge=1024, le=1024 * 1024)
    """A record of an input topic with a larger value is dead-lettered (at most what a topic
    of the broker's defaults takes, so that its dead letter always fits whole)."""
    timers: TimerOptions = Field(default_factory=TimerOptions)
    """The runner's options; in the environment as JSON, e.g. {"claim_timeout": 5000}."""

    @property
    def limits(self) -> InputLimits:
        """The bounds of an input record (the dead letters' size is the topic's)."""
        return InputLimits(max_key_bytes=self.max_key_bytes, max_record_bytes=self.max_record_bytes)

    @field_validator("aggregate_types")
    @classmethod
    def _valid_types(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            parse_aggregate_type(name)
        return names

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, /, **overrides: Any) -> Settings:
        """Settings from `env` (the process environment by default), then `overrides`."""
        env = os.environ if env is None else env
        raw: dict[str, object] = {}
        for field, var in _ENV.items():
            if var in env and env[var].strip():
                value: object = env[var].strip()
                if field == "aggregate_types":
                    value = tuple(p.strip() for p in str(value).split(",") if p.strip())
                elif field == "timers":
                    value = _json(var, str(value))
                raw[field] = value
        raw.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(raw)
        except (ValidationError, ConfigError) as exc:
            raise ConfigError(_explain(exc)) from exc


def _json(var: str, text: str) -> object:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{var}: not JSON ({exc})") from exc


def _explain(exc: ValidationError | ConfigError) -> str:
    if isinstance(exc, ConfigError):
        return str(exc)
    parts = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else "settings"
        var = _ENV.get(field, field)
        where = ".".join(str(p) for p in err["loc"][1:])
        parts.append(
            f"{var}{'.' + where if where else ''}: {err['msg']} (got {err.get('input')!r})"
        )
    return "bad configuration: " + "; ".join(parts)
