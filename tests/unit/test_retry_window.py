"""No slot is sent after its target may have forgotten its request id (a hunt).

A slot's retries were measured from their own due time, so they never expired as a whole:
a policy whose waits add up past the target's request-id window (accepted by the
settings, which held the window against `expires_after` alone) sent the same request id
on days 0, 1, 3, 7, 14 and 21, and the target, having applied the first and forgotten it,
applied the one of day 14 again. An operator's retry sent a PARKED slot however old it
was. Now every send of a slot ends `expires_after` after it was due, the settings keep the
window a day past that, and an operator's retry of a slot older than the window (less a
day) is refused unless asked past it. Rows written before `retry_until` load as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import orjson
import pytest
from fakes import OWNER, T0, TARGET, AnsweringSender, StillClock
from fakes import slot_timer as make
from pydantic import BaseModel

from app.commands.processor import CommandProcessor
from app.kafka import OutRecord
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.node.settings import Settings
from app.node.type_transactions import TypeTransactions
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import encode
from app.timers.runner import SendResult, TimerOptions, TimerRunner
from app.timers.runner.operating import Operated
from app.timers.runner.options import DAY_MS, RetryPolicy
from app.timers.sender import timer_command
from tables import open_timer_store
from tables.aggregate_store import MemoryAggregateStore
from tables.keys import decode_timer, encode_timer, row_key
from tables.ledger import MemoryFailureLedger
from tables.partitioner import partition_of
from tables.rowcheck import restored_index
from tables.rowload import load_timer
from tables.rules import IntervalRule
from tables.store import TimerStore
from tables.timer import Outcome, Timer, TimerStatus
from tables.writes import pause_row, resume_row

PARTITIONS = 4
# The hunt's policy: waits of 1, 2, 4, 7 and 7 days, 21 days in all, six attempts.
LONG = RetryPolicy(
    initial_backoff_ms=DAY_MS, multiplier=2.0, max_backoff_ms=7 * DAY_MS, max_attempts=6
)


class Counter(BaseModel):
    reminded: int = 0


counters = AggregateType(TARGET.context, TARGET.aggregate, Counter)


@counters.command("Remind")
def _remind(state: Counter, cmd: Command, d: Decision) -> None:
    d.emit("Reminded", {})


@pytest.fixture
async def store() -> AsyncIterator[TimerStore]:
    s = open_timer_store("memory://", partitions=1)
    yield s
    await s.close()


class LostResults:
    """The target's own `CommandProcessor` (its request-id window the settings'): every
    command sent is decided there at the clock's time, and its result never comes back
    (TIMEOUT)."""

    def __init__(self, clock: StillClock, window: int) -> None:
        self.clock = clock
        self.window = window
        self.sent: list[tuple[str, int]] = []
        self.log = MemoryLog(now=clock.now)
        self.topics = AggregateTopics(TARGET.context, TARGET.aggregate)
        self.results = ContextTopics(TARGET.context).results
        self.partition = partition_of(TARGET.id, PARTITIONS)
        self.processor: CommandProcessor | None = None

    async def start(self) -> None:
        t = self.topics
        for name in (t.commands, t.events, t.timers_changelog, self.results):
            self.log.create_topic(name, PARTITIONS)
        changes = TypeTransactions(self.log.transactional_writer, t.timers_changelog, "g")
        await changes.open(self.partition)

        async def commit(
            records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]
        ) -> list[int]:
            return await changes.of(self.partition).commit(offsets, records)

        self.processor = CommandProcessor(
            counters,
            self.partition,
            partitions=PARTITIONS,
            states=MemoryAggregateStore(),
            commit=commit,
            now=self.clock.now,
            request_id_window=self.window,
        )

    async def send(self, timer: Timer) -> SendResult:
        assert self.processor is not None
        now = self.clock.now()
        self.sent.append((timer.request_id, (now - T0) // DAY_MS))
        command = timer_command(timer, now, reply_to=self.results, reply_partition=0)
        key = TARGET.id.encode()
        await self.log.publisher().send(self.topics.commands, key, encode(command), self.partition)
        await self.processor.handle([self.log.records(self.topics.commands, self.partition)[-1]])
        return SendResult("TIMEOUT", "no result within the send timeout")

    def applied(self) -> int:
        return sum(len(self.log.records(self.topics.events, p)) for p in range(PARTITIONS))


async def rounds(runner: TimerRunner, store: TimerStore, clock: StillClock, key: str) -> Timer:
    """Rounds at each time the timer is next due, until it leaves PENDING and FIRING."""
    for _ in range(50):
        row = await store.find(OWNER, key)
        assert row is not None
        if row.status not in (TimerStatus.PENDING, TimerStatus.FIRING):
            return row
        clock.t = max(clock.t, row.due_at)
        await runner.run_round()
    raise AssertionError("the timer never settled")


async def test_a_slot_whose_results_never_come_is_applied_once(store: TimerStore) -> None:
    """The hunt's scenario: before, six sends over 21 days, the target applied it twice."""
    options = TimerOptions(retry=LONG)
    window = Settings(timers=options).request_id_window_ms  # the settings take it
    assert window == 7 * DAY_MS
    clock = StillClock(T0)
    target = LostResults(clock, window)
    await target.start()
    assert await store.put(make())  # a one-off due at T0
    runner = TimerRunner(store, target, clock, MemoryFailureLedger(), options, [0])
    row = await rounds(runner, store, clock, "remind")
    # Sent at its slot and at its first retry, a day later; the next, due on day 3, expired.
    assert target.sent == [("t-1#0", 0), ("t-1#0", 1)]
    assert (row.status, row.outcome, row.error_code) == (
        TimerStatus.CANCELLED,
        Outcome.EXPIRED,
        "TIMEOUT",
    )
    assert target.applied() == 1


async def park_slow(store: TimerStore, clock: StillClock, ledger: MemoryFailureLedger) -> None:
    """Default options: a target that never answers in time parks the timer in seconds."""
    assert await store.put(make())
    slow = AnsweringSender(then="TIMEOUT")
    runner = TimerRunner(store, slow, clock, ledger, TimerOptions(), [0])
    row = await rounds(runner, store, clock, "remind")
    assert row.status is TimerStatus.PARKED and clock.t - T0 < 60_000
    assert slow.sent == ["t-1#0"] * TimerOptions().retry.max_attempts


async def test_an_operators_retry_past_the_window_is_refused_unless_asked(
    store: TimerStore,
) -> None:
    """Before, a retry eight days later sent `t-1#0` again: its target, whose window is a
    week, had applied the first send and forgotten it."""
    clock, ledger = StillClock(T0), MemoryFailureLedger()
    await park_slow(store, clock, ledger)
    clock.t = T0 + 8 * DAY_MS
    sender = AnsweringSender()
    runner = TimerRunner(store, sender, clock, ledger, TimerOptions(), [0])
    assert await runner.retry_counted(TARGET) == Operated(changed=0, refused=1)
    await runner.run_round()
    assert sender.sent == []
    row = await store.find(OWNER, "remind")
    assert row is not None and row.status is TimerStatus.PARKED and row.retry_until is None
    # Still named for an operator, who may skip it, or send it knowing what that means.
    assert [e.target for e in await ledger.entries()] == [TARGET]
    assert await runner.retry(TARGET, past_window=True) == 1
    await runner.run_round()
    assert sender.sent == ["t-1#0"]
    row = await store.find(OWNER, "remind")
    assert row is not None and (row.status, row.outcome) == (TimerStatus.FIRED, Outcome.COMMITTED)
    assert await ledger.entries() == []


@pytest.mark.parametrize(("days", "sent"), [(5, True), (6, True), (7, False)])
async def test_an_operators_retry_is_sent_until_a_day_before_the_window_ends(
    store: TimerStore, days: int, sent: bool
) -> None:
    clock, ledger = StillClock(T0), MemoryFailureLedger()
    await park_slow(store, clock, ledger)
    clock.t = T0 + days * DAY_MS - (1 if sent else -1)
    sender = AnsweringSender()
    runner = TimerRunner(store, sender, clock, ledger, TimerOptions(), [0])
    assert await runner.retry(TARGET) == (1 if sent else 0)
    await runner.run_round()
    assert sender.sent == (["t-1#0"] if sent else [])


async def test_an_operators_retry_sends_within_the_window_however_it_fails(
    store: TimerStore,
) -> None:
    """Retried on day 5 (the window a week, less a day: day 6), its sends that fail
    again stop on day 6, not a day after the retry: the hunt's policy would have sent it
    on day 6 and day 8."""
    clock, ledger = StillClock(T0), MemoryFailureLedger()
    await park_slow(store, clock, ledger)
    clock.t = T0 + 5 * DAY_MS
    options = TimerOptions(retry=LONG)
    target = LostResults(clock, 7 * DAY_MS)
    await target.start()
    runner = TimerRunner(store, target, clock, ledger, options, [0])
    assert await runner.retry(TARGET) == 1
    row = await rounds(runner, store, clock, "remind")
    assert target.sent == [("t-1#0", 5), ("t-1#0", 6)]
    assert (row.status, row.outcome) == (TimerStatus.CANCELLED, Outcome.EXPIRED)


# --- rows as an earlier version wrote them ------------------------------------------------

# An operator's retry of 0.2.0 (due again at once, its attempts reset), three days after its
# slot, its send not made yet: no `retry_until`, as every row before it.
OLD_ROW = {
    "id": "t-1",
    "owner": OWNER.model_dump(mode="json"),
    "key": "remind",
    "version": 1,
    "partition": 0,
    "status": "PENDING",
    "rule": {"coalesce": True, "kind": "once", "at": T0},
    "target": TARGET.model_dump(mode="json"),
    "command": {"type": "Remind", "body": {}},
    "slot": 0,
    "slot_due_at": T0,
    "due_at": T0 + 3 * DAY_MS,
    "attempts": 0,
    "skipped": 0,
    "outcome": "FAILED",
    "error_code": "TIMEOUT",
}


async def test_a_row_written_before_retry_until_loads_and_expires_by_its_slot(
    store: TimerStore,
) -> None:
    raw = orjson.dumps(OLD_ROW)
    for loaded in (load_timer(raw), decode_timer(raw)):
        assert loaded.retry_until is None and loaded.outcome is Outcome.FAILED
        assert encode_timer(loaded) == raw, "written back byte for byte"
    restored_index(0, row_key(OWNER, "remind"), raw)  # a restore takes it as it is
    timer = load_timer(raw)
    assert await store.put(timer)
    clock = StillClock(T0 + 3 * DAY_MS)
    sender = AnsweringSender()
    runner = TimerRunner(store, sender, clock, MemoryFailureLedger(), TimerOptions(), [0])
    stats = await runner.run_round()
    # Its slot was due three days ago, past `expires_after` (a day): not sent again.
    assert (stats.expired, sender.sent) == (1, [])


def test_a_resume_that_moves_the_timer_to_a_later_slot_drops_the_retrys_horizon() -> None:
    """`retry_until` is the operator's retry's of one slot: a resume that catches up to a
    later slot clears it, one that keeps the slot keeps it."""
    rule = IntervalRule(start=T0, every=DAY_MS)
    retried = make(rule, outcome=Outcome.FAILED, retry_until=T0 + 2 * DAY_MS)
    paused = pause_row(retried, 2)
    assert paused is not None and paused.retry_until == T0 + 2 * DAY_MS
    kept = resume_row(paused, 3, T0 + DAY_MS // 2)
    assert kept is not None and (kept.slot, kept.retry_until) == (0, T0 + 2 * DAY_MS)
    moved = resume_row(paused, 3, T0 + 3 * DAY_MS)
    assert moved is not None and (moved.slot, moved.retry_until) == (3, None)
    assert "retry_until" not in orjson.loads(encode_timer(moved))


# --- the settings -------------------------------------------------------------------------


def test_the_window_must_outlast_expiry_by_a_day() -> None:
    six_and_a_half = 6 * DAY_MS + DAY_MS // 2
    timers = TimerOptions(expires_after=six_and_a_half)
    # Not given, the window is a day past the expiry; given shorter, refused at start.
    assert Settings(timers=timers).request_id_window_ms == six_and_a_half + DAY_MS
    with pytest.raises(ValueError, match="must be at least"):
        Settings(timers=timers, request_id_window_ms=7 * DAY_MS)
    ok = Settings(timers=TimerOptions(expires_after=6 * DAY_MS), request_id_window_ms=7 * DAY_MS)
    assert ok.request_id_window_ms == 7 * DAY_MS
