"""What the cluster answered a CreateTopics request: the topics it did not create and why
(`creation_errors`), the node's error naming them (`check_created`), and a refusal said in
a user's terms, the ACL missing (`creation_refused`)."""

from __future__ import annotations

from typing import Any

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    KafkaError,
    NoError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    for_code,
)

from app.errors import KafkaUnavailable
from app.kafka.connection import Connectable, address

__all__ = ["check_created", "creation_errors", "creation_refused"]


def creation_refused(topics: list[str]) -> str:
    """Topics the cluster refused to create, in a user's terms: the ACL missing."""
    first = topics[0]
    context = first.split(".", 1)[0]
    more = f" and {len(topics) - 1} more" if len(topics) > 1 else ""
    return (
        f"not authorized to create topic {first}{more}: the principal needs Create on the "
        f"topics (topic '{context}.' prefixed: Create) or on the cluster, as the README's "
        "'Connecting to your Kafka' lists; or create the topics beforehand"
    )


def creation_errors(response: Any) -> dict[str, tuple[type[KafkaError], str | None]]:
    """Per topic of a CreateTopics answer that was not created, its error and the broker's
    message (a topic already there is no error)."""
    failed: dict[str, tuple[type[KafkaError], str | None]] = {}
    for entry in getattr(response, "topic_errors", ()):
        topic, code = entry[0], entry[1]
        kind = for_code(code)
        if kind in (NoError, TopicAlreadyExistsError):
            continue
        failed[topic] = (kind, entry[2] if len(entry) > 2 else None)
    return failed


def check_created(
    bootstrap: Connectable, failed: dict[str, tuple[type[KafkaError], str | None]]
) -> None:
    """`KafkaUnavailable` naming the topics not created (a refusal: the ACL missing)."""
    if not failed:
        return
    topics = sorted(failed)
    denied = [t for t in topics if issubclass(failed[t][0], _CREATE_DENIED)]
    if denied:
        raise KafkaUnavailable(
            f"cannot create topics at {address(bootstrap)}: {creation_refused(denied)}"
        ) from failed[denied[0]][0](failed[denied[0]][1] or "")
    said = "; ".join(
        f"{t}: {failed[t][0].__name__}" + (f" ({failed[t][1]})" if failed[t][1] else "")
        for t in topics
    )
    raise KafkaUnavailable(f"cannot create topics at {address(bootstrap)}: {said}")


_CREATE_DENIED = (TopicAuthorizationFailedError, ClusterAuthorizationFailedError)
