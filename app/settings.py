"""Node settings, read from the environment (`TICKWHEEL_*`, `KAFKA_BOOTSTRAP_SERVERS`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.exceptions import ConfigError
from app.topics import parse_aggregate_type

__all__ = ["Settings"]

_ENV = {
    "bootstrap_servers": "KAFKA_BOOTSTRAP_SERVERS",
    "aggregate_types": "TICKWHEEL_AGGREGATE_TYPES",
    "partitions": "TICKWHEEL_PARTITIONS",
    "data_dir": "TICKWHEEL_DATA_DIR",
    "group_id": "TICKWHEEL_GROUP_ID",
    "session_timeout_ms": "TICKWHEEL_SESSION_TIMEOUT_MS",
    "web_port": "TICKWHEEL_WEB_PORT",
}


class Settings(BaseModel):
    """What a node needs to know; every field has an environment variable (see README)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = "127.0.0.1:9092"
    aggregate_types: tuple[str, ...] = ("shop.order",)
    partitions: int = Field(default=12, ge=1, le=1024)
    data_dir: Path = Path("./state")
    group_id: str = Field(default="tickwheel", min_length=1)
    session_timeout_ms: int = Field(default=10_000, ge=1_000, le=300_000)
    web_port: int = Field(default=0, ge=0, le=65535)

    @field_validator("aggregate_types")
    @classmethod
    def _valid_types(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        if not names:
            raise ValueError("at least one aggregate type is needed")
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
                raw[field] = value
        raw.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(raw)
        except (ValidationError, ConfigError) as exc:
            raise ConfigError(_explain(exc)) from exc


def _explain(exc: ValidationError | ConfigError) -> str:
    if isinstance(exc, ConfigError):
        return str(exc)
    parts = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else "settings"
        var = _ENV.get(field, field)
        parts.append(f"{var}: {err['msg']} (got {err.get('input')!r})")
    return "bad configuration: " + "; ".join(parts)
