"""A fence reaches the transactional producer in more than one shape: aiokafka's own
`ProducerFenced`, a broker's INVALID_PRODUCER_EPOCH (47), and Kafka's PRODUCER_FENCED (90),
which aiokafka does not know and on which its sender dies with "Unexpected error during
batch delivery" (CI on Kafka 4.1.2: a replay fenced by another replay of the same letter
said "transaction failed" instead of "fenced"). Each is a fence, wrapped or not; any other
error is none."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    NotLeaderForPartitionError,
    ProducerFenced,
    UnknownError,
    for_code,
)

from app.kafka.records import ProducerFencedCode, fenced_by


def died_of(cause: BaseException) -> KafkaError:
    """What aiokafka's sender raises when `cause` killed it."""
    try:
        try:
            raise cause
        except Exception as exc:
            raise KafkaError("Unexpected error during batch delivery") from exc
    except KafkaError as outer:
        return outer


def test_kafkas_producer_fenced_code_is_known_to_the_client() -> None:
    assert for_code(90) is ProducerFencedCode


@pytest.mark.parametrize(
    "fence", [ProducerFenced(), InvalidProducerEpoch(), for_code(90)()], ids=str
)
def test_a_fence_is_one_wrapped_or_not(fence: BaseException) -> None:
    assert fenced_by(fence)
    assert fenced_by(died_of(fence))


@pytest.mark.parametrize("other", [UnknownError(), NotLeaderForPartitionError(), KafkaError()])
def test_another_error_is_no_fence(other: BaseException) -> None:
    assert not fenced_by(other)
    assert not fenced_by(died_of(other))
    assert not fenced_by(None)
