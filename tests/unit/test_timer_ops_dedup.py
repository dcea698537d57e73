"""An operator's retry or skip sent again under its request id (`tickwheel timers retry
--request-id`, after a send that failed or timed out) is carried out once in each
partition, as a command sent again is: a whole node on the in-memory log, a fake clock.

Before, each copy was carried out: a retry sent twice retried the timer that had parked
again in between (one send more than asked), and a skip sent twice skipped a timer parked
since. A take reads the request ids again from the timer-ops topic, so a node that takes
the partition without a local copy knows them too; past the window a copy is carried out
again, as a command is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel

from app.kafka import Record, TopicSpec
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.dead_letters import DeadLetterContext
from app.protocol.limits import InputLimits
from app.protocol.request_window import margin_ms
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, OpOutcome, TimerAction, TimerOp, encode
from app.service import Service
from app.timers.applied_ops import AppliedOps, read_applied_ops
from app.timers.op_answers import answer_of
from app.timers.operator import new_op, op_records
from app.timers.runner import RetryPolicy, TimerOptions
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.partitioner import partition_of

P = 2
ORDERS = AggregateTopics("shop", "order")
OWNER = AggregateRef(context="shop", aggregate="order", id="o-1")
WINDOW = 60_000  # the shortest de-duplication window a node takes


class Order(BaseModel):
    pass


order = AggregateType("shop", "order", Order)
FAILING = [True]
NUDGES: list[str] = []


@order.command("Start")
def _start(state: Order, cmd: Command, d: Decision) -> None:
    at = cmd.body["at"]
    d.schedule(cmd.body["key"], OnceRule(at=at), CommandSpec(type="Nudge"))


@order.command("Nudge")
def _nudge(state: Order, cmd: Command, d: Decision) -> None:
    NUDGES.append(cmd.request_id)
    if FAILING[0]:
        raise RuntimeError("the shop is closed")  # ERROR: a failed attempt
    d.emit("Nudged", {})


SERVICE = Service(aggregates=(order,))
# One attempt: a failed send parks the timer at once.
OPTIONS = TimerOptions(retry=RetryPolicy(max_attempts=1), expires_after=WINDOW // 2)


@pytest.fixture(autouse=True)
def _reset() -> None:
    FAILING[0] = True
    NUDGES.clear()


def rows(log: MemoryLog) -> dict[str, Timer]:
    latest: dict[bytes, bytes | None] = {}
    for p in range(P):
        for r in log.records(ORDERS.timers_changelog, p):
            assert r.key is not None
            latest[r.key] = r.value
    timers = [Timer.model_validate_json(v) for v in latest.values() if v is not None]
    return {t.key: t for t in timers}


def status(log: MemoryLog, key: str) -> TimerStatus | None:
    row = rows(log).get(key)
    return None if row is None else row.status


async def start(log: MemoryLog, key: str, at: int) -> None:
    cmd = CommandEnvelope(
        request_id=f"start-{key}",
        type="Start",
        aggregate=OWNER,
        body={"key": key, "at": at},
        issued_at=at,
    )
    p = partition_of(OWNER.id, P)
    await log.publisher().send(ORDERS.commands, OWNER.id.encode(), encode(cmd), p)


async def parked(log: MemoryLog, clock: FakeClock, key: str) -> None:
    """The timer `key` set, due now, fired, failed and PARKED."""
    await start(log, key, clock.now() + 1_000)
    await wait_until(lambda: status(log, key) is TimerStatus.PENDING)
    clock.advance(1_000)
    await wait_until(lambda: status(log, key) is TimerStatus.PARKED)


async def request(log: MemoryLog, op: TimerOp) -> None:
    """As `tickwheel timers retry|skip` writes it: once to every partition."""
    await log.publisher().send_many(op_records(ORDERS.timer_ops, op, P))


def op(action: TimerAction, request_id: str, clock: FakeClock) -> TimerOp:
    return new_op(action, OWNER, now=clock.now(), request_id=request_id)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[MemoryLog, FakeClock]]:
    log, clock = MemoryLog(), FakeClock(T0)
    async with running(
        RunningNode(
            log,
            tmp_path,
            "n",
            SERVICE,
            P,
            clock=clock,
            timers=OPTIONS,
            request_id_window_ms=WINDOW,
        )
    ):
        yield log, clock


async def test_a_retry_sent_again_does_not_retry_a_timer_parked_again(
    node: tuple[MemoryLog, FakeClock],
) -> None:
    log, clock = node
    await parked(log, clock, "remind")
    assert len(NUDGES) == 1
    retry = op(TimerAction.RETRY, "retry-1", clock)
    await request(log, retry)
    # Retried: sent again, failed again, parked again.
    await wait_until(lambda: len(NUDGES) == 2 and status(log, "remind") is TimerStatus.PARKED)
    # The CLI sent it again after a timeout, under its request id; then a skip (a later
    # request, read after it in each partition: once it is carried out, the copy was read).
    await request(log, retry)
    await request(log, op(TimerAction.SKIP, "skip-1", clock))
    await wait_until(lambda: status(log, "remind") is TimerStatus.CANCELLED or len(NUDGES) > 2)
    assert len(NUDGES) == 2, "the retry's copy retried the timer that parked again"
    assert rows(log)["remind"].outcome == "SKIPPED"


async def test_a_skip_sent_again_does_not_skip_a_timer_parked_since(
    node: tuple[MemoryLog, FakeClock],
) -> None:
    log, clock = node
    await parked(log, clock, "first")
    skip = op(TimerAction.SKIP, "skip-1", clock)
    await request(log, skip)
    await wait_until(lambda: status(log, "first") is TimerStatus.CANCELLED)
    await parked(log, clock, "second")  # parked after the skip
    await request(log, skip)
    FAILING[0] = False
    await request(log, op(TimerAction.RETRY, "retry-1", clock))  # read after the copy
    await wait_until(lambda: status(log, "second") in (TimerStatus.FIRED, TimerStatus.CANCELLED))
    assert status(log, "second") is TimerStatus.FIRED, "the skip's copy skipped it"


async def test_a_node_taking_the_partition_afresh_knows_the_requests_carried_out(
    tmp_path: Path,
) -> None:
    """No local copy (another node, a lost disk): the take reads them from the topic."""
    log, clock = MemoryLog(), FakeClock(T0)

    def a_node(name: str) -> RunningNode:
        return RunningNode(
            log,
            tmp_path,
            name,
            SERVICE,
            P,
            clock=clock,
            timers=OPTIONS,
            request_id_window_ms=WINDOW,
        )

    retry = None
    async with running(a_node("first")):
        await parked(log, clock, "remind")
        retry = op(TimerAction.RETRY, "retry-1", clock)
        await request(log, retry)
        await wait_until(lambda: len(NUDGES) == 2 and status(log, "remind") is TimerStatus.PARKED)
    async with running(a_node("second")):
        await request(log, retry)
        await request(log, op(TimerAction.SKIP, "skip-1", clock))
        await wait_until(lambda: status(log, "remind") is TimerStatus.CANCELLED or len(NUDGES) > 2)
        assert len(NUDGES) == 2


async def test_a_request_sent_again_past_the_window_is_carried_out_again(
    node: tuple[MemoryLog, FakeClock],
) -> None:
    log, clock = node
    await parked(log, clock, "remind")
    retry = op(TimerAction.RETRY, "retry-1", clock)
    await request(log, retry)
    await wait_until(lambda: len(NUDGES) == 2 and status(log, "remind") is TimerStatus.PARKED)
    clock.advance(WINDOW + 1)
    # Its timer's slot is as old: without `past_window` the retry would leave it parked
    # (the target may have forgotten the slot's request id too).
    await request(log, retry.model_copy(update={"past_window": True}))
    await wait_until(lambda: len(NUDGES) == 3)


async def test_a_request_dated_ahead_is_answered_failed_and_its_copy_is_its_duplicate(
    node: tuple[MemoryLog, FakeClock],
) -> None:
    """Dead-lettered as dated ahead of the clock, a request is answered FAILED (its sender
    waits) and its id counted used, as a take's reading of the topic counts it: a copy is
    its DUPLICATE with or without a take between (review finding: DUPLICATE only after a
    take), and a new request id carries it out."""
    log, clock = node
    await parked(log, clock, "remind")
    dated_by = log._now
    log._now = lambda: clock.now() + WINDOW  # the sender's clock a window ahead
    retry = op(TimerAction.RETRY, "retry-1", clock)
    await request(log, retry)
    log._now = dated_by
    results = ContextTopics("shop").results

    def answers() -> list[OpOutcome]:
        found = [
            answer_of(r) for p in range(log.partitions(results)) for r in log.records(results, p)
        ]
        return [a.outcome for a in found if a is not None]

    await wait_until(lambda: len(answers()) == P)
    assert set(answers()) == {OpOutcome.FAILED}
    await request(log, retry)  # its clock fixed, sent again under its id
    await wait_until(lambda: len(answers()) == 2 * P)
    assert answers()[P:] == [OpOutcome.DUPLICATE] * P
    assert len(NUDGES) == 1 and status(log, "remind") is TimerStatus.PARKED
    await request(log, op(TimerAction.RETRY, "retry-2", clock))
    await wait_until(lambda: len(NUDGES) == 2)


def test_applied_ops_forget_past_the_window_and_past_their_bound() -> None:
    applied = AppliedOps(window_ms=WINDOW, limit=2)
    first = new_op(TimerAction.RETRY, OWNER, now=T0, request_id="a")
    applied.note(first, 5, T0)
    assert applied.duplicate_of(first, 5, T0) is None, "itself, read again by a take"
    assert applied.duplicate_of(first, 9, T0 + WINDOW - 1) == 5
    assert applied.duplicate_of(first, 9, T0 + WINDOW) is None
    # A copy sent again past the window is carried out, and its later copies duplicate it.
    again = new_op(TimerAction.RETRY, OWNER, now=T0 + WINDOW, request_id="a")
    applied.note(again, 9, T0 + WINDOW)
    assert applied.duplicate_of(again, 12, T0 + WINDOW) == 9
    for i, name in enumerate(["b", "c"]):
        later = new_op(TimerAction.SKIP, OWNER, now=T0 + WINDOW, request_id=name)
        applied.note(later, 20 + i, T0 + WINDOW)
    assert len(applied) == 2
    assert applied.duplicate_of(again, 30, T0 + WINDOW) is None, "the oldest was dropped"


def test_a_request_dated_ahead_of_the_clock_past_the_margin_is_not_carried_out() -> None:
    # Carried out now, its id forgotten a window from now, it would still read as within the
    # window by its own date: read again then (the group's offsets lost), carried out twice.
    applied = AppliedOps(window_ms=WINDOW, skew_ms=0)
    margin = margin_ms(WINDOW, 0)
    op = new_op(TimerAction.RETRY, OWNER, now=T0, request_id="r")
    ahead = Record("shop.order.timer-ops", 0, 5, b"k", b"", T0 + margin + 1, ())
    assert "ahead of this node's clock" in (applied.past_window(op, ahead, T0) or "")
    near = Record("shop.order.timer-ops", 0, 5, b"k", b"", T0 + margin, ())
    assert applied.past_window(op, near, T0) is None
    no_timestamp = Record("shop.order.timer-ops", 0, 5, b"k", b"", -1, ())
    early = new_op(TimerAction.RETRY, OWNER, now=T0 + margin + 1, request_id="r")
    assert applied.past_window(early, no_timestamp, T0) is not None, "its requested_at counts"


async def test_a_request_dead_lettered_as_carried_out_is_used_as_a_take_reads_it(
    node: tuple[MemoryLog, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request whose carrying out failed (dead-lettered, perhaps half done) has used its
    request id, as a take's reading of the topic counts it: a copy is its DUPLICATE on the
    node that failed it as on any other (before, carried out here, passed over there)."""
    from app.node import cycle_timers

    log, clock = node
    await parked(log, clock, "remind")
    real = cycle_timers.carry_out  # type: ignore[attr-defined]

    async def failing(*args: object, **kwargs: object) -> None:
        raise ValueError("the runner refused it")

    monkeypatch.setattr(cycle_timers, "carry_out", failing)
    retry = op(TimerAction.RETRY, "retry-1", clock)
    await request(log, retry)
    letters = ContextTopics("shop").dead_letters
    await wait_until(
        lambda: sum(len(log.records(letters, p)) for p in range(log.partitions(letters))) >= 1
    )
    monkeypatch.setattr(cycle_timers, "carry_out", real)
    await request(log, retry)
    await request(log, op(TimerAction.SKIP, "skip-1", clock))
    await wait_until(lambda: status(log, "remind") is TimerStatus.CANCELLED or len(NUDGES) > 1)
    assert len(NUDGES) == 1, "the copy of a request dead-lettered was carried out"


def test_a_request_asked_long_before_it_is_carried_out_is_still_its_copies_first() -> None:
    """Its window counted from the sender's `requested_at` (found by a hunt): one written
    in seconds, from a clock behind, or read after a node was down longer than the window
    was forgotten as it was noted, and a copy read a moment later carried out again."""
    applied = AppliedOps(window_ms=WINDOW)
    seconds = new_op(TimerAction.RETRY, OWNER, now=T0 // 1000, request_id="r")
    applied.note(seconds, 5, T0)
    assert applied.duplicate_of(seconds, 6, T0 + 1) == 5


async def test_a_take_counts_a_request_from_when_its_record_was_written() -> None:
    """Read again by a take: the later of its record's time and its `requested_at`."""
    topic = ORDERS.timer_ops
    log = MemoryLog([TopicSpec(topic, 1)], now=lambda: T0)
    seconds = new_op(TimerAction.RETRY, OWNER, now=T0 // 1000, request_id="r")
    await log.publisher().send(topic, b"k", encode(seconds), 0)
    applied = await read_applied_ops(
        log.reader(), topic, 0, now=T0 + 10, window_ms=WINDOW, limits=InputLimits()
    )
    assert applied.duplicate_of(seconds, 1, T0 + 10) == 0


async def test_a_request_read_again_past_the_window_by_a_group_without_offsets_is_not(
    tmp_path: Path,
) -> None:
    """The group's committed offsets deleted (or expired over an outage): its next node
    reads the timer-ops topic from its start. A retry asked longer ago than the window may
    have been carried out under an id forgotten since: dead-lettered, not carried out (it
    retried the timer parked again since)."""
    log, clock = MemoryLog(), FakeClock(T0)

    def a_node() -> RunningNode:
        return RunningNode(
            log, tmp_path, "n", SERVICE, P, clock=clock, timers=OPTIONS,
            request_id_window_ms=WINDOW,
        )  # fmt: skip

    async with running(a_node()):
        await parked(log, clock, "remind")
        await request(log, op(TimerAction.RETRY, "retry-1", clock))
        await wait_until(lambda: len(NUDGES) == 2 and status(log, "remind") is TimerStatus.PARKED)
    log._groups.pop("g")
    clock.advance(WINDOW + 1)
    letters = ContextTopics("shop").dead_letters

    def refused() -> list[DeadLetterContext]:
        found = [
            DeadLetterContext.from_headers(r.headers)
            for p in range(log.partitions(letters))
            for r in log.records(letters, p)
        ]
        return [c for c in found if c.topic == ORDERS.timer_ops]

    async with running(a_node()):
        await wait_until(lambda: len(refused()) == P)  # the retry's record in each partition
    assert len(NUDGES) == 2, "the retry was carried out again"
    assert all("request-id window" in c.exception_message for c in refused())
    assert status(log, "remind") is TimerStatus.PARKED
