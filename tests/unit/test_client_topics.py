"""A timer book client's topics (`ClientTopics`), made through the cluster's `Admin` port:
here a memory log's, as a faust app's `TickwheelTimers` makes them on Kafka's."""

from __future__ import annotations

import pytest

from app.clients.client_topics import ClientTopics
from app.errors import KafkaUnavailable
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.protocol.topics import AggregateTopics

P = 4
BOOK = AggregateTopics("reminders", "order-timers")
TARGET = AggregateTopics("reminders", "order")


async def test_the_topics_are_made_once_through_the_admin_port() -> None:
    log = MemoryLog()
    topics = ClientTopics(log.admin(), BOOK, TARGET, P)
    await topics.ensure()
    made = {name: log.partitions(name) for name in log.topic_names()}
    assert made == {s.name: s.partitions for s in topics.specs}
    assert {made[t] for t in (BOOK.commands, BOOK.events, TARGET.commands)} == {P}
    log.down = True  # made once per process: a second call asks the cluster nothing
    await topics.ensure()


async def test_a_topic_of_another_partition_count_is_an_error_and_is_tried_again() -> None:
    log = MemoryLog([TopicSpec(TARGET.commands, P + 1)])
    topics = ClientTopics(log.admin(), BOOK, TARGET, P)
    with pytest.raises(KafkaUnavailable, match=f"{TARGET.commands} has {P + 1} partitions"):
        await topics.ensure()
    with pytest.raises(KafkaUnavailable, match=f"{TARGET.commands} has {P + 1} partitions"):
        await topics.ensure()  # a failed attempt is made again
