"""faust-streaming apps as Tickwheel clients: durable timers per key, fired into an agent.

A faust app keeps its state per key; for each key it may keep timers in a *timer book*
(`app.clients.timer_book`): the aggregate `<context>.<book>/<key>`, decided by Tickwheel workers
running a service that declares the book. The app never writes the book's log itself:
`schedule`, `cancel`, `pause`, `resume` and `trigger` (`app.clients.book_client`) send the
book's commands (`app.clients.book_commands`) to its command topic, keyed by the key, in
murmur2(key)'s partition (computed by the client, so faust's partitioner cannot put it
elsewhere), and the node owning that partition appends the events (`wow.ScheduleSet`, …)
at the book's next version, de-duplicated by request id. Writing the events directly
would race the node: the version the app would pick is the one the node appends next, and
a replayed faust event would set a timer twice.

A timer fires its command into `<context>.<target>.commands` (the app's own type, the
key's id), which `commands` reads: a faust topic whose values are `CommandEnvelope`s
(records that are not are dead-lettered to `<context>.dead-letters`, and answered `ERROR`
where their reply address reads, as Tickwheel's own processors do, and never reach the
agent). The node waits for the command's result on
`reply_to`: the agent answers with `answer` (COMMITTED once done, or its refusal); an
unanswered command is sent again (same request id, `<timer id>#<slot>`) after the node's
`send_timeout`, so the agent should treat a request id it has handled as done.

    app = faust.App("reminders", broker="kafka://127.0.0.1:9092")
    timers = TickwheelTimers(app, context="reminders", book="order-timers",
                             target="order", partitions=12)

    @app.agent(timers.commands)
    async def fired(stream):
        async for cmd in stream:
            ...                                  # cmd: CommandEnvelope
            await timers.answer(cmd)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

try:
    import faust
    from faust.exceptions import ValueDecodeError
    from faust.streams import current_event
    from faust.types import AppT, CodecArg, Message
except ImportError as exc:  # the extra is optional: say how to get it
    raise ImportError(
        "app.clients.faust_client needs faust-streaming: pip install '.[faust]' (from a clone)"
    ) from exc

from app.clients.book_client import BookClient
from app.clients.book_commands import BookCommands, request_id_for, scoped_request_id
from app.clients.client_topics import ClientTopics, unreadable_answer
from app.clients.fired import command_in, letter_of, record_of
from app.clients.timer_book import timer_book
from app.errors import BadRecord, ConfigError
from app.kafka import KafkaClients
from app.kafka.connection import Connectable
from app.kafka.records import Replication
from app.node.settings import MAX_PARTITIONS, Settings
from app.protocol.limits import DEFAULT_MAX_RECORD_BYTES, InputLimits
from app.protocol.topics import AggregateTopics, aggregate_topics
from app.protocol.wire import CommandEnvelope, encode

__all__ = [
    "NODE_REPLICATION",
    "RECORD_OVERHEAD",
    "CommandSchema",
    "CommandTopic",
    "TickwheelTimers",
    "bootstrap_of",
    "request_id_for",
]

logger = logging.getLogger(__name__)

_Out = tuple[str, int | None, bytes | None, bytes | None, list[tuple[str, bytes]]]
"""A record as `CommandTopic` sends one: (topic, partition, key, value, headers)."""

NODE_REPLICATION: Final = Replication(
    Settings.model_fields["replication_factor"].default,
    Settings.model_fields["min_insync_replicas"].default,
)
"""A worker's replication unless configured: the topics the app creates first are theirs."""


RECORD_OVERHEAD: Final = 128
"""What a record takes in a producer's request besides its key and value: a batch's header
(61 bytes) and the record's own fields (at most 36 bytes of varints and its attributes;
it has no headers): aiokafka refuses one whose total exceeds `max_request_size`."""


def bootstrap_of(app: AppT) -> str:
    """The app's brokers as `host:port,…`, for Tickwheel's own admin client."""
    return ",".join(f"{url.host}:{url.port or 9092}" for url in app.conf.broker)


class CommandSchema(faust.Schema[str, CommandEnvelope]):
    """Keys as the aggregate id (str), values as `CommandEnvelope`s of the target type.

    A value that is not one, is another type's, or is keyed or partitioned other than
    its aggregate (murmur2 of the id) is a decode error: `CommandTopic` dead-letters it
    and answers it where it can (`unreadable_answer`, within `limits`, at `now()`). They
    are the schema's, not the topic's: faust clones the topic an agent iterates.
    """

    def __init__(
        self,
        topology: ClientTopics,
        limits: InputLimits | None = None,
        now: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(key_type=str, value_type=bytes)
        self.topology = topology
        self.limits = limits or InputLimits()
        self.now = now or (lambda: int(time.time() * 1000))

    def loads_value(
        self,
        app: AppT,
        message: Message,
        *,
        loads: Callable[..., Any] | None = None,
        serializer: CodecArg | None = None,
    ) -> CommandEnvelope:
        return command_of(message, self.topology.target, self.topology.partitions, self.limits)

    def dumps_value(
        self,
        app: AppT,
        value: Any,
        *,
        serializer: CodecArg | None = None,
        headers: Any,
    ) -> tuple[Any, Any]:
        if not isinstance(value, CommandEnvelope):
            raise TypeError(f"{self.topology.target.commands} takes CommandEnvelope values")
        return encode(value), headers


def command_of(
    message: Message,
    target: AggregateTopics,
    partitions: int,
    limits: InputLimits | None = None,
) -> CommandEnvelope:
    """The command `message` carries, within `limits` (the defaults unless given);
    `ValueDecodeError` saying why it is not one."""
    try:
        return command_in(message, target, partitions, limits or InputLimits())
    except BadRecord as exc:
        raise ValueDecodeError(str(exc)) from exc


class CommandTopic(faust.Topic):
    """The target type's command topic: made with Tickwheel's specs when the app
    subscribes (`internal=True` makes faust declare it), and a record that is not a
    command is dead-lettered and answered `ERROR` where its reply address reads, as a
    node does, not thrown into the agent (where it would crash the agent on every
    delivery)."""

    @property
    def _schema(self) -> CommandSchema:
        return cast(CommandSchema, self.schema)

    async def declare(self) -> None:
        await self._schema.topology.ensure()

    async def on_key_decode_error(self, exc: Exception, message: Message) -> None:
        await self._refuse(exc, message)

    async def on_value_decode_error(self, exc: Exception, message: Message) -> None:
        await self._refuse(exc, message)

    async def _refuse(self, exc: Exception, message: Message) -> None:
        schema, now = self._schema, self._schema.now()
        await self._send_logged(exc, message, "dead-letter", letter_of(message, exc, now))
        answer = unreadable_answer(schema.topology, record_of(message), exc, schema.limits, now)
        if answer is not None:
            await self._send_logged(exc, message, "answer", (*answer, []))

    async def _send_logged(self, exc: Exception, message: Message, what: str, out: _Out) -> None:
        topic, partition, key, value, headers = out
        channel = self.app.topic(topic, key_type=bytes, value_type=bytes)
        try:
            sent = await channel.send(
                key=key, value=value, partition=partition, headers=headers, force=True
            )
            await sent
        except Exception:
            # Logged, not raised: faust acked the record before calling this, so raising
            # would not keep it (its offset commits all the same) but would stop the
            # fetcher, and every partition with it. Its coordinates say where to read it.
            at = f"{message.topic}[{message.partition}]@{message.offset}"
            logger.exception(
                "could not %s %s (%s) to %s: the record is skipped, read it again from there",
                what,
                at,
                exc,
                topic,
            )


class TickwheelTimers(BookClient):
    """Timers for the keys of a faust app, kept by Tickwheel workers in a timer book.

    `context`, `book`, `target`: the book is `<context>.<book>` (the workers' service must
    declare `timer_book(context, book)`), the timers fire into `<context>.<target>` by
    default. `partitions`: the workers' `TICKWHEEL_PARTITIONS` (an int, 1 to 1024).
    `bootstrap`: the app's brokers unless given. `replication`: of the topics this client
    creates, the workers' default unless given (their `TICKWHEEL_REPLICATION_FACTOR`,
    `…MIN_INSYNC_REPLICAS`), fewer on a smaller cluster as theirs. `now`: epoch ms (the
    clock `early_by` and results use). `max_record_bytes`: the workers'
    `TICKWHEEL_MAX_RECORD_BYTES`.
    """

    def __init__(
        self,
        app: faust.App,
        *,
        context: str,
        book: str,
        target: str,
        partitions: int,
        bootstrap: Connectable | None = None,
        replication: Replication = NODE_REPLICATION,
        now: Callable[[], int] | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        book_topics = aggregate_topics(context, book)
        target_topics = aggregate_topics(context, target)
        if book_topics == target_topics:
            raise ValueError(f"the target {target!r} must not be the book: its timers fire into it")
        if type(partitions) is not int or not 1 <= partitions <= MAX_PARTITIONS:
            # 12.0 or True went on into the topics' specs and every record's partition.
            raise ConfigError(
                f"partitions must be an integer from 1 to {MAX_PARTITIONS} (the workers' "
                f"TICKWHEEL_PARTITIONS), got {partitions!r}"
            )
        self.app = app
        self.book = timer_book(context, book)
        # The client's edge, as the CLI is: its one `KafkaClients`, made from the brokers;
        # below it only the ports.
        clients = KafkaClients(bootstrap or bootstrap_of(app), replication)
        topology = ClientTopics(clients.admin(), book_topics, target_topics, partitions)
        clock = now or (lambda: int(time.time() * 1000))
        # The workers' TICKWHEEL_MAX_RECORD_BYTES: a command past it is refused here, as
        # they would drop it unanswered.
        limits = InputLimits(max_record_bytes=max_record_bytes)
        # And past what faust's producer sends (aiokafka refuses it unsent, with an error
        # that is no ValueError: retried, never sent).
        request = app.conf.producer_max_request_size
        sendable = (request - RECORD_OVERHEAD, f"the app's producer_max_request_size {request}")
        commands_of = BookCommands(self.book, target_topics, clock, limits, sendable=sendable)
        super().__init__(
            partitions=partitions, topology=topology, commands_of=commands_of, now=clock
        )
        self.commands: CommandTopic = CommandTopic(
            app,
            topics=[target_topics.commands],
            schema=CommandSchema(topology, limits, clock),
            partitions=partitions,
            internal=True,
        )
        """The timers' commands: `@app.agent(timers.commands)` iterates `CommandEnvelope`s."""
        self._topics: dict[str, faust.types.TopicT] = {}

    async def _send(self, topic: str, key: bytes, value: bytes, partition: int) -> None:
        # Awaited inside an agent too: faust does not wait for an agent's sends (nor raise a
        # failed one, published at commit with stream_publish_on_commit) before it commits
        # the event's offset. `force`: not attached to the event, whose commit would wait
        # for this very send.
        channel = self._topics.get(topic)
        if channel is None:
            channel = self._topics[topic] = self.app.topic(topic, key_type=bytes, value_type=bytes)
        sent: Awaitable[Any] = await channel.send(
            key=key, value=value, partition=partition, force=True
        )
        await sent

    def _request_id(self, op: str, timer: str, given: str | None) -> str:
        """`given`, scoped to `op` on `timer` (`scoped_request_id`: an id reused for another
        change is no DUPLICATE of the first), or the one derived from the event the agent
        processes (`request_id_for`)."""
        if given is not None:
            return scoped_request_id(op, timer, given)
        event = current_event()
        return request_id_for(op, timer, None if event is None else event.message)
