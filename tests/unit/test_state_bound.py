"""An aggregate's stored state is bounded (`TICKWHEEL_MAX_STATE_BYTES`): a command whose
decision would grow it past the bound is answered ERROR and dead-lettered, its events not
written, the aggregate as it was; the log itself (a restore, another writer's events) is
folded whatever the size, with a warning once per aggregate. A timer book keeps at most
`MAX_BOOK_TIMERS` timers: a set of a new key past them is REJECTED."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from fakes import CommitLog
from pydantic import BaseModel

from app.clients.book_state import BookTimer
from app.clients.timer_book import CANCEL_TIMER, MAX_BOOK_TIMERS, SET_TIMER, timer_book
from app.commands.processor import CommandProcessor, state_key
from app.kafka import Record
from app.model.aggregate import AggregateType, Command, Decision
from app.model.decide import StoredAggregate, decide
from app.node.settings import Settings
from app.protocol.limits import DEFAULT_MAX_STATE_BYTES, InputLimits
from app.protocol.wire import CommandEnvelope, EventEnvelope, ResultCode, encode
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

T0 = 1_800_000_000_000
PARTITIONS = 4
BOUND = 64 * 1024
LIMITS = InputLimits(max_state_bytes=BOUND)


class Pile(BaseModel):
    text: str = ""


piles = AggregateType("shop", "pile", Pile)


@piles.command("shop.Add")
def add(state: Pile, cmd: Command, d: Decision) -> None:
    d.emit("shop.Added", {"text": cmd.body["text"]})


@piles.command("shop.Clear")
def clear(state: Pile, cmd: Command, d: Decision) -> None:
    d.emit("shop.Cleared")


@piles.command("shop.Trim")
def trim(state: Pile, cmd: Command, d: Decision) -> None:
    d.emit("shop.Trimmed")


@piles.applies("shop.Trimmed")
def trimmed(state: Pile, e: Any) -> Pile:
    return Pile(text=state.text[:-1000])


@piles.applies("shop.Added")
def added(state: Pile, e: Any) -> Pile:
    return Pile(text=state.text + e.body["text"])


@piles.applies("shop.Cleared")
def cleared(state: Pile, e: Any) -> Pile:
    return Pile()


PILE = AggregateRef(context="shop", aggregate="pile", id="p-1")
P = partition_of(PILE.id, PARTITIONS)
EVENTS = "shop.pile.events"


def size_of(text: str, version: int) -> int:
    """The bytes the store keeps for the pile holding `text` at `version`."""
    return len(encode(StoredAggregate(version=version, state={"text": text})))


def command(request_id: str, type_: str, **body: Any) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=request_id, type=type_, aggregate=PILE, issued_at=T0, body=body
    )


def record(cmd: CommandEnvelope, offset: int) -> Record:
    return Record("shop.pile.commands", P, offset, PILE.id.encode(), encode(cmd), T0)


def event(n: int, text: str) -> EventEnvelope:
    return EventEnvelope(
        id=f"other-{n}",
        type="shop.Added",
        aggregate=PILE,
        version=n,
        created_at=T0,
        body={"text": text},
    )


class Log:
    """The pile's events log, read in one batch."""

    def __init__(self, events: list[EventEnvelope]) -> None:
        self.records = [
            Record(EVENTS, P, i, PILE.id.encode(), encode(e), T0) for i, e in enumerate(events)
        ]

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, len(self.records)

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        yield self.records[start:]


def processor(
    states: MemoryAggregateStore | None = None,
) -> tuple[CommandProcessor, CommitLog]:
    log = CommitLog()
    proc = CommandProcessor(
        piles,
        P,
        partitions=PARTITIONS,
        states=states or MemoryAggregateStore(),
        commit=log,
        now=lambda: T0,
        limits=LIMITS,
    )
    return proc, log


def stored(proc: CommandProcessor) -> StoredAggregate:
    held = proc._states.stored(state_key(PILE))
    assert held is not None
    return held


async def test_a_command_growing_the_state_past_the_bound_is_refused_the_state_unchanged() -> None:
    proc, log = processor()
    # The first command brings the state to exactly the bound: it passes.
    first = "a" * (BOUND - size_of("", 1))
    assert size_of(first, 1) == BOUND
    await proc.handle([record(command("r-1", "shop.Add", text=first), 0)])
    [result] = log.last("results")
    assert result["code"] == ResultCode.COMMITTED
    # One byte more is one too many: refused, with its size and the bound.
    await proc.handle(
        [
            record(command("r-2", "shop.Add", text="b"), 1),
            record(command("r-3", "shop.Clear"), 2),
        ]
    )
    results = log.last("results")
    assert [(r["request_id"], r["code"]) for r in results] == [
        ("r-2", ResultCode.ERROR),
        ("r-3", ResultCode.COMMITTED),
    ]
    assert results[0]["message"] == (
        f"StateTooLarge: the decision would grow the aggregate's state to {BOUND + 1} bytes, "
        f"over {BOUND} (TICKWHEEL_MAX_STATE_BYTES): nothing of it is written"
    )
    assert [e["request_id"] for e in log.last("events")] == ["r-3"]
    assert len(log.last("dead-letters")) == 1
    assert results[1]["version"] == 2, "the refused decision left the aggregate as it was"


async def test_a_fired_command_growing_the_state_past_the_bound_is_answered_error() -> None:
    proc, _ = processor()
    batch = proc.begin()
    [(_, code, message)] = proc.decide_local(batch, [command("t#0", "shop.Add", text="a" * BOUND)])
    assert code == ResultCode.ERROR
    assert "TICKWHEEL_MAX_STATE_BYTES" in message
    assert not batch.staged and not any(r[0] == EVENTS for r in batch.out)


async def test_a_restore_folds_a_state_past_the_bound_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The log is the truth: nothing in it is refused for its size. The aggregate takes a
    command that does not grow it (it could never shrink back otherwise), not one that does."""
    halves = [event(1, "a" * BOUND), event(2, "b" * BOUND)]
    proc, log = processor()
    with caplog.at_level(logging.WARNING, logger="app.commands.states"):
        assert await proc.restore(Log(halves)) == 2
    held = stored(proc)
    assert held.version == 2 and held.state["text"] == "a" * BOUND + "b" * BOUND
    warned = [r for r in caplog.records if "TICKWHEEL_MAX_STATE_BYTES" in r.getMessage()]
    assert len(warned) == 1, "once per aggregate"
    assert f"{size_of(held.state['text'], 2)} bytes, over {BOUND}" in warned[0].getMessage()

    await proc.handle(
        [
            record(command("r-1", "shop.Add", text="c"), 0),
            record(command("r-2", "shop.Trim"), 1),
            record(command("r-3", "shop.Clear"), 2),
        ]
    )
    codes = [r["code"] for r in log.last("results")]
    assert codes == [ResultCode.ERROR, ResultCode.COMMITTED, ResultCode.COMMITTED]
    assert stored(proc).state == {"text": ""}


async def test_another_writers_event_past_the_bound_is_followed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    proc, _ = processor()
    batch = proc.begin()
    with caplog.at_level(logging.WARNING, logger="app.commands.states"):
        assert proc.follow(batch, event(1, "a" * BOUND), 0)
        assert proc.follow(batch, event(2, "b"), 1)
    assert batch.staged[state_key(PILE)].version == 2
    assert sum("TICKWHEEL_MAX_STATE_BYTES" in r.getMessage() for r in caplog.records) == 1


# --- the setting ----------------------------------------------------------------------------


def test_the_setting_reaches_the_limits() -> None:
    assert Settings().limits.max_state_bytes == DEFAULT_MAX_STATE_BYTES == 4 * 1024 * 1024
    env = {"TICKWHEEL_MAX_STATE_BYTES": str(8 * 1024 * 1024)}
    assert Settings.from_env(env).limits.max_state_bytes == 8 * 1024 * 1024
    # Out of its range (below the record bound, past 64 MiB): `test_settings`.


# --- a timer book's timers ------------------------------------------------------------------


BOOK = timer_book("rem", "order-timers")
TARGET = AggregateRef(context="rem", aggregate="order", id="o-1")


def book_command(request_id: str, type_: str, key: str) -> CommandEnvelope:
    body: dict[str, Any] = {"key": key}
    if type_ == SET_TIMER:
        body |= {
            "rule": {"kind": "interval", "start": T0, "every": 60_000},
            "target": TARGET.model_dump(mode="json"),
            "command": {"type": "rem.Remind", "body": {}},
        }
    ref = AggregateRef(context="rem", aggregate="order-timers", id="b-1")
    return CommandEnvelope(
        request_id=request_id, type=type_, aggregate=ref, body=body, issued_at=T0
    )


def test_a_full_book_rejects_a_new_key_and_takes_a_known_one() -> None:
    timer = BookTimer.model_validate(
        {"target": TARGET.model_dump(mode="json"), "command": {"type": "rem.Remind"}}
    ).model_dump(mode="json", exclude_none=True)
    full = StoredAggregate(
        version=1, state={"timers": {f"k{i}": timer for i in range(MAX_BOOK_TIMERS)}}
    )
    d = decide(BOOK, full, book_command("r-1", SET_TIMER, "new"), now=T0, seen=False)
    assert d.code == ResultCode.REJECTED and not d.events
    assert f"keeps {MAX_BOOK_TIMERS} timers, the most a book keeps" in d.message
    # Setting a key it keeps again grows nothing; a cancel makes room for a new one.
    assert decide(BOOK, full, book_command("r-2", SET_TIMER, "k0"), now=T0, seen=False).code == (
        ResultCode.COMMITTED
    )
    cancelled = decide(BOOK, full, book_command("r-3", CANCEL_TIMER, "k0"), now=T0, seen=False)
    assert cancelled.stored is not None
    d = decide(BOOK, cancelled.stored, book_command("r-4", SET_TIMER, "new"), now=T0, seen=False)
    assert d.code == ResultCode.COMMITTED
