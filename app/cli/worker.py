"""`tickwheel worker`: one node, with its web edge (when `TICKWHEEL_WEB_PORT` is set) and
its status published for the cluster's pages, until SIGINT or SIGTERM; either of the node
and its status publishing ending stops both, loudly.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from app.cli.common import (
    CONFIG_ERROR,
    FAILED,
    Bootstrap,
    LogLevelOption,
    ServiceSpec,
    a_path,
    command_settings,
    fail,
    load_service,
)
from app.errors import NodeFailed, TickwheelError
from app.kafka.broker_watch import install_log_filter
from app.node.settings import Settings
from app.service import Service
from app.task_ends import cancelled_here, how_ended

if TYPE_CHECKING:
    from app.node import Node
    from app.ops.cluster_status import ClusterStatus
    from app.ops.web import WebServer

__all__ = ["worker"]

logger = logging.getLogger("tickwheel")


def worker(
    bootstrap: Bootstrap = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(parser=a_path, metavar="<path>", help="overrides TICKWHEEL_DATA_DIR"),
    ] = None,
    log_level: LogLevelOption = None,
    service: ServiceSpec = "app.demo:service",
) -> None:
    """Runs one node: decides the commands and fires the timers of the partitions it owns."""
    settings = command_settings(bootstrap_servers=bootstrap, data_dir=data_dir, log_level=log_level)
    # While the broker is away the client library logs every retry (hundreds of lines a
    # second): the filter hands those to the node's BrokerWatch, which logs one line when
    # the broker goes and one when it is back (it mutes nothing while no watch runs).
    install_log_filter()
    found = load_service(service)
    try:
        asyncio.run(_run_worker(settings, found))
    except TickwheelError as exc:
        from app.ops.other_groups import OtherGroupRunning

        # Another group runs there: TICKWHEEL_GROUP_ID refused, as a bad setting is.
        code = CONFIG_ERROR if isinstance(exc, OtherGroupRunning) else FAILED
        raise fail(str(exc), code) from exc
    except asyncio.CancelledError as exc:
        # Nothing cancels the worker's own task (a signal cancels the node's run, which
        # it waits for): this is the client library's, leaked out of a stop (the group
        # consumer's re-raises one while the broker is away; the other stops still ran).
        logger.debug("the node's stop was cut short", exc_info=True)
        raise fail(
            "the worker stopped, but not cleanly: the Kafka group consumer's stop was cut "
            "short (is the broker away?)"
        ) from exc


async def _run_worker(settings: Settings, service: Service) -> None:
    from app.node import Node
    from app.node.collector import tune_collector
    from app.ops.other_groups import refuse_other_groups
    from app.ops.page import default_node_id
    from app.ops.status_for_node import for_node
    from app.ops.web import WebServer
    from app.ops.web_port import check_listenable

    node = Node(settings, service)
    web: WebServer | None = None
    cluster: ClusterStatus | None = None
    # Heard from the first: a SIGTERM while starting (its stores opened, the group joined)
    # stops what started, and the worker exits 0. Unhandled, it killed the process without
    # a stop, and a PID 1 (a container with no init) did not hear it at all.
    asked = asyncio.Event()
    stopping: list[asyncio.Task[None] | None] = [asyncio.current_task()]  # what a signal ends
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, functools.partial(_asked, asked, stopping))
    try:
        # Made here: a failure to make it (a bad setting) stops the node's clients too.
        if settings.web_port:
            web = WebServer(node, settings.web_port, settings.web_host)
            check_listenable(settings.web_host, settings.web_port)
        # Before it joins its group: another group's nodes on its types would fire every
        # timer beside it (`app.ops.other_groups`).
        await refuse_other_groups(node)
        await node.start()
        if web is not None:
            await web.start()
        port = web.port if web is not None else 0
        # The page's name of the node is its name in the cluster's status too.
        cluster = for_node(node, default_node_id(port), port)
        await cluster.start()
        if web is not None:
            assert web.page is not None
            web.page.cluster = cluster
        if asked.is_set():  # a start that swallowed its cancellation (a client's call)
            raise asyncio.CancelledError
    except BaseException as exc:
        stopping[0] = None  # a second signal does not cut the stop short
        signalled = asked.is_set()
        if signalled and (me := asyncio.current_task()) is not None:
            # The signal's cancellation is heard (whatever a client's call turned it into):
            # the stops below would otherwise take a cancellation leaking out of a client's
            # stop for their own, and stop short.
            while me.cancelling():
                me.uncancel()
        # Closes what did start, so nothing leaks on the way out (each stop is logged).
        started = [] if web is None else [web.stop]
        started += [] if cluster is None else [cluster.stop]
        error = await _stop_each([*started, node.stop])
        if not signalled:
            raise
        # Asked to stop: what the start was doing then is no failure (a client's call cut
        # short may raise anything); a stop that failed is.
        logger.info("worker stopped while starting (its start ended with %r)", exc)
        if error is not None:
            raise error from None
        return
    tune_collector(settings.gc_threshold)
    task = asyncio.create_task(_run_node(node, cluster))
    stopping[0] = task
    logger.info("worker started: %s", settings.bootstrap_servers)
    # The status's tombstone is written while the node's producer still runs.
    stops = [*([] if web is None else [web.stop]), cluster.stop, node.stop]
    try:
        await _until_stopped(task)
    except BaseException:
        await _stop_each(stops)  # what they raise is logged: the run's end is the error
        logger.info("worker stopped")
        raise
    error = await _stop_each(stops)
    logger.info("worker stopped")
    if error is not None:
        raise error


def _asked(asked: asyncio.Event, stopping: list[asyncio.Task[None] | None]) -> None:
    """A signal: what runs now (the start, then the node's run) is cancelled, once."""
    if (task := stopping[0]) is not None and not asked.is_set():
        task.cancel()
    asked.set()


async def _until_stopped(task: asyncio.Task[None]) -> None:
    """Awaits the node's run: its end asked for (a signal cancels it; so does a cancel of
    this task, which is passed on) returns, any other end raises. A run that ends
    cancelled unasked had a cancellation leak out of a client call: the worker fails."""
    try:
        await task
    except asyncio.CancelledError:
        if task.cancelling() == 0:
            raise NodeFailed("the node's run ended cancelled, though nothing stopped it") from None
        if cancelled_here():
            raise


async def _stop_each(stops: Sequence[Callable[[], Awaitable[None]]]) -> BaseException | None:
    """Awaits each stop in turn, whatever the ones before raised (a cancellation leaked out
    of one included); logs what they raise and returns the first."""
    first: BaseException | None = None
    for stop in stops:
        try:
            await stop()
        except BaseException as exc:
            logger.error("stopping the worker: %r", exc, exc_info=exc)
            first = exc if first is None else first
    return first


async def _run_node(node: Node, cluster: ClusterStatus) -> None:
    """The node's run with its status publishing beside it: either ending stops both (the
    status's end is a bug; the node stops loudly rather than vanish from every page). Both
    run until cancelled: one ended cancelled unasked (leaked out of a client call) fails."""
    running = asyncio.create_task(node.run(), name="node")
    status = asyncio.create_task(cluster.run(), name="cluster status")
    try:
        await asyncio.wait([running, status], return_when=asyncio.FIRST_COMPLETED)
        if not running.done():
            raise NodeFailed(f"publishing the node's status stopped: {how_ended(status)}")
        if running.cancelled() or running.exception() is None:
            raise NodeFailed(f"the node's run {how_ended(running)}")
        await running  # raises its error
    finally:
        for t in (running, status):
            t.cancel()
        await asyncio.gather(running, status, return_exceptions=True)
