"""Applied request ids are forgotten after the de-duplication window (fake clock)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from fakes import T0, order_type

from app.commands.processor import CommandProcessor, state_key
from app.kafka import OutRecord
from app.node.settings import Settings
from app.protocol.wire import CommandEnvelope, ResultCode
from tables import AggregateRef
from tables.aggregate_store import MemoryAggregateStore
from tables.partitioner import partition_of

ORDER = AggregateRef(context="shop", aggregate="order", id="o-1")
P = partition_of(ORDER.id, 4)
HOUR = 3_600_000


async def commit(records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]) -> list[int]:
    return list(range(len(records)))


def command(request_id: str) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=request_id,
        type="shop.Remind",
        aggregate=ORDER,
        not_before=T0,
        issued_at=T0,
        in_process=True,
    )


async def test_a_request_id_is_a_duplicate_within_the_window_and_applied_after_it() -> None:
    now = [T0]
    states = MemoryAggregateStore()
    processor = CommandProcessor(
        order_type(), P, partitions=4, states=states, commit=commit, now=lambda: now[0],
        request_id_window=2 * HOUR,
    )  # fmt: skip

    async def decide(request_id: str) -> ResultCode:
        batch = processor.begin()
        [(_, code, _)] = processor.decide_local(batch, [command(request_id)])
        processor.committed(batch, await commit(batch.out, batch.offsets))
        return code

    assert await decide("t-1#0") == ResultCode.COMMITTED
    now[0] += HOUR
    assert await decide("t-2#0") == ResultCode.COMMITTED
    assert await decide("t-1#0") == ResultCode.DUPLICATE, "within the window"
    now[0] += HOUR + 1  # t-1#0 applied 2 h + 1 ms ago: forgotten by this commit
    assert await decide("t-3#0") == ResultCode.COMMITTED
    assert not states.seen(P, state_key(ORDER), "t-1#0")
    assert states.seen(P, state_key(ORDER), "t-2#0"), "1 h + 1 ms: kept"
    assert await decide("t-1#0") == ResultCode.COMMITTED, "past the window: applied again"


def test_the_window_must_outlast_the_timers_retries() -> None:
    assert Settings.from_env({}).request_id_window_ms == 7 * 24 * HOUR
    with pytest.raises(Exception, match="TICKWHEEL_REQUEST_ID_WINDOW_MS"):
        Settings.from_env({"TICKWHEEL_REQUEST_ID_WINDOW_MS": str(24 * HOUR)})
