"""The faust client refuses, with a `ValueError` and nothing sent, a command faust's own
producer would refuse: one past the app's `producer_max_request_size` (1,000,000 bytes by
default) though within the workers' `TICKWHEEL_MAX_RECORD_BYTES` (up to 1 MiB). aiokafka's
refusal (`MessageSizeTooLargeError`) is no `ValueError`: docs/faust.md's `durably` retried
it for ever, the agent stalled on that event for good."""

from __future__ import annotations

import faust
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from app.clients.faust_client import RECORD_OVERHEAD, TickwheelTimers
from app.protocol.wire import CommandEnvelope, encode
from tables import CommandSpec, OnceRule

NOW = 1_700_000_000_000
MIB = 1_048_576


def timers(request_bytes: int | None = None, max_record_bytes: int = MIB) -> TickwheelTimers:
    # Nothing connects: a faust app does so only when started.
    app = faust.App("unit-faust-sizes", broker="kafka://broker.invalid:9092")
    if request_bytes is not None:
        app.conf.producer_max_request_size = request_bytes
    return TickwheelTimers(
        app,
        context="rem",
        book="order-timers",
        target="order",
        partitions=4,
        now=lambda: NOW,
        max_record_bytes=max_record_bytes,
    )


def command(t: TickwheelTimers, pad: int) -> CommandEnvelope:
    spec = CommandSpec(type="rem.Remind", body={"pad": "x" * pad})
    return t.set_command("o-1", "reminder", OnceRule(at=NOW + 60_000), spec, request_id="r-1")


def largest(t: TickwheelTimers) -> int:
    """The largest pad `t` takes (by bisection: the command's size grows with it)."""
    low, high = 0, 2 * MIB
    while low < high:
        mid = (low + high + 1) // 2
        try:
            command(t, mid)
            low = mid
        except ValueError:
            high = mid - 1
    return low


async def test_a_command_past_the_producers_request_bound_is_refused_unsent() -> None:
    t = timers()
    assert t.app.conf.producer_max_request_size == 1_000_000
    with pytest.raises(ValueError, match="producer_max_request_size 1000000"):
        command(t, 1_010_000)  # ~1.01 MB: within the workers' 1 MiB
    # The largest taken is one faust's producer sends: aiokafka refuses a record whose
    # size so estimated exceeds its max_request_size (`AIOKafkaProducer._serialize`).
    cmd = command(t, largest(t))
    value = encode(cmd)
    size = DefaultRecordBatchBuilder.estimate_size_in_bytes(b"o-1", value, [])
    assert len(value) > 1_000_000 - RECORD_OVERHEAD - 100 and size <= 1_000_000


async def test_the_workers_record_bound_holds_under_a_larger_producer_bound() -> None:
    t = timers(request_bytes=4 * MIB, max_record_bytes=MIB)
    with pytest.raises(ValueError, match="TICKWHEEL_MAX_RECORD_BYTES"):
        command(t, MIB)
    assert len(encode(command(t, largest(t)))) <= MIB
    small = timers(request_bytes=4 * MIB, max_record_bytes=200_000)
    assert len(encode(command(small, largest(small)))) <= 200_000
