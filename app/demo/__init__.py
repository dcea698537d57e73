"""The demo: a `shop.order` context whose orders schedule a payment deadline and a reminder.

Placing an order schedules `shop.CancelUnpaid` at a deadline and `shop.RemindToPay` every
few seconds; paying cancels both; the deadline cancels an unpaid order (and its reminder).
The `shop` context also declares a job, `unpaid-report`, run every 5 seconds (cron with a
seconds field): each slot records a `shop.ReportRun` on the `shop.report` aggregate
`unpaid-orders`, in the same transaction as the slot's `wow.Ticked` on `shop.schedule`.
`run_demo` enables the job, places a few orders, pays one, and prints what the logs record
as it happens; it reaches Kafka through the `Clients` it is given (the CLI makes them).

May import: the package root alone (`app`), as a service would.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from pydantic import BaseModel

from app import (
    SCHEDULE,
    SCHEDULE_CANCELLED,
    SCHEDULE_SET,
    TICKED,
    AggregateRef,
    AggregateTopics,
    AggregateType,
    Clients,
    Command,
    CommandEnvelope,
    CommandSpec,
    CronRule,
    Decision,
    Event,
    EventEnvelope,
    IntervalRule,
    Job,
    JobRun,
    JobScope,
    OnceRule,
    Service,
    Timer,
    decode,
    enable_command,
    encode,
    node_topics,
    partition_of,
)

__all__ = [
    "OrderState",
    "ReportState",
    "orders",
    "reports",
    "run_demo",
    "service",
    "timer_table",
    "unpaid_report",
]

ORDERS = AggregateTopics("shop", "order")
REPORTS = AggregateTopics("shop", "report")
SCHEDULES = AggregateTopics("shop", SCHEDULE)
REPORT_EVERY = "*/5 * * * * *"
"""Every 5 seconds: six cron fields, the first one seconds."""


class OrderState(BaseModel):
    placed: bool = False
    paid: bool = False
    cancelled: bool = False
    amount: int = 0
    reminders: int = 0


orders = AggregateType("shop", "order", OrderState)


@orders.command("shop.PlaceOrder")
def place(state: OrderState, cmd: Command, d: Decision) -> None:
    if state.placed:
        d.reject("order already placed")
    deadline_ms = int(cmd.body.get("deadline_ms", 10_000))
    remind_every_ms = int(cmd.body.get("remind_every_ms", 2_000))
    d.emit("shop.OrderPlaced", {"amount": int(cmd.body.get("amount", 0))})
    d.schedule(
        "payment-deadline",
        OnceRule(at=d.now + deadline_ms),
        CommandSpec(type="shop.CancelUnpaid"),
    )
    d.schedule(
        "reminder",
        IntervalRule(start=d.now + remind_every_ms, every=remind_every_ms),
        CommandSpec(type="shop.RemindToPay"),
    )


@orders.command("shop.PayOrder")
def pay(state: OrderState, cmd: Command, d: Decision) -> None:
    if not state.placed or state.cancelled:
        d.reject("no open order to pay")
    if state.paid:
        d.reject("already paid")
    d.emit("shop.OrderPaid", {})
    d.cancel_schedule("payment-deadline")
    d.cancel_schedule("reminder")


@orders.command("shop.RemindToPay")
def remind(state: OrderState, cmd: Command, d: Decision) -> None:
    if state.paid or state.cancelled:
        d.reject("nothing to remind of")
    d.emit("shop.ReminderSent", {"n": state.reminders + 1})


@orders.command("shop.CancelUnpaid")
def cancel_unpaid(state: OrderState, cmd: Command, d: Decision) -> None:
    if state.paid or state.cancelled:
        d.reject("paid or cancelled already")
    d.emit("shop.OrderCancelled", {"reason": "unpaid at the deadline"})
    d.cancel_schedule("reminder")


@orders.applies("shop.OrderPlaced")
def _placed(state: OrderState, e: Event) -> OrderState:
    return state.model_copy(update={"placed": True, "amount": e.body["amount"]})


@orders.applies("shop.OrderPaid")
def _paid(state: OrderState, e: Event) -> OrderState:
    return state.model_copy(update={"paid": True})


@orders.applies("shop.ReminderSent")
def _reminded(state: OrderState, e: Event) -> OrderState:
    return state.model_copy(update={"reminders": e.body["n"]})


@orders.applies("shop.OrderCancelled")
def _cancelled(state: OrderState, e: Event) -> OrderState:
    return state.model_copy(update={"cancelled": True})


class ReportState(BaseModel):
    runs: int = 0
    last_slot: int | None = None


reports = AggregateType("shop", "report", ReportState)


@reports.command("shop.RunReport")
def run_report(state: ReportState, cmd: Command, d: Decision) -> None:
    d.emit(
        "shop.ReportRun",
        {"slot": cmd.body["slot"], "due_at": cmd.body["due_at"], "run": state.runs + 1},
    )


@reports.applies("shop.ReportRun")
def _report_run(state: ReportState, e: Event) -> ReportState:
    return state.model_copy(update={"runs": e.body["run"], "last_slot": e.body["slot"]})


def _unpaid_report(run: JobRun) -> None:
    # Committed with the slot's wow.Ticked: the report runs once per slot.
    target = AggregateRef(context="shop", aggregate="report", id="unpaid-orders")
    run.send(target, "shop.RunReport", {"slot": run.slot, "due_at": run.due_at})


unpaid_report = Job(
    "unpaid-report",
    JobScope.SYSTEM,
    CronRule(expr=REPORT_EVERY, zone="UTC"),
    _unpaid_report,
)

service = Service(aggregates=(orders, reports), jobs={"shop": (unpaid_report,)})


def command(order_id: str, type_: str, body: dict[str, object] | None = None) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=f"demo-{uuid.uuid4().hex}",
        type=type_,
        aggregate=AggregateRef(context="shop", aggregate="order", id=order_id),
        body=body or {},
        issued_at=int(time.time() * 1000),
    )


async def timer_table(clients: Clients, partitions: int) -> dict[bytes, Timer]:
    """The timers as the table's changelog has them now (the latest row per key)."""
    rows: dict[bytes, Timer] = {}
    async with clients.reader() as reader:
        for p in range(partitions):
            async with aclosing(reader.read(ORDERS.timers_changelog, p, 0)) as batches:
                async for batch in batches:
                    for r in batch:
                        if r.key is not None and r.value is not None:
                            rows[r.key] = Timer.model_validate_json(r.value)
    return rows


async def run_demo(
    clients: Clients,
    partitions: int,
    *,
    count: int = 3,
    seconds: float = 20.0,
    show: Callable[[str], None] = print,
) -> dict[bytes, Timer]:
    """Enables the report job, places `count` orders, pays the first, prints the logs for
    `seconds`; the orders' timers."""
    await clients.admin().ensure_topics(node_topics([ORDERS, REPORTS, SCHEDULES], partitions))
    producer = clients.publisher()
    await producer.start()
    started = time.monotonic()

    async def send(cmd: CommandEnvelope) -> None:
        key = cmd.aggregate.id
        await producer.send(
            ORDERS.commands, key.encode(), encode(cmd), partition_of(key, partitions)
        )

    watchers = [
        asyncio.create_task(_watch(clients, partitions, started, show)),
        asyncio.create_task(_watch_schedule(clients, partitions, started, show)),
    ]
    await asyncio.sleep(1)  # the tails start at the logs' ends: let them get there first
    try:
        # Idempotent: enabling an enabled instance with the same rule changes nothing.
        enable = enable_command("shop", unpaid_report)
        key = enable.aggregate.id
        await producer.send(
            SCHEDULES.commands, key.encode(), encode(enable), partition_of(key, partitions)
        )
        show(f"enabled job {unpaid_report.name}: a report by cron {REPORT_EVERY!r} (every 5 s)")
        ids = [f"order-{uuid.uuid4().hex[:6]}" for _ in range(count)]
        for order_id in ids:
            await send(command(order_id, "shop.PlaceOrder", {"amount": 42}))
        show(f"placed {', '.join(ids)}: each schedules a deadline (10 s) and a reminder (2 s)")
        await asyncio.sleep(3)
        await send(command(ids[0], "shop.PayOrder"))
        show(f"paid {ids[0]}: its timers are cancelled")
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))
    finally:
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        await producer.stop()
    rows = await timer_table(clients, partitions)
    show(render(rows))
    return rows


async def _tail(
    clients: Clients, topic: str, partitions: int
) -> AsyncGenerator[bytes | None, None]:
    """The values of the records written to `topic` from now on, until cancelled."""
    follower = clients.follower(topic)
    await follower.start()
    try:
        for p in range(partitions):
            await follower.add(p)  # from the partition's end
        while True:
            for record in await follower.poll(timeout_ms=500):
                yield record.value
    finally:
        await follower.stop()


async def _watch(
    clients: Clients, partitions: int, started: float, show: Callable[[str], None]
) -> None:
    async with aclosing(_tail(clients, ORDERS.events, partitions)) as values:
        async for value in values:
            e = decode(EventEnvelope, value)
            what = e.type
            if e.type in (SCHEDULE_SET, SCHEDULE_CANCELLED):
                what = f"{e.type} {e.body.get('key')}"
            by = "" if not e.request_id or "#" not in e.request_id else " (fired by a timer)"
            show(f"{time.monotonic() - started:6.1f}s  {e.aggregate.id}  v{e.version}  {what}{by}")


async def _watch_schedule(
    clients: Clients, partitions: int, started: float, show: Callable[[str], None]
) -> None:
    async with aclosing(_tail(clients, SCHEDULES.events, partitions)) as values:
        async for value in values:
            e = decode(EventEnvelope, value)
            if e.type == TICKED:
                due = time.strftime("%H:%M:%S", time.gmtime(e.body["due_at"] / 1000))
                what = f"{e.type} slot {e.body['slot']} due {due} UTC: the report runs"
            elif e.type in (SCHEDULE_SET, SCHEDULE_CANCELLED):
                continue  # the job's own timer, rescheduled with it
            else:
                what = e.type
            show(f"{time.monotonic() - started:6.1f}s  job {e.aggregate.id}  v{e.version}  {what}")


def render(rows: dict[bytes, Timer]) -> str:
    lines = [f"{'order':<13} {'key':<17} {'status':<9} {'slot':>4} {'skipped':>7}  outcome"]
    for t in sorted(rows.values(), key=lambda t: (t.owner.id, t.key)):
        lines.append(
            f"{t.owner.id:<13} {t.key:<17} {t.status.value:<9} {t.slot:>4} {t.skipped:>7}  "
            f"{t.outcome.value if t.outcome else '-'}"
        )
    return "\n".join(lines)
