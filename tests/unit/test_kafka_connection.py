"""A cluster's connection: its security settings checked before anything connects, and the
client options every client the project creates is made with."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError
from tls_certs import Certs

from app.kafka.connection import KafkaConnection, address, client_options
from app.kafka.rdkafka_config import rdkafka_options


def test_a_bootstrap_string_is_plaintext() -> None:
    assert client_options("127.0.0.1:9092") == {"bootstrap_servers": "127.0.0.1:9092"}
    assert address("127.0.0.1:9092") == "127.0.0.1:9092"


def test_sasl_over_plaintext_gives_the_mechanism_and_credentials() -> None:
    kafka = KafkaConnection(
        bootstrap_servers="b:9093",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="tickwheel",
        sasl_password="s3cret",
    )
    assert kafka.options() == {
        "bootstrap_servers": "b:9093",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "tickwheel",
        "sasl_plain_password": "s3cret",
    }
    said = kafka.describe()
    assert "SCRAM-SHA-512" in said and "tickwheel" in said and "s3cret" not in said
    assert "s3cret" not in repr(kafka)


def test_tls_with_the_systems_cas_makes_a_context() -> None:
    kafka = KafkaConnection(bootstrap_servers="b:9093", security_protocol="SSL")
    assert isinstance(kafka.options()["ssl_context"], ssl.SSLContext)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"security_protocol": "SASL_SSL"}, "needs KAFKA_SASL_MECHANISM"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"},
            "KAFKA_SASL_PASSWORD",
        ),
        ({"sasl_username": "u"}, "KAFKA_SECURITY_PROTOCOL is PLAINTEXT"),
        ({"ssl_cafile": "/nowhere/ca.pem"}, "use SSL or SASL_SSL"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nowhere/ca.pem"}, "no such file"),
        ({"security_protocol": "SSL", "ssl_certfile": "/x.pem"}, "both KAFKA_SSL_CERTFILE"),
        ({"security_protocol": "TLS"}, "security_protocol"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "sasl_mechanism"),
    ],
)
def test_an_inconsistent_security_setting_is_one_clear_error(
    fields: dict[str, object], said: str
) -> None:
    with pytest.raises(ValidationError, match=said):
        KafkaConnection(bootstrap_servers="b:9093", **fields)


def test_a_ca_file_that_is_no_certificate_is_refused(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate")
    with pytest.raises(ValidationError, match="TLS material unusable"):
        KafkaConnection(bootstrap_servers="b:9093", security_protocol="SSL", ssl_cafile=ca)


def test_a_refusal_is_said_in_the_users_terms() -> None:
    from aiokafka.errors import (
        GroupAuthorizationFailedError,
        KafkaConnectionError,
        SaslAuthenticationFailed,
        TransactionalIdAuthorizationFailed,
    )

    from app.kafka.records import explain

    assert "not authorized on the consumer group" in explain(GroupAuthorizationFailedError())
    assert "transactional id" in explain(TransactionalIdAuthorizationFailed())
    said = explain(SaslAuthenticationFailed("bad password"))
    assert "authentication failed" in said and "KAFKA_SASL_PASSWORD" in said
    assert explain(KafkaConnectionError("x")) == repr(KafkaConnectionError("x"))


def test_a_refusal_is_known_through_what_wraps_it() -> None:
    from aiokafka.errors import GroupAuthorizationFailedError, KafkaConnectionError

    from app.errors import KafkaUnavailable
    from app.kafka.records import refused

    try:
        try:
            raise GroupAuthorizationFailedError()
        except GroupAuthorizationFailedError as exc:
            raise KafkaUnavailable("poll failed") from exc
    except KafkaUnavailable as wrapped:
        assert refused(wrapped)
    assert not refused(KafkaUnavailable("the broker is away"))
    assert not refused(KafkaConnectionError("x"))


@pytest.fixture
def encrypted_key_pair(tmp_path: Path) -> tuple[Path, Path]:
    """A client certificate and its key, encrypted with "s3cret"."""
    certs = Certs(tmp_path)
    client = certs.leaf("client", certs.ca("ca"), days=1, password="s3cret")
    return client.cert, client.key


def test_an_encrypted_client_key_needs_its_password_and_is_never_asked_for(
    encrypted_key_pair: tuple[Path, Path],
) -> None:
    """Found by a settings hunt: OpenSSL asked for the key's password on the terminal (a
    worker's start hung there; without one it failed naming neither the key nor the
    missing password), and there was no setting for it."""
    cert, key = encrypted_key_pair
    tls = {"bootstrap_servers": "b:9093", "security_protocol": "SSL"}
    with pytest.raises(ValueError, match=r"is encrypted: set KAFKA_SSL_KEY_PASSWORD"):
        KafkaConnection(**tls, ssl_certfile=cert, ssl_keyfile=key)
    with pytest.raises(ValueError, match=r"TLS material unusable .*key"):
        KafkaConnection(**tls, ssl_certfile=cert, ssl_keyfile=key, ssl_key_password="wrong")
    given = KafkaConnection(**tls, ssl_certfile=cert, ssl_keyfile=key, ssl_key_password="s3cret")
    assert given.ssl_context() is not None
    assert rdkafka_options(given)["ssl.key.password"] == "s3cret"
    assert "s3cret" not in repr(given)
    with pytest.raises(ValueError, match="KAFKA_SSL_KEY_PASSWORD given without"):
        KafkaConnection(**tls, ssl_key_password="s3cret")


def test_a_tls_file_that_is_no_file_says_what_it_is(tmp_path: Path) -> None:
    """A directory was "no such file", an empty key an OpenSSL "PEM lib" naming the
    certificate (a settings hunt)."""
    tls = {"bootstrap_servers": "b:9093", "security_protocol": "SSL"}
    with pytest.raises(ValueError, match=r"KAFKA_SSL_CAFILE: .* is a directory"):
        KafkaConnection(**tls, ssl_cafile=tmp_path)
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"KAFKA_SSL_CAFILE: .* is empty"):
        KafkaConnection(**tls, ssl_cafile=empty)
