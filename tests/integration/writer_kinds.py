"""The transactional writers a real-broker test runs on: aiokafka's (on the caller's loop, or
on the producers' own: `producer_thread`) and librdkafka's, each made as
`KafkaClients(client=..., producer_thread=...)` makes it (`make(bootstrap, transactional_id)`, with
`max_batch_bytes=` where a test sets it)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.kafka import TransactionalWriter
from app.kafka.producer_loop import OwnLoopProducer
from app.kafka.rdkafka_writer import RdkafkaTransactionalWriter
from app.kafka.transactional_producer import TransactionalProducer

MakeWriter = Callable[..., TransactionalWriter]

WRITERS: dict[str, MakeWriter] = {
    "aiokafka": TransactionalProducer,  # on the node's loop, as a node makes it by default
    "aiokafka-thread": OwnLoopProducer,  # on the producers' loop (TICKWHEEL_PRODUCER_THREAD)
    "confluent": RdkafkaTransactionalWriter,
}

each_writer: pytest.MarkDecorator = pytest.mark.parametrize(
    "make", list(WRITERS.values()), ids=list(WRITERS)
)
"""Runs the test once with each writer, given as `make`."""
