"""A command a handler sent is as it was at the send (`Decision.send` copies its body to
its depth): a nested part the handler changed after the send (checked at the send) changed
the record written, past its checks, and a value no record holds (an integer past 64 bits)
failed every retry of the decision: a job's tick, so its schedule stopped at that slot."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from pathlib import Path
from typing import Any

from fakes import MIN, T0, FakeClock, WebNode, wait_until, web_node

from app.errors import BadRecord
from app.jobs import RUN_FAILED, TICKED, Job, JobRun, JobScope
from app.kafka.memory import MemoryLog
from app.model.aggregate import Decision
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, EventEnvelope, decode
from app.service import Service
from tables import AggregateRef, IntervalRule

CONTEXT = "ops"
P = 2
SCHEDULE = AggregateTopics(CONTEXT, "schedule")
TARGET = AggregateRef(context=CONTEXT, aggregate="schedule", id="elsewhere")


def test_a_sent_body_changed_after_the_send_is_sent_as_it_was() -> None:
    d = Decision(aggregate=TARGET, now=T0, request_id="r-1")
    inner: dict[str, Any] = {"list": [1]}
    d.send(TARGET, "X", {"inner": inner})
    inner["n"] = 2**70
    inner["list"].append({1, 2})
    assert d.commands[0].body == {"inner": {"list": [1]}}
    # A mapping or list of a subclass (a defaultdict) is copied as plain too.
    nested: defaultdict[str, Any] = defaultdict(list)
    nested["list"].append(1)
    d.send(TARGET, "X", {"inner": nested})
    nested["n"] = 2**70
    assert d.commands[1].body == {"inner": {"list": [1]}}
    assert type(d.commands[1].body["inner"]) is dict


def _changes_after_send(run: JobRun) -> None:
    inner: dict[str, Any] = {}
    run.send(TARGET, "wow.schedule.Disable", {"inner": inner, "slot": run.slot})
    inner["n"] = 2**70  # after the send, which checked the body without it


JOB = Job(
    "mut", JobScope.SYSTEM, IntervalRule(start=T0, every=MIN, coalesce=False), _changes_after_send
)
SERVICE = Service(aggregates=(), jobs={CONTEXT: (JOB,)})


def records(log: MemoryLog, topic: str, kind: Any) -> list[Any]:
    out = []
    for p in range(P):
        for r in log.records(topic, p):
            with contextlib.suppress(BadRecord):
                out.append(decode(kind, r.value))
    return out


async def test_a_jobs_body_changed_after_the_send_stops_no_slot(tmp_path: Path) -> None:
    async with web_node(SERVICE, tmp_path, FakeClock(T0 - 30_000), WebNode, partitions=P) as e:
        status, answer = await e.call("POST", f"/jobs/{CONTEXT}/mut/enable", {})
        assert status == 200, answer

        def ticked() -> list[int]:
            events = records(e.log, SCHEDULE.events, EventEnvelope)
            return sorted(x.body["slot"] for x in events if x.type == TICKED)

        e.clock.set(T0 + 2 * MIN + 1)  # slots 0, 1 and 2 due

        def run_on() -> bool:
            e.clock.advance(100)  # each firing round waits for the next poll's time
            return ticked()[:3] == [0, 1, 2]

        await wait_until(run_on, within=20.0, what=lambda: f"ticked {ticked()}")
        events = records(e.log, SCHEDULE.events, EventEnvelope)
        assert [x for x in events if x.type == RUN_FAILED] == []
        sent = [
            c
            for c in records(e.log, SCHEDULE.commands, CommandEnvelope)
            if c.type == "wow.schedule.Disable"
        ]
        assert sorted(c.body["slot"] for c in sent)[:3] == [0, 1, 2]
        assert all(c.body["inner"] == {} for c in sent)
