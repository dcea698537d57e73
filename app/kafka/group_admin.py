"""Admin calls on a consumer group: its members (`group_members`), its committed offsets
(`GroupOffsets`) and their reset (`reset_group_offsets`), each asked again while the
group's coordinator is not ready."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    GroupIdNotFound,
    KafkaError,
    NoError,
    NotCoordinatorError,
    for_code,
)

from app.errors import KafkaUnavailable
from app.kafka.connection import Connectable, client_options
from app.kafka.records import explain, start_client

__all__ = ["GroupOffsets", "group_members", "reset_group_offsets"]


_NO_COORDINATOR_YET = (
    CoordinatorNotAvailableError,
    CoordinatorLoadInProgressError,
    NotCoordinatorError,
)
"""A group's coordinator not ready: on a new cluster the broker is still creating its
offsets topic, or the coordinator moved. Asked again, it answers."""

T = TypeVar("T")


async def _coordinated(call: Callable[[], Awaitable[T]], within: float = 15.0) -> T:
    """`call`, asked again while the group's coordinator is not ready, for up to `within` s."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except _NO_COORDINATOR_YET:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)


async def group_members(bootstrap: Connectable, group_id: str) -> int:
    """How many members the consumer group has now. `KafkaUnavailable` when the broker
    does not describe it: its coordinator not ready (asked again for a while first) or the
    group refused (`refused`): never a count it did not give (a rebuild goes on at 0)."""
    admin = AIOKafkaAdminClient(**client_options(bootstrap), request_timeout_ms=30_000)

    async def described() -> int:
        responses = await admin.describe_consumer_groups([group_id])
        groups = [g for r in responses for g in r.groups]
        # (error_code, group_id, state, protocol_type, protocol, members, …): the error is
        # the group's, in the answer (aiokafka raises none of them), its members then empty.
        if not any(g[1] == group_id for g in groups):
            raise KafkaUnavailable(f"cannot describe group {group_id}: the answer lacks it")
        members = 0
        for g in groups:
            kind = for_code(g[0])
            if kind is GroupIdNotFound:
                continue  # no such group, no member (newer brokers say so as an error)
            if kind is not NoError:
                raise kind(f"describing group {g[1]}")
            members += len(g[5])
        return members

    try:
        await admin.start()
        return await _coordinated(described)
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot describe group {group_id}: {explain(exc)}") from exc
    finally:
        await admin.close()


class GroupOffsets:
    """Reads a consumer group's committed offsets, as often as asked, on one connection.

    Only committed offsets count: those a transaction sent are seen once its commit
    markers are written, a moment after the commit returned (this OffsetFetch cannot ask
    the broker to wait for them): a read right after a commit may see the offsets before
    it. Reading them joins nothing, so the group's members are not disturbed.
    """

    def __init__(self, bootstrap: Connectable, group_id: str) -> None:
        self.group_id = group_id
        self._admin = AIOKafkaAdminClient(**client_options(bootstrap), request_timeout_ms=30_000)

    async def start(self) -> None:
        await start_client(self._admin, "admin client")

    async def stop(self) -> None:
        await self._admin.close()

    async def __aenter__(self) -> GroupOffsets:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def fetch(
        self, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int | None]:
        """The committed offset of each (topic, partition); None where the group has none."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        try:
            got = await _coordinated(
                lambda: self._admin.list_consumer_group_offsets(self.group_id, partitions=tps)
            )
        except KafkaError as exc:
            raise KafkaUnavailable(
                f"cannot read {self.group_id}'s offsets: {explain(exc)}"
            ) from exc
        out: dict[tuple[str, int], int | None] = {}
        for tp in tps:
            meta = got.get(tp)
            out[(tp.topic, tp.partition)] = (
                None if meta is None or meta.offset < 0 else int(meta.offset)
            )
        return out


async def reset_group_offsets(
    bootstrap: Connectable, group_id: str, topic: str, partitions: int, offset: int = 0
) -> None:
    """Sets the group's committed offset of every partition of `topic` (group must be idle)."""
    consumer = AIOKafkaConsumer(
        **client_options(bootstrap), group_id=group_id, enable_auto_commit=False
    )
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    try:
        await consumer.start()
        consumer.assign(tps)
        await consumer.commit({tp: offset for tp in tps})
    except KafkaError as exc:
        raise KafkaUnavailable(
            f"cannot reset {group_id}'s offsets of {topic}: {explain(exc)}"
        ) from exc
    finally:
        await consumer.stop()
