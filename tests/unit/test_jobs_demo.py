"""The demo's job: `unpaid-report` in `shop`, run through `decide` as a node runs it."""

from __future__ import annotations

from fakes import sent_base

from app.demo import reports, service, unpaid_report
from app.jobs import ENABLE, TICK, TICKED, enable_command
from app.model.decide import decide, fold
from app.protocol.wire import SCHEDULE_SET, CommandEnvelope, ResultCode
from tables import CronRule

T0 = 1_800_000_000_000  # a multiple of 5 s


def test_the_demo_declares_its_job_on_shop() -> None:
    names = [a.type_name for a in service.all_aggregates(4)]
    assert names == ["shop.order", "shop.report", "shop.schedule"]
    assert unpaid_report.rule == CronRule(expr="*/5 * * * * *", zone="UTC")


def test_each_tick_runs_the_report_once_in_the_ticks_transaction() -> None:
    (schedule,) = [a for a in service.all_aggregates(4) if a.name == "schedule"]
    enable = enable_command("shop", unpaid_report, now=T0)
    assert enable.type == ENABLE
    enabled = decide(schedule, None, enable, now=T0, seen=False)
    assert enabled.code is ResultCode.COMMITTED
    assert enabled.stored is not None
    (timer,) = [e for e in enabled.events if e.type == SCHEDULE_SET]
    tick = CommandEnvelope(
        request_id=f"{timer.id}#0",
        type=TICK,
        aggregate=enable.aggregate,
        not_before=T0,
        issued_at=T0,
    )
    ticked = decide(schedule, enabled.stored, tick, now=T0 + 5_001, seen=False)
    assert [e.type for e in ticked.events] == [TICKED]
    (run,) = ticked.commands
    assert (run.aggregate.type_name, run.aggregate.id, run.type) == (
        "shop.report",
        "unpaid-orders",
        "shop.RunReport",
    )
    assert run.body == {"slot": 0, "due_at": T0}
    assert sent_base(run.request_id) == f"{tick.request_id}>0"

    report = decide(reports, None, run, now=T0 + 5_002, seen=False)
    assert [(e.type, e.body) for e in report.events] == [
        ("shop.ReportRun", {"slot": 0, "due_at": T0, "run": 1})
    ]
    state = fold(reports, None, report.events).state
    assert state == {"runs": 1, "last_slot": 0}
    # the same tick again: the schedule ran that slot already
    assert ticked.stored is not None
    again = decide(schedule, ticked.stored, tick, now=T0 + 5_003, seen=True)
    assert again.code is ResultCode.DUPLICATE and not again.commands
