"""How another writer's log events become timers, on a node over the in-memory log:

- a `wow.ScheduleCancelled` (or `wow.AggregateDeleted`) read before the older
  `wow.ScheduleSet` it supersedes (a producer whose retries reorder two sends) leaves a
  row the set meets (`tables.tombstones`): the timer never fires (before, it did);
- a `wow.ScheduleSet` within `TICKWHEEL_MAX_RECORD_BYTES` whose timer's command would be
  over it is dead-lettered where it is read, no timer stored (`app.timers.timer_sizes`):
  before, it was stored and, fired in-process, its own command record was dead-lettered
  when read back, at every firing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel

from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.dead_letters import DeadLetter
from app.protocol.limits import DEFAULT_MAX_RECORD_BYTES
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import EventEnvelope, decode
from app.service import Service
from app.timers.operator import NoTimers, read_timer_history, read_timers
from app.timers.runner import RetryPolicy, TimerOptions
from tables import AggregateRef, Timer
from tables.partitioner import partition_of

P = 2
CTX, AGG = "hx", "counter"
TOPICS = AggregateTopics(CTX, AGG)
LETTERS = ContextTopics(CTX).dead_letters


class Counter(BaseModel):
    fired: int = 0


counter = AggregateType(CTX, AGG, Counter)


@counter.command("Fire")
def _fire(state: Counter, cmd: Command, d: Decision) -> None:
    d.emit("Fired", {"rid": cmd.request_id})


@counter.applies("Fired")
def _fired(state: Counter, e: Any) -> Counter:
    return Counter(fired=state.fired + 1)


SERVICE = Service(aggregates=(counter,))
OWNERS = [f"o{i}" for i in range(50) if partition_of(f"o{i}", P) == 0]


def event(owner: str, id: str, type_: str, version: int, body: dict[str, Any]) -> bytes:
    ref = {"context": CTX, "aggregate": AGG, "id": owner}
    e = {"id": id, "type": type_, "aggregate": ref, "version": version, "created_at": 0}
    return orjson.dumps({**e, "body": body})


def schedule(owner: str, id: str, version: int, at: int, **command: Any) -> bytes:
    body = {"key": "k", "rule": {"kind": "once", "at": at}, "command": {"type": "Fire", **command}}
    return event(owner, id, "wow.ScheduleSet", version, body)


async def write(log: MemoryLog, owner: str, value: bytes) -> None:
    await log.publisher().send(TOPICS.events, owner.encode(), value, partition_of(owner, P))


def fired(log: MemoryLog) -> list[str]:
    found = []
    for p in range(P):
        for r in log.records(TOPICS.events, p):
            e = decode(EventEnvelope, r.value, 1 << 20)
            if e.type == "Fired":
                found.append(e.body["rid"])
    return sorted(found)


def letters(log: MemoryLog) -> list[DeadLetter]:
    return [DeadLetter.read(r.key, r.value, r.headers) for r in log.records(LETTERS, 0)]


def rows_of(log: MemoryLog) -> list[tuple[str, str, int]]:
    return sorted((t.id, t.status.value, t.version) for t in rows(log).values())


def rows(log: MemoryLog) -> dict[bytes, Timer]:
    latest: dict[bytes, bytes | None] = {}
    for p in range(P):
        for r in log.records(TOPICS.timers_changelog, p):
            latest[r.key or b""] = r.value
    return {k: Timer.model_validate_json(v) for k, v in latest.items() if v is not None}


async def test_a_cancel_or_deletion_read_before_its_older_set_stops_the_timer(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    one, two, control = OWNERS[:3]
    async with running(RunningNode(log, tmp_path, "a", SERVICE, P, clock=FakeClock(T0))):
        cancelled = event(one, "c5", "wow.ScheduleCancelled", 5, {"key": "k"})
        await write(log, one, cancelled)
        await write(log, one, schedule(one, "s3", 3, T0 - 2))
        await write(log, two, event(two, "d9", "wow.AggregateDeleted", 9, {}))
        await write(log, two, schedule(two, "s4", 4, T0 - 2))
        # Set after them in the same partition, and due after them: once it has fired, so
        # had they, had they been written.
        await write(log, control, schedule(control, "ctl", 1, T0 - 1))
        await wait_until(lambda: "ctl#0" in fired(log), what=lambda: f"fired: {fired(log)}")
        assert fired(log) == ["ctl#0"]
        assert letters(log) == []
    held = {(t.owner.id, t.key): (t.id, t.version, t.status.value) for t in rows(log).values()}
    assert held[(one, "k")] == ("c5", 5, "CANCELLED")
    assert held[(two, "\x00deleted")] == ("d9", 9, "CANCELLED")
    # An operator's views: the tombstone is the key's CANCELLED row; a deletion mark is no
    # timer, left out.
    listed = [(t.owner.id, t.key, t.status.value) for t in await read_timers(log, TOPICS.type_name)]
    assert sorted(listed) == [(one, "k", "CANCELLED"), (control, "k", "FIRED")]
    owner_two = AggregateRef(context=CTX, aggregate=AGG, id=two)
    with pytest.raises(NoTimers):
        await read_timer_history(log, owner_two)


async def test_a_set_whose_command_would_be_over_the_bound_is_dead_lettered_as_it_is_read(
    tmp_path: Path,
) -> None:
    """An event exactly at the bound, its timer's command (in-process: its owner's own) a
    few bytes over: the event is the one dead-lettered, once, naming why; the timer it
    replaces is cancelled (left, it would fire though its owner replaced it)."""
    log = MemoryLog()
    owner = OWNERS[0]
    retry = RetryPolicy(initial_backoff_ms=50, max_backoff_ms=50, max_attempts=2)
    options = TimerOptions(retry=retry, send_timeout=1000)
    node = RunningNode(log, tmp_path, "a", SERVICE, P, clock=FakeClock(T0), timers=options)

    def sized(pad: int, id: str = "big") -> bytes:
        return schedule(owner, id, 2, T0 - 2, body={"x": "a" * pad})

    pad = DEFAULT_MAX_RECORD_BYTES - len(sized(0))
    big = sized(pad)
    assert len(big) == DEFAULT_MAX_RECORD_BYTES
    async with running(node):
        # The key's timer before, due in an hour.
        await write(log, owner, schedule(owner, "old", 1, T0 + 3_600_000))
        await wait_until(lambda: any(t.id == "old" for t in rows(log).values()))
        await write(log, owner, big)
        await write(log, OWNERS[1], schedule(OWNERS[1], "ctl", 1, T0 - 1))
        await wait_until(lambda: "ctl#0" in fired(log), what=lambda: f"fired: {fired(log)}")
        assert fired(log) == ["ctl#0"]
        [letter] = letters(log)
        assert (letter.topic, letter.value) == (TOPICS.events, big)
        assert "the command its timer sends would be a record of" in letter.error
        assert "TICKWHEEL_MAX_RECORD_BYTES 262144" in letter.error
        want = [("ctl", "FIRED", 1), ("old", "CANCELLED", 2)]
        await wait_until(lambda: rows_of(log) == want, what=lambda: f"rows: {rows_of(log)}")
    assert fired(log) == ["ctl#0"]
