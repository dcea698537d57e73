"""The README's "Writing a service" example, run as written: the module loads as the
worker's `--service mymodule:service`, and its handlers decide as the README says."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from app.cli.common import load_service
from app.model.decide import decide
from app.protocol.wire import SCHEDULE_CANCELLED, SCHEDULE_SET, CommandEnvelope, ResultCode
from tables import AggregateRef

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
NOW = 1_800_000_000_000


def example() -> str:
    section = README.split("## Writing a service", 1)[1]
    blocks: list[str] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return blocks[0]


@pytest.fixture
def mymodule(tmp_path: Path) -> Iterator[ModuleType]:
    (tmp_path / "mymodule.py").write_text(example())
    sys.path.insert(0, str(tmp_path))
    try:
        service = load_service("mymodule:service")  # as `tickwheel worker --service` does
        yield sys.modules["mymodule"]
        assert service is sys.modules["mymodule"].service
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mymodule", None)


def command(type_: str, body: dict[str, object] | None = None) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=f"r-{type_}",
        type=type_,
        aggregate=AggregateRef(context="shop", aggregate="order", id="o-42"),
        body=body or {},
        issued_at=NOW,
    )


def test_the_readmes_service_places_an_order_with_its_timers(mymodule: ModuleType) -> None:
    orders = mymodule.orders
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
