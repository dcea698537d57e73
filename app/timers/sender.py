"""The firer's Kafka side: sends a timer's command and waits for its result.

A command to an aggregate of the timer owner's own context goes to that type's command
topic with `reply_partition` = the timer's partition, so its result comes back on the
results partition this node owns and reads (`ResultsReader`). A command to another
context is only handed to the broker: its outcome is SENT once acknowledged. A command
topic the cluster does not have (`app.kafka.catalog.TopicCatalog`) is `NO_TARGET` at once,
a failed attempt (retried by the timer's policy, then parked), never a send that waits.

The followers the node's sends and parks depend on (`ResultsReader`, the failure ledger's)
poll through `FollowerPolls`: what may pass by itself is retried, for `POLL_FAILING_S` at
most, as the group's polls are (`app.node.polling`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from app.errors import BadRecord, KafkaUnavailable
from app.kafka import Follower, FollowerFactory, Publisher, Record
from app.kafka.catalog import NO_TARGET, TopicCatalog, no_target_message
from app.kafka.in_log_refusals import FetchRefused
from app.kafka.ports import POLL_FAILING_S
from app.kafka.records import refused
from app.log_limit import LogLimit
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, CommandResult, decode, encode
from app.timers.op_answers import is_answer
from app.timers.runner.decisions import NOT_CLAIMED, SENT, SendResult
from tables import AggregateRef, Timer

__all__ = ["FOLLOW_RETRY_S", "FollowerPolls", "KafkaSender", "ResultsReader", "timer_command"]

logger = logging.getLogger(__name__)

FOLLOW_RETRY_S = 1.0
"""The pause after a follower's poll that failed, before the next."""

POLL_WITHIN_S = 60.0
"""How long a follower's poll may take before it counts as failed: the adapters bound
their own well under it, and one that never answered held every remote send's result
(or the ledger) for good while `/healthz` said nothing failed."""


class FollowerPolls:
    """Polls a follower the node depends on, retrying what may pass by itself (a broker or
    a leader away) once a second, for `failing_s` at most (`POLL_FAILING_S`): a refusal (an
    ACL, the credentials) is raised at once, and so are a partition's reading stopped
    (`FetchRefused`: fetches unanswered for that long while records wait, an error the
    client only logs) and polls failing that long with none passing (a batch corrupt on a
    broker's disk fails every fetch of it, for good), which end the follower's task and
    stop the node (its supervision). `failing` says meanwhile
    how long they have failed (`/healthz`). `monotonic`: the clock it is told by."""

    def __init__(
        self,
        follower: Follower,
        *,
        failing_s: float = POLL_FAILING_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._follower = follower
        self._failing_s = failing_s
        self._monotonic = monotonic
        self._failing: tuple[float, str] | None = None  # since when, and the last error

    @property
    def failing(self) -> tuple[float, str] | None:
        """How long the polls have failed, none passing since, and the last one's error;
        None while they pass."""
        if self._failing is None:
            return None
        since, error = self._failing
        return self._monotonic() - since, error

    async def poll(self) -> list[Record]:
        """The follower's next records, once a poll passes."""
        topic = self._follower.topic
        while True:
            try:
                try:
                    async with asyncio.timeout(POLL_WITHIN_S):
                        records = await self._follower.poll()
                except TimeoutError:
                    raise KafkaUnavailable(
                        f"a poll of {topic} did not answer within {POLL_WITHIN_S:.0f} s"
                    ) from None
            except KafkaUnavailable as exc:
                if refused(exc):
                    raise  # an ACL or the credentials: no retry passes it (the node stops)
                if isinstance(exc, FetchRefused):
                    # A partition's reading stopped, its own bound passed (`FetchStalled`):
                    # every poll passes meanwhile, and no bound of failing ones would end it.
                    raise
                now = self._monotonic()
                since = now if self._failing is None else self._failing[0]
                self._failing = (since, str(exc))
                if now - since >= self._failing_s:
                    raise KafkaUnavailable(
                        f"polls of {topic} failed for {now - since:.0f} s, none passing: {exc}"
                    ) from exc
                # The broker or a leader away: read on once it is back, from where it was.
                logger.warning("reading %s failed, trying again: %s", topic, exc)
                await asyncio.sleep(FOLLOW_RETRY_S)
                continue
            self._failing = None
            return records


def timer_command(
    timer: Timer,
    issued_at: int,
    *,
    reply_to: str | None = None,
    reply_partition: int | None = None,
    in_process: bool = False,
) -> CommandEnvelope:
    """The command a timer's slot sends: request id `<timer id>#<slot>`, not before the
    slot's due time."""
    return CommandEnvelope(
        request_id=timer.request_id,
        type=timer.command.type,
        aggregate=timer.target,
        body=timer.command.body,
        not_before=timer.slot_due_at,
        issued_at=issued_at,
        reply_to=reply_to,
        reply_partition=reply_partition,
        in_process=in_process,
    )


class ResultsReader:
    """Reads the owned partitions of a context's results topic; resolves waiting sends.

    `followers` makes the topic's follower (`Clients.follower`); `log_limit` bounds the
    lines about unreadable results, misaddressed ones and those of a code this version
    does not know (each, by default, one a minute after the first); `failing_s` and
    `monotonic`: how long its polls may fail, none passing (`FollowerPolls`);
    `on_unknown_code` is called for each result read whose code this version does not
    know (`CommandResult.unknown_code`: read as ERROR, a failed attempt of its send).
    """

    def __init__(
        self,
        followers: FollowerFactory,
        context: str,
        *,
        log_limit: LogLimit | None = None,
        failing_s: float = POLL_FAILING_S,
        monotonic: Callable[[], float] = time.monotonic,
        on_unknown_code: Callable[[], None] = lambda: None,
    ) -> None:
        self.topic = ContextTopics(context).results
        self._on_unknown_code = on_unknown_code
        self._reader = followers(self.topic)
        self._polls = FollowerPolls(self._reader, failing_s=failing_s, monotonic=monotonic)
        # Anyone who may write to the results topic could otherwise set this node's log
        # volume, one line per record of garbage.
        self._unreadable_log = log_limit or LogLimit()
        # By request id and the aggregate the send went to: the answers to be of the sends
        # in flight. Keyed by the target too: two sends of one request id to two targets
        # (two logs' timers of one event id, which the wire format allows) are two
        # requests, each settled by its own target's answer alone; one future each, so a
        # send cancelled (timed out) never cancels another's wait.
        self._waiting: dict[tuple[str, AggregateRef], list[asyncio.Future[CommandResult]]] = {}
        # How many sends in flight of each request id (a result naming one to another
        # aggregate is logged as misaddressed).
        self._ids: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._reader.start()
        self._task = asyncio.create_task(self._run(), name=f"results:{self.topic}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._reader.stop()
        for futures in self._waiting.values():
            for f in futures:
                f.cancel()

    async def add_partition(self, partition: int) -> None:
        """Reads `partition` from its end from now on: earlier results are not ours."""
        await self._reader.add(partition)

    async def remove_partition(self, partition: int) -> None:
        await self._reader.remove(partition)

    def expect(self, request_id: str, target: AggregateRef) -> asyncio.Future[CommandResult]:
        """The answer to the send of `request_id` to `target`: a result of that request id
        and that aggregate alone (another writer's result naming the request id of a send
        in flight is no answer to it). Each call its own future: `forget` it when done."""
        future: asyncio.Future[CommandResult] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault((request_id, target), []).append(future)
        self._ids[request_id] += 1
        return future

    def forget(
        self, request_id: str, target: AggregateRef, future: asyncio.Future[CommandResult]
    ) -> None:
        """Ends the wait `expect` gave (answered, or not waited for any longer): the one
        place a wait is let go, so one forgotten twice takes no other out of the count."""
        futures = self._waiting.get((request_id, target))
        if futures is None or future not in futures:
            return  # forgotten already
        futures.remove(future)
        if not futures:
            del self._waiting[(request_id, target)]
        self._ids[request_id] -= 1
        if self._ids[request_id] <= 0:
            del self._ids[request_id]

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The reading task (started by `start`): it ends only on an error no retry passes,
        which its owner must act on (every remote send of the context waits on it)."""
        return self._task

    @property
    def failing(self) -> tuple[float, str] | None:
        """How long its polls have failed, none passing, and why (`FollowerPolls`)."""
        return self._polls.failing

    async def _run(self) -> None:
        while True:
            records = await self._polls.poll()
            for record in records:
                try:
                    result = decode(CommandResult, record.value)
                except BadRecord as exc:
                    if is_answer(record):
                        continue  # an owner's answer to an operator's request: no result
                    if (more := self._unreadable_log.check()) is not None:
                        logger.warning(
                            "unreadable result at %s[%d]@%d: %s%s",
                            record.topic,
                            record.partition,
                            record.offset,
                            exc,
                            more,
                        )
                    continue
                if result.unknown_code is not None:
                    self._newer_code(record, result)
                # Left for `forget` to let go: the answered wait still counts.
                futures = self._waiting.get((result.request_id, result.aggregate))
                if futures is None:
                    if result.request_id in self._ids:
                        self._misaddressed(result)
                    continue
                for future in futures:
                    if not future.done():
                        future.set_result(result)

    def _misaddressed(self, result: CommandResult) -> None:
        """Logs (bounded as unreadable ones are: any writer may repeat a request id) a
        result naming the request id of a send in flight and another aggregate."""
        if (more := self._unreadable_log.check("misaddressed")) is not None:
            logger.warning(
                "a result for %s names %s, not an aggregate it was sent to: passed over%s",
                result.request_id,
                result.aggregate,
                more,
            )

    def _newer_code(self, record: Record, result: CommandResult) -> None:
        """Counts and logs (bounded) a result whose code this version does not know."""
        self._on_unknown_code()
        if (more := self._unreadable_log.check("unknown code")) is not None:
            logger.warning(
                "the result at %s[%d]@%d for %s has the code %r, which this version does "
                "not know (a newer writer's?): read as ERROR, a failed attempt of its send%s",
                record.topic,
                record.partition,
                record.offset,
                result.request_id,
                result.unknown_code,
                more,
            )


class KafkaSender:
    """The runner's `Sender` over Kafka; the runner bounds how long a send may wait."""

    def __init__(
        self,
        producer: Publisher,
        results: ResultsReader,
        context: str,
        now: Callable[[], int],
        targets: TopicCatalog | None = None,
    ) -> None:
        self._producer = producer
        self._results = results
        self._context = context
        self._now = now
        # The cluster's topics: a send to a missing one fails at once as NO_TARGET (a failed
        # attempt, retried by the timer's policy and parked), not after a metadata wait.
        self._targets = targets

    async def send(self, timer: Timer) -> SendResult:
        return await self.send_if(timer, _always)

    async def send_if(self, timer: Timer, still: Callable[[], Awaitable[bool]]) -> SendResult:
        """As `send`, the command handed to the producer only if `still()` says so after
        the topic listing this send may wait for (`CheckingSender`)."""
        target = timer.target
        own = target.context == self._context
        command = timer_command(
            timer,
            self._now(),
            reply_to=self._results.topic if own else None,
            reply_partition=timer.partition if own else None,
        )
        topic = AggregateTopics(target.context, target.aggregate).commands
        if self._targets is not None and not await self._targets.exists(topic):
            return SendResult(NO_TARGET, no_target_message(topic))
        if not await still():  # no wait of this send's own from here to the producer's
            return NOT_CLAIMED
        if not own:
            # Another context's partition count is its own: the key picks the partition.
            await self._producer.send(topic, target.id.encode(), encode(command))
            return SendResult(SENT)
        waiting = self._results.expect(timer.request_id, target)
        try:
            await self._producer.send(topic, target.id.encode(), encode(command))
            result = await waiting
        finally:
            self._results.forget(timer.request_id, target, waiting)
        # A code this version does not know reads ERROR: a failed attempt, retried by the
        # timer's policy (never its success), the code itself kept in its reason.
        return SendResult(result.code.value, result.reason)


async def _always() -> bool:
    return True
