"""The topics a client of a timer book uses: the book's (as its workers make them, so that
either side may start first) and the command topic of the type its timers fire into, which
only the client reads. Made with Tickwheel's own specs: the partition count co-partitioning
needs (a topic of another count is an error naming it), through the cluster's `Admin` port
(the client's edge, `TickwheelTimers`, makes it from the app's brokers).
"""

from __future__ import annotations

import asyncio

from app.kafka import TopicSpec
from app.kafka.ports import Admin
from app.node import node_topics
from app.protocol.topics import AggregateTopics, ContextTopics

__all__ = ["ClientTopics"]


class ClientTopics:
    """The topics a `TickwheelTimers` uses, made once with Tickwheel's own specs (the
    partition count that co-partitioning needs; a mismatch is an error naming it)."""

    def __init__(
        self,
        admin: Admin,
        book: AggregateTopics,
        target: AggregateTopics,
        partitions: int,
    ) -> None:
        self.admin = admin
        self.book = book
        self.target = target
        self.partitions = partitions
        self.context = ContextTopics(book.context)
        self._lock = asyncio.Lock()
        self._made = False

    @property
    def specs(self) -> list[TopicSpec]:
        # The book's topics as its workers make them (so either side may start first), and
        # the target's command topic, which only this app reads.
        return [
            *node_topics([self.book], self.partitions),
            TopicSpec(self.target.commands, self.partitions),
        ]

    async def ensure(self) -> None:
        """Makes the topics once per process (a failed attempt is made again next time)."""
        if self._made:
            return
        async with self._lock:
            if not self._made:
                await self.admin.ensure_topics(self.specs)
                self._made = True
