"""Fakes the unit tests share: clocks, senders, a counting store, a spying ledger, a local
firer, timer factories, and the runner's world (a store of each backend, a fake clock, a
scripted sender) with its fixtures; and the metric names the dashboard queries. Nothing
here sleeps in real time or needs a broker. It re-exports `fakes_node`'s whole node on the
in-memory log (`RunningNode`, `running`, `wait_until`), which runs in real time.

A module that uses the fixtures imports them (`raw_store`, `world`) for pytest to find.
The integration tests import it too (pytest's `pythonpath` puts tests/unit on the path): it
imports no test module.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Sequence,
    Set,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fakes_node import WEB_TOKEN as WEB_TOKEN
from fakes_node import FakeClock as FakeClock
from fakes_node import RunningNode as RunningNode
from fakes_node import WebNode as WebNode
from fakes_node import running as running
from fakes_node import wait_until as wait_until
from fakes_node import web_node as web_node
from pydantic import BaseModel

from app.clients.book_commands import unscoped_request_id
from app.errors import TickwheelError
from app.kafka.clients import KafkaClients
from app.kafka.ports import Clients
from app.kafka.records import OutRecord, Record
from app.model.aggregate import AggregateType, Command, Decision
from app.node.metrics import NodeMetrics
from app.node.settings import Settings
from app.ops.op_answers import Answered
from app.ops.page_timer_ops import Asker
from app.protocol.wire import OpOutcome, TimerAction, TimerOp, TimerOpAnswer, decode
from app.timers.op_answers import answer_record
from app.timers.runner import InProcessTargets, SendResult, TimerOptions, TimerRunner
from tables.census import TimerCensus
from tables.ledger import FailureLedger, MemoryFailureLedger
from tables.memory_store import MemoryTimerStore
from tables.refs import AggregateRef
from tables.rules import CronRule, IntervalRule, OnceRule
from tables.slots import Slot, first_slot
from tables.store import ChangelogRecord, DueRow, TimerStore
from tables.timer import CommandSpec, Outcome, Timer, TimerChange, TimerStatus

T0 = 1_800_000_000_000
MIN = 60_000
PARTITIONS = 3
OWNER = AggregateRef(context="shop", aggregate="order", id="o-1")
TARGET = AggregateRef(context="shop", aggregate="order", id="o-2")
ONCE = OnceRule(at=T0)
EVERY_MIN = IntervalRule(start=T0, every=MIN)

# --- clocks -------------------------------------------------------------------------------


class StillClock:
    """Time moves only when a test sets `t`; a wait for a later time never ends by itself."""

    def __init__(self, now: int) -> None:
        self.t = now

    def now(self) -> int:
        return self.t

    async def sleep_until(self, t: int) -> None:
        if t > self.t:
            await asyncio.Event().wait()


# --- senders and local firers -------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    request_id: str
    target: AggregateRef
    command: str
    not_before: int
    at: int


Script = Callable[[Timer], "SendResult | Awaitable[SendResult]"]


class FakeSender:
    """Answers each send with what `script` says for it, and records every send."""

    def __init__(self, clock: FakeClock, script: Script) -> None:
        self.clock = clock
        self.script = script
        self.sends: list[Sent] = []
        self.timers: list[Timer] = []
        self.cancelled: list[str] = []

    async def send(self, timer: Timer) -> SendResult:
        self.timers.append(timer)
        self.sends.append(
            Sent(
                timer.request_id,
                timer.target,
                timer.command.type,
                timer.slot_due_at,
                self.clock.now(),
            )
        )
        try:
            result = self.script(timer)
            if inspect.isawaitable(result):
                result = await result
            return result
        except asyncio.CancelledError:
            self.cancelled.append(timer.request_id)
            raise

    @property
    def request_ids(self) -> list[str]:
        return [s.request_id for s in self.sends]


def always(code: str) -> Script:
    return lambda _timer: SendResult(code)


def scripted(answers: dict[str, list[str]], default: str = "COMMITTED") -> Script:
    """Per request id, the codes of its sends in turn; `default` once they run out."""
    queues = {rid: list(codes) for rid, codes in answers.items()}

    def script(timer: Timer) -> SendResult:
        queue = queues.get(timer.request_id)
        return SendResult(queue.pop(0) if queue else default)

    return script


async def never(_timer: Timer) -> SendResult:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


class AnsweringSender:
    """Answers with the codes given, in turn, then with `then`; records each request id."""

    def __init__(self, *codes: str, then: str = "COMMITTED") -> None:
        self.codes = list(codes)
        self.then = then
        self.sent: list[str] = []

    async def send(self, timer: Timer) -> SendResult:
        self.sent.append(timer.request_id)
        return SendResult(self.codes.pop(0) if self.codes else self.then)


class FakeLocal:
    """In-process firing as a node's cycles ask for it: the timers of `TARGET`'s type aimed
    at their own partition fire in-process (or, `accept=False`, none does); `fired` is
    every timer the runner claimed to fire in-process, as the partitions' cycles take them
    (`TimerRunner.in_process_due`). Handed to the runner as its `in_process`, then bound."""

    def __init__(self, accept: bool = True) -> None:
        self.targets = (
            InProcessTargets(TARGET.context, TARGET.aggregate, PARTITIONS) if accept else None
        )
        self.runner: TimerRunner | None = None
        self._fired: list[Timer] = []

    @property
    def fired(self) -> list[Timer]:
        assert self.runner is not None, "bind the runner first"
        for p in sorted(self.runner.partitions):
            self._fired += self.runner.in_process_due(p)
        return self._fired


# --- a store that counts, a ledger that spies ---------------------------------------------


class CountingStore:
    """The store, with its runner-facing calls counted and hooks to race the runner."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.due_calls: list[tuple[frozenset[int], int, int]] = []
        self.firing_calls: list[frozenset[int]] = []
        self.settle_calls: list[list[TimerChange]] = []
        self.find_calls = 0
        self.after_due: Callable[[list[Timer]], Awaitable[None]] | None = None
        self.before_settle: Callable[[], Awaitable[None]] | None = None
        self.fail_settle: Callable[[int], bool] = lambda _n: False

    async def due(self, partitions: Set[int], until: int, limit: int) -> list[Timer]:
        self.due_calls.append((frozenset(partitions), until, limit))
        rows = await self.inner.due(partitions, until=until, limit=limit)
        if self.after_due is not None:
            await self.after_due(rows)
        return list(rows)

    async def due_rows(self, partitions: Set[int], until: int, limit: int) -> list[DueRow]:
        """As `due`, for the runner's wheel: `after_due` is handed the rows built."""
        self.due_calls.append((frozenset(partitions), until, limit))
        rows = await self.inner.due_rows(partitions, until=until, limit=limit)
        if self.after_due is not None:
            await self.after_due(DueRow.built(rows))
        return list(rows)

    async def firing(self, partitions: Set[int], limit: int) -> list[Timer]:
        self.firing_calls.append(frozenset(partitions))
        return list(await self.inner.firing(partitions, limit))

    async def settle(self, changes: list[TimerChange]) -> int:
        self.settle_calls.append(list(changes))
        if self.before_settle is not None:
            await self.before_settle()
        if self.fail_settle(len(self.settle_calls)):
            raise OSError("store unavailable")
        return int(await self.inner.settle(changes))

    async def find(self, owner: AggregateRef, key: str) -> Timer | None:
        self.find_calls += 1
        found: Timer | None = await self.inner.find(owner, key)
        return found

    async def parked(self, target: AggregateRef) -> list[Timer]:
        return list(await self.inner.parked(target))

    async def expire(self, partition: int, now: int, retention: int, limit: int) -> int:
        return int(await self.inner.expire(partition, now, retention, limit))

    async def census(
        self, partition: int, now: int, *, limit: int = 100_000, parked_limit: int = 100
    ) -> TimerCensus:
        census: TimerCensus = await self.inner.census(
            partition, now, limit=limit, parked_limit=parked_limit
        )
        return census


class SpyLedger(MemoryFailureLedger):
    """Records what the store held for each timer when the ledger was written; may fail."""

    def __init__(self, store: Any, failures: int = 0) -> None:
        super().__init__()
        self.store = store
        self.failures = failures
        self.seen: list[TimerStatus] = []

    async def record(
        self, subscription: str, target: AggregateRef, timers: Sequence[Timer]
    ) -> None:
        for t in timers:
            row = await self.store.find(t.owner, t.key)
            self.seen.append(row.status)
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("ledger unavailable")
        await super().record(subscription, target, timers)


# --- the runner's world -------------------------------------------------------------------


@pytest.fixture(params=["memory", "rocksdb"])
async def raw_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    from tables.backends import open_timer_store

    url = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 'timers'}"
    store = open_timer_store(url, partitions=PARTITIONS)
    try:
        yield store
    finally:
        await store.close()


@dataclass
class World:
    store: CountingStore
    clock: FakeClock
    ledger: SpyLedger
    sender: FakeSender = field(init=False)

    def runner(
        self, script: Script | None = None, partitions: Iterable[int] = (0,), **options: Any
    ) -> TimerRunner:
        self.sender = FakeSender(self.clock, script or always("COMMITTED"))
        return TimerRunner(
            self.store,
            self.sender,
            self.clock,
            self.ledger,
            TimerOptions.model_validate(options),
            partitions,
        )

    async def put(self, **fields: Any) -> Timer:
        timer = make_timer(**fields)
        assert await self.store.inner.put(timer)
        return timer

    async def row(self, key: str = "remind", owner: AggregateRef = OWNER) -> Timer:
        row: Timer | None = await self.store.inner.find(owner, key)
        assert row is not None
        return row


@pytest.fixture
def world(raw_store: Any) -> World:
    store = CountingStore(raw_store)
    return World(store, FakeClock(T0), SpyLedger(raw_store))


@pytest.fixture
async def rocks(tmp_path: Path) -> AsyncIterator[World]:
    """A runner's world on RocksDB alone (what only RocksDB does: its rows on disk, its
    writes one partition at a time)."""
    from tables.backends import open_timer_store

    raw = open_timer_store(f"rocksdb://{tmp_path / 'timers'}", partitions=PARTITIONS)
    try:
        yield World(CountingStore(raw), FakeClock(T0), SpyLedger(raw))
    finally:
        await raw.close()


def make_timer(
    id: str = "t-1",
    key: str = "remind",
    rule: OnceRule | IntervalRule = ONCE,
    partition: int = 0,
    owner: AggregateRef = OWNER,
    version: int = 1,
) -> Timer:
    due = rule.at if isinstance(rule, OnceRule) else rule.start
    return Timer(
        id=id,
        owner=owner,
        key=key,
        version=version,
        partition=partition,
        rule=rule,
        target=TARGET,
        command=CommandSpec(type="Remind", body={"n": 1}),
        slot_due_at=due,
        due_at=due,
    )


def stored_timer(
    owner: AggregateRef, key: str, status: TimerStatus, due: int, partition: int, id: str
) -> Timer:
    """A one-off `Remind` timer of `owner` aimed at itself, as a table holds it."""
    return Timer(
        id=id,
        owner=owner,
        key=key,
        version=1,
        partition=partition,
        status=status,
        rule=OnceRule(at=due),
        target=owner,
        command=CommandSpec(type="Remind"),
        slot_due_at=due,
        due_at=due,
    )


Rule = OnceRule | IntervalRule | CronRule


def slot_timer(rule: Rule = ONCE, slot: Slot | None = None, **fields: object) -> Timer:
    """OWNER's PENDING timer "remind" (id t-1, partition 0) of `rule` at `slot` (its first
    by default), sending TARGET a `Remind`; `fields` override any of its fields."""
    slot = slot or first_slot(rule, 0)
    assert slot is not None
    values: dict[str, object] = {
        "id": "t-1",
        "owner": OWNER,
        "key": "remind",
        "version": 1,
        "partition": 0,
        "rule": rule,
        "target": TARGET,
        "command": CommandSpec(type="Remind"),
        "slot": slot.index,
        "slot_due_at": slot.due_at,
        "due_at": slot.due_at,
    }
    values.update(fields)
    return Timer.model_validate(values)


async def parked_slot_timer(
    store: TimerStore, key: str, partition: int, target: AggregateRef = TARGET
) -> Timer:
    """A `slot_timer` of `target` (id t-`key`) put, then PARKED by a conditional write, as
    the runner parks; its row (the ledger is the caller's)."""
    timer = slot_timer(id=f"t-{key}", key=key, partition=partition, target=target)
    assert await store.put(timer)
    row = await store.find(OWNER, key)
    assert row is not None
    parked = row.model_copy(
        update={"status": TimerStatus.PARKED, "attempts": 5, "outcome": Outcome.FAILED}
    )
    assert await store.settle([TimerChange(loaded=row, next=parked)]) == 1
    return parked


async def until(condition: Callable[[], bool], turns: int = 2000) -> None:
    """Lets the event loop run until `condition` holds; fails rather than hang."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


# --- an aggregate ------------------------------------------------------------------------


class Order(BaseModel):
    reminded: int = 0


def order_type() -> AggregateType[Order]:
    """A `shop.order` aggregate type of its own: `shop.Remind` emits `shop.Reminded`."""
    orders = AggregateType("shop", "order", Order)

    @orders.command("shop.Remind")
    def remind(state: Order, cmd: Command, d: Decision) -> None:
        d.emit("shop.Reminded", {"n": state.reminded + 1})

    return orders


# --- the metrics the dashboard queries ----------------------------------------------------

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "grafana" / "tickwheel.json"
METRIC_NAME = re.compile(r"\btickwheel_[a-z0-9_]+")


def dashboard_metrics() -> set[str]:
    """Every metric name the dashboard's queries use (as exported: `_total`, `_bucket`…)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs, "a dashboard without queries"
    return {m for e in exprs for m in METRIC_NAME.findall(e)}


def exported(text: str) -> set[str]:
    """The metric names of an exposition that carry at least one sample."""
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] not in "#"}


# --- the operator page's node (test_web_page, test_web_health_token) ---------------------

PAGE_PARTITIONS = 4
TYPE = "shop.order"
NODE = "node-a:8080 (pid 1)"


class FixedClock:
    def __init__(self, now: int) -> None:
        self.t = now

    def now(self) -> int:
        return self.t

    async def sleep_until(self, t: int) -> None:
        raise AssertionError("the page never sleeps")


@dataclass
class Kept:
    store: MemoryTimerStore


@dataclass
class FakeNode:
    settings: Settings = field(
        default_factory=lambda: Settings(
            partitions=PAGE_PARTITIONS, group_id="g1", bootstrap_servers="b:1"
        )
    )
    clock: FixedClock = field(default_factory=lambda: FixedClock(T0))
    types: dict[str, Kept] = field(
        default_factory=lambda: {TYPE: Kept(MemoryTimerStore(PAGE_PARTITIONS))}
    )
    ledger: MemoryFailureLedger = field(default_factory=MemoryFailureLedger)
    metrics: NodeMetrics = field(default_factory=NodeMetrics)
    owned: list[int] = field(default_factory=lambda: [0, 1])
    restoring: list[int] = field(default_factory=list)
    stalled: dict[str, str] = field(default_factory=dict)
    log: Clients | None = None
    """The clients the page writes its requests with (a `MemoryLog`); None: Kafka's at the
    settings' address, never started (a `Recorder` stands in for the requests)."""

    @property
    def ledgers(self) -> list[FailureLedger]:
        return [self.ledger]

    @property
    def clients(self) -> Clients:
        return self.log if self.log is not None else KafkaClients(self.settings.kafka)

    def owns(self, type_name: str, p: int) -> bool:
        return type_name in self.types and p in self.owned

    def owned_of(self, type_name: str) -> frozenset[int]:
        return frozenset(self.owned) if type_name in self.types else frozenset()

    def health(self) -> dict[str, Any]:
        return {
            "owned": self.owned,
            "restoring": self.restoring,
            "stalled": self.stalled,
            "broker": {"reachable": True},
            "ready": not self.restoring and not self.stalled,
        }

    @property
    def store(self) -> MemoryTimerStore:
        return self.types[TYPE].store


class Recorder:
    """Stands in for `request_answered` of one action: records the calls (where the clients
    given reach), every partition answering DONE with nothing changed; or fails."""

    def __init__(self, action: TimerAction) -> None:
        self.action = action
        self.calls: list[tuple[str, str, AggregateRef, int]] = []
        self.ops: list[TimerOp] = []
        self.fail: TickwheelError | None = None

    async def __call__(
        self, clients: Clients, type_name: str, op: TimerOp, partitions: int, wait_s: float
    ) -> Answered:
        assert op.action is self.action
        if self.fail is not None:
            raise self.fail
        self.calls.append((clients.admin().where(), type_name, op.target, partitions))
        self.ops.append(op)
        done = [
            answer_record(type_name, op, p, 0, OpOutcome.DONE, partitions=1, now=T0)
            for p in range(partitions)
        ]
        answers = {p: decode(TimerOpAnswer, r[3]) for p, r in enumerate(done)}
        return Answered(op, partitions, waited=True, answers=answers)


def asking(retry: Recorder, skip: Recorder) -> Asker:
    """The page's requests: retries to `retry`, skips to `skip`."""

    async def ask(
        clients: Clients, type_name: str, op: TimerOp, partitions: int, wait_s: float
    ) -> Answered:
        by = retry if op.action is TimerAction.RETRY else skip
        return await by(clients, type_name, op, partitions, wait_s)

    return ask


def ref(id: str, **fields: str) -> AggregateRef:
    return AggregateRef(context="shop", aggregate="order", id=id, **fields)


GOOD = {"type": TYPE, "target_type": TYPE, "target_tenant": "(0)", "target_id": "t-1"}
"""A Retry/Skip form that names a parked timer's target."""


# --- the docs (test_readme_service, test_cli_readme) --------------------------------------

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
"""Every page a reader is sent to: the README and the docs/ pages."""

NAMED_MODULE = re.compile(r"# (\w+)\.py\b")
"""A docs python block that starts by naming its file (`# mymodule.py`)."""


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def doc_modules(path: Path) -> dict[str, str]:
    """The modules a page shows: module name → code, for each block whose first line names
    its file (`# mymodule.py`)."""
    found: dict[str, str] = {}
    for code in python_blocks(path):
        named = NAMED_MODULE.match(code)
        if named:
            assert named[1] not in found, f"{path.name} shows {named[1]}.py twice"
            found[named[1]] = code
    return found


class CommitLog:
    """A `CommandProcessor`'s commit: what each of its transactions wrote, offsets counted
    from 0 over them all."""

    def __init__(self) -> None:
        self.commits: list[list[OutRecord]] = []
        self.n = 0

    async def __call__(
        self, records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]
    ) -> list[int]:
        self.commits.append(list(records))
        first, self.n = self.n, self.n + len(records)
        return list(range(first, self.n))

    def last(self, topic_end: str) -> list[dict[str, Any]]:
        """The JSON of the last transaction's records of the topics named so at the end."""
        return [json.loads(r[3] or b"") for r in self.commits[-1] if r[0].endswith(topic_end)]


def sent_base(request_id: str) -> str:
    """A sent command's request id without its sender's digest
    (`app.model.aggregate.sent_request_id`), nor the scope a timer change's id is given
    (`app.clients.book_commands.scoped_request_id`): `<request id>>n`, as a test names it."""
    return unscoped_request_id(re.sub(r"@[0-9a-f]{16}$", "", request_id))


class OneBatchLog:
    """A partition's log that a restore reads in one batch: `records`, whose offsets are
    their places in it."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, len(self.records)

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        yield [r for r in self.records if r.offset >= start]


class RecordingSink:
    """A timer store's changelog sink that keeps every record it is given, in order."""

    def __init__(self) -> None:
        self.records: list[ChangelogRecord] = []

    async def __call__(self, records: list[ChangelogRecord]) -> None:
        self.records.extend(records)
