"""A topic of the group's subscription whose ACL is taken away mid-run: aiokafka leaves
it out of the group's metadata and the assignor hands none of its partitions out, so
every member would own nothing and say it is ready. Once the topic has been refused for
the grace (a topic missing a moment is answered as refused too, where the principal may
not create it), the poll raises a refusal, which the node's poll loop turns into a loud
stop (`test_poll_loop_errors`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from app.errors import KafkaUnavailable
from app.kafka.group_consumer import GroupConsumer
from app.kafka.records import refused
from app.kafka.refused_topics import REFUSED_GRACE_S, RefusedTopics

TOPICS = ["shop.order.events", "shop.order.commands"]


def consumer_refused(*topics: str) -> Any:
    cluster = SimpleNamespace(unauthorized_topics=set(topics))
    return SimpleNamespace(_fetcher=None, _client=SimpleNamespace(cluster=cluster))


def test_a_topic_refused_for_the_grace_is_a_refusal_naming_it() -> None:
    check = RefusedTopics()
    consumer = consumer_refused("shop.order.events", "another.teams.topic")
    check.check(consumer, TOPICS, now=100.0)
    check.check(consumer, TOPICS, now=100.0 + REFUSED_GRACE_S - 1)
    with pytest.raises(KafkaUnavailable, match=r"not authorized to read shop\.order\.events ") as e:
        check.check(consumer, TOPICS, now=100.0 + REFUSED_GRACE_S)
    assert refused(e.value)
    assert "another.teams.topic" not in str(e.value)


def test_a_topic_refused_a_moment_only_starts_the_grace_again() -> None:
    check = RefusedTopics()
    check.check(consumer_refused("shop.order.events"), TOPICS, now=0.0)
    check.check(consumer_refused(), TOPICS, now=10.0)  # known again: a topic made anew
    check.check(consumer_refused("shop.order.events"), TOPICS, now=20.0)
    check.check(consumer_refused("shop.order.events"), TOPICS, now=20.0 + REFUSED_GRACE_S - 1)


def test_topics_refused_only_outside_the_subscription_or_no_metadata_yet_pass() -> None:
    check = RefusedTopics(grace_s=0)
    check.check(consumer_refused("another.teams.topic"), TOPICS, now=0.0)
    check.check(SimpleNamespace(_client=None), TOPICS, now=0.0)
    check.check(consumer_refused(), TOPICS, now=0.0)


async def test_the_group_consumers_poll_checks_its_topics() -> None:
    group = GroupConsumer.__new__(GroupConsumer)
    group._consumer = consumer_refused("shop.order.events")
    group._topics = TOPICS
    group._refused = RefusedTopics(grace_s=0)
    with pytest.raises(KafkaUnavailable, match="not authorized") as e:
        await group.poll()
    assert refused(e.value)
