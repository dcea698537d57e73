"""aiokafka's OAUTHBEARER token provider against an in-process token endpoint (aiohttp):
the client-credentials grant as asked, one token shared and fetched anew past 80 % of its
lifetime (a fake clock) in the background, an answer read whole however it comes, a
refused grant (an OAuth error alone) said with the endpoint and the error and never the
secret, an endpoint away (or a proxy's page) retried no faster than the backoff, a
connection within it waiting for its end, its TLS checked with
KAFKA_SASL_OAUTHBEARER_CAFILE; and the connection's settings that lead to it."""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast
from urllib.parse import unquote_plus

import orjson
import pytest
from aiohttp import web
from aiokafka.abc import AbstractTokenProvider
from tls_certs import Certs

from app.errors import ConfigError
from app.kafka.connection import KafkaConnection
from app.kafka.oauth import ClientCredentials, endpoint_context
from app.kafka.oauth_token import MAX_ANSWER_BYTES, Token, TokenRefused, TokenUnavailable
from app.kafka.rdkafka_config import rdkafka_options
from app.node.settings import Settings

SECRET = "s3cret:with spaces&+"


@dataclass
class Idp:
    """A token endpoint: answers `answers` in turn (the last one again), records each
    request's form and client credentials."""

    answers: list[tuple[int, bytes]] = field(default_factory=list)
    seen: list[tuple[dict[str, str], tuple[str, str]]] = field(default_factory=list)
    hold: asyncio.Event | None = None
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
        assert scheme == "Basic"
        client, _, secret = base64.b64decode(encoded).decode().partition(":")
        self.seen.append((form, (unquote_plus(client), unquote_plus(secret))))
        if self.hold is not None:
            await self.hold.wait()  # never set: the client's timeout ends the request
        status, body = self.answers[min(len(self.seen), len(self.answers)) - 1]
        return web.Response(status=status, body=body, content_type="application/json")


def granted(token: str = "tok-1", expires_in: object = 3600) -> tuple[int, bytes]:
    return 200, orjson.dumps(
        {"access_token": token, "token_type": "Bearer", "expires_in": expires_in}
    )


async def serve(idp: Idp, ssl_context: object = None) -> AsyncIterator[Idp]:
    app = web.Application()
    app.router.add_post("/token", idp.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)  # type: ignore[arg-type]
    await site.start()
    port = runner.addresses[0][1]
    idp.url = f"{'https' if ssl_context else 'http'}://localhost:{port}/token"
    try:
        yield idp
    finally:
        if idp.hold is not None:
            idp.hold.set()
        await runner.cleanup()


@pytest.fixture
async def idp() -> AsyncIterator[Idp]:
    async for running in serve(Idp([granted()])):
        yield running


class Clock:
    """The provider's clock, and its sleep: each wait recorded, the time moved on by it
    when `moves` (else a wait ends with the time where it was: the backoff outlasts it)."""

    def __init__(self, moves: bool = False) -> None:
        self.now = 1000.0
        self.moves = moves
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        if self.moves:
            self.now += seconds


def provider(
    idp: Idp, clock: Clock, scope: str | None = "kafka", timeout_s: float = 10.0
) -> ClientCredentials:
    return ClientCredentials(
        idp.url, "tickwheel", SECRET, scope, clock=clock, sleep=clock.sleep, timeout_s=timeout_s
    )


async def test_the_grant_is_asked_as_rfc_6749_says_and_its_token_given(idp: Idp) -> None:
    tokens = provider(idp, Clock())
    assert isinstance(tokens, AbstractTokenProvider)
    assert await tokens.token() == "tok-1"
    [(form, credentials)] = idp.seen
    assert form == {"grant_type": "client_credentials", "scope": "kafka"}
    assert credentials == ("tickwheel", SECRET)


async def test_no_scope_is_sent_when_none_is_set(idp: Idp) -> None:
    await provider(idp, Clock(), scope=None).token()
    assert idp.seen[0][0] == {"grant_type": "client_credentials"}


async def test_clients_connecting_at_once_share_one_fetch(idp: Idp) -> None:
    tokens = provider(idp, Clock())
    got = await asyncio.gather(*(tokens.token() for _ in range(20)))
    assert set(got) == {"tok-1"} and len(idp.seen) == 1


async def test_a_token_is_fetched_anew_past_80_percent_of_its_lifetime(idp: Idp) -> None:
    idp.answers = [granted("tok-1", 100), granted("tok-2", 100)]
    clock = Clock()
    tokens = provider(idp, clock)
    assert await tokens.token() == "tok-1"
    clock.now += 79.9
    assert await tokens.token() == "tok-1" and len(idp.seen) == 1
    clock.now += 0.1  # in the refresh window: the one held, refreshed in the background
    assert await tokens.token() == "tok-1"
    await asyncio.wait([refreshing(tokens)])
    assert await tokens.token() == "tok-2" and len(idp.seen) == 2


def refreshing(tokens: ClientCredentials) -> asyncio.Task[Token]:
    task = tokens.fetch_under_way()
    assert task is not None
    return task


async def test_a_connection_never_waits_on_a_refresh_while_the_token_lives(idp: Idp) -> None:
    idp.answers = [granted("tok-1", 100), granted("tok-2", 100)]
    clock = Clock()
    tokens = provider(idp, clock, timeout_s=30)
    assert await tokens.token() == "tok-1"
    idp.hold = asyncio.Event()  # the endpoint hangs from now on
    clock.now += 85  # in the refresh window; the token lives 15 s more
    for _ in range(3):  # connections (re)made meanwhile get it at once
        assert await asyncio.wait_for(tokens.token(), 5) == "tok-1"
    assert tokens.fetches == 2  # one refresh under way, not one per connection
    idp.hold.set()
    clock.now += 20  # expired: a connection waits for the refresh under way
    assert await tokens.token() == "tok-2" and tokens.fetches == 2


async def test_a_fetch_its_callers_gave_up_on_is_joined_and_its_cancel_does_not_back_off(
    idp: Idp,
) -> None:
    idp.hold = asyncio.Event()
    tokens = provider(idp, Clock(), timeout_s=30)
    for _ in range(3):  # aiokafka's connect timeout cancels each connection's wait
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(tokens.token(), 0.05)
    assert tokens.fetches == 1  # each joined the one under way
    waiting = asyncio.create_task(tokens.token())
    await asyncio.sleep(0)  # it joins the fetch under way
    await tokens.aclose()  # the fetch itself cancelled (its loop ending, say)
    with pytest.raises(TokenUnavailable, match="was cancelled"):
        await waiting  # its waiter has no token, and is itself not cancelled
    # Nothing was said of the endpoint: no backoff, it is asked again at once.
    idp.hold.set()
    assert await tokens.token() == "tok-1"
    assert tokens.fetches == 2 and tokens.fetch_under_way() is None


async def test_a_failing_refresh_is_said_once_and_backs_off_the_token_held_handed(
    idp: Idp, caplog: pytest.LogCaptureFixture
) -> None:
    idp.answers = [granted("tok-1", 100), (503, b"down")]
    clock = Clock()
    tokens = provider(idp, clock)
    assert await tokens.token() == "tok-1"
    clock.now += 85
    with caplog.at_level(logging.WARNING, logger="app.kafka.oauth"):
        for _ in range(3):
            assert await tokens.token() == "tok-1"
            await asyncio.wait([refreshing(tokens)])
            assert await tokens.token() == "tok-1"  # within the backoff: not asked
            clock.now += 2
    assert tokens.fetches == 4
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "HTTP 503" in said[0]


async def test_a_refused_grant_names_the_endpoint_and_error_never_the_secret(idp: Idp) -> None:
    idp.answers = [(401, orjson.dumps({"error": "invalid_client"}))]
    with pytest.raises(TokenRefused) as caught:
        await provider(idp, Clock()).token()
    said = str(caught.value)
    assert idp.url in said and "invalid_client" in said
    assert SECRET not in said and "s3cret" not in repr(caught.value)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (200, b"<html>Down for maintenance</html>"),  # a proxy's page
        (401, b"<html>401 Authorization Required</html>"),  # a load balancer's
        (403, b"Forbidden"),
        (404, b"<html>Not Found</html>"),
    ],
)
async def test_an_answer_that_is_no_oauth_error_is_retried_the_token_held_kept(
    idp: Idp, status: int, body: bytes
) -> None:
    idp.answers = [granted("tok-1", 100), (status, body), (status, body), granted("tok-2", 100)]
    clock = Clock(moves=True)
    tokens = provider(idp, clock)
    assert await tokens.token() == "tok-1"
    clock.now += 85
    assert await tokens.token() == "tok-1"  # its refresh fails: kept while it lives
    await asyncio.wait([refreshing(tokens)])
    clock.now += 20  # expired: no refusal (a take would stop the node), unavailable
    with pytest.raises(TokenUnavailable, match=f"HTTP {status}|no JSON object"):
        await tokens.token()
    assert await tokens.token() == "tok-2" and tokens.fetches == 4  # after the backoff


async def test_an_endpoint_away_keeps_the_token_held_while_it_lives(idp: Idp) -> None:
    idp.answers = [granted("tok-1", 100), (503, b"down")]
    clock = Clock()
    tokens = provider(idp, clock)
    assert await tokens.token() == "tok-1"
    clock.now += 90  # past the refresh window, not the expiry
    assert await tokens.token() == "tok-1"
    clock.now += 10  # expired: the endpoint's failure is said
    with pytest.raises(TokenUnavailable, match="HTTP 503"):
        await tokens.token()


async def test_a_failing_endpoint_is_not_asked_faster_than_the_backoff(idp: Idp) -> None:
    idp.answers = [(500, b""), (500, b""), granted("tok-ok")]
    clock = Clock()  # a wait ends with the time where it was: the backoff outlasts it
    tokens = provider(idp, clock)
    for _ in range(5):  # aiokafka reconnects every 10 ms: the endpoint is asked once
        with pytest.raises(TokenUnavailable):
            await tokens.token()
    assert len(idp.seen) == 1 and clock.slept == [0.1] * 4
    clock.now += 0.1
    with pytest.raises(TokenUnavailable):
        await tokens.token()
    assert len(idp.seen) == 2
    clock.now += 0.15  # the second wait is 0.2 s
    with pytest.raises(TokenUnavailable):
        await tokens.token()
    clock.now += 0.1
    assert await tokens.token() == "tok-ok" and len(idp.seen) == 3


async def test_a_connection_with_no_token_waits_for_the_backoffs_end_then_asks(
    idp: Idp,
) -> None:
    """aiokafka reconnects at once when `token()` raises: raised at once within the
    backoff, ~100 connections a second would each log an error. Each waits for the
    backoff's end instead, then asks (one fetch for them all)."""
    idp.answers = [(503, b"down"), (503, b"down"), granted("tok-ok")]
    clock = Clock(moves=True)
    tokens = provider(idp, clock)
    with pytest.raises(TokenUnavailable, match="HTTP 503"):
        await tokens.token()
    with pytest.raises(TokenUnavailable, match="HTTP 503"):
        await tokens.token()  # waited 0.1 s, then asked
    assert clock.slept == [0.1] and tokens.fetches == 2
    got = await asyncio.gather(*(tokens.token() for _ in range(20)))
    assert set(got) == {"tok-ok"} and tokens.fetches == 3
    assert clock.slept == [0.1, 0.2]  # the first waited for the backoff, the rest joined


async def test_a_wait_within_a_long_backoff_is_five_seconds_at_most(idp: Idp) -> None:
    idp.answers = [(500, b"")]
    clock = Clock(moves=True)
    tokens = provider(idp, clock)
    for _ in range(7):  # each waits for the backoff, then asks: it doubles to 6.4 s
        with pytest.raises(TokenUnavailable):
            await tokens.token()
    assert tokens.fetches == 7 and clock.slept == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2]
    clock.slept.clear()
    with pytest.raises(TokenUnavailable):
        await tokens.token()  # 5 s waited of the 6.4: the failure, the endpoint not asked
    assert clock.slept == [5.0] and tokens.fetches == 7
    with pytest.raises(TokenUnavailable):
        await tokens.token()  # the backoff's rest, then asked
    assert clock.slept == [5.0, 1.4] and tokens.fetches == 8


class OtherLoopsFetch:
    """A fetch of another loop (the producers' thread) that succeeds the moment this
    loop's `token()` looks at it: after it has read the backoff's end, before the failure."""

    def __init__(self, tokens: ClientCredentials, loop: asyncio.AbstractEventLoop) -> None:
        self.tokens, self.loop, self.succeeded = tokens, loop, False

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self.loop

    def done(self) -> bool:
        if not self.succeeded:
            self.succeeded = True
            fetch = self.tokens._fetch_and_keep()  # its own success path, run to its end
            with pytest.raises(StopIteration):
                fetch.send(None)
        return True


async def test_a_fetch_of_another_thread_succeeding_meanwhile_raises_no_assertion(
    idp: Idp, monkeypatch: pytest.MonkeyPatch
) -> None:
    idp.answers = [(503, b"down")]
    clock = Clock()
    tokens = provider(idp, clock)
    with pytest.raises(TokenUnavailable):
        await tokens.token()  # failed: the endpoint not asked for 0.1 s

    async def answered() -> Token:
        return Token("tok-other", clock(), 100)

    monkeypatch.setattr(tokens, "_fetch", answered)
    other = asyncio.new_event_loop()
    try:
        tokens._fetching[other] = cast("asyncio.Task[Token]", OtherLoopsFetch(tokens, other))
        # An AssertionError here is no KafkaError: it would end aiokafka's sender.
        assert await tokens.token() == "tok-other"
    finally:
        tokens._fetching.pop(other, None)
        other.close()


async def test_a_failure_raised_again_is_a_new_exception_each_time(idp: Idp) -> None:
    """Two threads raising one exception object would mix its traceback."""
    idp.answers = [(503, b"down")]
    tokens = provider(idp, Clock())
    raised = []
    for _ in range(3):
        with pytest.raises(TokenUnavailable) as caught:
            await tokens.token()
        raised.append(caught.value)
    assert len({id(exc) for exc in raised}) == 3 and len(idp.seen) == 1
    assert {(type(exc), str(exc)) for exc in raised} == {(TokenUnavailable, str(raised[0]))}


async def test_an_unexpected_error_of_a_fetch_is_a_failure_backed_off(
    idp: Idp, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = provider(idp, Clock())

    async def broken() -> Token:
        tokens.fetches += 1
        raise RuntimeError("a bug")

    monkeypatch.setattr(tokens, "_fetch", broken)
    for _ in range(2):
        with pytest.raises(TokenUnavailable, match="failed: RuntimeError"):
            await tokens.token()
    assert tokens.fetches == 1


async def test_an_endpoint_that_does_not_answer_is_timed_out(idp: Idp) -> None:
    idp.hold = asyncio.Event()
    tokens = provider(idp, Clock(), timeout_s=0.3)
    with pytest.raises(TokenUnavailable, match=r"did not answer within 0\.3 s"):
        await tokens.token()


async def test_an_endpoint_not_there_is_unavailable() -> None:
    tokens = ClientCredentials("http://127.0.0.1:9/token", "c", "s", clock=Clock())
    with pytest.raises(TokenUnavailable, match="cannot be reached"):
        await tokens.token()


def tls_idp(tmp_path: Path) -> tuple[Path, Path, ssl.SSLContext]:
    """The identity provider's CA, the brokers' (another: theirs is private), and the
    endpoint's server context."""
    certs = Certs(tmp_path)
    idp_ca, kafka_ca = certs.ca("idp-ca"), certs.ca("kafka-ca")
    server = certs.leaf("localhost", idp_ca, server=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server.cert, server.key)
    return idp_ca.cert, kafka_ca.cert, context


async def test_the_endpoints_tls_is_checked_with_its_own_ca_file_not_kafkas(
    tmp_path: Path,
) -> None:
    idp_ca, kafka_ca, context = tls_idp(tmp_path)
    async for idp in serve(Idp([granted("tls-tok")]), context):
        env = oauth_env(
            KAFKA_SECURITY_PROTOCOL="SASL_SSL",
            KAFKA_SSL_CAFILE=str(kafka_ca),
            KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL=idp.url,
            KAFKA_SASL_OAUTHBEARER_CAFILE=str(idp_ca),
        )
        assert await Settings.from_env(env).kafka.token_provider().token() == "tls-tok"
        # The brokers' CA is not the endpoint's: without its own, the system's CAs.
        env["KAFKA_SSL_CAFILE"] = str(idp_ca)
        del env["KAFKA_SASL_OAUTHBEARER_CAFILE"]
        # Unavailable, retried: a certificate mid-rotation passes, the node goes on.
        with pytest.raises(TokenUnavailable, match="check KAFKA_SASL_OAUTHBEARER_CAFILE"):
            await Settings.from_env(env).kafka.token_provider().token()
        system = ClientCredentials(
            idp.url, "c", "s", ssl_context=endpoint_context(idp.url, None), clock=Clock()
        )
        with pytest.raises(TokenUnavailable, match="not trusted"):
            await system.token()


async def serve_in_writes(
    pieces: list[bytes], then_hold: bool = False
) -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A token endpoint that writes its answer's body in `pieces`, 50 ms apart (a slow
    network, a proxy's chunks); `then_hold`: then sends nothing more until the event."""
    released = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.post()
        answer = web.StreamResponse(headers={"Content-Type": "application/json"})
        answer.enable_chunked_encoding()
        await answer.prepare(request)
        for n, piece in enumerate(pieces):
            if n:
                await asyncio.sleep(0.05)  # the endpoint's own pace, not a wait for a state
            await answer.write(piece)
        if then_hold:
            await released.wait()
        return answer

    app = web.Application()
    app.router.add_post("/token", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://localhost:{runner.addresses[0][1]}/token", released
    finally:
        released.set()
        await runner.cleanup()


async def test_an_answer_written_in_several_pieces_is_read_whole() -> None:
    body = granted("tok-slow")[1]
    thirds = [body[: len(body) // 3], body[len(body) // 3 : -5], body[-5:]]
    async for url, _ in serve_in_writes(thirds):
        tokens = ClientCredentials(url, "c", "s", clock=Clock())
        assert await tokens.token() == "tok-slow"


async def test_an_answer_past_the_cap_is_said_without_waiting_for_its_end() -> None:
    piece = b" " * (64 * 1024)
    async for url, _ in serve_in_writes([b"{", *[piece] * 5], then_hold=True):
        # Its end never comes: a read to the end would time out, not naming the cap.
        tokens = ClientCredentials(url, "c", "s", clock=Clock(), timeout_s=30)
        with pytest.raises(TokenUnavailable, match=f"more than {MAX_ANSWER_BYTES} bytes"):
            await asyncio.wait_for(tokens.token(), 10)


def oauth_env(**more: str) -> dict[str, str]:
    return {
        "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KAFKA_SASL_MECHANISM": "OAUTHBEARER",
        "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "https://idp.example/token",
        "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "tickwheel",
        "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": SECRET,
        **more,
    }


def test_every_client_of_the_settings_shares_one_provider() -> None:
    settings = Settings.from_env(oauth_env(KAFKA_SASL_OAUTHBEARER_SCOPE="kafka"))
    first, second = settings.kafka.options(), settings.kafka.options()
    assert first["sasl_mechanism"] == "OAUTHBEARER"
    assert first["sasl_oauth_token_provider"] is second["sasl_oauth_token_provider"]
    assert "sasl_plain_password" not in first
    said = settings.kafka.describe()
    assert "OAUTHBEARER as client 'tickwheel'" in said and SECRET not in said


def test_the_secret_may_be_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    env = oauth_env(KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE=str(secret))
    del env["KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET"]
    kafka = Settings.from_env(env).kafka
    assert kafka.sasl_oauthbearer_client_secret is not None
    assert kafka.sasl_oauthbearer_client_secret.get_secret_value() == SECRET


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": ""},
            "needs KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
        ),
        ({"KAFKA_SASL_OAUTHBEARER_CLIENT_ID": ""}, "needs KAFKA_SASL_OAUTHBEARER_CLIENT_ID"),
        ({"KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": ""}, "needs KAFKA_SASL_OAUTHBEARER_TOKEN"),
        (
            {"KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "http://idp.example/token"},
            "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL: https:// for idp.example",
        ),
        ({"KAFKA_SASL_USERNAME": "u"}, "KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD are for"),
        (
            {
                "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                "KAFKA_SASL_USERNAME": "u",
                "KAFKA_SASL_PASSWORD": "p",
            },
            "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL, KAFKA_SASL_OAUTHBEARER_CLIENT_ID, "
            "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET given, but KAFKA_SASL_MECHANISM is SCRAM-SHA-512",
        ),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SASL_MECHANISM": ""}, "SASL settings given"),
        ({"KAFKA_SASL_OAUTHBEARER_SCOPE": "a\x07b"}, "printable"),
        (
            {"KAFKA_SASL_OAUTHBEARER_CAFILE": "{tmp}/absent.pem"},
            "KAFKA_SASL_OAUTHBEARER_CAFILE: no such file",
        ),
        ({"KAFKA_SASL_OAUTHBEARER_CAFILE": "{tmp}"}, "is a directory"),
        ({"KAFKA_SASL_OAUTHBEARER_CAFILE": "{tmp}/not-a-ca.pem"}, "holds no usable CA"),
        (
            {
                "KAFKA_SASL_OAUTHBEARER_CAFILE": "{tmp}/ca.pem",
                "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "http://localhost:8080/token",
            },
            "KAFKA_SASL_OAUTHBEARER_CAFILE given, but the token endpoint",
        ),
        (
            {
                "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                "KAFKA_SASL_USERNAME": "u",
                "KAFKA_SASL_PASSWORD": "p",
                "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "",
                "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "",
                "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": "",
                "KAFKA_SASL_OAUTHBEARER_CAFILE": "{tmp}/ca.pem",
            },
            "KAFKA_SASL_OAUTHBEARER_CAFILE given, but KAFKA_SASL_MECHANISM is SCRAM-SHA-512",
        ),
    ],
)
def test_a_wrong_oauthbearer_setting_is_a_configuration_error(
    change: dict[str, str], said: str, tmp_path: Path
) -> None:
    Certs(tmp_path).ca("ca")  # tmp/ca.pem
    (tmp_path / "not-a-ca.pem").write_text("not a certificate\n")
    change = {k: v.replace("{tmp}", str(tmp_path)) for k, v in change.items()}
    env = {k: v for k, v in {**oauth_env(), **change}.items() if v}
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    assert said in str(caught.value)
    assert SECRET not in str(caught.value)


def test_librdkafka_logs_in_with_its_own_oidc_client() -> None:
    kafka = KafkaConnection(
        bootstrap_servers="b:9093",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauthbearer_token_endpoint_url="https://idp.example/token",
        sasl_oauthbearer_client_id="tickwheel",
        sasl_oauthbearer_client_secret=SECRET,
        sasl_oauthbearer_scope="kafka",
    )
    assert rdkafka_options(kafka) == {
        "bootstrap.servers": "b:9093",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
        "sasl.oauthbearer.client.id": "tickwheel",
        "sasl.oauthbearer.client.secret": SECRET,
        "sasl.oauthbearer.scope": "kafka",
    }


def test_librdkafka_checks_the_endpoint_with_its_own_ca_file_not_kafkas(tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    idp_ca, kafka_ca = certs.ca("idp-ca").cert, certs.ca("kafka-ca").cert
    oauth = {
        "bootstrap_servers": "b:9093",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "OAUTHBEARER",
        "sasl_oauthbearer_token_endpoint_url": "https://idp.example/token",
        "sasl_oauthbearer_client_id": "tickwheel",
        "sasl_oauthbearer_client_secret": SECRET,
        "ssl_cafile": kafka_ca,
    }
    options = rdkafka_options(KafkaConnection.model_validate(oauth))
    assert options["ssl.ca.location"] == str(kafka_ca)
    assert "https.ca.location" not in options  # librdkafka's default: the system's CAs
    options = rdkafka_options(
        KafkaConnection.model_validate({**oauth, "sasl_oauthbearer_cafile": idp_ca})
    )
    assert options["https.ca.location"] == str(idp_ca)
    assert options["ssl.ca.location"] == str(kafka_ca)


async def test_a_refusal_raised_again_through_an_outage_keeps_no_old_frames(idp: Idp) -> None:
    idp.answers = [(500, b"")]
    tokens = provider(idp, Clock())
    depths = []
    for _ in range(50):  # connections asking again within the backoff: the one failure
        with pytest.raises(TokenUnavailable) as raised:
            await tokens.token()
        depth, tb = 0, raised.value.__traceback__
        while tb is not None:
            depth, tb = depth + 1, tb.tb_next
        depths.append(depth)
    assert len(idp.seen) == 1
    assert max(depths[1:]) == min(depths[1:]) < 10, depths
