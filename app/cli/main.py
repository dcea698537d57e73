"""The `tickwheel` command."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli.common import Bootstrap, ServiceSpec, load_service, quiet_client_library
from app.cli.jobs import jobs_cli
from app.cli.timers import timers_cli
from app.errors import ConfigError, TickwheelError
from app.kafka.broker_watch import install_log_filter
from app.node.settings import Settings
from app.protocol.schemas import SCHEMA_DIR, stale_schemas, write_schemas
from app.service import Service

__all__ = ["main"]

cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
cli.add_typer(timers_cli, name="timers")
cli.add_typer(jobs_cli, name="jobs")
logger = logging.getLogger("tickwheel")

LogLevel = Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR")]


def _settings(**overrides: Any) -> Settings:
    try:
        return Settings.from_env(None, **overrides)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    # While the broker is away the client library logs every retry (hundreds of lines a
    # second): the filter hands those to the node's BrokerWatch, which logs one line when
    # the broker goes and one when it is back (it mutes nothing while no watch runs).
    install_log_filter()


@cli.command()
def worker(
    bootstrap: Bootstrap = None,
    data_dir: Annotated[Path | None, typer.Option(help="overrides TICKWHEEL_DATA_DIR")] = None,
    log_level: LogLevel = "INFO",
    service: ServiceSpec = "app.demo:service",
) -> None:
    """Runs one node: decides the commands and fires the timers of the partitions it owns."""
    _logging(log_level)
    settings = _settings(bootstrap_servers=bootstrap, data_dir=data_dir)
    try:
        asyncio.run(_run_worker(settings, load_service(service)))
    except TickwheelError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


async def _run_worker(settings: Settings, service: Service) -> None:
    from app.node import Node
    from app.ops.web import WebServer

    node = Node(settings, service)
    web = WebServer(node, settings.web_port, settings.web_host) if settings.web_port else None
    try:
        await node.start()
        if web is not None:
            await web.start()
    except BaseException:
        # Closes what did start, so nothing leaks on the way out.
        if web is not None:
            await web.stop()
        await node.stop()
        raise
    task = asyncio.create_task(node.run())
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
        await node.stop()
        logger.info("worker stopped")


@cli.command()
def demo(
    bootstrap: Bootstrap = None,
    orders: Annotated[int, typer.Option(min=1, max=100)] = 3,
    seconds: Annotated[float, typer.Option(min=0.0)] = 20.0,
) -> None:
    """Places a few orders (their timers fire on the workers) and prints what happens."""
    from app.demo import run_demo

    settings = _settings(bootstrap_servers=bootstrap)
    # Topics just created have no leader for a moment: aiokafka logs each retry of it
    # (NotLeaderForPartitionError), which is nothing to worry about; real failures end
    # the demo with an error below.
    try:
        with quiet_client_library():
            asyncio.run(
                run_demo(
                    settings.bootstrap_servers, settings.partitions, count=orders, seconds=seconds
                )
            )
    except TickwheelError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


@cli.command()
def rebuild(
    types: Annotated[
        list[str] | None,
        typer.Option("--type", help="aggregate type (ctx.agg); all of the service's if none"),
    ] = None,
    bootstrap: Bootstrap = None,
    service: ServiceSpec = "app.demo:service",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print what would be reset; change nothing")
    ] = False,
    wait: Annotated[
        bool,
        typer.Option("--wait/--no-wait", help="follow the workers' replay until it is complete"),
    ] = True,
) -> None:
    """Rebuilds the timer tables from the log (stop the workers first), then follows the
    workers' replay of the log to its end."""
    from rich.console import Console

    from app.cli.rebuild import Ended, plan_lines, progress_line, run_rebuild
    from app.protocol.topics import parse_aggregate_type

    settings = _settings(bootstrap_servers=bootstrap)
    out = Console(highlight=False, soft_wrap=True)
    try:
        names = types or [
            a.type_name for a in load_service(service).all_aggregates(settings.partitions)
        ]
        topics = [parse_aggregate_type(n) for n in names]
        with quiet_client_library():
            run = asyncio.run(
                run_rebuild(
                    settings.bootstrap_servers,
                    settings.group_id,
                    topics,
                    dry_run=dry_run,
                    wait=wait,
                    out=out,
                    err=sys.stderr,
                )
            )
    except TickwheelError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    plan, last = run.plan, run.last
    if dry_run:
        typer.echo("dry run: nothing was changed; a rebuild would")
        for line in plan_lines(plan, done=False):
            typer.echo(line)
        if plan.members:
            typer.echo(
                f"error: group {plan.group_id} has {plan.members} running worker(s): "
                "the rebuild would refuse; stop them first",
                err=True,
            )
            raise typer.Exit(1)
        typer.echo(f"group {plan.group_id} has no running worker: the rebuild may run")
    elif run.ended is Ended.NOT_FOLLOWED:
        typer.echo("timer tables emptied; the workers replay the log when they start")
    elif run.ended is Ended.INTERRUPTED:
        where = f" at {progress_line(last)}" if last is not None else ""
        typer.echo(
            f"stopped following the replay{where}; the rebuild is done and the workers replay on",
            err=True,
        )
        raise typer.Exit(130)
    else:
        total = sum(s.size for s in plan.spans().values())
        typer.echo(f"replay complete: {total:,} log offsets; the timer tables are rebuilt")


@cli.command()
def schemas(
    check: Annotated[bool, typer.Option(help="fail if the published schemas are stale")] = False,
    directory: Annotated[Path, typer.Option()] = SCHEMA_DIR,
) -> None:
    """Writes the JSON Schemas of the wire envelopes (or checks them)."""
    if check:
        stale = stale_schemas(directory)
        if stale:
            typer.echo(f"stale schemas in {directory}: {', '.join(stale)}", err=True)
            raise typer.Exit(1)
        typer.echo("schemas are up to date")
        return
    for path in write_schemas(directory):
        typer.echo(str(path))


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
