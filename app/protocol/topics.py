"""Topic names of a context, all derived from `<context>.<aggregate>`; one place to change them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.errors import ConfigError

__all__ = ["AggregateTopics", "ContextTopics", "aggregate_topics", "parse_aggregate_type"]

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]*")

TOPIC_NAME_MAX = 249
"""Kafka's longest topic name."""
TYPE_NAME_MAX = TOPIC_NAME_MAX - len(".timer-ops")
"""A type's name at most: its longest topic is `<type>.timer-ops`."""
CONTEXT_NAME_MAX = TOPIC_NAME_MAX - len(".failure-ledger")
"""A context's name at most: its longest topic is `<context>.failure-ledger`."""


@dataclass(frozen=True, slots=True)
class AggregateTopics:
    """The topics of one aggregate type; all have the context's partition count."""

    context: str
    aggregate: str

    @property
    def type_name(self) -> str:
        return f"{self.context}.{self.aggregate}"

    @property
    def events(self) -> str:
        return f"{self.type_name}.events"

    @property
    def commands(self) -> str:
        return f"{self.type_name}.commands"

    @property
    def timers_changelog(self) -> str:
        return f"{self.type_name}.timers"

    @property
    def timer_ops(self) -> str:
        """Operators' retry/skip requests for the type's timers, carried out by each owner."""
        return f"{self.type_name}.timer-ops"


@dataclass(frozen=True, slots=True)
class ContextTopics:
    """The topics a context shares among its aggregate types."""

    context: str

    @property
    def results(self) -> str:
        return f"{self.context}.results"

    @property
    def dead_letters(self) -> str:
        return f"{self.context}.dead-letters"

    @property
    def ledger(self) -> str:
        return f"{self.context}.failure-ledger"

    @property
    def nodes(self) -> str:
        """Each node's status, keyed by node id (`app.ops.cluster_status`)."""
        return f"{self.context}.nodes"


def parse_aggregate_type(name: str) -> AggregateTopics:
    """`shop.order` → its topics; a clear `ConfigError` for anything else."""
    parts = name.split(".")
    if len(parts) != 2 or not all(_NAME.fullmatch(p) for p in parts):
        raise ConfigError(
            f"aggregate type {name!r} must be '<context>.<aggregate>' (letters, digits, '_' or '-')"
        )
    if len(name) > TYPE_NAME_MAX or len(parts[0]) > CONTEXT_NAME_MAX:
        # Taken, the worker made some of its topics, then failed on the one Kafka refused
        # (or on its data directory's name).
        raise ConfigError(
            f"aggregate type {name[:40]!r}… is {len(name)} characters, its context "
            f"{len(parts[0])}: at most {TYPE_NAME_MAX} and {CONTEXT_NAME_MAX}, so that "
            f"every topic named after them is within Kafka's {TOPIC_NAME_MAX}"
        )
    return AggregateTopics(parts[0], parts[1])


def aggregate_topics(context: object, aggregate: object) -> AggregateTopics:
    """The topics of the type `<context>.<aggregate>`, as a caller in Python names it; a clear
    `ConfigError` unless both are names (`parse_aggregate_type`): a number, `""` or a
    space would name no topic Kafka takes."""
    if not isinstance(context, str) or not isinstance(aggregate, str):
        raise ConfigError(
            f"aggregate type ({context!r}, {aggregate!r}): its context and name must be strings"
        )
    return parse_aggregate_type(f"{context}.{aggregate}")
