"""Checks of settings' values, as plain functions raising `ValueError`: of one setting (its
field validator calls it, and pydantic names the variable), and of settings that must agree
(the model's validator calls them, and each message names its variables). May import
`app.kafka.addresses`, `app.kafka.clients`, `app.protocol.topics` and `yarl` alone."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from yarl import URL

from app.kafka.addresses import broker_addresses, has_invisible
from app.kafka.clients import KafkaClient, client_missing
from app.protocol.topics import parse_aggregate_type

__all__ = [
    "a_directory",
    "ascii_for_librdkafka",
    "brokers",
    "client_installed",
    "handler_within_session",
    "insync_within_replication",
    "page_address",
    "printable",
    "state_holds_a_record",
    "thread_of_aiokafka",
    "type_names",
    "window_outlasts_retries",
]


def brokers(value: str) -> str:
    """`value` if it reads as brokers' addresses, as the probe and the clients read it (the
    clients fail on a bad port with a bare OverflowError, on a scheme or an empty host by
    retrying for ever)."""
    broker_addresses(value)
    return value


def printable(value: str) -> str:
    """`value` with no space, control or invisible character, at most 200 characters:
    said at start (a NUL cuts librdkafka's transactional id short, and a web host's
    address is resolved before the node starts: `app.ops.web_port`)."""
    if has_invisible(value):
        raise ValueError("no space, control or invisible character")
    if len(value) > 200:
        raise ValueError("at most 200 characters")
    return value


def page_address(value: str) -> str:
    """`value` if it is a page's address a browser opens and the HTTP edge reads its host
    from (`app.ops.action_guard`, with yarl): a host, and a port, if any, of 1 to 65535 in
    digits. Else the worker failed at start on it, naming no setting."""
    try:
        host = URL(value).raw_host
        port = urlsplit(value).port  # ASCII digits alone, as yarl does not check
    except ValueError as exc:
        raise ValueError(f"not a URL ({exc})") from None
    if not host:
        raise ValueError("a URL with a host")
    if port == 0:
        raise ValueError("a port from 1 to 65535")
    return value


def a_directory(value: Path) -> Path:
    """`value` if it can be a data directory: said before anything connects, not as an OS
    error at the lock's open."""
    text = str(value)
    if not text.strip() or text != text.strip():
        raise ValueError("a directory path, with no blank around it")
    if "\x00" in text:
        raise ValueError("a NUL character in the path")
    try:
        a_file = value.exists() and not value.is_dir()
    except OSError:  # not searchable by this user, a name too long: the lock says so
        return value
    if a_file:
        raise ValueError("it is a file, not a directory")
    return value


def type_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """`names` if each is an aggregate type's name, and none is named twice."""
    for name in names:
        parse_aggregate_type(name)
    # A type named twice was kept twice: the worker opened its store twice and failed
    # on the store's lock, naming no setting.
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"{', '.join(twice)} named more than once")
    return names


def client_installed(value: KafkaClient) -> KafkaClient:
    """`value` if its library is installed (`confluent` needs its extra)."""
    missing = client_missing(value)
    if missing is not None:
        raise ValueError(missing)
    return value


def handler_within_session(handler_timeout_ms: int, session_timeout_ms: int) -> None:
    """The loop is the handler's while it runs: no heartbeat goes out. A handler allowed
    past the session would get the node expelled before its timeout ends it."""
    if 0 < handler_timeout_ms < 100:
        raise ValueError(
            f"TICKWHEEL_HANDLER_TIMEOUT_MS ({handler_timeout_ms}) is 0 (no timeout) or 100 at least"
        )
    if handler_timeout_ms >= session_timeout_ms:
        raise ValueError(
            f"TICKWHEEL_HANDLER_TIMEOUT_MS ({handler_timeout_ms}) must be below "
            f"TICKWHEEL_SESSION_TIMEOUT_MS ({session_timeout_ms})"
        )


def window_outlasts_retries(
    request_id_window_ms: int, expires_after_ms: int, margin_ms: int
) -> None:
    """A timer's slot is sent, its retries included, until `expires_after` after it was
    due, always under the same request id: the target must still know an id it applied
    by then, with `margin_ms` to spare (the command's trip through the broker and the
    target's backlog, the clocks' skew: `TimerOptions.request_id_margin`)."""
    if request_id_window_ms < expires_after_ms + margin_ms:
        raise ValueError(
            f"TICKWHEEL_REQUEST_ID_WINDOW_MS ({request_id_window_ms}) must be at least "
            f"TICKWHEEL_TIMER_OPTIONS.expires_after ({expires_after_ms}) plus {margin_ms} "
            "(expires_after again, at most a day), or a timer's last retries could reach its "
            "target after it forgot their request id, and be applied twice"
        )


def insync_within_replication(min_insync_replicas: int, replication_factor: int) -> None:
    """No write could be acknowledged with more in-sync replicas asked for than a topic has."""
    if min_insync_replicas > replication_factor:
        raise ValueError(
            f"TICKWHEEL_MIN_INSYNC_REPLICAS {min_insync_replicas} is more than "
            f"TICKWHEEL_REPLICATION_FACTOR {replication_factor}"
        )


def state_holds_a_record(max_state_bytes: int, max_record_bytes: int) -> None:
    """One event may be as large as a record: a state bound below it would refuse what
    the node reads."""
    if max_state_bytes < max_record_bytes:
        raise ValueError(
            f"TICKWHEEL_MAX_STATE_BYTES {max_state_bytes} is less than "
            f"TICKWHEEL_MAX_RECORD_BYTES {max_record_bytes}"
        )


def thread_of_aiokafka(producer_thread: bool, kafka_client: str) -> None:
    """librdkafka's producers have threads of their own: a thread asked for them would be
    silently not there."""
    if producer_thread and kafka_client != "aiokafka":
        raise ValueError(
            "TICKWHEEL_PRODUCER_THREAD=true is for TICKWHEEL_KAFKA_CLIENT=aiokafka only "
            f"(this is {kafka_client}, whose producers run on threads of their "
            "own): unset it or set it false"
        )


def ascii_for_librdkafka(group_id: str, kafka_client: str) -> None:
    """librdkafka takes the group of a transaction's offsets as printable ASCII alone
    (`app.kafka.rdkafka_config.group_metadata`): with another, every commit of every
    partition failed, for ever. The transactional ids built on the group id (with topics'
    names, ASCII, and numbers) follow it; the group consumer is aiokafka's whatever the
    client, and the client ids are the project's own."""
    if kafka_client == "confluent" and not (group_id.isascii() and group_id.isprintable()):
        raise ValueError(
            "TICKWHEEL_GROUP_ID holds a character that is not ASCII: with "
            "TICKWHEEL_KAFKA_CLIENT=confluent, librdkafka takes a group id of printable ASCII "
            "alone (it would refuse every transaction's offsets, and no partition would ever "
            "commit); use an ASCII group id (a group renamed loses its committed offsets) or "
            "TICKWHEEL_KAFKA_CLIENT=aiokafka"
        )
