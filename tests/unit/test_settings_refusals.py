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
