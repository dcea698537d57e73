"""A partition's lifecycle on the in-memory log (#19): what a node must never do when its
membership, its commits or its cycles are cut short. Each test is the reproduction of a
bug found by reading (a record lost after a lost membership, a timer fired after its
cancel was decided, half a cycle committed by a hand-off), fixed since."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fakes import RunningNode, wait_until
from pydantic import BaseModel

from app.errors import KafkaUnavailable, NodeFailed
from app.kafka.memory import MemoryLog
from app.kafka.memory_group import MemoryGroupMember
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.node.task_id import TaskId
from app.node.task_state import TaskState
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import CommandEnvelope, CommandResult, EventEnvelope, decode, encode
from app.service import Service
from app.timers.operator import request_skip
from app.timers.runner import RetryPolicy, TimerOptions
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerStatus
from tables.partitioner import partition_of

PARTITIONS = 2


class Count(BaseModel):
    fired: int = 0


def timed_type(name: str) -> AggregateType[Count]:
    """ "Schedule" sets timer "k" (firing "Fire" on the aggregate itself: in-process),
    "Unschedule" cancels it, "Remind" sets timer "r" firing "Fire" on another aggregate (a
    remote send, through the commands topic), "Fire" emits "Fired". "Doom" and
    "Misremind" set timers whose command ("Nope") has no handler, fired in-process and
    sent remotely."""
    agg = AggregateType("life", name, Count)

    @agg.command("Schedule")
    def _schedule(state: Count, cmd: Command, d: Decision) -> None:
        d.schedule("k", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Fire"))

    @agg.command("Unschedule")
    def _unschedule(state: Count, cmd: Command, d: Decision) -> None:
        d.cancel_schedule(str(cmd.body.get("key", "k")))

    @agg.command("Remind")
    def _remind(state: Count, cmd: Command, d: Decision) -> None:
        target = AggregateRef(context="life", aggregate=name, id=cmd.body["target"])
        d.schedule("r", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Fire"), target)

    @agg.command("Doom")
    def _doom(state: Count, cmd: Command, d: Decision) -> None:
        d.schedule("d", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Nope"))

    @agg.command("Misremind")
    def _misremind(state: Count, cmd: Command, d: Decision) -> None:
        target = AggregateRef(context="life", aggregate=name, id=cmd.body["target"])
        d.schedule("m", OnceRule(at=int(cmd.body["at"])), CommandSpec(type="Nope"), target)

    @agg.command("Fire")
    def _fire(state: Count, cmd: Command, d: Decision) -> None:
        d.emit("Fired", {"n": state.fired + 1})

    @agg.applies("Fired")
    def _fired(state: Count, e: Event) -> Count:
        return state.model_copy(update={"fired": e.body["n"]})

    return agg


COUNTER, GAUGE = timed_type("counter"), timed_type("gauge")
SERVICE = Service(aggregates=(COUNTER, GAUGE))
TOPICS = {a.name: AggregateTopics("life", a.name) for a in (COUNTER, GAUGE)}


def same_partition(a: str, b: str) -> bool:
    return partition_of(a, PARTITIONS) == partition_of(b, PARTITIONS)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
async def log() -> AsyncIterator[MemoryLog]:
    yield MemoryLog()


@pytest.fixture
async def nodes() -> AsyncIterator[list[RunningNode]]:
    started: list[RunningNode] = []
    yield started
    for held in HeldCommits.held:
        held.release()  # a test that failed holding commits: its nodes can stop
    HeldCommits.held.clear()
    for n in reversed(started):
        await n.stop()


async def start(
    nodes: list[RunningNode],
    log: MemoryLog,
    data: Path,
    name: str,
    options: TimerOptions | None = None,
) -> RunningNode:
    n = await RunningNode(log, data, name, SERVICE, PARTITIONS, options=options).start()
    nodes.append(n)
    return n


async def command(
    log: MemoryLog, agg: AggregateType[Any], owner: str, type_: str, **body: Any
) -> CommandEnvelope:
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type=type_,
        aggregate=AggregateRef(context="life", aggregate=agg.name, id=owner),
        body=body,
        issued_at=now_ms(),
    )
    p = partition_of(owner, PARTITIONS)
    await log.publisher().send(TOPICS[agg.name].commands, owner.encode(), encode(cmd), p)
    return cmd


def events(log: MemoryLog, agg: AggregateType[Any], type_: str) -> list[EventEnvelope]:
    found = []
    for p in range(PARTITIONS):
        for r in log.records(TOPICS[agg.name].events, p):
            e = decode(EventEnvelope, r.value)
            if e.type == type_:
                found.append(e)
    return found


def timer_rows(log: MemoryLog, agg: AggregateType[Any]) -> list[Timer]:
    latest: dict[bytes, bytes | None] = {}
    for p in range(PARTITIONS):
        for r in log.records(TOPICS[agg.name].timers_changelog, p):
            assert r.key is not None
            latest[r.key] = r.value
    return [Timer.model_validate_json(v) for v in latest.values() if v is not None]


class HeldCommits:
    """Holds every transaction of the log between its writes and its commit while set."""

    held: ClassVar[list[HeldCommits]] = []

    def __init__(self, log: MemoryLog) -> None:
        self.entered = asyncio.Event()
        self._open = asyncio.Event()
        log.before_commit = self._before
        HeldCommits.held.append(self)

    async def _before(self, transactional_id: str) -> None:
        self.entered.set()
        await self._open.wait()

    def release(self) -> None:
        self._open.set()


async def test_records_after_the_last_done_in_a_batch_read_again_are_not_lost(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node lost its group membership while a cycle's work was staged but not committed:
    on joining again the consumer reads from the committed offset, behind what the worker
    did, and one batch holds both the records it did and one it never saw. That record is
    decided (it was dropped with the batch, for good: the position moved past it)."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    member = log.groups["g"].members[0]
    held = HeldCommits(log)
    other = next(f"o{i}" for i in range(2, 50) if same_partition("o1", f"o{i}"))
    await command(log, COUNTER, "o1", "Schedule", at=now_ms() + 3_600_000)
    await wait_until(held.entered.is_set)  # decided, its commit held: staged, not committed
    # The poll loop parked at its next poll, so the next record waits for the rejoin.
    parked = asyncio.Event()
    poll = member.poll

    async def parked_poll(timeout_ms: int = 500) -> Any:
        if not member._polls.is_set():
            parked.set()
        return await poll(timeout_ms)

    monkeypatch.setattr(member, "poll", parked_poll)
    member.hold_polls()
    await wait_until(parked.is_set)
    await command(log, COUNTER, other, "Schedule", at=now_ms() + 3_600_000)
    await log.groups["g"].expel(member)  # a lost membership: the same partitions come back
    member.release_polls()
    await wait_until(lambda: not member.expelled)
    held.release()
    await wait_until(lambda: {t.owner.id for t in timer_rows(log, COUNTER)} == {"o1", other})


@pytest.mark.parametrize("remote", [False, True], ids=["in-process", "remote"])
async def test_a_timer_does_not_fire_after_its_cancel_was_decided(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, remote: bool
) -> None:
    """The cancel is decided (its ScheduleCancelled staged in the partition's transaction)
    before the timer falls due, but its commit is slow (a leader changing), so the
    subscription has not read it back into the timer table when the runner takes the
    timer: fired in-process or sent, it must see the cancel all the same."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    due = now_ms() + 1_000
    if remote:
        await command(log, COUNTER, "o1", "Remind", at=due, target=elsewhere("o1"))
    else:
        await command(log, COUNTER, "o1", "Schedule", at=due)
    await wait_until(lambda: len(timer_rows(log, COUNTER)) == 1)
    held = HeldCommits(log)
    await command(log, COUNTER, "o1", "Unschedule", key="r" if remote else "k")
    await wait_until(held.entered.is_set)  # decided; its commit held, so not read back
    kept = node.node.types[COUNTER.type_name]
    await wait_until(lambda: now_ms() > due + 100)
    await wait_until(lambda: kept.runner.backlog(now_ms())[0] == 0)  # taken and decided
    held.release()
    rounds = kept.loop.rounds
    await wait_until(lambda: not kept.transactions.pending() and node.node.commits.lag() == 0)
    await wait_until(lambda: kept.loop.rounds >= rounds + 2 and kept.runner.in_flight == 0)
    assert events(log, COUNTER, "wow.ScheduleCancelled")
    assert events(log, COUNTER, "Fired") == [], "fired after its cancel was decided"
    assert [t.status for t in timer_rows(log, COUNTER)] == [TimerStatus.CANCELLED]


async def test_a_cycle_asks_the_consumers_backlog_holding_no_lock(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle of commands asks the consumer how far behind the commands topic is (a Kafka
    client's call, which waits for a position): before it takes its partition's lock, so
    that no lock is held across it (a commit of the partition may go on meanwhile)."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    n = node.node
    asked: list[tuple[str, int, bool]] = []
    backlog = n.cycles._backlog

    async def watched(topic: str, p: int) -> int:
        task = n.tasks.running.get(TaskId(COUNTER.type_name, p))
        inp = task.input if task is not None else None
        asked.append((topic, p, inp is not None and inp.lock.locked()))
        return await backlog(topic, p)

    monkeypatch.setattr(n.cycles, "_backlog", watched)
    await command(log, COUNTER, "o1", "Schedule", at=now_ms() + 3_600_000)
    await wait_until(lambda: len(timer_rows(log, COUNTER)) == 1)
    p = partition_of("o1", PARTITIONS)
    assert (TOPICS[COUNTER.name].commands, p, False) in asked
    assert not any(locked for _, _, locked in asked), asked


@pytest.mark.parametrize("raised", [KafkaUnavailable, AssertionError], ids=["kafka", "client"])
async def test_a_backlog_the_consumer_cannot_tell_counts_none_and_the_cycle_goes_on(
    log: MemoryLog,
    nodes: list[RunningNode],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    raised: type[Exception],
) -> None:
    """The consumer's backlog only bounds how busy a partition says it is: when it cannot
    tell (its coordinator failing; aiokafka asserts for a partition no longer assigned),
    the commands are decided all the same and the task is not taken afresh."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    n, p = node.node, partition_of("o1", PARTITIONS)
    task = n.tasks.running[TaskId(COUNTER.type_name, p)]
    takes = task.takes

    async def failing(topic: str, q: int) -> int:
        raise raised("the consumer cannot tell")

    monkeypatch.setattr(n.cycles, "_backlog", failing)
    await command(log, COUNTER, "o1", "Schedule", at=now_ms() + 3_600_000)
    await wait_until(lambda: len(timer_rows(log, COUNTER)) == 1)
    assert task.takes == takes and n.tasks.running[task.key] is task


async def test_the_consumers_backlog_bounds_how_busy_a_partition_answers(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlog a cycle asked for is the one its commands are decided with: past the
    busy bound, a command is answered BUSY rather than decided."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    n = node.node

    async def flooded(topic: str, q: int) -> int:
        return 10**6

    monkeypatch.setattr(n.cycles, "_backlog", flooded)
    cmd = await command(log, COUNTER, "o1", "Schedule", at=now_ms() + 3_600_000)

    def answer() -> str | None:
        for p in range(PARTITIONS):
            for r in log.records(ContextTopics("life").results, p):
                res = decode(CommandResult, r.value)
                if res.request_id == cmd.request_id:
                    return res.code.value
        return None

    await wait_until(lambda: answer() is not None)
    assert answer() == "BUSY" and timer_rows(log, COUNTER) == []


async def test_a_worker_cancelled_by_anything_but_its_stop_has_its_task_taken_afresh(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `CancelledError` leaking out of a client's call ends the partition's worker as a
    cancellation would: its task is closed and taken afresh (never a task that looks as if
    it runs while nothing decides its partition), and the command is decided after."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    n, p = node.node, partition_of("o1", PARTITIONS)
    task = n.tasks.running[TaskId(COUNTER.type_name, p)]
    takes = task.takes
    backlog = n.cycles._backlog
    leaked = False

    async def leaking(topic: str, q: int) -> int:
        nonlocal leaked
        if q == p and not leaked:
            leaked = True
            raise asyncio.CancelledError  # as from a client's future cancelled under it
        return await backlog(topic, q)

    monkeypatch.setattr(n.cycles, "_backlog", leaking)
    await command(log, COUNTER, "o1", "Schedule", at=now_ms() + 3_600_000)
    await wait_until(lambda: leaked)
    await wait_until(lambda: len(timer_rows(log, COUNTER)) == 1)
    assert task.takes > takes


async def test_a_hand_off_in_the_middle_of_a_cycle_commits_none_of_it(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each type's timer of the same partition fires in its task's cycle; each outcome is
    written (its row FIRED, buffered for the transaction) and the partition is handed off
    while the cycles are still deciding (their Fired events not staged yet). Nothing of
    either cycle may commit: a FIRED row whose Fired event was never written is a timer
    lost. (One cycle held both types' work before a task per type and partition: the
    second type's was cut short after the first's settle; now each type's cycle is cut
    short after its own.)"""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    p = partition_of("o1", PARTITIONS)
    due = now_ms() + 800
    for agg in (COUNTER, GAUGE):
        await command(log, agg, "o1", "Schedule", at=due)
    await wait_until(lambda: len(timer_rows(log, COUNTER)) == len(timer_rows(log, GAUGE)) == 1)
    calls = 0
    for agg in (COUNTER, GAUGE):
        runner = node.node.types[agg.type_name].runner
        record_outcomes = runner.record_outcomes

        async def stalling(results: Any, record_outcomes: Any = record_outcomes) -> Any:
            nonlocal calls
            stats = await record_outcomes(results)  # the settle written, in the transaction
            calls += 1
            await asyncio.Event().wait()  # the cycle goes no further: until cut short
            return stats

        monkeypatch.setattr(runner, "record_outcomes", stalling)
    await wait_until(lambda: calls == 2)
    await start(nodes, log, tmp_path, "b")  # the hand-off
    await wait_until(
        lambda: len(events(log, COUNTER, "Fired")) == len(events(log, GAUGE, "Fired")) == 1
    )
    for agg in (COUNTER, GAUGE):
        assert [t.status for t in timer_rows(log, agg)] == [TimerStatus.FIRED]
        # Its local copy holds its settle, never committed: not marked clean.
        clean = tmp_path / "a" / agg.type_name / "timers" / f"clean-p{p}"
        assert not clean.exists(), "a local copy with uncommitted writes marked clean"


def elsewhere(owner: str) -> str:
    """An aggregate of another partition than `owner`'s: its timers' sends are remote."""
    return next(f"t{i}" for i in range(50) if not same_partition(owner, f"t{i}"))


async def failed_node(n: RunningNode) -> NodeFailed:
    """The node's run, ended on its failure (`RunningNode.stop` awaits it no more)."""
    assert n.task is not None
    await wait_until(n.task.done)
    error = n.task.exception()
    n.task = None
    assert isinstance(error, NodeFailed), error
    return error


async def test_the_results_reader_reads_on_after_the_broker_was_away(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One poll of the results topic fails (the broker away): the reader reads on, and the
    result of a remote send made since settles its timer."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    follower = node.node._results["life"]._reader
    poll = follower.poll
    failed = 0

    async def flaky(timeout_ms: int = 200) -> list[Any]:
        nonlocal failed
        if not failed:
            failed += 1
            raise KafkaUnavailable("the leader of the results partition is away")
        got: list[Any] = await poll(timeout_ms)
        return got

    monkeypatch.setattr(follower, "poll", flaky)
    await wait_until(lambda: failed == 1)
    await command(log, COUNTER, "o1", "Remind", at=now_ms() + 100, target=elsewhere("o1"))
    await wait_until(lambda: [t.status for t in timer_rows(log, COUNTER)] == [TimerStatus.FIRED])
    assert len(events(log, COUNTER, "Fired")) == 1
    assert node.runs()


async def test_a_results_reader_that_stops_stops_the_node_loudly(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error no retry passes ends the results reader: every remote send of its context
    would wait for ever, so the node stops, saying why, and /healthz says so."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    follower = node.node._results["life"]._reader

    async def broken(timeout_ms: int = 200) -> list[Any]:
        raise RuntimeError("a bug in the reader")

    monkeypatch.setattr(follower, "poll", broken)
    error = await failed_node(node)
    assert "results reader of life" in str(error) and "a bug in the reader" in str(error)
    health = node.node.health()
    assert not health["ready"] and "a bug in the reader" in health["failed"]


@pytest.mark.parametrize(
    "raised",
    [RuntimeError("resuming failed"), asyncio.CancelledError("leaked by a client")],
    ids=["error", "cancelled"],
)
async def test_a_take_that_fails_on_an_unexpected_error_stops_the_node_loudly(
    log: MemoryLog,
    nodes: list[RunningNode],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
) -> None:
    """A take that fails outside its retried steps (here resuming the consumer) leaves no
    partition half taken and quietly so: the node stops, naming the partition. So does a
    CancelledError raised out of a call the take makes (a client's), not a cancel of the
    take: it had ended the take's task with nothing said, its partition left restoring
    for ever with /healthz not ready."""
    resume = MemoryGroupMember.resume
    calls = 0

    def failing_once(self: MemoryGroupMember, partitions: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise raised
        resume(self, partitions)

    monkeypatch.setattr(MemoryGroupMember, "resume", failing_once)
    node = await start(nodes, log, tmp_path, "a")
    error = await failed_node(node)
    assert "taking partition" in str(error) and type(raised).__name__ in str(error)
    assert str(raised) in str(error) and str(raised) in node.node.health()["failed"]


class HeldOnce(HeldCommits):
    """Holds the first transaction of the log for good; the later ones commit."""

    async def _before(self, transactional_id: str) -> None:
        if not self.entered.is_set():
            self.entered.set()
            await self._open.wait()


async def test_a_commit_that_hangs_is_given_up_and_its_partition_taken_afresh(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path
) -> None:
    """A commit that never answers (a broker that accepts and hangs) is given up at its
    deadline: the partition is let go and taken afresh, and what the hung transaction held
    is decided again and committed."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    node.node.commits.deadline_s = 0.3
    held = HeldOnce(log)
    await command(log, COUNTER, "o1", "Schedule", at=now_ms() + 3_600_000)
    await wait_until(held.entered.is_set)
    await wait_until(lambda: len(timer_rows(log, COUNTER)) == 1)
    failed = node.node.metrics.registry.get_sample_value(
        "tickwheel_partitions_let_go_total", {"reason": "failed"}
    )
    assert failed == 1
    await wait_until(node.runs)


async def test_staging_waits_for_a_commit_in_flight_beyond_its_bound(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path
) -> None:
    """While a partition's commit hangs, its cycles stage no more than the bound (and one
    cycle's worth): the batches wait in the worker's queue, then in the poll loop. Once
    the commit is through, everything waiting is decided."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    node.node.commits.max_staged = 4
    held = HeldCommits(log)
    p = partition_of("o1", PARTITIONS)
    owners = [o for o in (f"o{i}" for i in range(200)) if partition_of(o, PARTITIONS) == p][:30]
    kept = node.node.types[COUNTER.type_name]
    member = log.groups["g"].members[0]
    commands = (TOPICS[COUNTER.name].commands, p)
    queue = node.node.tasks.running[TaskId(COUNTER.type_name, p)].queue
    most = 0
    for owner in owners:
        await command(log, COUNTER, owner, "Schedule", at=now_ms() + 3_600_000)
        end = log.offsets(*commands)[1]

        def read_or_held(end: int = end) -> bool:
            """Read, or the poll loop held up by a queue full of batches."""
            return member._positions[commands] == end or queue.full()

        await wait_until(read_or_held)
        most = max(most, (txn.waiting() if (txn := kept.transactions.get(p)) else 0))
    assert held.entered.is_set()
    assert most <= 4 + 3, f"{most} records staged behind a hung commit"
    held.release()
    await wait_until(lambda: len(timer_rows(log, COUNTER)) == len(owners))


async def test_an_in_process_park_waits_for_the_ledger_outside_its_partitions_cycle(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timer fired in-process is parked while the ledger does not answer (its calls may
    take seconds): its partition's cycles go on meanwhile (a command of the same partition
    is decided and committed; no cycle holds its lock across the ledger call), and so do
    the other partitions' timers. Its row waits as its last attempt to send again after
    the backoff, and is parked once the ledger has its target."""
    options = TimerOptions(retry=RetryPolicy(max_attempts=1))
    node = await start(nodes, log, tmp_path, "a", options)
    await wait_until(node.runs)
    calling, answer = asyncio.Event(), asyncio.Event()
    ledger = node.node._ledgers["life"]
    record = ledger.record

    async def slow(*args: Any) -> None:
        calling.set()
        await answer.wait()
        await record(*args)

    monkeypatch.setattr(ledger, "record", slow)
    await command(log, COUNTER, "o1", "Doom", at=now_ms() + 100)
    await wait_until(calling.is_set)

    def doomed() -> list[TimerStatus]:
        return [t.status for t in timer_rows(log, COUNTER) if t.owner.id == "o1"]

    await wait_until(lambda: doomed() == [TimerStatus.PENDING])
    neighbour = next(f"o{i}" for i in range(2, 50) if same_partition("o1", f"o{i}"))
    await command(log, COUNTER, neighbour, "Schedule", at=now_ms() + 3_600_000)
    await wait_until(lambda: neighbour in {t.owner.id for t in timer_rows(log, COUNTER)})
    other = elsewhere("o1")
    await command(log, COUNTER, other, "Schedule", at=now_ms() + 100)
    await wait_until(lambda: [e.aggregate.id for e in events(log, COUNTER, "Fired")] == [other])
    assert doomed() == [TimerStatus.PENDING] and await ledger.entries() == []

    answer.set()
    await wait_until(lambda: doomed() == [TimerStatus.PARKED])
    [entry] = await ledger.entries()
    [parked] = [t for t in timer_rows(log, COUNTER) if t.owner.id == "o1"]
    assert parked.request_id in entry.timers


async def test_an_operators_request_resolves_its_entry_outside_its_partitions_cycle(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's skip is read in the cycle of its partition, which settles the PARKED
    row there; its ledger entry is resolved by the partition's next round, so while the
    ledger does not answer, the partition's cycles go on (a command of it is decided and
    committed). The entry is resolved once the ledger answers."""
    options = TimerOptions(retry=RetryPolicy(max_attempts=1))
    node = await start(nodes, log, tmp_path, "a", options)
    await wait_until(node.runs)
    ledger = node.node._ledgers["life"]
    await command(log, COUNTER, "o1", "Doom", at=now_ms() + 100)

    def doomed() -> list[TimerStatus]:
        return [t.status for t in timer_rows(log, COUNTER) if t.owner.id == "o1"]

    await wait_until(lambda: doomed() == [TimerStatus.PARKED])
    [entry] = await ledger.entries()
    calling, answer, resolved = asyncio.Event(), asyncio.Event(), asyncio.Event()
    resolve = ledger.resolve

    async def slow(*args: Any) -> bool:
        calling.set()
        await answer.wait()
        try:
            return await resolve(*args)
        finally:
            resolved.set()

    monkeypatch.setattr(ledger, "resolve", slow)
    await request_skip(log, COUNTER.type_name, entry.target, PARTITIONS)
    await wait_until(calling.is_set)
    await wait_until(lambda: doomed() == [TimerStatus.CANCELLED])
    neighbour = next(f"o{i}" for i in range(2, 50) if same_partition("o1", f"o{i}"))
    await command(log, COUNTER, neighbour, "Schedule", at=now_ms() + 3_600_000)
    await wait_until(lambda: neighbour in {t.owner.id for t in timer_rows(log, COUNTER)})
    assert len(await ledger.entries()) == 1

    answer.set()
    await wait_until(resolved.is_set)
    assert await ledger.entries() == []


async def test_a_remote_park_whose_ledger_call_hangs_holds_no_other_partition_up(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timer sent through the commands topic fails and is parked, and the ledger does
    not answer (its calls may take seconds): its partition's outcomes wait for it, the
    other partition's timers fire and settle meanwhile (no lock of theirs is held)."""
    options = TimerOptions(retry=RetryPolicy(max_attempts=1))
    node = await start(nodes, log, tmp_path, "a", options)
    await wait_until(node.runs)
    parking, answer = asyncio.Event(), asyncio.Event()

    async def hanging(*args: Any) -> None:
        """Answers when the test ends, as the real ledger's timeout does (a node's stop
        waits for the outcomes under way)."""
        parking.set()
        await answer.wait()
        raise TimeoutError("the ledger did not answer")

    monkeypatch.setattr(node.node._ledgers["life"], "record", hanging)
    other = elsewhere("o1")
    await command(log, COUNTER, "o1", "Misremind", at=now_ms() + 100, target=other)
    await wait_until(parking.is_set)
    await command(log, COUNTER, other, "Schedule", at=now_ms() + 100)
    await wait_until(lambda: [e.aggregate.id for e in events(log, COUNTER, "Fired")] == [other])

    def settled() -> bool:
        rows = {t.owner.id: t.status for t in timer_rows(log, COUNTER)}
        return rows == {"o1": TimerStatus.FIRING, other: TimerStatus.FIRED}

    await wait_until(settled)
    answer.set()


async def test_claims_wait_for_the_commit_in_flight_and_never_commit_beside_it(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote send's claims must commit before it leaves; with a commit of the partition
    in flight they wait for it, then commit, rather than start a second commit beside it
    (which a let-go would not cancel, and whose start hides the first one's lag)."""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    await command(log, COUNTER, "o1", "Remind", at=now_ms() + 1_000, target=elsewhere("o1"))
    await wait_until(lambda: len(timer_rows(log, COUNTER)) == 1)
    held = HeldCommits(log)
    other = next(f"o{i}" for i in range(2, 50) if same_partition("o1", f"o{i}"))
    await command(log, COUNTER, other, "Schedule", at=now_ms() + 3_600_000)
    await wait_until(held.entered.is_set)
    commits = node.node.commits
    claims = commits.commit_claims
    beside: list[int] = []

    async def watching(kept: Any, partitions: set[int]) -> None:
        task = asyncio.ensure_future(claims(kept, partitions))
        await asyncio.sleep(0)  # it runs up to its first wait
        running = [t for t in asyncio.all_tasks() if t.get_name().startswith("commit (")]
        beside.append(len([t for t in running if not t.done()]))
        await task

    monkeypatch.setattr(commits, "commit_claims", watching)
    await wait_until(lambda: bool(beside))
    assert beside == [1], "a second commit started beside the one in flight"
    held.release()

    def sent() -> bool:
        return [t.status for t in timer_rows(log, COUNTER) if t.key == "r"] == [TimerStatus.FIRED]

    await wait_until(sent)


async def test_a_fault_in_one_types_work_of_a_partition_leaves_the_other_types_task_running(
    log: MemoryLog, nodes: list[RunningNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task per type and partition: COUNTER's commit of p fails, so its task of p is
    closed dirty and taken afresh (its retake held here); meanwhile GAUGE's task of p is
    never touched: it runs the same take, and its commands of p are decided, fired and
    committed while COUNTER's p is still being taken. (One task per partition failed and
    retook both types' p together: GAUGE's work waited for COUNTER's retake.)"""
    node = await start(nodes, log, tmp_path, "a")
    await wait_until(node.runs)
    p = partition_of("o1", PARTITIONS)
    counter_key, gauge_key = TaskId(COUNTER.type_name, p), TaskId(GAUGE.type_name, p)
    running = node.node.tasks.running
    counter, gauge = running[counter_key], running[gauge_key]
    assert counter is not gauge and counter.takes == gauge.takes == 1
    # COUNTER's next commit of p fails (once); its retake is held while `retaking` is unset.
    failing_id = f"{TOPICS[COUNTER.name].timers_changelog}.{p}"
    failed_commits: list[str] = []

    async def failing_once(transactional_id: str) -> None:
        if transactional_id.endswith(failing_id) and not failed_commits:
            failed_commits.append(transactional_id)
            raise KafkaUnavailable(f"{transactional_id}: the commit failed")

    log.before_commit = failing_once
    kept = node.node.types[COUNTER.type_name]
    open_, retaking = kept.transactions.open, asyncio.Event()

    async def held_open(partition: int) -> Any:
        if partition == p and failed_commits:
            await retaking.wait()
        return await open_(partition)

    monkeypatch.setattr(kept.transactions, "open", held_open)
    await command(log, COUNTER, "o1", "Schedule", at=now_ms() + 3_600_000)
    await wait_until(lambda: bool(failed_commits) and counter.taking)
    assert counter_key not in running and p in node.node.restoring
    # What the operator page and the timer API ask before they read a type's store of p.
    assert not node.node.owns(COUNTER.type_name, p) and node.node.owns(GAUGE.type_name, p)
    # GAUGE's task of p runs on, untouched: its command decided, its timer fired in-process
    # and its Fired event committed, while COUNTER's p is still being taken.
    await command(log, GAUGE, "o1", "Schedule", at=now_ms() + 200)
    await wait_until(lambda: len(events(log, GAUGE, "Fired")) == 1)
    assert counter.taking and not retaking.is_set()
    assert running[gauge_key] is gauge and gauge.takes == 1
    assert gauge.state is TaskState.RUNNING and gauge.broken is None
    assert [t.status for t in timer_rows(log, GAUGE)] == [TimerStatus.FIRED]
    # COUNTER's task, revived, runs again (taken afresh: its Schedule read again, decided).
    retaking.set()
    await wait_until(lambda: running.get(counter_key) is counter and counter.takes == 2)
    await wait_until(lambda: [t.key for t in timer_rows(log, COUNTER)] == ["k"])
    assert running[gauge_key] is gauge and gauge.takes == 1
