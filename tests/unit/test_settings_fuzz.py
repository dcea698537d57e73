"""`tickwheel worker`'s start with hostile settings: every `TICKWHEEL_*` and `KAFKA_*`
variable (and its `_FILE`) set to odd values in the environment, and `.env` files of odd
content (binary, a BOM, CRLF, duplicate keys, lines that are no assignment, huge lines).
It exits 0 (its node replaced by nothing: the settings were taken) or 2 with one line
`error: …` naming a variable or the file, never a traceback nor the catch-all's
`unexpected …`."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli_fuzz import no_node  # noqa: F401 (a fixture: the worker's start ends there)
from typer.testing import CliRunner, Result

from app.cli import cli
from app.node.variables import VARIABLES

NAMES = sorted(VARIABLES.values())
VALUES = [
    *("", " ", "\t", " x ", "a\x00b", "\x1b[2J", "\u200b", "\ufeff", "\udcff", "a\udcffb"),
    "x" * 70_000,
    *("-1", "0", "1", "2", "1.5", "1e3", "1e309", "nan", "inf", "9" * 400, "0x10", "5_000"),
    *("true", "false", "yes", "on", "TRUE", "None", "null", "[]", "{}", "{", "[" * 3000),
    *("DEBUG", "\u0131nfo", "json", "PLAINTEXT", "SASL_SSL", "SSL", "PLAIN", "SCRAM-SHA-256"),
    *("confluent", "aiokafka", "0.0.0.0", "::", "[::1]:1", "localhost", "127.0.0.1:0"),
    *("a:1,,b:2", "http://x:1", "javascript:alert(1)", "https://x/", "a" * 201, "shop.order"),
    *("a.b.c", "a,b", "/", "/tmp", "/dev/null", "/dev/zero", "/proc/self/environ", "."),
    '{"claim_timeout": 1e400}',
    '{"claim_timeout": -1}',
    '{"expires_after": 99999999999999999999999}',
    '{"retry": {"max_attempts": "x"}}',
    '{"a":' * 2000 + "1" + "}" * 2000,
]
ENV_VALUES = st.one_of(
    # No environment holds a NUL, nor a surrogate but those of bytes not UTF-8 (\udcXX).
    st.sampled_from([v for v in VALUES if "\x00" not in v]),
    st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=12),
)


def _check(result: Result, given: str) -> None:
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{given}: raised {result.exception!r}") from result.exception
    assert result.exit_code in (0, 2), (given, result.output)
    assert "Traceback" not in result.output and "error: unexpected " not in result.stderr
    if result.exit_code == 2:
        (line,) = result.stderr.splitlines()
        assert line.startswith("error: "), (given, line)
        assert "TICKWHEEL" in line or "KAFKA" in line or ".env" in line, (given, line)


def _files(tmp: Path) -> list[str]:
    """Files an `X_FILE` may name: odd ones, and none at all."""
    odd = {
        "empty": b"",
        "blank": b" \n",
        "binary": bytes(range(256)),
        "bom": b"\xef\xbb\xbf4\n",
        "crlf": b"4\r\n",
        "large": b"x" * 70_000,
        "json": b'{"claim_timeout": 5000}',
    }
    for name, data in odd.items():
        (tmp / name).write_bytes(data)
    return [*(str(tmp / n) for n in odd), str(tmp / "missing"), str(tmp), "/dev/zero", "/"]


@pytest.mark.usefixtures("no_node")
@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_hostile_variables_stop_the_start_with_one_error_naming_one(
    tmp_path: Path, data: st.DataObject
) -> None:
    files = _files(tmp_path)
    env: dict[str, str] = {}
    for name in data.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3)):
        if data.draw(st.booleans()):
            env[name] = data.draw(ENV_VALUES)
        else:
            env[f"{name}_FILE"] = data.draw(st.sampled_from(files))
    _check(CliRunner().invoke(cli, ["worker"], env=env), repr(env)[:300])


@st.composite
def dotenv_lines(draw: st.DrawFn) -> str:
    key = draw(st.sampled_from([*NAMES, *(f"{n}_FILE" for n in NAMES), "OTHER", "tickwheel_x"]))
    value = draw(st.sampled_from([v for v in VALUES if "\udcff" not in v]))
    how = draw(st.sampled_from(["{k}={v}", "export {k}={v}", "{k}='{v}'", '{k}="{v}', "{k}"]))
    return how.format(k=key, v=value)


@st.composite
def dotenv_files(draw: st.DrawFn) -> bytes:
    """A `.env`: lines of settings' (and others') variables, as written or mangled (an
    unclosed quote, no `=`), joined by any line ending, or bytes of no text at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    lines = draw(st.lists(dotenv_lines(), max_size=6))
    end = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    text = draw(st.sampled_from(["", "\ufeff", "# comment" + end])) + end.join(lines)
    return text.encode()


@pytest.mark.usefixtures("no_node")
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=dotenv_files(), named=st.booleans())
def test_an_odd_dotenv_stops_the_start_with_one_error_naming_it(
    tmp_path: Path, content: bytes, named: bool
) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_bytes(content)
    env = {"TICKWHEEL_ENV_FILE": str(dotenv)} if named else {}
    _check(CliRunner().invoke(cli, ["worker"], env=env), repr(content)[:300])
