"""Configuration a settings hunt found taken at start and failing later (every commit, the
worker's start, a header never sent), or silently read as something else: each is refused
at start now, by a `ConfigError` naming its variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import ConfigError
from app.node.settings import Settings


@pytest.mark.parametrize("name", ["a" * 300, "b" * 300 + "/.env"])
def test_an_env_file_name_too_long_is_a_config_error(name: str, tmp_path: Path) -> None:
    """`Path.is_file` raises ENAMETOOLONG (and EACCES): a raw OSError, naming nothing."""
    with pytest.raises(ConfigError, match=r"TICKWHEEL_ENV_FILE: cannot read .*File name too long"):
        Settings.from_env({"TICKWHEEL_ENV_FILE": str(tmp_path / name)})


@pytest.mark.parametrize(
    "variable",
    [
        "TICKWHEEL_WEB_TOKEN_FILE",
        "KAFKA_SASL_PASSWORD_FILE",
        "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE",
        "KAFKA_SSL_KEY_PASSWORD_FILE",
    ],
)
def test_a_secrets_file_variable_of_whitespace_alone_is_refused(variable: str) -> None:
    """It was taken as not given: a web token's turned the HTTP edge's token check off."""
    with pytest.raises(ConfigError, match=f"{variable} .*only whitespace"):
        Settings.from_env({variable: "   "})
    assert Settings.from_env({variable: ""}).web_token is None  # empty: not given


@pytest.mark.parametrize("token", ["abc\ndef", "abc\tdef", "a\x00b", "a\x7fb", "a\x85b"])
def test_a_web_token_no_header_can_carry_is_refused(token: str, tmp_path: Path) -> None:
    """Every action would be refused: no client can send it as `Authorization: Bearer`."""
    with pytest.raises(ConfigError, match="TICKWHEEL_WEB_TOKEN: a control character") as e:
        Settings.from_env({"TICKWHEEL_WEB_TOKEN": token})
    assert token not in str(e.value)
    (tmp_path / "token").write_text(f"\n{token}\n")  # stripped around it, not inside
    with pytest.raises(ConfigError, match="TICKWHEEL_WEB_TOKEN: a control character") as e:
        Settings.from_env({"TICKWHEEL_WEB_TOKEN_FILE": str(tmp_path / "token")})
    assert token not in str(e.value) and "read from TICKWHEEL_WEB_TOKEN_FILE" in str(e.value)


def test_a_web_token_with_a_space_inside_is_taken() -> None:
    token = Settings.from_env({"TICKWHEEL_WEB_TOKEN": "two words"}).web_token
    assert token is not None and token.get_secret_value() == "two words"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TICKWHEEL_SESSION_TIMEOUT_MS", "1500.0"),
        ("TICKWHEEL_SESSION_TIMEOUT_MS", "1_500"),
        ("TICKWHEEL_COMMIT_INTERVAL_MS", "100.0"),
        ("TICKWHEEL_PARTITIONS", "12.0"),
        ("TICKWHEEL_WEB_PORT", "8_080"),
    ],
)
def test_an_integer_setting_is_digits_alone(variable: str, value: str) -> None:
    """pydantic read "1500.0" as 1500, but the handler timeout's default, computed from the
    session timeout before validation, did not: the error blamed
    TICKWHEEL_HANDLER_TIMEOUT_MS, never given."""
    with pytest.raises(ConfigError) as e:
        Settings.from_env({variable: value})
    assert str(e.value) == (
        f"bad configuration: {variable}: Input should be a valid integer, in digits alone (no "
        f"decimal point, exponent or '_') (got {value!r})"
    )


def test_an_integer_setting_in_digits_is_taken() -> None:
    s = Settings.from_env({"TICKWHEEL_SESSION_TIMEOUT_MS": "1500", "TICKWHEEL_WEB_PORT": "+80"})
    assert (s.session_timeout_ms, s.handler_timeout_ms, s.web_port) == (1500, 750, 80)


@pytest.mark.parametrize(
    ("options", "twice"),
    [
        ('{"claim_timeout": 1000, "claim_timeout": 50000}', "'claim_timeout'"),
        ('{"retry": {"max_attempts": 2, "max_attempts": 3}}', "'max_attempts'"),
    ],
)
def test_a_timer_option_given_twice_is_refused(options: str, twice: str) -> None:
    """JSON readers keep the last silently: an option given twice by mistake."""
    with pytest.raises(ConfigError, match=f"TICKWHEEL_TIMER_OPTIONS: .*{twice} given more than"):
        Settings.from_env({"TICKWHEEL_TIMER_OPTIONS": options})


def test_an_expiry_out_of_its_range_is_its_own_error_alone() -> None:
    """A window computed from it was out of the window's range: a second error, about
    TICKWHEEL_REQUEST_ID_WINDOW_MS, never given."""
    with pytest.raises(ConfigError) as e:
        Settings.from_env({"TICKWHEEL_TIMER_OPTIONS": '{"expires_after": 400000000000}'})
    assert "TICKWHEEL_TIMER_OPTIONS.expires_after: Input should be less" in str(e.value)
    assert "REQUEST_ID_WINDOW" not in str(e.value)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://host:99999/", "not a URL .*Port out of range"),
        ("http://[::1/", "not a URL .*IPv6"),
        ("http://[zz]/", "not a URL"),
        ("http://host:abc/", "not a URL"),
        ("http://ho\xadst/", "not a URL .*cannot contain"),
        ("http://host:\u0663/", "not a URL"),  # an Arabic-Indic 3: yarl reads it as 3
        ("http://host:+80/", "not a URL"),
        ("http://host:0/", "a port from 1 to 65535"),
        ("http://:80/", "not a URL .*host is required"),
    ],
)
def test_a_web_url_no_page_can_be_reached_at_is_refused(url: str, why: str) -> None:
    """The pattern took them; the worker then failed at start reading its host
    (`ActionGuard`: an unexpected ValueError, naming no setting)."""
    with pytest.raises(ConfigError, match=f"TICKWHEEL_WEB_URL: Value error, {why}"):
        Settings.from_env({"TICKWHEEL_WEB_URL": url})


@pytest.mark.parametrize(
    "url", ["https://tw-1.example/", "http://TW.Internal.:9400", "http://[::1]:80/x", "http://h:1"]
)
def test_a_web_url_with_a_host_is_taken(url: str) -> None:
    assert Settings.from_env({"TICKWHEEL_WEB_URL": url}).web_url == url
