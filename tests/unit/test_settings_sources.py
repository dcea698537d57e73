"""Where settings come from (pydantic-settings): the environment, a `.env` file, `X_FILE`
for secrets, and what is refused: a `TICKWHEEL_*` name no setting has (with the closest
one), a file that cannot be read (no regular file, too large), a value given twice; the
log level and format, the web token (never shown). `Settings(...)` reads nothing but its
arguments."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from app.errors import ConfigError
from app.node.settings import TOOLING_VARIABLES, VARIABLES, Settings
from app.node.variable_files import MAX_FILE_BYTES


def test_every_field_has_its_variable() -> None:
    assert set(VARIABLES) == set(Settings.model_fields)
    assert VARIABLES["bootstrap_servers"] == "KAFKA_BOOTSTRAP_SERVERS"
    assert VARIABLES["timers"] == "TICKWHEEL_TIMER_OPTIONS"
    # How to reach Kafka is named as Kafka's clients name it; the rest is Tickwheel's own.
    kafka = {"security_protocol", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_key_password"}
    kafka |= {f for f in VARIABLES if f.startswith("sasl_")}
    for field, var in VARIABLES.items():
        if field in kafka:
            assert var == f"KAFKA_{field.upper()}"
        elif field not in ("bootstrap_servers", "timers"):
            assert var == f"TICKWHEEL_{field.upper()}"


def test_settings_built_directly_read_no_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TICKWHEEL_PARTITIONS", "7")
    monkeypatch.setenv("TICKWHEEL_PARTITONS", "7")  # not even an unknown name is looked at
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("TICKWHEEL_GROUP_ID=from-dotenv\n")
    s = Settings(partitions=3, bootstrap_servers="b:1")
    assert (s.partitions, s.bootstrap_servers, s.group_id) == (3, "b:1", "tickwheel")
    assert Settings().partitions == 12


def test_values_are_stripped_and_empty_ones_are_no_value() -> None:
    s = Settings.from_env({"TICKWHEEL_PARTITIONS": " 4 ", "TICKWHEEL_GROUP_ID": "  "})
    assert (s.partitions, s.group_id) == (4, "tickwheel")


def test_overrides_win_and_none_is_not_given() -> None:
    env = {"TICKWHEEL_PARTITIONS": "4", "KAFKA_BOOTSTRAP_SERVERS": "env:1"}
    s = Settings.from_env(env, partitions=None, bootstrap_servers="cli:2")
    assert (s.partitions, s.bootstrap_servers) == (4, "cli:2")


# --- .env -------------------------------------------------------------------------------


def test_the_env_file_named_is_read_under_the_environment(tmp_path: Path) -> None:
    dotenv = tmp_path / "tickwheel.env"
    dotenv.write_text(
        "# a comment\n"
        "TICKWHEEL_PARTITIONS=6\n"
        "TICKWHEEL_GROUP_ID='from-file'\n"
        "export TICKWHEEL_LOG_FORMAT=json\n"
        "OTHER_TOOL=ignored\n"
    )
    env = {"TICKWHEEL_ENV_FILE": str(dotenv), "TICKWHEEL_GROUP_ID": "from-env"}
    s = Settings.from_env(env)
    assert (s.partitions, s.group_id, s.log_format) == (6, "from-env", "json")


def test_a_missing_env_file_named_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TICKWHEEL_ENV_FILE: no file"):
        Settings.from_env({"TICKWHEEL_ENV_FILE": str(tmp_path / "nope.env")})


def test_dotenv_in_the_working_directory_goes_with_the_process_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TICKWHEEL_PARTITIONS", raising=False)
    (tmp_path / ".env").write_text("TICKWHEEL_PARTITIONS=5\n")
    assert Settings.from_env().partitions == 5
    # A mapping given is the whole environment: a test's `from_env({})` stays hermetic.
    assert Settings.from_env({}).partitions == 12
    monkeypatch.setenv("TICKWHEEL_PARTITIONS", "9")
    assert Settings.from_env().partitions == 9


def test_an_unknown_name_in_the_env_file_is_an_error_naming_the_file(tmp_path: Path) -> None:
    dotenv = tmp_path / "x.env"
    dotenv.write_text("TICKWHEEL_COMMIT_INTERVAL=50\n")
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"TICKWHEEL_ENV_FILE": str(dotenv)})
    assert str(caught.value) == (
        f"TICKWHEEL_COMMIT_INTERVAL (in {dotenv}) is no setting: "
        "did you mean TICKWHEEL_COMMIT_INTERVAL_MS?"
    )


# --- unknown names ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("TICKWHEEL_PARTITONS", "TICKWHEEL_PARTITIONS"),
        ("TICKWHEEL_WEBPORT", "TICKWHEEL_WEB_PORT"),
        ("TICKWHEEL_TIMERS", "TICKWHEEL_TIMER_OPTIONS"),
        ("TICKWHEEL_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"),
        ("TICKWHEEL_WEB_TOKN_FILE", "TICKWHEEL_WEB_TOKEN_FILE"),
        ("tickwheel_partitions", "TICKWHEEL_PARTITIONS"),
        ("TICKWHEEL_LOGLEVEL", "TICKWHEEL_LOG_LEVEL"),
    ],
)
def test_an_unknown_tickwheel_variable_names_the_closest_setting(name: str, closest: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({name: "1"})
    assert str(caught.value) == (
        f"{name} (in the environment) is no setting: did you mean {closest}?"
    )


def test_every_unknown_name_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"TICKWHEEL_PARTITONS": "1", "TICKWHEEL_GROUPID": "g"})
    assert "TICKWHEEL_PARTITONS" in str(caught.value)
    assert "did you mean TICKWHEEL_GROUP_ID?" in str(caught.value)


def test_the_tools_variables_and_other_programs_are_no_error() -> None:
    env = dict.fromkeys(TOOLING_VARIABLES, "x")
    env |= {"TICKWHEEL_ENV_FILE": "", "KAFKA_HEAP_OPTS": "-Xmx1g", "PATH": "/bin"}
    assert Settings.from_env(env).partitions == 12


# --- *_FILE -----------------------------------------------------------------------------


def test_a_file_variable_is_its_files_contents(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    servers = tmp_path / "servers"
    servers.write_text("  k1:9092,k2:9092  \n")
    parts = tmp_path / "partitions"
    parts.write_text("8")
    s = Settings.from_env(
        {
            "TICKWHEEL_WEB_TOKEN_FILE": str(token),
            "KAFKA_BOOTSTRAP_SERVERS_FILE": str(servers),
            "TICKWHEEL_PARTITIONS_FILE": str(parts),
        }
    )
    assert s.web_token is not None and s.web_token.get_secret_value() == "s3cret-token"
    assert s.bootstrap_servers == "k1:9092,k2:9092"
    assert s.partitions == 8


def test_a_file_variable_in_the_env_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-a-file")
    dotenv = tmp_path / ".env"
    dotenv.write_text(f"TICKWHEEL_WEB_TOKEN_FILE={tmp_path / 'token'}\n")
    s = Settings.from_env({"TICKWHEEL_ENV_FILE": str(dotenv)})
    assert s.web_token is not None and s.web_token.get_secret_value() == "from-a-file"
    # The environment's own value is over the file's (a place over the other, not a mix).
    s = Settings.from_env({"TICKWHEEL_ENV_FILE": str(dotenv), "TICKWHEEL_WEB_TOKEN": "env"})
    assert s.web_token is not None and s.web_token.get_secret_value() == "env"


def test_a_file_that_cannot_be_read_names_its_variable(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"TICKWHEEL_WEB_TOKEN_FILE": str(missing)})
    assert str(caught.value) == (
        f"TICKWHEEL_WEB_TOKEN_FILE (in the environment): cannot read '{missing}': "
        "No such file or directory"
    )
    with pytest.raises(ConfigError, match=r"TICKWHEEL_WEB_TOKEN_FILE .*a directory"):
        Settings.from_env({"TICKWHEEL_WEB_TOKEN_FILE": str(tmp_path)})
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"TICKWHEEL_PARTITIONS_FILE .*not UTF-8 text"):
        Settings.from_env({"TICKWHEEL_PARTITIONS_FILE": str(binary)})


def test_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    # Its open would wait for a writer: the start hung.
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"TICKWHEEL_WEB_TOKEN_FILE": str(fifo)})
    assert str(caught.value) == (
        f"TICKWHEEL_WEB_TOKEN_FILE (in the environment): cannot read '{fifo}': it is a FIFO "
        "(named pipe), not a regular file"
    )


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero here")
def test_a_device_is_refused_without_reading_it() -> None:
    # /dev/zero never ends: the start read it until the memory ran out.
    with pytest.raises(
        ConfigError,
        match=r"^TICKWHEEL_WEB_TOKEN_FILE \(in the environment\): cannot read '/dev/zero': "
        r"it is a character device, not a regular file$",
    ):
        Settings.from_env({"TICKWHEEL_WEB_TOKEN_FILE": "/dev/zero"})


def test_a_file_larger_than_any_value_is_refused_and_one_at_the_bound_is_read(
    tmp_path: Path,
) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"t" * (MAX_FILE_BYTES + 1))
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"TICKWHEEL_WEB_TOKEN_FILE": str(big)})
    assert str(caught.value).startswith(
        f"TICKWHEEL_WEB_TOKEN_FILE (in the environment): cannot read '{big}': it holds more "
        f"than {MAX_FILE_BYTES} bytes"
    )
    assert "ttt" not in str(caught.value)  # a secret's value is never shown
    fits = tmp_path / "fits"
    fits.write_bytes(b"t" * MAX_FILE_BYTES)
    s = Settings.from_env({"TICKWHEEL_WEB_TOKEN_FILE": str(fits)})
    assert s.web_token is not None and len(s.web_token.get_secret_value()) == MAX_FILE_BYTES


def test_a_symlink_to_a_regular_file_is_read(tmp_path: Path) -> None:
    # as a Kubernetes secret's file is (`..data/token`)
    (tmp_path / "real").write_text("s3cret\n")
    (tmp_path / "token").symlink_to(tmp_path / "real")
    s = Settings.from_env({"TICKWHEEL_WEB_TOKEN_FILE": str(tmp_path / "token")})
    assert s.web_token is not None and s.web_token.get_secret_value() == "s3cret"


def test_a_value_and_its_file_both_given_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("x")
    env = {"TICKWHEEL_WEB_TOKEN": "a", "TICKWHEEL_WEB_TOKEN_FILE": str(tmp_path / "t")}
    with pytest.raises(
        ConfigError, match="TICKWHEEL_WEB_TOKEN and TICKWHEEL_WEB_TOKEN_FILE are both given"
    ):
        Settings.from_env(env)


def test_a_bad_value_from_a_file_names_the_setting(tmp_path: Path) -> None:
    (tmp_path / "p").write_text("zero")
    with pytest.raises(ConfigError, match="TICKWHEEL_PARTITIONS: Input should be a valid integer"):
        Settings.from_env({"TICKWHEEL_PARTITIONS_FILE": str(tmp_path / "p")})


def test_a_bad_value_read_from_a_file_is_not_shown(tmp_path: Path) -> None:
    """A file named by mistake (the web token's, the process's environment) would be shown
    whole in the error."""
    (tmp_path / "p").write_text("PATH=/usr/bin\x00KAFKA_SASL_PASSWORD=hunter2")
    with pytest.raises(ConfigError) as e:
        Settings.from_env({"TICKWHEEL_PARTITIONS_FILE": str(tmp_path / "p")})
    assert "hunter2" not in str(e.value)
    assert "(read from TICKWHEEL_PARTITIONS_FILE; the value not shown)" in str(e.value)
    # A check's own message quoting the value (an address) is not shown either.
    (tmp_path / "b").write_text("MY_SECRET=hunter2 b:9092")
    with pytest.raises(ConfigError) as e:
        Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS_FILE": str(tmp_path / "b")})
    assert "hunter2" not in str(e.value) and "KAFKA_BOOTSTRAP_SERVERS: not a valid" in str(e.value)


@pytest.mark.parametrize(
    "variable", ["TICKWHEEL_WEB_TOKEN_FILE", "KAFKA_SASL_PASSWORD_FILE", "TICKWHEEL_GROUP_ID_FILE"]
)
def test_a_file_variable_naming_an_empty_file_is_refused(tmp_path: Path, variable: str) -> None:
    """A secret's mount not filled yet: the token would be unset, the HTTP edge's token
    check off, with no word said."""
    (tmp_path / "empty").write_text("  \n")
    with pytest.raises(ConfigError, match=f"{variable} .*is empty; it must hold"):
        Settings.from_env({variable: str(tmp_path / "empty")})


@pytest.mark.parametrize("variable", ["TICKWHEEL_WEB_TOKEN", "KAFKA_SASL_PASSWORD"])
def test_a_secret_of_whitespace_alone_is_refused(variable: str) -> None:
    with pytest.raises(ConfigError, match=f"{variable} .*only whitespace"):
        Settings.from_env({variable: "   "})
    assert Settings.from_env({variable: ""}).web_token is None  # empty: not given


def test_a_value_nested_past_the_reprs_depth_is_explained_not_crashed() -> None:
    deep = "[" * 1000 + "]" * 1000
    with pytest.raises(ConfigError, match="TICKWHEEL_TIMER_OPTIONS") as e:
        Settings.from_env({"TICKWHEEL_TIMER_OPTIONS": deep})
    assert len(str(e.value)) < 1000


def test_a_near_miss_of_a_kafka_variable_is_refused_and_other_programs_ones_are_not() -> None:
    """`KAFKA_BOOTSTRAP_SERVER` (no S) sent the node to the default broker, saying only
    that 127.0.0.1:9092 did not answer."""
    with pytest.raises(ConfigError, match="did you mean KAFKA_BOOTSTRAP_SERVERS"):
        Settings.from_env({"KAFKA_BOOTSTRAP_SERVER": "prod:9092"})
    with pytest.raises(ConfigError, match="did you mean KAFKA_SSL_CAFILE"):
        Settings.from_env({"KAFKA_SSL_CA_FILE": "/ca.pem"})
    others = {
        "KAFKA_HEAP_OPTS": "-Xmx1g",
        "KAFKA_CFG_NODE_ID": "1",
        "KAFKA_OPTS": "",
        # Other programs' names further off, or beside the setting itself.
        "KAFKA_REST_BOOTSTRAP_SERVERS": "r:9092",
        "KAFKA_CFG_SECURITY_PROTOCOL": "PLAINTEXT",
        "KAFKA_SECURITY_PROTOCOL_MAP": "x",
        "KAFKA_BOOTSTRAP_SERVERS_0": "b0:9092",
        "KAFKA_BOOTSTRAP_SERVERS": "b:9092",
    }
    Settings.from_env(others)


def test_an_env_file_past_a_mebibyte_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.env"
    big.write_text("# comment\n" * 120_000)
    with pytest.raises(ConfigError, match=r"TICKWHEEL_ENV_FILE: .*larger than"):
        Settings.from_env({"TICKWHEEL_ENV_FILE": str(big)})


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TICKWHEEL_GROUP_ID", "g\x01"),
        ("TICKWHEEL_GROUP_ID", "g" * 201),
        ("TICKWHEEL_WEB_HOST", "a b"),
        ("TICKWHEEL_WEB_HOST", "\u202e"),
    ],
)
def test_a_group_id_or_web_host_no_client_can_use_is_refused(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        Settings.from_env({variable: value})


# --- the log, the web token ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "expected"), [("debug", "DEBUG"), ("Info", "INFO"), (" WARNING ", "WARNING")]
)
def test_the_log_level_in_any_case(level: str, expected: str) -> None:
    assert Settings.from_env({"TICKWHEEL_LOG_LEVEL": level}).log_level == expected


def test_the_log_settings_default_and_refuse_what_they_do_not_know() -> None:
    s = Settings.from_env({})
    assert (s.log_level, s.log_format) == ("INFO", "text")
    assert Settings.from_env({"TICKWHEEL_LOG_FORMAT": "JSON"}).log_format == "json"
    with pytest.raises(ConfigError, match="TICKWHEEL_LOG_LEVEL: Input should be 'DEBUG', 'INFO'"):
        Settings.from_env({"TICKWHEEL_LOG_LEVEL": "verbose"})
    with pytest.raises(ConfigError, match="TICKWHEEL_LOG_FORMAT: Input should be 'text' or 'json'"):
        Settings.from_env({"TICKWHEEL_LOG_FORMAT": "xml"})


@pytest.mark.parametrize("value", ["\u0131nfo", "warn\u0131ng"])  # dotless i: INFO upper-cased
def test_the_log_level_is_its_ascii_name_not_what_unicode_upper_cases_to_it(value: str) -> None:
    with pytest.raises(ConfigError, match="TICKWHEEL_LOG_LEVEL: Input should be"):
        Settings.from_env({"TICKWHEEL_LOG_LEVEL": value})


def test_the_web_token_is_never_shown() -> None:
    s = Settings.from_env({"TICKWHEEL_WEB_TOKEN": "hunter2-hunter2"})
    assert s.web_token is not None and s.web_token.get_secret_value() == "hunter2-hunter2"
    assert "hunter2" not in repr(s) and "hunter2" not in str(s)
    assert Settings.from_env({}).web_token is None
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({}, web_token=["hunter2"])
    assert "TICKWHEEL_WEB_TOKEN" in str(caught.value) and "hunter2" not in str(caught.value)


def test_several_bad_values_are_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"TICKWHEEL_PARTITIONS": "0", "TICKWHEEL_WEB_PORT": "http"})
    names = re.findall(r"(TICKWHEEL_\w+):", str(caught.value))
    assert names == ["TICKWHEEL_PARTITIONS", "TICKWHEEL_WEB_PORT"]
