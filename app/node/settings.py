"""Node settings (pydantic-settings): `Settings`, the list of them, each with its variable in
the environment (`TICKWHEEL_*`, `KAFKA_BOOTSTRAP_SERVERS`; `VARIABLES`).

`Settings(...)` is its keyword arguments and the defaults, nothing else (tests build it so);
`Settings.from_env()` reads its keyword overrides, the environment, a `.env` file and
`<VARIABLE>_FILE` for secrets, as `app.node.settings_sources` describes. The checks of a
setting's value, and of settings that must agree, are in `settings_checks`; the defaults
computed from another setting in `settings_defaults`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from app.errors import ConfigError
from app.kafka.clients import KafkaClient
from app.kafka.connection import KafkaConnection, SaslMechanism, SecurityProtocol
from app.kafka.group_consumer import rebalance_timeout_ms
from app.kafka.records import TRANSACTION_TIMEOUT_MS, Replication
from app.model.decide import CLOCK_SKEW_MS
from app.node import settings_checks as checks
from app.node import settings_defaults as defaults
from app.node import settings_sources as sources
from app.node.settings_defaults import DEFAULT_HANDLER_TIMEOUT_MS
from app.node.variables import ENV_FILE_VARIABLE, TOOLING_VARIABLES, VARIABLES, read_variables
from app.protocol.limits import (
    DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_MAX_STATE_BYTES,
    MAX_STATE_BYTES,
    InputLimits,
)
from app.timers.runner.options import REQUEST_ID_WINDOW_MS, YEAR_MS, TimerOptions

__all__ = [
    "DEFAULT_HANDLER_TIMEOUT_MS",
    "ENV_FILE_VARIABLE",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MAX_PARTITIONS",
    "TOOLING_VARIABLES",
    "VARIABLES",
    "WEB_URL_PATTERN",
    "LogFormat",
    "LogLevel",
    "Settings",
]

MAX_PARTITIONS: Final = 1024
"""The most partitions a context takes (`TICKWHEEL_PARTITIONS`, a faust client's)."""

WEB_URL_PATTERN: Final = r"^https?://[^\s/?#\"'<>\\]+[^\s\"'<>\\]*$"
"""A node page's address as pages link to it: http(s) with a host, nothing a link could
turn into script (`javascript:`) or out of its attribute."""

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LogFormat = Literal["text", "json"]

LOG_LEVELS: Final[tuple[LogLevel, ...]] = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS: Final[tuple[LogFormat, ...]] = ("text", "json")

_SECRETS = frozenset(
    {"web_token", "sasl_password", "sasl_oauthbearer_client_secret", "ssl_key_password"}
)
"""Fields whose values an error message never shows."""


class Settings(BaseSettings):
    """What a node (and a command) needs to know; every field has an environment variable
    (`VARIABLES`; see README)."""

    # A validation error chained under ConfigError shows no input (a password among them).
    model_config = SettingsConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    bootstrap_servers: str = Field(default="127.0.0.1:9092", min_length=1)
    aggregate_types: tuple[str, ...] = ()
    """Types whose timers the node keeps besides its service's (decided by other services);
    in the environment comma-separated."""
    partitions: int = Field(default=12, ge=1, le=MAX_PARTITIONS)
    data_dir: Path = Path("./state")
    group_id: str = Field(default="tickwheel", min_length=1)
    session_timeout_ms: int = Field(default=10_000, ge=1_000, le=300_000)
    group_instance_id: str | None = Field(default=None, min_length=1)
    """This worker's static member id in the group (KIP-345, Kafka's `group.instance.id`);
    None: a dynamic member. A static member's stop leaves no group: the coordinator keeps
    its partitions for up to `session_timeout_ms` and gives them back when it rejoins (a
    rolling restart without a rebalance). Unique per worker and stable across its
    restarts; a second worker with the same one is fenced by the first to rejoin."""
    web_port: int = Field(default=0, ge=0, le=65535)
    """HTTP port of /livez, /readyz, /healthz, /metrics, /ledger and the operator page (on
    `web_host`); 0: no HTTP."""
    web_host: str = Field(default="127.0.0.1", min_length=1)
    """Address the HTTP edge listens on: loopback unless a scraper elsewhere needs it (a
    container's Prometheus: 0.0.0.0)."""
    web_token: SecretStr | None = None
    """When set, every action (POST) of the HTTP edge needs it (`Authorization: Bearer
    <token>`, or the operator page's token field and cookie); reads stay open."""
    web_max_connections: int = Field(default=100, ge=1, le=10_000)
    """Connections the HTTP edge serves at once (each holds one of the worker's file
    descriptors); past them, an idle one is closed for a new one, else the new one is
    refused, with room kept for probes (`app.ops.connection_cap`)."""
    web_idle_timeout_ms: int = Field(default=75_000, ge=1_000, le=7_200_000)
    """How long an HTTP connection may idle between requests, or take to send a request's
    head, before the edge closes it (a body has its own bound, `app.ops.slow_body`).
    Longer than the 60 s idle timeout of common load balancers and scrape intervals; behind
    a proxy that keeps idle connections longer, above its."""
    web_url: str | None = Field(default=None, pattern=WEB_URL_PATTERN, max_length=500)
    """This node's operator page as the other nodes' pages link to it; unset: derived from
    `web_host` and `web_port` unless the host is a wildcard (0.0.0.0, ::)."""
    status_interval_ms: int = Field(default=3_000, ge=200, le=60_000)
    """How often the node publishes its status to `<context>.nodes` (`app.ops.cluster_status`)."""
    commit_interval_ms: int = Field(default=100, ge=1, le=60_000)
    """How often the timer runners' changelog writes are committed."""
    busy_backlog: int = Field(default=50_000, ge=1, le=1_000_000)
    """Commands waiting in a partition beyond which the node answers BUSY (at most a
    million: past that the waiting commands, not BUSY, bound the node's memory)."""
    clock_skew_ms: int = Field(default=CLOCK_SKEW_MS, ge=0, le=60_000)
    """How far this node's clock may trail the clocks of other contexts' nodes that send it
    timers' commands: one such command (no sender waits for its answer) early by at most
    this is decided as of its due time; earlier, it is dead-lettered (`app.model.decide`)."""
    request_id_window_ms: int = Field(default=REQUEST_ID_WINDOW_MS, ge=60_000, le=10 * YEAR_MS)
    """How long each applied request id is kept: a command sent again within it is
    answered DUPLICATE, later it is applied again (7 days). At least the timers'
    `expires_after` plus as much again, at most a day (`TimerOptions.request_id_margin`):
    no slot is sent later than
    `expires_after` after it was due. It is taken for the window of every target the
    node's timers send to (another context's nodes must keep theirs at least as long), and
    bounds an operator's retry (`app.timers.runner.decisions.retry_parked`)."""
    gc_threshold: int = Field(default=50_000, ge=0, le=10_000_000)
    """The worker's young-generation collection threshold, set once it has started (with
    what start-up made frozen out of the collector's way); 0: Python's own (700)."""
    max_key_bytes: int = Field(default=DEFAULT_MAX_KEY_BYTES, ge=16, le=1024 * 1024)
    """A record of an input topic with a longer key is dead-lettered."""
    max_record_bytes: int = Field(default=DEFAULT_MAX_RECORD_BYTES, ge=1024, le=1024 * 1024)
    """A record of an input topic with a larger value is dead-lettered (at most what a topic
    of the broker's defaults takes, so that its dead letter always fits whole)."""
    max_state_bytes: int = Field(default=DEFAULT_MAX_STATE_BYTES, ge=1024, le=MAX_STATE_BYTES)
    """An aggregate's stored state at most (at least `max_record_bytes`): a command whose
    decision would grow it past is answered ERROR; the log's events are folded whatever."""
    handler_timeout_ms: int = Field(
        default=DEFAULT_HANDLER_TIMEOUT_MS, ge=0, le=TRANSACTION_TIMEOUT_MS // 2
    )
    """How long one run of user code (a handler, the appliers of a command's events, a job's
    handler) may take: past it, it is interrupted and its record fails (answered ERROR,
    dead-lettered); still running at twice it (10 s after it at least), the worker exits
    (`app.node.user_code_watch`).
    Below `session_timeout_ms`, and 30 s at most: half the transactions' timeout (the loop
    is the handler's while it runs, so what its partition staged before cannot commit
    meanwhile; past 60 s the broker aborts it and fences the producer, and the partition,
    taken again, would run the same slow handler again). When not given, the default or
    half the session timeout, whichever is less. 0: no timeout (a debugger's breakpoint in
    a handler)."""
    timers: TimerOptions = Field(default_factory=TimerOptions)
    """The runner's options; in the environment as JSON, e.g. {"claim_timeout": 5000}."""
    kafka_client: KafkaClient = "aiokafka"
    """The client of the partitions' transactional producers and of the changelog readers:
    `aiokafka`, or `confluent` (librdkafka, each on a thread of its own: needs the
    `confluent` extra)."""
    producer_thread: bool = False
    """`aiokafka` only: the partitions' transactional producers run on an event loop of
    their own, in one thread, not on the node's. A commit's ~24 turns of the loop then
    never wait behind the partitions' work, so a burst's first fire lands a little
    sooner (33-38 against 41-55 ms after due at 10,000 due at once); but commits then
    take the GIL from the firing as often as they want it, and at a saturated steady load
    (5,000/s on two cores) lateness p50 and p99 were ~1.5-2x worse (docs/performance.md)."""
    log_level: LogLevel = "INFO"
    """The level of the process's log (any case in the environment)."""
    log_format: LogFormat = "text"
    """`text` lines, or `json`: one object per line (time, level, logger, message, and
    the exception's text when there is one)."""
    security_protocol: SecurityProtocol = "PLAINTEXT"
    """How every Kafka client connects: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."""
    sasl_mechanism: SaslMechanism | None = None
    """PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (with a SASL protocol)."""
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    """Best given as `KAFKA_SASL_PASSWORD_FILE`."""
    sasl_oauthbearer_token_endpoint_url: str | None = None
    """OAUTHBEARER: the OIDC token endpoint the client-credentials grant is asked of."""
    sasl_oauthbearer_client_id: str | None = None
    sasl_oauthbearer_client_secret: SecretStr | None = None
    """Best given as `KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE`."""
    sasl_oauthbearer_scope: str | None = None
    sasl_oauthbearer_cafile: Path | None = None
    """OAUTHBEARER: the CA of the token endpoint's certificate (the system's CAs when absent)."""
    ssl_cafile: Path | None = None
    """The CA of the brokers' certificates (the system's CAs when absent)."""
    ssl_certfile: Path | None = None
    """This client's certificate, for mutual TLS (with `ssl_keyfile`)."""
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    """The password of an encrypted `ssl_keyfile`; best given as `KAFKA_SSL_KEY_PASSWORD_FILE`."""
    replication_factor: int = Field(default=3, ge=1, le=32)
    """Replicas of every topic the node creates (fewer when the cluster has fewer brokers:
    a warning says so)."""
    min_insync_replicas: int = Field(default=2, ge=1, le=32)
    """`min.insync.replicas` of those topics: an acknowledged write survives that many
    brokers less one lost (capped below the replication factor actually used)."""

    @property
    def kafka(self) -> KafkaConnection:
        """How every Kafka client of the node (and of a command) connects: each field of
        `KafkaConnection` the setting of its name."""
        return KafkaConnection(
            **{name: getattr(self, name) for name in KafkaConnection.model_fields}
        )

    @property
    def close_deadline_s(self) -> float:
        """How long a partition task's whole close may take (its timers' last writes, its
        last commits and its producers' stops, every type): half the group's rebalance
        timeout, so that a revoke's closes end well before the group throws this node out
        (and moves every partition it has). What is not done by then is abandoned dirty."""
        return rebalance_timeout_ms(self.session_timeout_ms) / 2000

    @property
    def replication(self) -> Replication:
        return Replication(self.replication_factor, self.min_insync_replicas)

    @model_validator(mode="before")
    @classmethod
    def _handler_timeout_in_session(cls, data: Any) -> Any:
        return defaults.handler_timeout_default(
            data, cls.model_fields["session_timeout_ms"].default
        )

    @model_validator(mode="before")
    @classmethod
    def _window_past_expiry(cls, data: Any) -> Any:
        return defaults.window_default(data, cls.model_fields["request_id_window_ms"].default)

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        checks.handler_within_session(self.handler_timeout_ms, self.session_timeout_ms)
        checks.window_outlasts_retries(
            self.request_id_window_ms,
            self.timers.expires_after,
            self.timers.request_id_margin,
        )
        checks.state_holds_a_record(self.max_state_bytes, self.max_record_bytes)
        checks.thread_of_aiokafka(self.producer_thread, self.kafka_client)
        checks.ascii_for_librdkafka(self.group_id, self.kafka_client)
        return self

    @model_validator(mode="after")
    def _connectable(self) -> Settings:
        # A wrong security setting (a missing file, a SASL protocol without credentials)
        # is one clear error now, before anything connects.
        try:
            self.kafka  # noqa: B018
        except ValidationError as exc:
            how = " ".join(filter(None, [self.security_protocol, self.sasl_mechanism]))
            raise ValueError(sources.cannot_connect(exc, self.bootstrap_servers, how)) from None
        checks.insync_within_replication(self.min_insync_replicas, self.replication_factor)
        return self

    @property
    def limits(self) -> InputLimits:
        """The bounds of an input record and of an aggregate's state (the dead letters'
        size is the topic's)."""
        return InputLimits(
            max_key_bytes=self.max_key_bytes,
            max_record_bytes=self.max_record_bytes,
            max_state_bytes=self.max_state_bytes,
        )

    @field_validator("bootstrap_servers")
    @classmethod
    def _addresses(cls, value: str) -> str:
        return checks.brokers(value)

    @field_validator("group_id", "web_host")
    @classmethod
    def _printable(cls, value: str) -> str:
        return checks.printable(value)

    @field_validator("group_instance_id")
    @classmethod
    def _printable_or_none(cls, value: str | None) -> str | None:
        return None if value is None else checks.printable(value)

    @field_validator("web_token")
    @classmethod
    def _sendable(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            sources.sendable_token(value.get_secret_value())
        return value

    @field_validator("web_url")
    @classmethod
    def _page_address(cls, value: str | None) -> str | None:
        return None if value is None else checks.page_address(value)

    @field_validator("data_dir")
    @classmethod
    def _a_directory(cls, value: Path) -> Path:
        return checks.a_directory(value)

    @field_validator("aggregate_types", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return sources.comma_separated(value)

    @field_validator("aggregate_types")
    @classmethod
    def _valid_types(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        return checks.type_names(names)

    @field_validator("timers", mode="before")
    @classmethod
    def _json_object(cls, value: object) -> object:
        return sources.options_json(value) if isinstance(value, str) else value

    @field_validator("*", mode="before")
    @classmethod
    def _whole_numbers(cls, value: object, info: ValidationInfo) -> object:
        # Every integer setting alike: ASCII digits, as the timer options read theirs.
        name = info.field_name
        is_int = name is not None and cls.model_fields[name].annotation is int
        return sources.digits_alone(value) if is_int else value

    @field_validator("kafka_client")
    @classmethod
    def _client_installed(cls, value: KafkaClient) -> KafkaClient:
        return checks.client_installed(value)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        # ASCII alone: a dotless i (U+0131) upper-cased is an ASCII I, so "\u0131nfo" read INFO.
        return value.strip().upper() if isinstance(value, str) and value.isascii() else value

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # `Settings(...)` is its arguments only: the environment is `from_env`'s to read.
        return (init_settings,)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, /, **overrides: Any) -> Settings:
        """Settings from `env` (the process environment by default), its `.env` file and
        `_FILE` variables, then `overrides` (those None are not given); a `ConfigError`
        naming every variable at fault."""
        variables = read_variables(env)
        sources.all_utf8(variables)
        raw = sources.VariablesSource(cls, variables)()
        raw.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise ConfigError(sources.explain(exc, _SECRETS, variables.from_files)) from exc
