"""One connection before the clients start (`app.kafka.probe.check_access`): a refusal (wrong
credentials, an untrusted certificate) is one error saying so; a broker away is not a
refusal (the clients wait for it). The refusals on a real broker: test_secured_worker.py."""

from __future__ import annotations

import asyncio
import inspect
import re
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from pydantic import SecretStr

from app.cli.common import checked
from app.demo import service
from app.errors import KafkaUnavailable
from app.kafka import TopicSpec, ensure_topics, probe
from app.kafka.connection import KafkaConnection
from app.kafka.memory import MemoryLog
from app.kafka.memory_group import MemoryAdmin
from app.kafka.oauth_token import TokenRefused, TokenUnavailable
from app.kafka.probe import check_access, refusal
from app.kafka.records import refused
from app.kafka.topic_creation import check_created, creation_errors
from app.node import Node, node_topics
from app.node.settings import Settings

SCRAM = KafkaConnection(
    bootstrap_servers="b1:9093,b2:9093",
    security_protocol="SASL_SSL",
    sasl_mechanism="SCRAM-SHA-512",
    sasl_username="tickwheel",
    sasl_password=SecretStr("secret"),
)


def _wrapped(cause: BaseException) -> KafkaConnectionError:
    try:
        raise KafkaConnectionError("Connection at b1:9093 closed") from cause
    except KafkaConnectionError as exc:
        return exc


def test_wrong_credentials_are_an_authentication_failure() -> None:
    why = refusal(SCRAM, SaslAuthenticationFailed("Authentication failed during auth"))
    assert why is not None and why.startswith("authentication failed"), why
    assert "KAFKA_SASL_PASSWORD" in why and "secret" not in why


def test_an_untrusted_broker_certificate_names_the_ca_setting() -> None:
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.verify_message = "unable to get local issuer certificate"
    why = refusal(SCRAM, _wrapped(verify))  # found through what wraps it
    assert why is not None and "not trusted" in why, why
    assert "unable to get local issuer certificate" in why and "KAFKA_SSL_CAFILE" in why


@pytest.mark.parametrize(
    ("code", "message", "advice"),
    [
        (10, "certificate has expired", "renew the certificate out of its dates"),
        (9, "certificate is not yet valid", "this machine's clock"),
        (62, "Hostname mismatch, certificate is not valid for 'b1'.", "KAFKA_BOOTSTRAP_SERVERS"),
    ],
)
def test_a_certificate_refused_for_other_than_its_ca_says_what_to_check(
    code: int, message: str, advice: str
) -> None:
    """Expired, not yet valid, or for another name: the CA is trusted, and pointing the
    operator at KAFKA_SSL_CAFILE would send them the wrong way."""
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.verify_code, verify.verify_message = code, message
    why = refusal(SCRAM, _wrapped(verify))
    assert why is not None and message in why and advice in why, why
    assert "KAFKA_SSL_CAFILE" not in why


def test_a_mechanism_the_broker_does_not_offer_is_a_refusal() -> None:
    why = refusal(SCRAM, UnsupportedSaslMechanismError("enabled: ['PLAIN']"))
    assert why is not None and "KAFKA_SASL_MECHANISM" in why


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError(),
        KafkaConnectionError("Unable to bootstrap"),
        _wrapped(ConnectionResetError(104, "reset")),
        ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),
    ],
)
def test_a_broker_away_is_no_refusal(exc: BaseException) -> None:
    assert refusal(SCRAM, exc) is None


OAUTH = KafkaConnection(
    bootstrap_servers="b1:9093",
    security_protocol="SASL_SSL",
    sasl_mechanism="OAUTHBEARER",
    sasl_oauthbearer_token_endpoint_url="https://idp.example/token",
    sasl_oauthbearer_client_id="tickwheel",
    sasl_oauthbearer_client_secret=SecretStr("secret"),
)


def _no_token(cause: BaseException) -> TokenUnavailable:
    """The provider's failure as aiokafka's connection raises it: from aiohttp's error,
    itself from the token endpoint's ssl error."""
    try:
        try:
            raise aiohttp.ClientConnectionError("Cannot connect to host idp.example") from cause
        except aiohttp.ClientConnectionError as exc:
            raise TokenUnavailable("the token endpoint: no token") from exc
    except TokenUnavailable as exc:
        return exc


def _untrusted() -> ssl.SSLCertVerificationError:
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.verify_message = "unable to get local issuer certificate"
    return verify


@pytest.mark.parametrize(
    "exc",
    [
        _no_token(_untrusted()),  # the identity provider's certificate mid-rotation
        _no_token(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER]")),
        TokenUnavailable("the token endpoint answered HTTP 503"),
        _wrapped(_no_token(_untrusted())),
    ],
)
def test_no_token_now_is_no_refusal(exc: BaseException) -> None:
    """Retried as a broker away; a refusal would stop the node at a partition's take."""
    assert refusal(OAUTH, exc) is None


def test_a_grant_refused_with_an_oauth_error_is_a_refusal() -> None:
    why = refusal(OAUTH, _wrapped(TokenRefused("refused ... error 'invalid_client'")))
    assert why is not None and "invalid_client" in why


@pytest.mark.parametrize(
    ("failure", "refuses"),
    [(_no_token(_untrusted()), False), (TokenRefused("error 'invalid_client'"), True)],
)
async def test_the_check_of_a_take_stops_the_node_for_a_refused_grant_alone(
    monkeypatch: pytest.MonkeyPatch, failure: Exception, refuses: bool
) -> None:
    """A take that fails asks `check_access` whether the cluster lets the node in: a
    token endpoint away (`TokenUnavailable`) is no, and the take is tried again."""

    async def no_token(*args: object, **kwargs: object) -> None:
        raise failure

    monkeypatch.setattr(probe, "create_conn", no_token)
    if refuses:
        with pytest.raises(KafkaUnavailable, match="no OAUTHBEARER token"):
            await check_access(OAUTH, within=1.0)
    else:
        await check_access(OAUTH, within=1.0)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, never listening: connections refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_no_broker_answering_is_left_to_the_clients(closed_port: int) -> None:
    kafka = SCRAM.model_copy(update={"bootstrap_servers": f"127.0.0.1:{closed_port}"})
    await check_access(kafka, within=2.0)  # no error: the clients wait for a broker away


async def test_addresses_down_or_silent_are_passed_over_to_one_that_answers(
    closed_port: int,
) -> None:
    async def plaintext_listener(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"\x00\x00\x00\x02no")  # not TLS: a TLS client's handshake fails on it
        await w.drain()
        w.close()

    with socket.socket() as silent:  # accepts (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        server = await asyncio.start_server(plaintext_listener, "127.0.0.1", 0)
        answering = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        addresses = f"127.0.0.1:{closed_port},127.0.0.1:{silent.getsockname()[1]},{answering}"
        kafka = SCRAM.model_copy(update={"bootstrap_servers": addresses})
        async with server:
            with pytest.raises(KafkaUnavailable) as raised:
                await asyncio.wait_for(check_access(kafka, within=0.5), 5)
    # The refusal is the address that answered's, named alone.
    assert str(raised.value).startswith(f"{answering} (SASL_SSL SCRAM-SHA-512 as 'tickwheel')")
    assert "TLS handshake refused" in str(raised.value)


async def test_a_plaintext_connection_is_not_checked(closed_port: int) -> None:
    await asyncio.wait_for(check_access(f"127.0.0.1:{closed_port}"), 0.5)


async def test_a_connection_closed_mid_handshake_lets_the_command_run() -> None:
    started: list[str] = []

    async def work() -> str:
        started.append("work")
        return "done"

    async def refusing_broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()  # a TLS client's handshake meets a closed connection

    server = await asyncio.start_server(refusing_broker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    kafka = SCRAM.model_copy(update={"bootstrap_servers": f"127.0.0.1:{port}"})
    async with server:
        # A connection closed mid-handshake is not a refusal: the work goes on.
        assert await checked(kafka, work()) == "done"
    assert started == ["work"]


async def test_a_refused_check_closes_the_work_unstarted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[str] = []

    async def work() -> None:
        started.append("work")

    async def refuse(where: object) -> None:
        raise KafkaUnavailable("b1:9093 (SASL_SSL SCRAM-SHA-512 as 'x'): authentication failed")

    monkeypatch.setattr("app.cli.common.check_access", refuse)
    coroutine = work()
    with pytest.raises(KafkaUnavailable, match="authentication failed"):
        await checked(SCRAM, coroutine)
    assert started == []
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED  # no "never awaited"


class _Created:
    """A CreateTopics answer: (topic, error code, message) per topic."""

    def __init__(self, *topic_errors: tuple[str, int, str | None]) -> None:
        self.topic_errors = list(topic_errors)


def test_topics_the_cluster_refused_to_create_are_named_with_the_acl() -> None:
    answer = _Created(
        ("ctx.a.events", 0, None),
        ("ctx.a.commands", 36, "already exists"),  # there already: no error
        ("ctx.results", 29, "Authorization failed."),
        ("ctx.ledger", 29, "Authorization failed."),
    )
    failed = creation_errors(answer)
    assert set(failed) == {"ctx.results", "ctx.ledger"}
    with pytest.raises(KafkaUnavailable) as raised:
        check_created(SCRAM, failed)
    said = str(raised.value)
    assert said.startswith("cannot create topics at b1:9093,b2:9093 (SASL_SSL SCRAM-SHA-512")
    assert "not authorized to create topic ctx.ledger and 1 more" in said
    assert "topic 'ctx.' prefixed: Create" in said and "or on the cluster" in said
    assert refused(raised.value)  # the node stops on it rather than retrying


def test_a_topic_not_created_for_another_reason_is_named_with_its_error() -> None:
    failed = creation_errors(_Created(("ctx.results", 38, "Replication factor: 3 larger")))
    with pytest.raises(
        KafkaUnavailable, match=re.escape("ctx.results: InvalidReplicationFactorError")
    ) as e:
        check_created("127.0.0.1:9092", failed)
    assert not refused(e.value)
    check_created("127.0.0.1:9092", creation_errors(_Created(("ctx.results", 0, None))))


async def test_a_node_refused_at_its_first_connection_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = MemoryLog()
    said = "b1:9093 (SASL_SSL SCRAM-SHA-512 as 'x'): authentication failed (bad password)"

    async def refuse(self: object) -> None:
        raise KafkaUnavailable(said)

    monkeypatch.setattr(MemoryAdmin, "check_access", refuse)
    settings = Settings(bootstrap_servers="memory", partitions=2, data_dir=tmp_path / "n")
    node = Node(settings, service, clients=log)
    with pytest.raises(KafkaUnavailable, match=re.escape(said)):
        await node.start()
    await node.stop()
    topic = node_topics(node.topics, 2)[0].name
    with pytest.raises(KafkaUnavailable, match="unknown topic"):
        log.partitions(topic)  # checked before any topic was created


class _SlowController:
    """An admin client whose first CreateTopics answers a retriable error per topic (the
    creation timed out, the controller moved), as a slow or failing-over cluster does."""

    def __init__(self, retriable_answers: int) -> None:
        self.created: list[list[str]] = []
        self._left = retriable_answers

    def __call__(self, **options: object) -> _SlowController:
        return self

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def describe_cluster(self) -> dict[str, list[object]]:
        return {"brokers": [object()]}

    async def create_topics(self, new: list[Any]) -> _Created:
        self.created.append([n.name for n in new])
        code = 0
        if self._left:
            self._left -= 1
            code = 7  # RequestTimedOut: the creation may still complete
        return _Created(*((n.name, code, "timed out" if code else None) for n in new))

    async def describe_topics(self, names: list[str]) -> list[dict[str, object]]:
        return []  # not in the metadata yet


async def test_a_creation_timed_out_is_tried_again_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin = _SlowController(retriable_answers=1)
    monkeypatch.setattr("app.kafka.admin.AIOKafkaAdminClient", admin)
    await ensure_topics("127.0.0.1:9092", [TopicSpec("ctx.a", 2), TopicSpec("ctx.b", 2)])
    assert admin.created == [["ctx.a", "ctx.b"], ["ctx.a"], ["ctx.b"]]


async def test_a_creation_failing_again_is_one_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("app.kafka.admin.AIOKafkaAdminClient", _SlowController(3))
    with pytest.raises(KafkaUnavailable, match=r"ctx\.a: RequestTimedOutError \(timed out\)"):
        await ensure_topics("127.0.0.1:9092", [TopicSpec("ctx.a", 2)])
