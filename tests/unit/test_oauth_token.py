"""OAUTHBEARER's pure decisions: which token endpoint may be used, how its answer is read
(hostile ones too), which answer is a refusal (an OAuth error alone), when a token is
fetched anew and how long a failed fetch waits."""

from __future__ import annotations

import base64
import math

import orjson
import pytest
import yarl
from hypothesis import given
from hypothesis import strategies as st

from app.kafka.oauth_token import (
    DEFAULT_LIFETIME_S,
    MAX_ANSWER_BYTES,
    MAX_FAIL_WAIT_S,
    MAX_LIFETIME_S,
    OAUTH_REFUSALS,
    Step,
    Token,
    TokenRefused,
    TokenUnavailable,
    backoff_s,
    endpoint_problem,
    fail_wait_s,
    next_step,
    read_token_answer,
    refresh_due,
)

URL = "https://idp.example/oauth2/token"


def answer(**fields: object) -> bytes:
    return orjson.dumps({"access_token": "eyJ.abc.def", "token_type": "Bearer", **fields})


def jwt(claims: dict[str, object]) -> str:
    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(value)).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


@given(
    obtained=st.floats(0, 1e9),
    lifetime=st.floats(0.001, MAX_LIFETIME_S),
    after=st.floats(0, 2 * MAX_LIFETIME_S),
)
def test_a_token_is_fetched_anew_past_80_percent_of_its_lifetime(
    obtained: float, lifetime: float, after: float
) -> None:
    token = Token("t", obtained, lifetime)
    now = obtained + after
    assert refresh_due(token, now) == (now >= obtained + 0.8 * lifetime)
    assert token.refresh_at < token.expires_at
    assert refresh_due(None, now)


tokens = st.none() | st.builds(
    Token, st.just("t"), st.floats(0, 1e6), st.floats(0.001, MAX_LIFETIME_S)
)


@given(
    token=tokens,
    now=st.floats(0, 2e6),
    retry_at=st.none() | st.floats(0, 2e6),
    fetching=st.booleans(),
)
def test_a_connection_waits_only_when_no_token_lives(
    token: Token | None, now: float, retry_at: float | None, fetching: bool
) -> None:
    step = next_step(token, now, retry_at, fetching)
    lives = token is not None and now < token.expires_at
    backing_off = retry_at is not None and now < retry_at
    # A token that lives is handed at once, whatever the endpoint does.
    assert (step in (Step.HAND, Step.HAND_AND_REFRESH)) == lives
    # A refresh starts past the window alone, one at a time, never within the backoff.
    assert (step is Step.HAND_AND_REFRESH) == (
        lives and refresh_due(token, now) and not fetching and not backing_off
    )
    # With none, the endpoint is asked (or the fetch under way joined) unless backing off.
    assert (step is Step.FAIL) == (not lives and backing_off and not fetching)


def test_the_steps_of_a_token_s_life() -> None:
    token = Token("t", 0.0, 100.0)
    assert next_step(None, 0.0, None, fetching=False) is Step.WAIT
    assert next_step(token, 79.9, None, fetching=False) is Step.HAND
    assert next_step(token, 80.0, None, fetching=False) is Step.HAND_AND_REFRESH
    assert next_step(token, 80.0, None, fetching=True) is Step.HAND
    assert next_step(token, 80.0, 80.1, fetching=False) is Step.HAND  # backing off
    assert next_step(token, 100.0, 100.1, fetching=False) is Step.FAIL  # expired
    assert next_step(token, 100.0, 100.1, fetching=True) is Step.WAIT
    assert next_step(token, 100.1, 100.1, fetching=False) is Step.WAIT


def test_the_refresh_window_of_an_hour_token() -> None:
    token = Token("t", 100.0, 3600.0)
    assert not refresh_due(token, 100.0 + 2879.9)
    assert refresh_due(token, 100.0 + 2880.0)


@given(st.integers(-5, 10_000))
def test_the_backoff_doubles_and_is_bounded(failures: int) -> None:
    wait = backoff_s(failures)
    assert 0.0 <= wait <= 10.0
    assert backoff_s(failures + 1) >= wait
    assert (wait == 0.0) == (failures <= 0)


@given(now=st.floats(0, 1e6), ahead=st.floats(-100, 100))
def test_a_connection_within_the_backoff_waits_for_its_end_or_five_seconds(
    now: float, ahead: float
) -> None:
    retry_at = now + ahead
    wait = fail_wait_s(now, retry_at)
    assert 0.0 <= wait <= MAX_FAIL_WAIT_S == 5.0
    # Asked again once the backoff ends, or after the longest wait: never before it.
    assert wait == MAX_FAIL_WAIT_S or now + wait >= retry_at
    assert wait <= max(0.0, retry_at - now)


def test_the_backoff_starts_at_a_tenth_of_a_second() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 8, 50)] == [0.1, 0.2, 0.4, 10.0, 10.0]


def test_a_good_answer_is_read() -> None:
    token = read_token_answer(URL, 200, answer(expires_in=3600), now=5.0, wall=1e9)
    assert (token.value, token.obtained_at, token.lifetime_s) == ("eyJ.abc.def", 5.0, 3600.0)
    assert "eyJ" not in repr(token)


@pytest.mark.parametrize(
    ("expires_in", "lifetime"),
    [
        (60, 60.0),
        (0.5, 0.5),
        ("3599", 3599.0),
        (10**15, MAX_LIFETIME_S),
        ("9" * 40, MAX_LIFETIME_S),
    ],
)
def test_expires_in_is_read_and_a_huge_one_is_a_day(expires_in: object, lifetime: float) -> None:
    assert read_token_answer(URL, 200, answer(expires_in=expires_in), 0, 0).lifetime_s == lifetime


@pytest.mark.parametrize("expires_in", [0, -1, -3600, True, "soon", "-5", [3600], {"s": 1}])
def test_an_expires_in_that_is_no_positive_number_is_no_token(expires_in: object) -> None:
    with pytest.raises(TokenUnavailable, match="expires_in") as caught:
        read_token_answer(URL, 200, answer(expires_in=expires_in), 0, 0)
    assert URL in str(caught.value)


def test_an_infinite_expires_in_is_no_json() -> None:
    with pytest.raises(TokenUnavailable, match="no JSON object"):
        read_token_answer(URL, 200, b'{"access_token": "a", "expires_in": 1e309}', 0, 0)


def test_without_expires_in_the_jwts_exp_says_how_long_else_five_minutes() -> None:
    wall = 1_700_000_000.0
    token = jwt({"sub": "tickwheel", "exp": wall + 900})
    got = read_token_answer(URL, 200, orjson.dumps({"access_token": token}), 0, wall)
    assert got.lifetime_s == 900.0
    for value in ("opaque-token", jwt({"sub": "x"}), jwt({"exp": wall - 5}), "a.b.c"):
        got = read_token_answer(URL, 200, orjson.dumps({"access_token": value}), 0, wall)
        assert got.lifetime_s == DEFAULT_LIFETIME_S, value


@pytest.mark.parametrize(
    "body",
    [
        b"<html>login</html>",
        b"",
        b"[1, 2]",
        b'"token"',
        orjson.dumps({"token_type": "Bearer"}),
        orjson.dumps({"access_token": ""}),
        orjson.dumps({"access_token": 5}),
        orjson.dumps({"access_token": "two words"}),
        orjson.dumps({"access_token": "a\x01auth=Bearer b"}),
    ],
)
def test_an_answer_with_no_usable_token_is_unavailable_naming_the_endpoint(body: bytes) -> None:
    """A proxy's maintenance page, say: no refusal of the credentials, retried."""
    with pytest.raises(TokenUnavailable) as caught:
        read_token_answer(URL, 200, body, 0, 0)
    assert URL in str(caught.value)


def test_an_oversized_answer_is_unavailable() -> None:
    body = answer(padding="x" * MAX_ANSWER_BYTES)
    with pytest.raises(TokenUnavailable, match="more than"):
        read_token_answer(URL, 200, body, 0, 0)


def test_a_refused_grant_names_the_endpoint_and_the_oauth_error() -> None:
    body = orjson.dumps({"error": "invalid_client", "error_description": "bad secret\x1b[31m"})
    with pytest.raises(TokenRefused) as caught:
        read_token_answer(URL, 401, body, 0, 0)
    said = str(caught.value)
    assert URL in said and "'invalid_client'" in said and "HTTP 401" in said
    assert "\x1b" not in said and "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET" in said


def test_a_hostile_error_code_is_no_refusal_and_not_shown() -> None:
    body = orjson.dumps({"error": "x\nerror: forged line", "error_description": "y"})
    with pytest.raises(TokenUnavailable) as caught:
        read_token_answer(URL, 400, body, 0, 0)
    assert "\n" not in str(caught.value) and "forged" not in str(caught.value)


@pytest.mark.parametrize("status", [500, 502, 503, 504, 429, 408])
def test_an_endpoint_that_cannot_answer_now_is_retried(status: int) -> None:
    with pytest.raises(TokenUnavailable, match=f"HTTP {status}"):
        read_token_answer(URL, status, b"busy", 0, 0)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (200, b"<html><body>Down for maintenance</body></html>"),  # a proxy's page
        (401, b"<html>401 Authorization Required</html>"),  # a load balancer in front
        (403, b"Forbidden"),
        (404, b"<html>Not Found</html>"),
        (403, orjson.dumps({"error": "invalid_client"})),  # no OAuth status
        (401, orjson.dumps({"error": "access_denied"})),  # no token endpoint's error
        (400, orjson.dumps({"message": "bad request"})),
        (502, orjson.dumps({"error": "invalid_grant"})),
    ],
)
def test_an_answer_that_is_no_oauth_error_is_unavailable_not_refused(
    status: int, body: bytes
) -> None:
    with pytest.raises(TokenUnavailable, match=f"HTTP {status}|no JSON object") as caught:
        read_token_answer(URL, status, body, 0, 0)
    assert URL in str(caught.value)


oauth_like_answers = st.fixed_dictionaries(
    {},
    optional={
        "error": st.sampled_from(sorted(OAUTH_REFUSALS))
        | st.sampled_from(["server_error", "temporarily_unavailable", "access_denied"])
        | st.text(max_size=20)
        | st.integers(-(2**63), 2**64 - 1),  # orjson writes 64-bit integers alone
        "error_description": st.text(max_size=20),
        "access_token": st.sampled_from(["eyJ.abc.def", "", "two words"]),
        "expires_in": st.integers(-5, 10_000),
    },
).map(orjson.dumps)


@given(
    status=st.sampled_from([200, 400, 401, 403, 404, 500, 503]) | st.integers(100, 599),
    body=oauth_like_answers | st.binary(max_size=128),
)
def test_only_an_oauth_error_of_rfc_6749_is_a_refusal(status: int, body: bytes) -> None:
    try:
        decoded = orjson.loads(body)
    except orjson.JSONDecodeError:
        decoded = None
    code = decoded.get("error") if isinstance(decoded, dict) else None
    oauth_error = status in (400, 401) and isinstance(code, str) and code in OAUTH_REFUSALS
    try:
        read_token_answer(URL, status, body, 0.0, 0.0)
    except TokenRefused as exc:
        assert oauth_error
        assert f"error {code!r}" in str(exc)
    except TokenUnavailable:
        assert not oauth_error
    else:
        assert status == 200 and not oauth_error


@given(status=st.integers(100, 599), body=st.binary(max_size=512), wall=st.floats(0, 4e9))
def test_any_answer_is_a_token_or_one_of_two_errors(status: int, body: bytes, wall: float) -> None:
    try:
        token = read_token_answer(URL, status, body, 1.0, wall)
    except (TokenRefused, TokenUnavailable) as exc:
        assert URL in str(exc)
        assert "\n" not in str(exc)
    else:
        assert status == 200
        assert 0 < token.lifetime_s <= MAX_LIFETIME_S and math.isfinite(token.lifetime_s)


@given(
    fields=st.dictionaries(
        st.sampled_from(["access_token", "expires_in", "error", "token_type"]),
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    )
)
def test_any_json_answer_is_a_token_or_unavailable(fields: dict[str, object]) -> None:
    try:
        body = orjson.dumps(fields)
    except orjson.JSONEncodeError:
        return  # an integer past 64 bits: no JSON orjson reads either
    try:
        token = read_token_answer(URL, 200, body, 0.0, 0.0)
    except TokenUnavailable:
        return
    assert token.value == fields["access_token"]
    assert 0 < token.lifetime_s <= MAX_LIFETIME_S


@pytest.mark.parametrize(
    "url",
    [
        "https://login.microsoftonline.com/tenant/oauth2/v2.0/token",
        "https://keycloak:8443/realms/kafka/protocol/openid-connect/token",
        "http://localhost:8080/token",
        "http://127.0.0.1:9/token",
        "http://[::1]:9/token",
    ],
)
def test_https_or_http_to_this_machine_may_be_used(url: str) -> None:
    assert endpoint_problem(url) is None


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://idp.example/token", "https:// for idp.example"),
        ("ftp://idp.example/token", "an https:// URL"),
        ("idp.example/token", "an https:// URL"),
        ("https://", "an https:// URL"),
        ("https://user:pw@idp.example/token", "no user or password"),
        ("https://idp.example/token#x", "fragment"),
        ("https://idp.example:99999/token", "not a URL"),
        # Taken, and no connection could ever be made: port 0 is none a server listens on.
        ("https://idp:0/token", "a port from 1 to 65535"),
        ("http://localhost:0/token", "a port from 1 to 65535"),
        ("https://idp:+443/token", "not a URL"),
        ("https://[zz]/token", "not a URL"),
        ("https://idp.example/to ken", "space"),
    ],
)
def test_other_endpoints_are_refused(url: str, said: str) -> None:
    why = endpoint_problem(url)
    assert why is not None and said in why
    assert "pw" not in why


@given(st.text(max_size=80))
def test_any_text_is_a_usable_endpoint_or_a_reason(url: str) -> None:
    why = endpoint_problem(url)
    assert why is None or isinstance(why, str)
    if why is None:
        assert url.lower().startswith(("https://", "http://"))
        assert yarl.URL(url).port != 0  # aiohttp's reading of it: no ValueError
