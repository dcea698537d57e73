"""The README's worker line, `PYTHONPATH=. tickwheel worker --service mymodule:service`, run
as written (bash, in a directory holding the README's `mymodule.py`) against the session's
broker, and what the README says of it, each through an interface: the worker creates
the `shop.order.*` topics (the admin's list of topics), decides the commands sent to
`shop.order.commands` (their results and events in the committed log, `/metrics`) and
fires the timers (`/timers/upcoming`, then the timer's command and its events in the log);
then it stops cleanly on SIGTERM.

The README's payment deadline is due 10 minutes after its order is placed, longer than a
test may take: the test does not wait for it. It sets that timer due now instead, as
docs/wire-format.md says another service may (a `wow.ScheduleSet` of the key at the
owner's version, under another id, replaces it until it fired), and the worker fires it
into the README's `shop.CancelUnpaid` handler, which cancels the unpaid order.

`tickwheel` is the venv's (its directory first on PATH, as an activated venv puts it): the
line sets PYTHONPATH to the module's directory, so the worker runs the installed package,
as a user's does (where the venv's editable install points at another checkout, a git
worktree sharing one venv, that checkout's code).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes import doc_modules
from harness import Client, Cluster, Worker, eventually, free_port

from app.kafka import existing_topics, read_partitions
from app.node.settings import Settings
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    SCHEDULE_CANCELLED,
    SCHEDULE_SET,
    CommandEnvelope,
    EventEnvelope,
    ResultCode,
    decode,
)
from tables.partitioner import partition_of

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ORDERS = AggregateTopics("shop", "order")
DEADLINE_MS = 600_000
"""The README's payment deadline: "in 10 minutes"."""
GROUP = "readme-worker"
"""The worker's group: one no other test's workers join (scripts/run's demo runs in the
default `tickwheel`, test_readme_kcat's in `g-shop`), so that each finds its offsets where
it left them; the shop.order topics are shared, and each group decides the others'
commands with its own service (answers its commands need not be this test's)."""
WITHIN = 120.0
"""How long a state may take to come: the worker's start on a fresh broker (creating its
topics, joining its group) takes 8-12 s, twice that on a loaded machine."""


def readme_worker_line() -> str:
    """The README's line that runs the quick start's service, as written."""
    lines: list[str] = re.findall(r"Run it with `([^`]+)`", README.read_text())
    assert len(lines) == 1, "the README shows one line that runs its service"
    line = lines[0]
    assert re.fullmatch(r"(?:[A-Z_]+=\S+ )*tickwheel worker --service mymodule:service", line), (
        f"the README's line runs the worker on mymodule.py's service: {line!r}"
    )
    return line


async def shop_partitions(bootstrap: str) -> int | None:
    """The partition count the `shop` topics already have on the session's broker (other
    tests' workers made them: the docs' worker runs with the default count), or None: the
    worker makes them with the default count, as the README's would."""
    names = [ORDERS.events, ORDERS.commands, ORDERS.timers_changelog, ORDERS.timer_ops]
    found = set(
        (await existing_topics(bootstrap, [*names, ContextTopics("shop").results])).values()
    )
    assert len(found) <= 1, f"the shop topics have different partition counts: {found}"
    return found.pop() if found else None


@pytest.fixture
def readme_dir(tmp_path: Path) -> Path:
    """A directory holding only the README's `mymodule.py`, as a user's would."""
    here = tmp_path / "service"
    here.mkdir()
    (here / "mymodule.py").write_text(doc_modules(README)["mymodule"])
    return here


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def start_line(directory: Path, env: dict[str, str], log: Path) -> Worker:
    """The README's line, run by bash in `directory` in a process group of its own (what is
    left of it can be found), its output in `log`."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", readme_worker_line()],
            cwd=directory,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Worker("readme", proc, log, int(env["TICKWHEEL_WEB_PORT"]))


@pytest.fixture
async def readme_worker(
    kafka_bootstrap: str, readme_dir: Path, tmp_path: Path
) -> AsyncIterator[tuple[Worker, set[str]]]:
    """The README's worker running in `readme_dir`, with the shop topics that existed
    before it started; killed after the test if still running."""
    partitions = await shop_partitions(kafka_bootstrap)
    before = set(await existing_topics(kafka_bootstrap, topics_of_the_service()))
    # A fresh shell's (no TICKWHEEL_* or KAFKA_* of the test's), the venv's bin first.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TICKWHEEL_", "KAFKA_"))}
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        TICKWHEEL_GROUP_ID=GROUP,
        TICKWHEEL_WEB_PORT=str(free_port()),
    )
    if partitions is not None and partitions != Settings().partitions:
        env["TICKWHEEL_PARTITIONS"] = str(partitions)  # co-partitioning: theirs
    worker = start_line(readme_dir, env, tmp_path / "worker.log")
    try:
        yield worker, before
    finally:
        if group_alive(worker.proc.pid):
            os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(10)


def topics_of_the_service() -> list[str]:
    return [ORDERS.events, ORDERS.commands, ORDERS.timers_changelog, ORDERS.timer_ops]


def ready(worker: Worker) -> bool:
    """Running its partitions (or exited: its log says why)."""
    if not worker.alive:
        raise AssertionError(f"the worker exited {worker.proc.returncode}:\n{worker.text()}")
    health = worker.health()
    return bool(health and health["ready"] and health["owned"] and not health["restoring"])


def upcoming(worker: Worker, owner: str) -> list[dict[str, Any]]:
    """The timers of `owner` the worker's table keeps (`GET /timers/upcoming`)."""
    url = f"http://127.0.0.1:{worker.port}/timers/upcoming?type=shop.order&owner={owner}"
    with urllib.request.urlopen(url, timeout=5) as response:
        timers: list[dict[str, Any]] = orjson.loads(response.read())["timers"]
    return timers


async def events_of(client: Client, owner: str) -> list[EventEnvelope]:
    """The events of the order `owner` in the log. Only its own are decoded: other tests
    write records no reader takes to the shared topic (test_readme_kcat's bad event)."""
    partition = partition_of(owner, client.cluster.partitions)
    found: list[EventEnvelope] = []
    async for batch in read_partitions(client.cluster.kafka, ORDERS.events, [partition]):
        found += [decode(EventEnvelope, r.value) for r in batch if r.key == owner.encode()]
    return found


async def decided(client: Client, command: CommandEnvelope) -> list[EventEnvelope]:
    """Sends `command`; once it is answered COMMITTED, the events of its aggregate."""
    await client.send(command)
    [result] = (await client.wait_results([command.request_id], WITHIN)).values()
    assert result.code is ResultCode.COMMITTED, result
    return await events_of(client, command.aggregate.id)


async def test_the_readmes_worker_line_runs_the_readmes_service(
    kafka_bootstrap: str, readme_worker: tuple[Worker, set[str]], tmp_path: Path
) -> None:
    worker, before = readme_worker
    await eventually(lambda: ready(worker), WITHIN, "the README's worker never got ready")

    # It creates the shop.order topics (those a test before it made were there already).
    made = await existing_topics(kafka_bootstrap, topics_of_the_service())
    assert set(made) == set(topics_of_the_service()), f"made {made}, had {before}"
    partitions = set(made.values()).pop()

    cluster = Cluster(kafka_bootstrap, tmp_path / "client", context="shop", partitions=partitions)
    async with Client(cluster, "order") as client:
        # It decides the commands sent to shop.order.commands: a placed order has its
        # payment deadline, 10 minutes after the decision, in the worker's table...
        paid = f"readme-{uuid.uuid4().hex[:12]}"
        placed = await decided(client, client.command(paid, "shop.PlaceOrder", {"amount": 42}))
        assert [e.type for e in placed] == ["shop.OrderPlaced", SCHEDULE_SET]
        assert placed[0].body == {"amount": 42}
        deadline = placed[1]
        assert deadline.body["key"] == "payment-deadline"
        assert deadline.body["rule"]["at"] == deadline.created_at + DEADLINE_MS
        assert deadline.body["command"]["type"] == "shop.CancelUnpaid"

        def kept() -> bool:
            return [(t["key"], t["slot_due_at"]) for t in upcoming(worker, paid)] == [
                ("payment-deadline", deadline.body["rule"]["at"])
            ]

        await eventually(kept, WITHIN, "the worker's table never held the deadline")

        # ...which paying cancels.
        after = await decided(client, client.command(paid, "shop.PayOrder"))
        assert [e.type for e in after[2:]] == ["shop.OrderPaid", SCHEDULE_CANCELLED]
        await eventually(lambda: not upcoming(worker, paid), WITHIN, "the deadline stayed")

        # It fires the timers: an unpaid order's deadline, set due now at its version (not
        # waited for: 10 minutes), is sent to the README's shop.CancelUnpaid, which cancels
        # the order.
        unpaid = f"readme-{uuid.uuid4().hex[:12]}"
        placed = await decided(client, client.command(unpaid, "shop.PlaceOrder", {"amount": 7}))
        due_now = placed[1].model_copy(
            update={
                "id": uuid.uuid4().hex,
                "request_id": None,
                "body": {**placed[1].body, "rule": {"kind": "once", "at": int(time.time() * 1000)}},
            }
        )
        await client.write_events(due_now)

        async def cancelled() -> bool:
            return "shop.OrderCancelled" in [e.type for e in await events_of(client, unpaid)]

        await eventually(cancelled, WITHIN, "the deadline never fired")
        [fired] = [e for e in await events_of(client, unpaid) if e.type == "shop.OrderCancelled"]
        assert fired.request_id and fired.request_id.startswith(f"{due_now.id}#"), fired
        await eventually(lambda: not upcoming(worker, unpaid), WITHIN, "the fired one stayed")

    # /metrics counts what it decided (the commands of other tests' orders too).
    committed = worker.metric("tickwheel_commands_total", type="shop.order", code="COMMITTED")
    assert committed >= 4, "placed, paid, placed, cancelled by its deadline"

    # It stops cleanly on SIGTERM (to its process group: bash's exec'd worker).
    os.killpg(worker.proc.pid, signal.SIGTERM)
    code = worker.proc.wait(60)
    assert code == 0, worker.text()
    assert "worker stopped" in worker.text()
