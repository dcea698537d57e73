"""The topics a client of a timer book uses: the book's (as its workers make them, so that
either side may start first) and the command topic of the type its timers fire into, which
only the client reads. Made with Tickwheel's own specs: the partition count co-partitioning
needs (a topic of another count is an error naming it), through the cluster's `Admin` port
(the client's edge, `TickwheelTimers`, makes it from the app's brokers).

A record of the command topic that is not a command is answered as a node answers one
(`unreadable_answer`): `ERROR` with why, on the context's results topic, when its reply
address still reads (`app.commands.intake.reply_address`).
"""

from __future__ import annotations

import asyncio

from app.commands.intake import bad_reply, reply_address
from app.commands.records import result_record
from app.kafka import OutRecord, Record, TopicSpec
from app.kafka.ports import Admin
from app.model.decide import cut_message
from app.node import node_topics
from app.protocol.dead_letters import error_message
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandResult, ResultCode

__all__ = ["ClientTopics", "unreadable_answer"]


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


def unreadable_answer(
    topics: ClientTopics, record: Record, error: BaseException, limits: InputLimits, now: int
) -> OutRecord | None:
    """The answer to `record`, read from the target's command topic and refused (`error`
    says why): `ERROR` with why, as a node answers a command it cannot read, so that the
    timer that sent it fails at once instead of waiting out its `send_timeout` and parking
    as `TIMEOUT`. ERROR, not REJECTED: a newer client may read it (a rolling upgrade).

    None where a node answers nothing (`reply_address`: over `limits`, not JSON, no request
    id and aggregate that read) and where `answer` would not (no `reply_to`: a command of
    another context, fire-and-forget). A reply address elsewhere is answered on the
    context's own results topic, in the request id's partition, as a command's is."""
    address = reply_address(record, limits)
    if address is None or address.reply_to is None:
        return None
    results, partitions = topics.context.results, topics.partitions
    result = CommandResult(
        request_id=address.request_id,
        code=ResultCode.ERROR,
        aggregate=address.aggregate,
        message=cut_message(error_message(error)),
        decided_at=now,
    )
    own = bad_reply(address, results, partitions) is not None
    return result_record(address, result, results, partitions, own=own)
