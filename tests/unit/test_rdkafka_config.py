"""The librdkafka adapter's settings and group metadata, offline: a cluster's connection
(address, TLS, SASL) mapped to librdkafka's keys; the group id alone, in the bytes
librdkafka's `rd_kafka_consumer_group_metadata_read` takes; the client chosen by
`KafkaClients(client=...)`."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import certifi
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from app.kafka import KafkaClients, TransactionalProducer
from app.kafka.connection import KafkaConnection
from app.kafka.rdkafka_config import explain_code, group_metadata, rdkafka_options
from app.kafka.rdkafka_writer import RdkafkaTransactionalWriter


@pytest.fixture(scope="module")
def producer() -> Iterator[Producer]:
    """A producer with no transactional id and no broker: it parses the group metadata
    given to `send_offsets_to_transaction`, then refuses the call as not configured."""
    p = Producer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    yield p
    p.purge()
    p.close()


def parsed(producer: Producer, metadata: bytes) -> str:
    """The error librdkafka says for `metadata`: _NOT_CONFIGURED once it has read it."""
    with pytest.raises(KafkaException) as raised:
        producer.send_offsets_to_transaction([TopicPartition("t", 0, 1)], metadata, 0)
    error: KafkaError = raised.value.args[0]
    return str(error.name())


@given(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=60))
def test_librdkafka_reads_the_group_id_alone(producer: Producer, group: str) -> None:
    metadata = group_metadata(group)
    assert parsed(producer, metadata) == "_NOT_CONFIGURED"
    # generation -1 and no member, as rd_kafka_consumer_group_metadata_new makes it
    assert metadata[7:11] == struct.pack("=i", -1)
    assert metadata[11:] == group.encode() + b"\0\0\1"


def test_a_mangled_metadata_is_refused_by_librdkafka(producer: Producer) -> None:
    """What the test above tells apart: librdkafka checks the bytes before the call."""
    assert parsed(producer, group_metadata("g")[:-1]) == "_BAD_MSG"
    assert parsed(producer, b"CGMDv1:" + group_metadata("g")[7:]) == "_BAD_MSG"


@pytest.mark.parametrize("group", ["", "tab\there", "grüße"])
def test_a_group_id_librdkafka_cannot_carry_is_refused_here(group: str) -> None:
    with pytest.raises(ValueError, match="printable ASCII"):
        group_metadata(group or "\0")


def test_a_plain_address_is_plaintext() -> None:
    assert rdkafka_options("h:9092") == {
        "bootstrap.servers": "h:9092",
        "security.protocol": "PLAINTEXT",
    }


def test_sasl_ssl_maps_to_librdkafkas_keys() -> None:
    ca = Path(certifi.where())  # CA certificates both clients load
    c = KafkaConnection(
        bootstrap_servers="a:9093,b:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="tw",
        sasl_password="secret",
        ssl_cafile=ca,
    )
    assert rdkafka_options(c) == {
        "bootstrap.servers": "a:9093,b:9093",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(ca),
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "tw",
        "sasl.password": "secret",
    }
    # librdkafka takes them all (an unknown key or value is refused at construction)
    Producer({**rdkafka_options(c), "log_level": 0}).close()


def test_sasl_plaintext_has_no_tls_keys() -> None:
    c = KafkaConnection(
        bootstrap_servers="h:9092",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password="p",
    )
    options = rdkafka_options(c)
    assert not [k for k in options if k.startswith("ssl.")]
    assert options["sasl.mechanism"] == "PLAIN"


def test_a_refusal_names_the_acl_missing() -> None:
    said = explain_code(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "denied")
    assert "not authorized on a transactional id" in said
    assert "authentication failed" in explain_code(KafkaError._AUTHENTICATION, "bad login")
    assert explain_code(KafkaError._TRANSPORT, "down") == "down"


async def test_the_client_is_chosen_aiokafka_by_default() -> None:
    default = KafkaClients("h:1").transactional_writer("t")
    assert isinstance(default, TransactionalProducer)
    await default.stop()
    writer = KafkaClients("h:1", client="confluent").transactional_writer("t", max_batch_bytes=9)
    assert isinstance(writer, RdkafkaTransactionalWriter)
    assert writer._config["batch.size"] == 9
    await writer.stop()  # never started: nothing to close
    with pytest.raises(ValueError, match="aiokafka or confluent"):
        KafkaClients("h:1", client="kafka-python")  # type: ignore[arg-type]
