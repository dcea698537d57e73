"""The local SASL_SSL broker's OAUTHBEARER without a JVM: its token server (a process of
its own) grants the users' client-credentials grants with RS256 JWTs its JWKS verifies,
refuses a wrong secret, and stops; the broker's settings and JVM option that point Kafka
at it; the variables a client logs in with (which the node's settings take)."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kafka_broker  # registered by tests/conftest.py
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from app.kafka.oauth import ClientCredentials
from app.kafka.oauth_token import TokenRefused
from app.node.settings import Settings

script = kafka_broker.load_kafka_local()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    state: Path = tmp_path_factory.mktemp("oidc")
    script.ensure_credentials(state, "sasl_ssl", keep=False)
    running = script.start_token_server(state)
    try:
        yield state, running
    finally:
        assert script.stop_token_server(state)


def read_jwks(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        jwks: dict[str, Any] = json.loads(answer.read())
    return jwks


def b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def verify(token: str, jwks: dict[str, Any]) -> dict[str, Any]:
    """The claims of `token`, its RS256 signature checked with the JWKS's key."""
    header_part, claims_part, signature = token.split(".")
    header = json.loads(b64(header_part))
    [key] = [k for k in jwks["keys"] if k["kid"] == header["kid"]]
    public = rsa.RSAPublicNumbers(
        int.from_bytes(b64(key["e"]), "big"), int.from_bytes(b64(key["n"]), "big")
    ).public_key()
    public.verify(
        b64(signature),
        f"{header_part}.{claims_part}".encode(),
        padding.PKCS1v15(),
        hashes.SHA256(),
    )
    assert header["alg"] == "RS256"
    claims: dict[str, Any] = json.loads(b64(claims_part))
    return claims


async def test_a_users_grant_is_a_jwt_its_jwks_verifies(server: tuple[Path, Any]) -> None:
    state, running = server
    secret = script.read_password(state, "tickwheel")
    tokens = ClientCredentials(running.token_url, "tickwheel", secret, "kafka")
    token = await tokens.token()
    jwks = await asyncio.to_thread(read_jwks, running.jwks_url)
    claims = verify(token, jwks)
    assert claims["sub"] == "tickwheel" and claims["aud"] == "kafka"
    assert claims["iss"] == "tickwheel-kafka-local" and claims["scope"] == "kafka"
    assert claims["exp"] - claims["iat"] == 3600


async def test_a_wrong_secret_is_refused_as_invalid_client(server: tuple[Path, Any]) -> None:
    _, running = server
    tokens = ClientCredentials(running.token_url, "tickwheel", "not-it", None)
    with pytest.raises(TokenRefused, match="invalid_client"):
        await tokens.token()
    path_out = ClientCredentials(running.token_url, "../secrets/admin", "x", None)
    with pytest.raises(TokenRefused, match="invalid_client"):
        await path_out.token()


def test_the_broker_checks_tokens_against_the_servers_jwks(server: tuple[Path, Any]) -> None:
    _, running = server
    props = script.server_properties(
        Path("/x"),
        9092,
        9093,
        "4.1.2",
        script.oauth_properties(running),
        credentials=script.read_credentials(server[0], "sasl_ssl"),
    )
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512,SCRAM-SHA-256,OAUTHBEARER"
    assert props["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    prefix = "listener.name.sasl_ssl.oauthbearer."
    assert props[prefix + "sasl.server.callback.handler.class"] == (
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
    )
    assert "OAuthBearerLoginModule required" in props[prefix + "sasl.jaas.config"]
    assert props["sasl.oauthbearer.jwks.endpoint.url"] == running.jwks_url
    option = script.allowed_urls_option(running)
    assert option == (
        f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={running.jwks_url},{running.token_url}"
    )


def test_the_env_variables_are_a_nodes_oauthbearer_settings(server: tuple[Path, Any]) -> None:
    state, running = server
    env = script.oauth_client_settings(state, "127.0.0.1:9092", "tickwheel")
    kafka = Settings.from_env(env).kafka
    assert kafka.sasl_mechanism == "OAUTHBEARER"
    assert kafka.sasl_oauthbearer_token_endpoint_url == running.token_url
    assert kafka.sasl_oauthbearer_client_id == "tickwheel"
    assert kafka.sasl_oauthbearer_client_secret is not None
    assert kafka.sasl_oauthbearer_client_secret.get_secret_value() == script.read_password(
        state, "tickwheel"
    )
