"""A faust app with durable reminders: an order placed gets a reminder, paying cancels it;
holding an order pauses its reminder, releasing it resumes it, a nudge sends it at once.

    tickwheel worker --service examples.reminders_service:service
    python -m examples.faust_app worker -l info

`<context>.orders` takes `{"order_id": …, "kind": "placed"|"paid"|"held"|"released"|"nudged",
"remind_in_ms": …}`
keyed by the order id; each reminder that fires is written to `<context>.reminders-sent`.
Environment: `KAFKA_BOOTSTRAP_SERVERS`, `TICKWHEEL_PARTITIONS` (the workers' count),
`REMINDERS_CONTEXT`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import faust

from app import CommandEnvelope, CommandSpec, OnceRule, ResultCode, TickwheelTimers
from examples.reminders_service import BOOK, CONTEXT, TARGET

PARTITIONS = int(os.environ.get("TICKWHEEL_PARTITIONS", "12"))
BROKER = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 30.0
"""How long `durably` waits before its first retry, doubled up to the longest."""
logger = logging.getLogger(__name__)

app = faust.App(
    f"{CONTEXT}-reminders",
    broker=[f"kafka://{b}" for b in BROKER.split(",")],
    topic_partitions=PARTITIONS,
    web_enabled=False,  # faust's web server would want port 6066 in every worker
    broker_session_timeout=10,  # a group joins in seconds, not faust's default minute
)


class OrderEvent(faust.Record, serializer="json"):
    order_id: str
    kind: str  # "placed", "paid", "held", "released" or "nudged"
    remind_in_ms: int = 0


class ReminderSent(faust.Record, serializer="json"):
    order_id: str
    request_id: str  # `<timer id>#<slot>`: the same for a reminder sent again
    due_at: int


orders = app.topic(
    f"{CONTEXT}.orders", key_type=str, value_type=OrderEvent, partitions=PARTITIONS, internal=True
)
reminders_sent = app.topic(
    f"{CONTEXT}.reminders-sent", key_type=str, value_type=ReminderSent, partitions=PARTITIONS
)
timers = TickwheelTimers(app, context=CONTEXT, book=BOOK, target=TARGET, partitions=PARTITIONS)


async def durably(call: Callable[..., Awaitable[object]], *args: Any) -> None:
    """`call(*args)` until the broker has its command. faust acks the event of an agent
    that raised (and restarts the agent): a command that failed would be lost with it.
    Sent again, its request id (derived from the event) is the same: one that did arrive
    is a DUPLICATE. A ValueError is the command's own fault (nothing was sent): raised."""
    delay = RETRY_FIRST_S
    while True:
        try:
            await call(*args)
            return
        except ValueError:
            raise
        except Exception as exc:  # the broker's: retried, the event kept unacked meanwhile
            logger.warning("timer command not sent (%r): again in %.1f s", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)


@app.agent(orders)
async def on_order(stream: faust.StreamT[OrderEvent]) -> None:
    async for event in stream.events():
        order = event.value
        if order.kind == "placed":
            # From the event's own time: processed again, it asks for the same slot.
            at = int(event.message.timestamp * 1000) + order.remind_in_ms
            remind = CommandSpec(type="reminders.Remind", body={"order_id": order.order_id})
            await durably(timers.schedule, order.order_id, "reminder", OnceRule(at=at), remind)
        elif order.kind == "paid":
            await durably(timers.cancel, order.order_id, "reminder")
        elif order.kind == "held":  # fires nothing until released (held again: UNCHANGED)
            await durably(timers.pause, order.order_id, "reminder")
        elif order.kind == "released":
            await durably(timers.resume, order.order_id, "reminder")
        elif order.kind == "nudged":  # the reminder once now; its due time stays as it was
            await durably(timers.trigger, order.order_id, "reminder")


@app.agent(timers.commands)
async def on_fired(commands: faust.StreamT[CommandEnvelope]) -> None:
    await reminders_sent.maybe_declare()
    async for cmd in commands:
        if (early := timers.early_by(cmd)) > 0:  # this host's clock is behind the worker's
            await timers.answer(cmd, ResultCode.SCHEDULE_NOT_DUE, f"{early} ms early")
            continue
        sent = ReminderSent(
            order_id=cmd.aggregate.id, request_id=cmd.request_id, due_at=cmd.not_before or 0
        )
        try:
            # `send` only queues it: its future is the broker's answer (`force`: sent now,
            # not held for the event's commit, which would wait on this very send).
            await (await reminders_sent.send(key=cmd.aggregate.id, value=sent, force=True))
        except Exception as exc:  # not sent: a failed attempt, sent again with backoff
            await timers.answer(cmd, ResultCode.ERROR, f"reminder not sent: {exc!r}")
            continue
        await timers.answer(cmd)  # COMMITTED: the worker settles the timer's slot


if __name__ == "__main__":
    app.main()
