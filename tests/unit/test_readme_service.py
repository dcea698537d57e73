"""The docs' services, run as written: every ```python block of README.md and docs/*.md
that defines a service is a module (named by its first line, `# mymodule.py`), which loads
as the worker's `--service mymodule:service` does, and whose handlers decide as the text
around it says.

The modules of one page are written side by side, so that one may import another
(docs/concepts.md's `myjobs.py` takes its orders from `mymodule.py`). The pages and their
modules are read by `fakes.doc_modules`, which tests/unit/test_cli_readme.py uses too: it
runs the docs' `jobs list` lines with these modules importable.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from fakes import DOCS, NAMED_MODULE, ROOT, doc_modules, python_blocks

from app.cli.common import load_service
from app.jobs import JobRun
from app.model.aggregate import Decision
from app.model.decide import decide
from app.protocol.wire import SCHEDULE_CANCELLED, SCHEDULE_SET, CommandEnvelope, ResultCode
from tables import AggregateRef

NOW = 1_800_000_000_000


def service_blocks() -> list[tuple[str, str]]:
    """(where, code) of every block of the docs that declares a service."""
    return [
        (f"{path.relative_to(ROOT)} python block {n}", code)
        for path in DOCS
        for n, code in enumerate(python_blocks(path), 1)
        if "Service(" in code
    ]


def test_every_block_that_declares_a_service_is_a_named_module() -> None:
    blocks = service_blocks()
    assert {w.split(" ")[0] for w, _ in blocks} >= {"README.md", "docs/concepts.md"}
    for where, code in blocks:
        assert NAMED_MODULE.match(code), f"{where}: a service block starts with `# <module>.py`"


@pytest.fixture
def importable(tmp_path: Path) -> Iterator[Path]:
    """A directory on sys.path for a page's modules; they are forgotten afterwards."""
    sys.path.insert(0, str(tmp_path))
    before = set(sys.modules)
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in set(sys.modules) - before:
            if getattr(sys.modules[name], "__file__", "") and str(tmp_path) in str(
                sys.modules[name].__file__
            ):
                del sys.modules[name]


def load_page(path: Path, into: Path) -> dict[str, ModuleType]:
    """Writes the page's modules into `into` and loads each one's service as the worker's
    `--service <module>:service` does; the modules, by name."""
    modules = doc_modules(path)
    for name, code in modules.items():
        (into / f"{name}.py").write_text(code)
    loaded = {}
    for name in modules:
        service = load_service(f"{name}:service")
        loaded[name] = sys.modules[name]
        assert service is loaded[name].service
    return loaded


@pytest.mark.parametrize("page", [p for p in DOCS if doc_modules(p)], ids=lambda p: p.name)
def test_every_services_module_loads_as_the_worker_loads_it(page: Path, importable: Path) -> None:
    assert load_page(page, importable)


def command(type_: str, body: dict[str, object] | None = None) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=f"r-{type_}",
        type=type_,
        aggregate=AggregateRef(context="shop", aggregate="order", id="o-42"),
        body=body or {},
        issued_at=NOW,
    )


# --- README.md: the quick start's service ---------------------------------------------------


def test_the_quick_starts_service_schedules_a_deadline_that_paying_cancels(
    importable: Path,
) -> None:
    orders = load_page(ROOT / "README.md", importable)["mymodule"].orders
    placed = decide(orders, None, command("shop.PlaceOrder", {"amount": 5}), now=NOW, seen=False)
    assert placed.code is ResultCode.COMMITTED
    assert [e.type for e in placed.events] == ["shop.OrderPlaced", SCHEDULE_SET]
    deadline = placed.events[1].body
    assert deadline["key"] == "payment-deadline"
    assert deadline["rule"]["at"] == NOW + 600_000, "in 10 minutes"
    assert deadline["command"]["type"] == "shop.CancelUnpaid"
    assert deadline.get("target") is None, "sent to this order"

    # The deadline's command, unpaid: the order is cancelled.
    due = decide(orders, placed.stored, command("shop.CancelUnpaid"), now=NOW, seen=False)
    assert [e.type for e in due.events] == ["shop.OrderCancelled"]

    paid = decide(orders, placed.stored, command("shop.PayOrder"), now=NOW, seen=False)
    assert [e.type for e in paid.events] == ["shop.OrderPaid", SCHEDULE_CANCELLED]
    # Had it fired anyway (sent before the cancel committed): a paid order stays.
    late = decide(orders, paid.stored, command("shop.CancelUnpaid"), now=NOW, seen=False)
    assert late.code is ResultCode.UNCHANGED


# --- docs/concepts.md: "Writing a service" and "Scheduled jobs" -----------------------------


def test_the_concepts_service_places_an_order_with_its_timers(importable: Path) -> None:
    orders = load_page(ROOT / "docs" / "concepts.md", importable)["mymodule"].orders
    placed = decide(orders, None, command("shop.PlaceOrder", {"amount": 5}), now=NOW, seen=False)
    assert placed.code is ResultCode.COMMITTED
    types = [e.type for e in placed.events]
    assert types == ["shop.OrderPlaced", SCHEDULE_SET, SCHEDULE_SET]
    keys = [e.body["key"] for e in placed.events[1:]]
    assert keys == ["payment-deadline", "reminder"]
    assert placed.events[1].body["rule"]["at"] == NOW + 600_000

    again = decide(
        orders,
        placed.stored,
        command("shop.PlaceOrder", {"amount": 5}).model_copy(update={"request_id": "r-2"}),
        now=NOW,
        seen=False,
    )
    assert again.code is ResultCode.REJECTED and "already placed" in again.message

    paid = decide(orders, placed.stored, command("shop.PayOrder"), now=NOW, seen=False)
    assert [e.type for e in paid.events] == [
        "shop.OrderPaid",
        SCHEDULE_CANCELLED,
        SCHEDULE_CANCELLED,
    ]


def test_the_concepts_job_sends_its_report_which_the_report_aggregate_decides(
    importable: Path,
) -> None:
    myjobs = load_page(ROOT / "docs" / "concepts.md", importable)["myjobs"]
    service = myjobs.service
    (nightly,) = service.jobs["shop"]
    assert (nightly.name, nightly.rule.expr, nightly.rule.zone) == (
        "unpaid-report",
        "0 2 * * *",
        "Europe/Berlin",
    )
    assert {a.type_name for a in service.aggregates} == {"shop.order", "shop.report"}

    instance = AggregateRef(context="shop", aggregate="schedule", id="unpaid-report")
    decision = Decision(aggregate=instance, now=NOW, request_id="tick#3")
    run = JobRun(
        context="shop",
        job="unpaid-report",
        instance="unpaid-report",
        tenant="(0)",
        partition=None,
        slot=3,
        due_at=NOW,
        request_id="tick#3",
        now=NOW,
        _decision=decision,
    )
    nightly.handler(run)
    (sent,) = decision.commands
    assert sent.aggregate == AggregateRef(context="shop", aggregate="report", id="unpaid-orders")
    assert (sent.type, sent.body) == ("shop.RunReport", {"slot": 3})
    ran = decide(service.find("shop.report"), None, sent, now=NOW, seen=False)
    assert ran.code is ResultCode.COMMITTED
    assert [(e.type, e.body) for e in ran.events] == [("shop.ReportRan", {"slot": 3})]
