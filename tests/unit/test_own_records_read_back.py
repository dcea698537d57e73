"""A node's own records read back (the events of the commands it decided, the commands
it decided in-process), once their transaction committed, are passed over without being
decoded again (`app.node.own_records`): a burst's read-back decoded and checked each one
only to find it done. Another writer's records, and its own event whose timer operation
was refused when decided, still go the whole way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes import T0, FakeClock, RunningNode, running, wait_until
from test_duplicated_batch_memory import OWNER, _set, _slots_ran
from test_jobs_backfill_memory import PARTITIONS, REPORTS, SERVICE

import app.commands.processor as processor_module
import app.node.cycle_timers as cycle_timers_module
from app.commands.intake import read_command
from app.kafka.memory import MemoryLog
from app.node.own_records import NOT_OWN, OwnRecords
from app.node.task_id import TaskId
from app.protocol.wire import decode_event, encode
from tables.partitioner import partition_of

SLOTS = range(1, 6)


async def test_own_events_and_in_process_commands_are_passed_over_undecoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[str] = []  # the event types the subscription decoded
    read: list[bool] = []  # whether each command the processor read was in-process

    def counted_event(*args: Any, **kw: Any) -> Any:
        event, lax = decode_event(*args, **kw)
        decoded.append(event.type)
        return event, lax

    def counted_command(*args: Any, **kw: Any) -> Any:
        cmd = read_command(*args, **kw)
        read.append(cmd.in_process)
        return cmd

    monkeypatch.setattr(cycle_timers_module, "decode_event", counted_event)
    monkeypatch.setattr(processor_module, "read_command", counted_command)
    log, clock = MemoryLog(), FakeClock(T0)
    publisher = log.publisher()
    p = partition_of(OWNER.id, PARTITIONS)
    async with running(
        RunningNode(log, tmp_path, "n", SERVICE, PARTITIONS, clock=clock), within=10
    ) as node:
        for slot in SLOTS:
            event = _set(f"evt-{slot}", slot, f"k{slot}", slot, T0 - 1)
            await publisher.send(REPORTS.events, OWNER.id.encode(), encode(event), p)
        await wait_until(lambda: _slots_ran(log) == list(SLOTS))

        def own_left() -> int:
            inputs = [
                node.node.cycles._input(TaskId(REPORTS.type_name, q)) for q in range(PARTITIONS)
            ]
            return sum(len(i.own) + len(i.carried) for i in inputs if i is not None)

        # Every own record read back: none held, none carried.
        await wait_until(lambda: own_left() == 0)
    # The other writer's sets were decoded; the target's own "Ran" events were not.
    assert decoded.count("wow.ScheduleSet") == len(SLOTS)
    assert "Ran" not in decoded
    assert True not in read, "no in-process command of its own decoded again"


def test_a_record_read_before_its_commit_was_heard_of_is_forgotten_as_read_past() -> None:
    own = OwnRecords()
    own.committed([("t", 3, None), ("t", 5, "e-5"), ("t", 9, None)])
    assert own.take("other", 5) is NOT_OWN
    assert own.take("t", 4) is NOT_OWN
    assert own.take("t", 5) == "e-5"
    assert len(own) == 1, "3 was read past: forgotten"
    assert own.take("t", 9) is None and len(own) == 0


def test_an_offset_no_record_has_or_one_that_goes_back_is_not_taken_for_its_own() -> None:
    """A client's offset of -1 (a batch it took for a duplicate), or offsets that go back
    (a topic re-created, a leader's log cut): never a record passed over unread."""
    own = OwnRecords()
    own.committed([("t", -1, None), ("t", 0, None), ("t", 1, None)])
    assert len(own) == 0, "no offset from a batch without one"
    own.committed([("t", 1000, None)])
    own.committed([("t", 5, "e-5")])  # back: what was held is forgotten
    assert own.take("t", 5) == "e-5"
    assert own.take("t", 1000) is NOT_OWN and len(own) == 0


def test_records_never_read_back_are_held_up_to_a_bound() -> None:
    own = OwnRecords(bound=3)
    own.committed([("t", offset, None) for offset in range(10, 15)])
    assert len(own) == 3
    assert own.take("t", 11) is NOT_OWN, "the oldest forgotten: read the whole way"
    assert own.take("t", 12) is None
