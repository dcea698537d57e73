from __future__ import annotations

import traceback
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from app.errors import ConfigError
from app.node.settings import Settings
from app.protocol.topics import AggregateTopics, ContextTopics, parse_aggregate_type
from app.timers.runner.options import DAY_MS, TimerOptions


def test_defaults_and_environment() -> None:
    s = Settings.from_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1234",
            "TICKWHEEL_AGGREGATE_TYPES": "shop.order, shop.cart",
            "TICKWHEEL_PARTITIONS": "4",
            "TICKWHEEL_DATA_DIR": "/tmp/x",
        }
    )
    assert s.bootstrap_servers == "127.0.0.1:1234"
    assert s.aggregate_types == ("shop.order", "shop.cart")
    assert s.partitions == 4
    assert s.data_dir == Path("/tmp/x")


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"TICKWHEEL_PARTITIONS": "zero"}, "TICKWHEEL_PARTITIONS"),
        ({"TICKWHEEL_PARTITIONS": "0"}, "TICKWHEEL_PARTITIONS"),
        ({"TICKWHEEL_AGGREGATE_TYPES": "shop"}, "TICKWHEEL_AGGREGATE_TYPES"),
        # Kept twice, its store opened twice: the worker failed on RocksDB's lock.
        (
            {"TICKWHEEL_AGGREGATE_TYPES": "other.thing, a.b,other.thing"},
            "TICKWHEEL_AGGREGATE_TYPES: .*other.thing named more than once",
        ),
        ({"TICKWHEEL_SESSION_TIMEOUT_MS": "5"}, "TICKWHEEL_SESSION_TIMEOUT_MS"),
        ({"TICKWHEEL_BUSY_BACKLOG": "1000001"}, "TICKWHEEL_BUSY_BACKLOG: .* less than or equal"),
        (
            {"TICKWHEEL_MAX_STATE_BYTES": str(64 * 1024 * 1024 + 1)},
            "TICKWHEEL_MAX_STATE_BYTES: .* less than or equal",
        ),
        (
            {"TICKWHEEL_MAX_STATE_BYTES": "524288", "TICKWHEEL_MAX_RECORD_BYTES": "1048576"},
            "TICKWHEEL_MAX_STATE_BYTES 524288 is less than TICKWHEEL_MAX_RECORD_BYTES 1048576",
        ),
        (
            {"TICKWHEEL_REQUEST_ID_WINDOW_MS": str(2**63 - 1)},
            "TICKWHEEL_REQUEST_ID_WINDOW_MS: .* less than or equal",
        ),
        # A port no client can connect to: said here, not a traceback from the first
        # connection (OverflowError, ValueError).
        ({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:99999"}, "KAFKA_BOOTSTRAP_SERVERS.*99999"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "b1:9093,b2:x"}, "KAFKA_BOOTSTRAP_SERVERS.*'b2:x'"),
        # isdigit() is true of "\u00b2", which int() refuses, and of 4,301 digits.
        ({"KAFKA_BOOTSTRAP_SERVERS": "b:\u00b2"}, "KAFKA_BOOTSTRAP_SERVERS.*port must be"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "b:" + "9" * 5000}, "KAFKA_BOOTSTRAP_SERVERS.*port must be"),
        # An IPv6 address with a bracket missing: the client failed on it with "not enough
        # values to unpack", an unexpected error, not a config one.
        ({"KAFKA_BOOTSTRAP_SERVERS": "[::1"}, "KAFKA_BOOTSTRAP_SERVERS.*IPv6 address"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "a:1,["}, "KAFKA_BOOTSTRAP_SERVERS.*IPv6 address"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "[::1]x"}, "KAFKA_BOOTSTRAP_SERVERS.*IPv6 address"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "[::1]:99999"}, "KAFKA_BOOTSTRAP_SERVERS.*port must be"),
        # What no client can use, each of them reading it otherwise (a settings hunt): no
        # address, an empty host, a listener's scheme, a space in a host, bare IPv6.
        ({"KAFKA_BOOTSTRAP_SERVERS": ",,,"}, "KAFKA_BOOTSTRAP_SERVERS.*no broker address"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "x" * 300 + ":9092"}, "KAFKA_BOOTSTRAP_SERVERS.*not a host"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "a\x01b:9092"}, "KAFKA_BOOTSTRAP_SERVERS.*control"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "a\u202eb:9092"}, "KAFKA_BOOTSTRAP_SERVERS.*control"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "[a\x00b]:9092"}, "KAFKA_BOOTSTRAP_SERVERS.*control"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "a:9092,"}, "KAFKA_BOOTSTRAP_SERVERS.*empty entry"),
        ({"KAFKA_BOOTSTRAP_SERVERS": ":9092"}, "KAFKA_BOOTSTRAP_SERVERS.*no host"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "PLAINTEXT://k:9092"}, "KAFKA_BOOTSTRAP_SERVERS.*scheme"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "a b:9092"}, "KAFKA_BOOTSTRAP_SERVERS.*space"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "::1"}, "KAFKA_BOOTSTRAP_SERVERS.*IPv6 address"),
    ],
)
def test_bad_values_name_their_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        Settings.from_env(env)


@pytest.mark.parametrize(
    "servers",
    ["[::1]:9092", "[::1]", "b1:9092,[fe80::1]:9093", "[fe80::1%eth0]:9092", "[b.local]:9092"],
)
def test_an_ipv6_address_in_brackets_is_taken(servers: str) -> None:
    assert Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": servers}).bootstrap_servers == servers


def test_topic_names() -> None:
    t = parse_aggregate_type("shop.order")
    assert t == AggregateTopics("shop", "order")
    assert (t.events, t.commands, t.timers_changelog) == (
        "shop.order.events",
        "shop.order.commands",
        "shop.order.timers",
    )
    assert ContextTopics("shop").dead_letters == "shop.dead-letters"
    with pytest.raises(ConfigError):
        parse_aggregate_type("shop.order.x")


def test_timer_options_as_json() -> None:
    s = Settings.from_env(
        {"TICKWHEEL_TIMER_OPTIONS": '{"claim_timeout": 5000, "send_timeout": 2000}'}
    )
    assert s.timers.claim_timeout == 5000
    with pytest.raises(ConfigError, match="TICKWHEEL_TIMER_OPTIONS"):
        Settings.from_env({"TICKWHEEL_TIMER_OPTIONS": "{nope"})
    with pytest.raises(ConfigError, match=r"TICKWHEEL_TIMER_OPTIONS\.claim_timeout"):
        Settings.from_env({"TICKWHEEL_TIMER_OPTIONS": '{"claim_timeout": -1}'})
    # Read strictly (a settings hunt): `true` was 1 (one send at a time, retries off), a
    # string a number.
    for given, name in [
        ('{"max_in_flight": true}', "max_in_flight"),
        ('{"retry": {"max_attempts": true}}', "retry.max_attempts"),
        ('{"batch_limit": "  7 "}', "batch_limit"),
    ]:
        with pytest.raises(ConfigError, match=rf"TICKWHEEL_TIMER_OPTIONS\.{name}"):
            Settings.from_env({"TICKWHEEL_TIMER_OPTIONS": given})
    assert (
        Settings.from_env(
            {"TICKWHEEL_TIMER_OPTIONS": '{"retry": {"multiplier": 3, "max_attempts": 2}}'}
        ).timers.retry.multiplier
        == 3.0
    )


def test_a_config_errors_traceback_shows_no_secret() -> None:
    """The ValidationError chained under the ConfigError showed every input, the SASL
    password and the web token among them, to whoever logs or prints its traceback (a
    settings hunt)."""
    env = {
        "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KAFKA_SASL_MECHANISM": "PLAIN",
        "KAFKA_SASL_USERNAME": "u",
        "KAFKA_SASL_PASSWORD": "hunter2-secret",
        "TICKWHEEL_WEB_TOKEN": "tok-secret-token",
        "TICKWHEEL_REQUEST_ID_WINDOW_MS": "60000",
    }
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(env)
    shown = "".join(traceback.format_exception(raised.value))
    assert "hunter2-secret" not in shown and "tok-secret-token" not in shown


def test_a_value_that_is_not_utf8_names_its_variable_and_shows_nothing_of_it() -> None:
    """The environment holds bytes that are not UTF-8 as lone surrogates: the worker failed
    later with a bare UnicodeEncodeError that named no setting and showed a character of
    the token and its position (a settings hunt)."""
    with pytest.raises(ConfigError, match="TICKWHEEL_WEB_TOKEN: not valid UTF-8") as raised:
        Settings.from_env({"TICKWHEEL_WEB_TOKEN": "t\udcf6ken-secret"})
    assert "secret" not in str(raised.value) and "\udcf6" not in str(raised.value)


def test_a_check_of_two_settings_names_their_variables() -> None:
    """It named the fields (request_id_window_ms), not what an operator sets (a hunt)."""
    with pytest.raises(
        ConfigError,
        match=r"TICKWHEEL_REQUEST_ID_WINDOW_MS \(60000\) must be at least "
        r"TICKWHEEL_TIMER_OPTIONS\.expires_after",
    ):
        Settings.from_env({"TICKWHEEL_REQUEST_ID_WINDOW_MS": "60000"})


def test_a_long_expiry_alone_still_starts_its_defaults_outlasting_it() -> None:
    """A 0.2.0 configuration, `expires_after` of 10 days (which had no retention and no
    de-duplication window to outlast), stopped the worker at start: both defaults are a
    week. Not given, each is now a day past the expiry when that is longer."""
    ten_days = 10 * DAY_MS
    env = {"TICKWHEEL_TIMER_OPTIONS": orjson.dumps({"expires_after": ten_days}).decode()}
    s = Settings.from_env(env)
    assert s.timers.finished_retention == s.request_id_window_ms == ten_days + DAY_MS
    assert Settings(timers=TimerOptions(expires_after=ten_days)).request_id_window_ms == (
        ten_days + DAY_MS
    )
    # Under a week, or given, they are as they were.
    short = {"TICKWHEEL_TIMER_OPTIONS": '{"expires_after": 3600000}'}
    assert Settings.from_env(short).request_id_window_ms == 7 * DAY_MS
    assert Settings.from_env(short).timers.finished_retention == 7 * DAY_MS
    given = {**env, "TICKWHEEL_REQUEST_ID_WINDOW_MS": str(ten_days)}
    with pytest.raises(ConfigError, match=r"TICKWHEEL_REQUEST_ID_WINDOW_MS \(864000000\) must"):
        Settings.from_env(given)
    kept = {"expires_after": ten_days, "finished_retention": ten_days}
    with pytest.raises(ValidationError, match="finished_retention"):
        TimerOptions.model_validate(kept)
    # What is not a number is the options' own error, as before.
    with pytest.raises(ConfigError, match="expires_after"):
        Settings.from_env({"TICKWHEEL_TIMER_OPTIONS": '{"expires_after": true}'})


def test_a_group_id_of_a_character_newer_than_pythons_unicode_data_is_taken() -> None:
    assert Settings.from_env({"TICKWHEEL_GROUP_ID": "g-\U0001fae8"}).group_id == "g-\U0001fae8"


@pytest.mark.parametrize(
    ("value", "said"),
    [("FILE", "a file, not a directory"), ("  ", "no blank"), (" state", "no blank")],
)
def test_a_data_directory_that_cannot_be_one_is_a_configuration_error(
    tmp_path: Path, value: str, said: str
) -> None:
    """Said before anything connects, naming the variable, not as the lock's OS error."""
    (tmp_path / "FILE").write_text("x")
    path = str(tmp_path / "FILE") if value == "FILE" else value
    with pytest.raises(ConfigError, match=f"TICKWHEEL_DATA_DIR: .*{said}"):
        Settings.from_env({}, data_dir=path)
