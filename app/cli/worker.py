"""`tickwheel worker`: one node, with its web edge (when `TICKWHEEL_WEB_PORT` is set) and
its status published for the cluster's pages, until SIGINT or SIGTERM; either of the node
and its status publishing ending stops both, loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from app.cli.common import (
    Bootstrap,
    LogLevelOption,
    ServiceSpec,
    command_settings,
    fail,
    load_service,
)
from app.errors import NodeFailed, TickwheelError
from app.kafka.broker_watch import install_log_filter
from app.node.settings import Settings
from app.service import Service

if TYPE_CHECKING:
    from app.node import Node
    from app.ops.cluster_status import ClusterStatus

__all__ = ["worker"]

logger = logging.getLogger("tickwheel")


def worker(
    bootstrap: Bootstrap = None,
    data_dir: Annotated[Path | None, typer.Option(help="overrides TICKWHEEL_DATA_DIR")] = None,
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
        raise fail(str(exc)) from exc
    except asyncio.CancelledError as exc:
        # Nothing cancels the worker's own task (a signal cancels the node's run, which
        # it waits for): this is the client library's, re-raised by the group consumer's
        # stop while the broker is away, which ends the node's stop half-way.
        logger.debug("the node's stop was cut short", exc_info=True)
        raise fail(
            "the worker stopped, but not cleanly: the Kafka group consumer's stop was cut "
            "short (is the broker away?)"
        ) from exc


async def _run_worker(settings: Settings, service: Service) -> None:
    from app.node import Node
    from app.node.collector import tune_collector
    from app.ops.cluster_status import for_node
    from app.ops.page import default_node_id
    from app.ops.web import WebServer

    node = Node(settings, service)
    web = WebServer(node, settings.web_port, settings.web_host) if settings.web_port else None
    cluster: ClusterStatus | None = None
    try:
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
    except BaseException:
        # Closes what did start, so nothing leaks on the way out.
        if web is not None:
            await web.stop()
        if cluster is not None:
            await cluster.stop()
        await node.stop()
        raise
    tune_collector(settings.gc_threshold)
    task = asyncio.create_task(_run_node(node, cluster))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    logger.info("worker started: %s", settings.bootstrap_servers)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        if web is not None:
            await web.stop()
        await cluster.stop()  # its tombstone, while the node's producer still runs
        await node.stop()
        logger.info("worker stopped")


async def _run_node(node: Node, cluster: ClusterStatus) -> None:
    """The node's run with its status publishing beside it: either ending stops both (the
    status's end is a bug; the node stops loudly rather than vanish from every page)."""
    running = asyncio.create_task(node.run(), name="node")
    status = asyncio.create_task(cluster.run(), name="cluster status")
    try:
        await asyncio.wait([running, status], return_when=asyncio.FIRST_COMPLETED)
        if not running.done():
            raise NodeFailed(f"publishing the node's status stopped: {status.exception()!r}")
        await running
    finally:
        for t in (running, status):
            t.cancel()
        await asyncio.gather(running, status, return_exceptions=True)
