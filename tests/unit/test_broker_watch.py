"""BrokerWatch: the aiokafka log filter, the reachable/unreachable state machine, the probe.

The state machine runs on a fake clock and a fake probe (nothing waits in real time); the
probe itself is tried on real sockets: a server that answers ApiVersions, one that accepts
connections but never answers (a frozen broker: the kernel accepts for it), one that
hangs up, and a closed port.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import aiokafka
import pytest
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    KafkaConnectionError,
    NodeNotReadyError,
    NotEnoughReplicasError,
    NotLeaderForPartitionError,
)
from prometheus_client import CollectorRegistry

from app.kafka import log_filter as filtering
from app.kafka import probe as probe_module
from app.kafka.broker_watch import (
    AIOKAFKA_LOGGERS,
    BrokerLogFilter,
    BrokerWatch,
    api_versions_probe,
    classify,
)

ADDRESS = "127.0.0.1:9092"
REFUSED = OSError(111, "Connect call failed ('127.0.0.1', 9092)")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeProbe:
    """Answers with the verdicts queued (None: the broker answered), then the last one."""

    def __init__(self, *verdicts: str | None) -> None:
        self.verdicts = list(verdicts) or [None]
        self.calls = 0
        self.called = asyncio.Event()

    def queue(self, *verdicts: str | None) -> None:
        self.verdicts = list(verdicts)

    async def __call__(self) -> str | None:
        self.calls += 1
        self.called.set()
        if len(self.verdicts) > 1:
            return self.verdicts.pop(0)
        return self.verdicts[0]


@pytest.fixture
def log_filter() -> Iterator[BrokerLogFilter]:
    f = BrokerLogFilter()
    f.install()
    yield f
    f.uninstall()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def watch_of(
    log_filter: BrokerLogFilter,
    clock: FakeClock,
    registry: CollectorRegistry,
    probe: FakeProbe,
) -> BrokerWatch:
    watch = BrokerWatch(ADDRESS, registry=registry, probe=probe, clock=clock, log_filter=log_filter)
    log_filter.attach(watch)  # what start() does, without the probing task
    return watch


def metric(registry: CollectorRegistry, name: str) -> float | None:
    value: float | None = registry.get_sample_value(name)
    return value


def flood(n: int) -> None:
    """What aiokafka logs while the broker is away, `n` times over."""
    client = logging.getLogger("aiokafka")
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    coordinator = logging.getLogger("aiokafka.consumer.group_coordinator")
    sender = logging.getLogger("aiokafka.producer.sender")
    for _ in range(n):
        client.error("Unable connect to node with id %s: %s", 1, REFUSED)
        client.error("Unable to update metadata from %s", [1])
        fetcher.error("Failed fetch messages from %s: %s", 1, NodeNotReadyError("node 1"))
        coordinator.error("Group Coordinator Request failed: %s", NodeNotReadyError("node 1"))
        sender.warning("Cannot send %r to %s: %r", object, 1, KafkaConnectionError("closed"))


def recovery_noise() -> None:
    """What aiokafka logs while a broker that is back elects leaders and loads groups."""
    sender = logging.getLogger("aiokafka.producer.sender")
    coordinator = logging.getLogger("aiokafka.consumer.group_coordinator")
    sender.warning(
        "Got error produce response on topic-partition %s, retrying. Error: %s",
        "t-0",
        NotLeaderForPartitionError,
    )
    sender.warning(
        "Got error produce response on topic-partition %s, retrying. Error: %s",
        "t-1",
        NotEnoughReplicasError,
    )
    coordinator.warning(
        "Heartbeat failed: local member_id was not recognized; resetting and re-joining group"
    )
    coordinator.error("Group Coordinator Request failed: %s", GroupCoordinatorNotAvailableError())


def lines(caplog: pytest.LogCaptureFixture, name: str = "") -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith(name)] if name else caplog.records


# --------------------------------------------------------------------------- the filter


async def test_a_flood_of_client_errors_is_one_line_down_and_one_line_back(
    log_filter: BrokerLogFilter,
    clock: FakeClock,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    probe = FakeProbe(None)
    watch = watch_of(log_filter, clock, registry, probe)
    assert await watch.check()

    flood(200)  # the broker was killed: connection refused
    probe.queue("connection refused")
    assert not await watch.check()  # one failed probe: the client library agrees
    flood(800)
    clock.now += 2
    assert not await watch.check()
    clock.now += 15
    flood(1000)
    probe.queue(None)
    assert await watch.check()
    recovery_noise()  # leaders elected, groups loaded: part of the outage's tail

    assert not lines(caplog, "aiokafka")
    said = [(r.levelname, r.getMessage()) for r in lines(caplog, "app.kafka.broker_watch")]
    assert len(said) == 2, said
    (down_level, down), (up_level, up) = said
    assert down_level == "WARNING"
    assert ADDRESS in down and "unreachable" in down and "connection refused" in down
    assert "Unable connect to node with id 1" in down  # the client library's first word
    assert up_level == "INFO"
    assert ADDRESS in up and "after 17.0 s" in up
    assert "10000 client library line(s) muted" in up
    assert metric(registry, "tickwheel_broker_outages_total") == 1
    assert metric(registry, "tickwheel_broker_outage_seconds_total") == pytest.approx(17.0)
    assert metric(registry, "tickwheel_broker_reachable") == 1

    # Long after the outage, the same retries are news again and pass: one of each kind
    # (the second produce retry of the same second is muted, and counted).
    clock.now += watch.settle + 1
    recovery_noise()
    assert len(lines(caplog, "aiokafka")) == 3


def test_retries_while_the_broker_answers_are_one_line_of_each_kind_every_ten_seconds(
    log_filter: BrokerLogFilter,
    clock: FakeClock,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A partition short of in-sync replicas for minutes, on a cluster whose other brokers
    answer: aiokafka retries its produce ~100 times a second, a WARNING each."""
    caplog.set_level(logging.DEBUG)
    watch = watch_of(log_filter, clock, registry, FakeProbe())
    sender = logging.getLogger("aiokafka.producer.sender")

    def retries(n: int) -> None:
        for i in range(n):
            sender.warning(
                "Got error produce response on topic-partition %s, retrying. Error: %s",
                f"t-{i % 3}",
                NotEnoughReplicasError,
            )

    retries(100)
    assert len(lines(caplog, "aiokafka")) == 1
    clock.now += watch.retry_line_every - 1
    retries(100)
    assert len(lines(caplog, "aiokafka")) == 1
    clock.now += 1
    retries(100)
    assert len(lines(caplog, "aiokafka")) == 2
    said = [r.getMessage() for r in lines(caplog, "app.kafka.broker_watch")]
    assert said == ["199 client library retry line(s) like the next one muted in the last 10 s"]


def test_unrelated_records_pass(
    log_filter: BrokerLogFilter,
    clock: FakeClock,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    watch = watch_of(log_filter, clock, registry, FakeProbe())
    watch.reachable = False  # even while the broker is away
    logging.getLogger("aiokafka.consumer.consumer").info("Subscribed to topic(s): %s", {"t"})
    logging.getLogger("aiokafka.coordinator.assignors.range").warning(
        "No partition metadata for topic %s", "t"
    )
    logging.getLogger("aiokafka.consumer.group_coordinator").error(
        "OffsetCommit failed for group %s on partition %s with offset %s: %s", "g", "t-0", 5, "X"
    )
    logging.getLogger("app.node").error("Unable connect to node with id %s: %s", 1, REFUSED)
    assert [r.name for r in caplog.records] == [
        "aiokafka.consumer.consumer",
        "aiokafka.coordinator.assignors.range",
        "aiokafka.consumer.group_coordinator",
        "app.node",
    ]


def test_nothing_is_muted_while_no_watch_listens(
    log_filter: BrokerLogFilter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    flood(3)
    recovery_noise()
    assert len(lines(caplog, "aiokafka")) == 3 * 5 + 4


def test_classify() -> None:
    def record(name: str, msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)

    coordinator = "aiokafka.consumer.group_coordinator"
    fetch = "Failed fetch messages from %s: %s"
    assert classify(record("aiokafka", "Unable to update metadata from %s", [1])) == "connection"
    assert classify(record("aiokafka.consumer.fetcher", fetch, 1, NodeNotReadyError())) == (
        "connection"
    )
    assert classify(record("aiokafka.consumer.fetcher", fetch, 1, TimeoutError())) == ("connection")
    # The same record about a broker that answered with an error: it is there.
    assert classify(record("aiokafka.consumer.fetcher", fetch, 1, NotLeaderForPartitionError()))
    assert classify(
        record(
            coordinator, "Group Coordinator Request failed: %s", GroupCoordinatorNotAvailableError()
        )
    ) == ("recovery")
    assert classify(
        record(coordinator, "Heartbeat failed for group %s because it is rebalancing", "g")
    ) == ("recovery")
    # Same words, another logger: not aiokafka's.
    assert classify(record("app.kafka", "Unable to update metadata from %s", [1])) is None
    assert classify(record("aiokafka", "Unable connect to node with id %s", 1)) is None


def _aiokafka_log_calls() -> dict[str, set[str]]:
    """Every `log.<level>("literal", ...)` format string in aiokafka, by logger name."""
    root = Path(aiokafka.__file__).parent
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        module = "aiokafka." + ".".join(path.relative_to(root).with_suffix("").parts)
        name = None
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and node.args
            ):
                arg = node.args[0]
                if isinstance(arg, ast.Name) and arg.id == "__name__":
                    name = module
                elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    name = arg.value
        if name is None:
            continue
        calls = found.setdefault(name, set())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "log"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                calls.add(node.args[0].value)
    return found


def test_the_filter_knows_aiokafkas_loggers_and_messages() -> None:
    """Guards an aiokafka upgrade: every logger it logs on gets the filter, and every
    message the filter looks for is still one it logs."""
    calls = _aiokafka_log_calls()
    assert set(calls) <= set(AIOKAFKA_LOGGERS)
    known = filtering._CONNECTION | filtering._BY_ERROR | filtering._RECOVERY
    missing = [(name, msg) for name, msg in known if msg not in calls.get(name, set())]
    assert not missing


# --------------------------------------------------------------------------- state machine


async def test_unreachable_after_two_failed_probes_back_after_one_answer(
    clock: FakeClock,
    registry: CollectorRegistry,
    log_filter: BrokerLogFilter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="app.kafka.broker_watch")
    probe = FakeProbe(None)
    watch = watch_of(log_filter, clock, registry, probe)
    assert watch.status() == {"address": ADDRESS, "reachable": True, "outages": 0}

    probe.queue("connected, but no answer to ApiVersions within 2 s")
    assert await watch.check()  # one slow answer is not an outage
    assert watch.reachable and watch.down_since is None and watch.reason is None
    first_failure = clock.now
    clock.now += 3
    assert not await watch.check()
    assert watch.down_since == first_failure  # gone since the first probe it did not answer
    assert watch.reason == "connected, but no answer to ApiVersions within 2 s"
    assert watch.outages == 1
    assert metric(registry, "tickwheel_broker_reachable") == 0
    assert metric(registry, "tickwheel_broker_outages_total") == 1

    clock.now += 4
    probe.queue("connection refused")  # frozen, then killed
    assert not await watch.check()
    assert watch.reason == "connection refused"
    assert metric(registry, "tickwheel_broker_outage_seconds_total") == pytest.approx(7)
    assert watch.status() == {
        "address": ADDRESS,
        "reachable": False,
        "outages": 1,
        "down_for_s": 7.0,
        "reason": "connection refused",
    }

    clock.now += 6
    probe.queue(None)
    assert await watch.check()
    assert watch.reachable and watch.down_since is None and watch.reason is None
    assert metric(registry, "tickwheel_broker_outage_seconds_total") == pytest.approx(13)
    assert metric(registry, "tickwheel_broker_reachable") == 1
    assert watch.status() == {"address": ADDRESS, "reachable": True, "outages": 1}

    # A second outage counts again.
    probe.queue("connection refused")
    await watch.check()
    clock.now += 1
    await watch.check()
    clock.now += 2
    probe.queue(None)
    await watch.check()
    assert watch.outages == 2
    assert metric(registry, "tickwheel_broker_outages_total") == 2
    assert metric(registry, "tickwheel_broker_outage_seconds_total") == pytest.approx(16)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 4
    assert "no answer for 3.0 s" in said[0] and "no answer for 1.0 s" in said[2]
    assert "after 13.0 s unreachable" in said[1] and "after 3.0 s unreachable" in said[3]


async def test_client_errors_agreeing_with_one_failed_probe_are_an_outage(
    clock: FakeClock, registry: CollectorRegistry, log_filter: BrokerLogFilter
) -> None:
    probe = FakeProbe(None)
    watch = watch_of(log_filter, clock, registry, probe)
    await watch.check()
    flood(1)
    probe.queue("connection refused")
    assert not await watch.check()
    assert watch.muted == 5


async def test_client_errors_while_the_broker_answers_are_summed_up_once_a_minute(
    clock: FakeClock,
    registry: CollectorRegistry,
    log_filter: BrokerLogFilter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that cannot talk to a broker that answers the probe (a wrong advertised
    address, say) is not silenced: one WARNING a minute says so."""
    caplog.set_level(logging.INFO)
    probe = FakeProbe(None)
    watch = watch_of(log_filter, clock, registry, probe)
    await watch.check()
    flood(10)
    assert await watch.check()
    flood(10)
    clock.now += 30
    assert await watch.check()  # within the minute: held
    clock.now += 31
    assert await watch.check()
    assert watch.outages == 0
    said = [r.getMessage() for r in lines(caplog, "app.kafka.broker_watch")]
    assert len(said) == 2
    assert "reported 50 connection error(s)" in said[0] and ADDRESS in said[0]
    assert "Unable connect to node with id 1" in said[0]
    assert "reported 50 connection error(s)" in said[1]
    assert not lines(caplog, "aiokafka")


async def test_client_errors_heard_during_a_probe_wait_for_the_next_one(
    clock: FakeClock,
    registry: CollectorRegistry,
    log_filter: BrokerLogFilter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="app.kafka.broker_watch")

    async def probe() -> str | None:
        clock.now += 1
        flood(1)  # the broker went away while this probe was answered
        return None

    watch = BrokerWatch(ADDRESS, registry=registry, probe=probe, clock=clock, log_filter=log_filter)
    log_filter.attach(watch)
    assert await watch.check()
    assert not caplog.records  # not "answers, but...": the answer came before the errors


# --------------------------------------------------------------------------- the task


async def test_the_task_probes_at_once_when_the_client_library_complains(
    registry: CollectorRegistry, log_filter: BrokerLogFilter
) -> None:
    probe = FakeProbe(None)
    watch = BrokerWatch(
        ADDRESS,
        registry=registry,
        probe=probe,
        interval=3600,
        down_interval=0.01,
        log_filter=log_filter,
    )
    await watch.start()
    try:
        await asyncio.wait_for(probe.called.wait(), 5)
        assert log_filter in logging.getLogger("aiokafka.producer.sender").filters
        probe.called.clear()
        probe.queue("connection refused")
        flood(1)
        await asyncio.wait_for(probe.called.wait(), 5)  # long before the hour is up
        assert not watch.reachable
        probe.queue(None)
        for _ in range(500):
            if watch.reachable:
                break
            await asyncio.sleep(0.01)  # the task probes every down_interval meanwhile
        assert watch.reachable and watch.outages == 1
    finally:
        await watch.stop()
    calls = probe.calls
    flood(1)
    await asyncio.sleep(0.05)
    assert probe.calls == calls  # stopped: no more probes, nothing muted
    assert watch not in log_filter._watches


# --------------------------------------------------------------------------- the probe


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> AsyncIterator[str]:
    writers: list[asyncio.StreamWriter] = []

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await handler(reader, writer)

    server = await asyncio.start_server(tracked, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.close()
        for writer in writers:  # a handler still waiting on its peer would hold it up
            writer.transport.abort()
        await server.wait_closed()


@pytest.fixture
async def answering() -> AsyncIterator[str]:
    """A minimal broker: answers ApiVersions v0 with no APIs."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                request = await reader.readexactly(size)
                api_key, _version, correlation = struct.unpack_from(">hhi", request)
                assert api_key == 18
                body = struct.pack(">ihi", correlation, 0, 0)
                writer.write(struct.pack(">i", len(body)) + body)
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    async for address in _serve(handle):
        yield address


@pytest.fixture
async def frozen() -> AsyncIterator[str]:
    """Accepts connections and reads requests, never answers (like a SIGSTOPped broker)."""
    gone = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionResetError):
            await reader.read()  # until the probe gives up and hangs up
        gone.set()
        writer.close()

    async for address in _serve(handle):
        yield address
        await asyncio.wait_for(gone.wait(), 5)  # the probe hung up: it gave up on an answer


@pytest.fixture
async def hanging_up() -> AsyncIterator[str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async for address in _serve(handle):
        yield address


@pytest.fixture
def closed_port() -> str:
    return f"127.0.0.1:{broker_watch_free_port()}"


def broker_watch_free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_a_broker_that_answers_is_reachable(answering: str) -> None:
    assert await api_versions_probe(answering, within=5) is None
    watch = BrokerWatch(answering, log_filter=BrokerLogFilter())
    assert await watch.check()


async def test_a_frozen_broker_that_accepts_but_never_answers_is_unreachable(frozen: str) -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    why = await api_versions_probe(frozen, within=0.3)
    assert why == "connected, but no answer to ApiVersions within 0.3 s"
    assert 0.25 < loop.time() - began < 3
    watch = BrokerWatch(frozen, timeout=0.2, log_filter=BrokerLogFilter())
    assert await watch.check()  # one slow answer
    assert not await watch.check()
    assert watch.reason == "connected, but no answer to ApiVersions within 0.2 s"


async def test_a_refused_or_hung_up_connection_is_a_failure(
    closed_port: str, hanging_up: str
) -> None:
    assert await api_versions_probe(closed_port, within=5) == "connection refused"
    assert await api_versions_probe(hanging_up, within=5) == "connection closed before an answer"


async def test_one_answering_bootstrap_address_is_enough(
    closed_port: str, answering: str, frozen: str
) -> None:
    assert await api_versions_probe(f"{closed_port},{answering}", within=5) is None
    why = await api_versions_probe(f"{closed_port}, {frozen}", within=0.2)
    assert why == (
        f"{closed_port}: connection refused; "
        f"{frozen}: connected, but no answer to ApiVersions within 0.2 s"
    )
    assert "without a scheme" in str(await api_versions_probe("PLAINTEXT://k:9092", within=1))


async def test_a_host_without_a_port_is_probed_at_9092_as_the_clients_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a hunt of the settings: a bootstrap host without a port (which both client
    libraries read at 9092) was "not host:port" to the probe, the broker never answered
    the watch and the node was never ready; the access check at start tried nothing."""
    seen: list[tuple[str, int]] = []

    async def one(host: str, port: int, within: float, context: object) -> str | None:
        seen.append((host, port))
        return "refused here"

    monkeypatch.setattr(probe_module, "_probe_one", one)
    assert await api_versions_probe("localhost", within=0.2) == "refused here"
    await api_versions_probe("[::1],kafka-0.kafka:9093", within=0.2)
    assert seen == [("localhost", 9092), ("::1", 9092), ("kafka-0.kafka", 9093)]
