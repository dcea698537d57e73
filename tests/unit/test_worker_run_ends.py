"""The worker's run stops loudly (non-zero exit) on any end it did not ask for: its status
publishing or its node's run ended cancelled from inside (a cancellation leaked out of a
client call: `status.exception()` raised it, the worker took it for SIGTERM and exited 0),
the run's task ended cancelled without a signal; a signal is a clean stop; and each of the
status's and the node's stops runs whatever the other raised."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest
import typer
from test_cluster_status import _Runs

from app.cli import worker as worker_cli
from app.cli.common import FAILED
from app.cli.worker import _run_node, _run_worker, worker
from app.errors import KafkaUnavailable, NodeFailed
from app.node.settings import Settings
from app.task_ends import cancelled_here


class _CancelledInside:
    """A run that ends cancelled though nobody cancelled it."""

    async def run(self) -> None:
        await asyncio.sleep(0)
        raise asyncio.CancelledError  # e.g. leaked out of a client call


class _Returns:
    async def run(self) -> None:
        await asyncio.sleep(0)


async def test_a_status_run_cancelled_from_inside_stops_the_worker_loudly() -> None:
    node = _Runs()
    with pytest.raises(NodeFailed, match="publishing the node's status stopped: ended cancelled"):
        await _run_node(node, _CancelledInside())  # type: ignore[arg-type]
    assert node.cancelled


@pytest.mark.parametrize(
    ("run", "how"), [(_CancelledInside, "ended cancelled"), (_Returns, "returned")]
)
async def test_a_node_run_that_ends_unasked_stops_the_worker_loudly(run: type, how: str) -> None:
    status = _Runs()
    with pytest.raises(NodeFailed, match=f"the node's run {how}"):
        await _run_node(run(), status)  # type: ignore[arg-type]
    assert status.cancelled


# --- the worker's whole run, its node and status faked ---------------------------------


class _Part:
    """Stands in for the node and the cluster status: its stop recorded, maybe failing."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name = name
        self.calls = calls
        self.running = asyncio.Event()
        self.stop_raises: BaseException | None = None
        # Whether its stop ran in a task being cancelled (None: not stopped).
        self.stopped_cancelling: bool | None = None
        # What a start cut short raises instead of its cancellation (a client's error).
        self.start_cancelled_as: BaseException | None = None

    async def start(self) -> None:
        self.calls.append(f"{self.name} start")

    async def run(self) -> None:
        self.running.set()
        await asyncio.Event().wait()

    async def stop(self) -> None:
        self.calls.append(f"{self.name} stop")
        self.stopped_cancelling = cancelled_here()
        if self.stop_raises is not None:
            raise self.stop_raises


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[_Part, _Part]]:
    calls: list[str] = []
    node, cluster = _Part("node", calls), _Part("cluster", calls)
    monkeypatch.setattr("app.node.Node", lambda settings, service: node)
    monkeypatch.setattr("app.ops.status_for_node.for_node", lambda n, node_id, port: cluster)
    monkeypatch.setattr("app.node.collector.tune_collector", lambda threshold: None)
    monkeypatch.setattr("app.ops.other_groups.refuse_other_groups", _no_other_group)
    yield node, cluster


async def _no_other_group(*args: object) -> None:
    """The start's check of other groups (`app.ops.other_groups`): none, no cluster here."""


def _settings() -> Settings:
    return Settings(partitions=4, group_id="g1", bootstrap_servers="b:1", gc_threshold=0)


async def _leaks(node: object, cluster: object) -> None:
    await asyncio.sleep(0)
    raise asyncio.CancelledError  # nobody cancelled the run's task


async def test_a_run_ended_cancelled_without_a_signal_fails_the_worker(
    parts: tuple[_Part, _Part], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, _ = parts
    monkeypatch.setattr(worker_cli, "_run_node", _leaks)
    with pytest.raises(NodeFailed, match="the node's run ended cancelled"):
        await _run_worker(_settings(), None)  # type: ignore[arg-type]
    assert node.calls[-2:] == ["cluster stop", "node stop"]


def test_the_worker_exits_non_zero_when_its_run_ends_cancelled_unasked(
    parts: tuple[_Part, _Part], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(worker_cli, "_run_node", _leaks)
    monkeypatch.setattr(worker_cli, "command_settings", lambda **kwargs: _settings())
    monkeypatch.setattr(worker_cli, "install_log_filter", lambda: None)
    monkeypatch.setattr(worker_cli, "load_service", lambda spec: None)
    with pytest.raises(typer.Exit) as ended:
        worker()
    assert ended.value.exit_code == FAILED != 0
    assert "the node's run ended cancelled" in capsys.readouterr().err


async def _signalled(node: _Part, sig: signal.Signals = signal.SIGTERM) -> None:
    await node.running.wait()  # the worker's signal handlers are in place
    os.kill(os.getpid(), sig)


async def test_a_signal_stops_the_worker_cleanly(parts: tuple[_Part, _Part]) -> None:
    node, _ = parts
    kill = asyncio.create_task(_signalled(node))
    await asyncio.wait_for(_run_worker(_settings(), None), 5)  # type: ignore[arg-type]
    await kill
    assert node.calls == ["node start", "cluster start", "cluster stop", "node stop"]


async def test_the_node_stops_though_the_status_stop_leaks_a_cancellation(
    parts: tuple[_Part, _Part],
) -> None:
    node, cluster = parts
    cluster.stop_raises = asyncio.CancelledError()
    kill = asyncio.create_task(_signalled(node))
    with pytest.raises(asyncio.CancelledError):  # `worker` fails on it (non-zero)
        await asyncio.wait_for(_run_worker(_settings(), None), 5)  # type: ignore[arg-type]
    await kill
    assert node.calls[-2:] == ["cluster stop", "node stop"]


async def test_a_failed_run_stops_the_node_though_the_status_stop_fails(
    parts: tuple[_Part, _Part], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, cluster = parts
    cluster.stop_raises = asyncio.CancelledError()

    async def fails(node: object, cluster: object) -> None:
        raise NodeFailed("partition 1 could not be taken")

    monkeypatch.setattr(worker_cli, "_run_node", fails)
    with pytest.raises(NodeFailed, match="partition 1"):  # the run's error, not the stop's
        await _run_worker(_settings(), None)  # type: ignore[arg-type]
    assert node.calls[-2:] == ["cluster stop", "node stop"]


async def test_a_start_that_fails_stops_the_node_though_the_status_stop_fails(
    parts: tuple[_Part, _Part], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, cluster = parts
    cluster.stop_raises = asyncio.CancelledError()

    async def start_fails() -> None:
        raise NodeFailed("the topics are missing")

    monkeypatch.setattr(cluster, "start", start_fails)
    with pytest.raises(NodeFailed, match="topics are missing"):
        await _run_worker(_settings(), None)  # type: ignore[arg-type]
    assert node.calls == ["node start", "cluster stop", "node stop"]


async def _signalled_while_starting(node: _Part, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's run, SIGTERM sent while the node starts (a group join that takes its
    time, its cancellation raised as `node.start_cancelled_as`, if set); the test's own
    SIGTERM handler, in place before, must not hear it (it would were the worker's not in
    place: the default would end the test run)."""
    joining = asyncio.Event()

    async def slow_start() -> None:
        node.calls.append("node start")
        joining.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if node.start_cancelled_as is None:
                raise
            raise node.start_cancelled_as from None

    monkeypatch.setattr(node, "start", slow_start)
    heard_by_none: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: heard_by_none.append(sig))

    async def signalled() -> None:
        await joining.wait()
        os.kill(os.getpid(), signal.SIGTERM)

    kill = asyncio.create_task(signalled())
    try:
        await asyncio.wait_for(_run_worker(_settings(), None), 5)  # type: ignore[arg-type]
    finally:
        await kill
        signal.signal(signal.SIGTERM, previous)
        assert not heard_by_none


async def test_a_signal_while_starting_stops_what_started_and_the_worker_cleanly(
    parts: tuple[_Part, _Part], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while the node starts (its stores opened, the group joined): unhandled, it
    killed the process with no stop (and a PID 1 did not hear it at all)."""
    node, _ = parts
    await _signalled_while_starting(node, monkeypatch)
    assert node.calls == ["node start", "node stop"]
    assert node.stopped_cancelling is False  # the signal's cancel heard: no stop cut short


async def test_a_stop_after_a_signal_while_starting_that_fails_fails_the_worker(
    parts: tuple[_Part, _Part], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, _ = parts
    node.stop_raises = NodeFailed("closing partition 0 of shop.order failed")
    with pytest.raises(NodeFailed, match="closing partition 0"):
        await _signalled_while_starting(node, monkeypatch)


async def test_a_signal_while_starting_is_a_stop_whatever_the_start_turned_it_into(
    parts: tuple[_Part, _Part], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's call may turn the signal's cancellation into its own error ("cannot
    connect"): the worker was asked to stop, so it stops cleanly, its stops not cut short."""
    node, _ = parts
    node.start_cancelled_as = KafkaUnavailable("cannot connect")
    await _signalled_while_starting(node, monkeypatch)
    assert node.stopped_cancelling is False


async def test_a_stop_that_fails_the_node_fails_the_worker(parts: tuple[_Part, _Part]) -> None:
    """A partition's close that failed in the node's stop (its copy not marked clean): the
    worker exited 0."""
    node, _ = parts
    node.stop_raises = NodeFailed("closing partition 0 of shop.order failed")
    kill = asyncio.create_task(_signalled(node))
    with pytest.raises(NodeFailed, match="closing partition 0"):
        await asyncio.wait_for(_run_worker(_settings(), None), 5)  # type: ignore[arg-type]
    await kill


async def test_a_web_server_that_cannot_be_made_stops_the_node(
    parts: tuple[_Part, _Part], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was made before the start's guard: its failure (a bad TICKWHEEL_WEB_URL) left
    the node's Kafka clients unclosed."""
    node, _ = parts

    def refused(*args: object) -> None:
        raise ValueError("Port out of range 0-65535")

    monkeypatch.setattr("app.ops.web.WebServer", refused)
    settings = _settings().model_copy(update={"web_port": 8080})
    with pytest.raises(ValueError, match="Port out of range"):
        await _run_worker(settings, None)  # type: ignore[arg-type]
    assert node.calls == ["node stop"]
