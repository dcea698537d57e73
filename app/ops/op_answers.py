"""An operator's retry/skip request sent to every partition of its type's timer-ops topic
and the owners' answers waited for (`request_answered`): one per partition
(`app.timers.op_answers`), all on the context's results topic in the request id's
partition, read from where that partition ended before the send. An answer is this send's
when it names the offset its copy was written at (a copy sent before under the request id
has its own answers). What did not come within the wait is left out (`Answered.missing`):
the request may still be carried out there. What came of it, told alike by the command
line and the operator page: `Answered.summary`, `Answered.failed`, `partitions_named`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from app.kafka.cluster import existing_topics
from app.kafka.ports import Clients, LogReader
from app.ops.deadline import by, stop_by
from app.protocol.topics import ContextTopics, parse_aggregate_type
from app.protocol.wire import OpOutcome, TimerAction, TimerOp, TimerOpAnswer
from app.timers.op_answers import answer_of, answers_partition
from app.timers.operator import send_op

__all__ = [
    "DONE_WORDS",
    "REFUSED_WHY",
    "Answered",
    "changed",
    "partitions_named",
    "request_answered",
    "timers",
]

DONE_WORDS = {TimerAction.RETRY: "retried", TimerAction.SKIP: "skipped"}
REFUSED_WHY = (
    "their slot was due longer ago than TICKWHEEL_REQUEST_ID_WINDOW_MS less expires_after "
    "(at most a day), so their target may have applied it and forgotten its request id, "
    "and would apply it again; to send them all the same, retry past the window"
)
"""Why a retry left timers parked (`Answered.refused`): each edge then says how to ask."""


def changed(answer: TimerOpAnswer) -> int:
    """The PARKED timers the answer's partition retried or skipped (by its action)."""
    return answer.retried if answer.action is TimerAction.RETRY else answer.skipped


def timers(n: int) -> str:
    return f"{n} timer{'' if n == 1 else 's'}"


def partitions_named(ps: list[int]) -> str:
    return f"partition{'' if len(ps) == 1 else 's'} {', '.join(map(str, ps))}"


@dataclass
class Answered:
    """A request sent, and the answers that came for it, by partition."""

    op: TimerOp
    partitions: int
    waited: bool = False
    """Whether its answers were waited for (not with a wait of 0)."""
    answers: dict[int, TimerOpAnswer] = field(default_factory=dict)
    unread: str | None = None
    """Why no answer could be read at all (the results topic is not there), if so."""

    @property
    def missing(self) -> list[int]:
        """The partitions whose answer did not come (all of them when none was waited
        for)."""
        return [p for p in range(self.partitions) if p not in self.answers]

    @property
    def in_order(self) -> list[TimerOpAnswer]:
        """The answers, by partition."""
        return [self.answers[p] for p in sorted(self.answers)]

    @property
    def failed(self) -> list[int]:
        """The partitions that answered FAILED."""
        return [a.partition for a in self.in_order if a.outcome is OpOutcome.FAILED]

    @property
    def refused(self) -> int:
        """The PARKED timers a retry left parked in all: their slot past the request-id
        window, the request not asking past it (`TimerOpAnswer.refused`)."""
        return sum(a.refused for a in self.answers.values() if a.outcome is OpOutcome.DONE)

    def summary(self, type_name: str, target: str, request: str) -> str:
        """What was retried or skipped in all, where, what was a DUPLICATE and how many
        answered; `target` and `request` as the caller shows them (escaped its way)."""
        done = [a for a in self.answers.values() if a.outcome is OpOutcome.DONE]
        total = sum(changed(a) for a in done)
        where = sum(1 for a in done if changed(a))
        duplicates = sum(1 for a in self.answers.values() if a.outcome is OpOutcome.DUPLICATE)
        again = (
            f"; {duplicates} partition{'' if duplicates == 1 else 's'} had carried it out "
            "before under this request id (DUPLICATE: nothing done again)"
            if duplicates
            else ""
        )
        if refused := self.refused:
            again += f"; {timers(refused)} not retried, left parked: {REFUSED_WHY}"
        if missing := len(self.missing):
            again += f"; {self.partitions - missing} of {self.partitions} answered"
        return (
            f"{DONE_WORDS[self.op.action]} {timers(total)} of {type_name} parked on {target} "
            f"in {where} of {self.partitions} partitions{again} (request {request})"
        )


async def request_answered(
    clients: Clients,
    type_name: str,
    op: TimerOp,
    partitions: int,
    wait_s: float,
    *,
    poll_s: float = 0.1,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Answered:
    """Sends `op` to the `partitions` partitions of `type_name`'s timer-ops topic (refused,
    nothing sent, when it is not there: `MissingTopic`) and waits up to `wait_s` seconds
    (none with 0) for each one's answer.

    `wait_s` bounds the reads as a whole, not the send: cut short, a send is as ambiguous
    as one that failed. Creates no results topic: without one (no worker of the context
    ran), nothing is read (`Answered.unread`)."""
    answered = Answered(op, partitions, waited=wait_s > 0)
    if not answered.waited:
        await send_op(clients, type_name, op, partitions)
        return answered
    results = ContextTopics(parse_aggregate_type(type_name).context).results
    deadline = asyncio.get_running_loop().time() + wait_s
    found = await by(deadline, existing_topics(clients.admin(), [results]))
    if found is None or results not in found:
        await send_op(clients, type_name, op, partitions)
        if found is not None:
            answered.unread = (
                f"topic {results} does not exist: no worker of the context has run against "
                "this cluster"
            )
        return answered
    at = answers_partition(op.request_id, found[results])
    reader = clients.reader()
    await reader.start()
    try:
        # The results partition's end before the send: the answers are written after it.
        ends = await by(deadline, reader.offsets(results, at))
        offsets = await send_op(clients, type_name, op, partitions)
        if ends is not None:
            read = _read(reader, results, at, ends[1], op, offsets, answered.answers)
            await by(deadline, _polled(read, poll_s, sleep))
    finally:
        # The wait bounds the reader's stop too (librdkafka's waits for its call in flight).
        await stop_by(deadline, reader.stop(), "the answers' reader")
    return answered


async def _polled(
    read: Callable[[], Awaitable[bool]], poll_s: float, sleep: Callable[[float], Awaitable[None]]
) -> None:
    while not await read():
        await sleep(poll_s)


def _read(
    reader: LogReader,
    topic: str,
    at: int,
    start: int,
    op: TimerOp,
    offsets: list[int],
    got: dict[int, TimerOpAnswer],
) -> Callable[[], Awaitable[bool]]:
    """Reads on from where the last call stopped, answers of this send put in `got` (kept
    when the wait is cut); whether every partition has answered."""
    position = start

    async def read() -> bool:
        nonlocal position
        async with aclosing(reader.read(topic, at, position)) as batches:
            async for batch in batches:
                for r in batch:
                    position = r.offset + 1
                    answer = answer_of(r)
                    if (
                        answer is not None
                        and answer.request_id == op.request_id
                        and answer.action is op.action
                        and answer.partition < len(offsets)
                        and answer.offset == offsets[answer.partition]
                    ):
                        # An owner answers a copy once, in the commit of its offset: one more
                        # (another producer's) does not take the first one's place.
                        got.setdefault(answer.partition, answer)
        return len(got) == len(offsets)

    return read
