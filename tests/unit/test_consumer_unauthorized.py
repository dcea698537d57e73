"""A topic of the group's subscription whose ACL is taken away mid-run: aiokafka leaves
it out of the group's metadata and the assignor hands none of its partitions out, so
every member would own nothing and say it is ready. The poll raises a refusal instead,
which the node's poll loop turns into a loud stop (`test_poll_loop_errors`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from app.errors import KafkaUnavailable
from app.kafka.consumers import GroupConsumer, authorized
from app.kafka.records import refused


def consumer_refused(*topics: str) -> Any:
    cluster = SimpleNamespace(unauthorized_topics=set(topics))
    return SimpleNamespace(_fetcher=None, _client=SimpleNamespace(cluster=cluster))


async def test_a_poll_with_a_subscribed_topic_refused_raises_a_refusal_naming_it() -> None:
    group = GroupConsumer.__new__(GroupConsumer)
    group._consumer = consumer_refused("shop.order.events", "another.teams.topic")
    group._topics = ["shop.order.events", "shop.order.commands"]
    with pytest.raises(
        KafkaUnavailable, match=r"not authorized to read shop\.order\.events \("
    ) as e:
        await group.poll()
    assert refused(e.value)
    assert "another.teams.topic" not in str(e.value)


def test_topics_refused_only_outside_the_subscription_or_no_metadata_yet_pass() -> None:
    authorized(consumer_refused("another.teams.topic"), ["shop.order.events"])
    authorized(SimpleNamespace(_client=None), ["shop.order.events"])
    authorized(consumer_refused(), ["shop.order.events"])
