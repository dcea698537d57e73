"""`RefusedTopics`: a group's subscribed topics the cluster refuses this principal, which
aiokafka passes over quietly (see the class). May import aiokafka and `app.errors`."""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import TopicAuthorizationFailedError

from app.errors import KafkaUnavailable

__all__ = ["REFUSED_GRACE_S", "RefusedTopics"]

REFUSED_GRACE_S = 30.0
"""How long a subscribed topic stays refused in the metadata before the poll raises: a
topic missing a moment (deleted and made again, not yet known to every broker) is
answered as refused too where the principal may not create it and the broker would."""


class RefusedTopics:
    """Subscribed topics the cluster refuses this principal: aiokafka leaves such a topic
    out of the group's metadata, so the assignor hands none of its partitions out and the
    member quietly owns nothing, ready all the while (the Java consumer raises here)."""

    def __init__(self, grace_s: float = REFUSED_GRACE_S) -> None:
        self.grace_s = grace_s
        self._since: dict[str, float] = {}

    def check(self, consumer: AIOKafkaConsumer, topics: Iterable[str], now: float) -> None:
        """Raises a refusal naming the topics refused in every metadata answer for
        `grace_s` up to `now`."""
        cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
        refused = set(getattr(cluster, "unauthorized_topics", ()) or ()) & set(topics)
        self._since = {t: self._since.get(t, now) for t in refused}
        lasting = sorted(t for t, since in self._since.items() if now - since >= self.grace_s)
        if lasting:
            raise KafkaUnavailable(
                f"not authorized to read {', '.join(lasting)} for {self.grace_s:g} s "
                "(Describe and Read ACLs; or the topic is missing and may not be created)"
            ) from TopicAuthorizationFailedError(lasting)
