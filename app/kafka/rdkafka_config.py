"""librdkafka's settings for a cluster (`Connectable`), and its errors in our terms: the
confluent-kafka adapter's counterpart of `connection.client_options` and `records.explain`.

Pure (no confluent-kafka import): the mapping is tested without the extra installed.
"""

from __future__ import annotations

import struct
from typing import Any

from aiokafka.errors import AuthenticationFailedError, for_code

from app.kafka.connection import Connectable, KafkaConnection, connection

__all__ = [
    "AUTHENTICATION_CODES",
    "DENIED_CODES",
    "FENCED_CODES",
    "SHORT_OF_REPLICAS_CODES",
    "explain_code",
    "group_metadata",
    "rdkafka_options",
    "refusal",
    "short_of_replicas",
]


def rdkafka_options(where: Connectable) -> dict[str, Any]:
    """librdkafka's connection settings for `where`: the same address, protocol, CA,
    client certificate and SASL login as aiokafka's (`KafkaConnection.options`).

    Without a CA file, librdkafka's wheels probe the system's CA paths, as aiokafka's
    default context loads the system's CAs; both check the broker's host name (librdkafka's
    `ssl.endpoint.identification.algorithm` is `https` by default). librdkafka reads the
    files once, as each client is made, and has no reload (2.16: no setting or call;
    confluentinc/librdkafka#2868): `tls_reload` renews aiokafka's context only."""
    c = connection(where)
    options: dict[str, Any] = {
        "bootstrap.servers": c.bootstrap_servers,
        "security.protocol": c.security_protocol,
    }
    if c.ssl_cafile is not None:
        options["ssl.ca.location"] = str(c.ssl_cafile)
    if c.ssl_certfile is not None and c.ssl_keyfile is not None:
        options["ssl.certificate.location"] = str(c.ssl_certfile)
        options["ssl.key.location"] = str(c.ssl_keyfile)
        if c.ssl_key_password is not None:
            options["ssl.key.password"] = c.ssl_key_password.get_secret_value()
    if c.sasl_mechanism == "OAUTHBEARER":
        options.update(_oidc_options(c))
    elif c.sasl_mechanism is not None:
        assert c.sasl_password is not None  # checked by KafkaConnection's validator
        options["sasl.mechanism"] = c.sasl_mechanism
        options["sasl.username"] = c.sasl_username
        options["sasl.password"] = c.sasl_password.get_secret_value()
    return options


def _oidc_options(c: KafkaConnection) -> dict[str, Any]:
    """librdkafka's own OIDC client-credentials login (its CONFIGURATION.md:
    `sasl.oauthbearer.method=oidc`), on the same endpoint, client and scope as aiokafka's
    provider; the endpoint's certificate checked against KAFKA_SASL_OAUTHBEARER_CAFILE
    when given (`https.ca.location`), as `oauth.endpoint_context`. Else librdkafka's
    default, which has no value: its wheels (OpenSSL linked statically) probe the
    system's usual CA paths, as for `ssl.ca.location`."""
    secret = c.sasl_oauthbearer_client_secret
    assert secret is not None  # checked by KafkaConnection's validator
    options: dict[str, Any] = {
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.token.endpoint.url": c.sasl_oauthbearer_token_endpoint_url,
        "sasl.oauthbearer.client.id": c.sasl_oauthbearer_client_id,
        "sasl.oauthbearer.client.secret": secret.get_secret_value(),
    }
    if c.sasl_oauthbearer_scope:
        options["sasl.oauthbearer.scope"] = c.sasl_oauthbearer_scope
    if c.sasl_oauthbearer_cafile is not None:
        options["https.ca.location"] = str(c.sasl_oauthbearer_cafile)
    return options


_MAGIC = b"CGMDv2:"


def group_metadata(group_id: str) -> bytes:
    """What `Producer.send_offsets_to_transaction` takes for a group the producer's node
    does not consume with librdkafka: the group id alone, generation -1 and no member.

    confluent-kafka passes this object to `rd_kafka_consumer_group_metadata_read` as the
    bytes `rd_kafka_consumer_group_metadata_write` makes (format v2: the magic, the
    generation as a native int32, the group id and the member id NUL-terminated, then 1
    for "no group instance id"); generation -1 with an empty member is what
    `rd_kafka_consumer_group_metadata_new(group_id)` makes: the broker commits the
    offsets without checking the group's generation (the pre-KIP-447 path, which
    aiokafka's `send_offsets_to_transaction(offsets, group_id)` takes as well)."""
    if not group_id.isascii() or not group_id.isprintable():
        # librdkafka refuses a non-printable id (isprint), as _BAD_MSG
        raise ValueError(f"group id {group_id!r}: librdkafka takes printable ASCII only")
    return _MAGIC + struct.pack("=i", -1) + group_id.encode() + b"\0" + b"\0" + b"\1"


FENCED_CODES = frozenset({-144, 90, 47})
"""librdkafka's `_FENCED`, the broker's PRODUCER_FENCED and INVALID_PRODUCER_EPOCH: a
newer writer of the transactional id started."""

DENIED_CODES: dict[int, str] = {
    29: "a topic (Describe, Read, Write or Create on it)",
    30: "the consumer group (Read, Describe)",
    53: "a transactional id (Write, Describe)",
    31: "the cluster (IdempotentWrite)",
}
"""TOPIC_, GROUP_, TRANSACTIONAL_ID_ and CLUSTER_AUTHORIZATION_FAILED: what an ACL lacks."""

AUTHENTICATION_CODES = frozenset({-169, 58})
"""librdkafka's `_AUTHENTICATION` and the broker's SASL_AUTHENTICATION_FAILED."""

SHORT_OF_REPLICAS_CODES = frozenset({19, 20})
"""The broker's NOT_ENOUGH_REPLICAS and NOT_ENOUGH_REPLICAS_AFTER_APPEND: a partition with
fewer in-sync replicas than its `min.insync.replicas` refused a write."""


TOO_LARGE_CODES = frozenset({10, 18})
"""The broker's MESSAGE_TOO_LARGE and RECORD_LIST_TOO_LARGE: a record or a batch over its
topic's `max.message.bytes`."""


def explain_code(code: int, said: str) -> str:
    """A librdkafka error (its code and its text) in a user's terms, as `records.explain`
    says aiokafka's."""
    if (what := DENIED_CODES.get(code)) is not None:
        return (
            f"not authorized on {what}: {said}; the principal needs the ACLs the "
            "README's 'Connecting to your Kafka' lists"
        )
    if code in AUTHENTICATION_CODES:
        return (
            f"authentication failed: {said}; check KAFKA_SASL_MECHANISM, "
            "KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD (OAUTHBEARER: its "
            "KAFKA_SASL_OAUTHBEARER_* settings)"
        )
    return said


def refusal(code: int, said: str) -> Exception | None:
    """aiokafka's error for a librdkafka refusal (an ACL missing: `DENIED_CODES`; the login
    refused: `AUTHENTICATION_CODES`), None for any other error: a failure raised from it
    is a refusal (`records.refused`: no retry passes it), as the aiokafka clients' are."""
    error: Exception | None = None
    if code in DENIED_CODES or code == 58:  # the broker's codes: aiokafka's own
        error = for_code(code)(said)
    elif code in AUTHENTICATION_CODES:
        error = AuthenticationFailedError(said)
    return error


def short_of_replicas(code: int, said: str) -> Exception | None:
    """aiokafka's error for a write librdkafka says a partition short of in-sync replicas
    refused (`SHORT_OF_REPLICAS_CODES`), None for any other error: a failure raised from
    it is the cluster's state (`records.short_of_replicas`: waited out, not counted), as
    the aiokafka writer's is."""
    return for_code(code)(said) if code in SHORT_OF_REPLICAS_CODES else None


def too_large(code: int, said: str) -> Exception | None:
    """aiokafka's error for a write librdkafka says the broker refused as too large
    (`TOO_LARGE_CODES`), None for any other error: a failure raised from it is told apart
    as the aiokafka writer's is (`records.too_large`: the topics' limits read again)."""
    return for_code(code)(said) if code in TOO_LARGE_CODES else None
