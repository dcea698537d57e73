"""The `tickwheel` command: a worker (`app.cli.worker`), the demo, the rebuild, the schemas,
the operators' `timers …`, `jobs …` and `dead-letters …` commands, and `rules next` (a
rule's slots, offline).

`tickwheel --version` prints the version; `--log-level` and `--log-format` before the
command set its log (as TICKWHEEL_LOG_LEVEL and TICKWHEEL_LOG_FORMAT do). Every command
exits 0 when done, 1 when it ran and failed, 2 for a bad command line or configuration
(see `app.cli.common`), with one line on stderr (`app.cli.root_group`).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
from pathlib import Path
from typing import Annotated

import typer

import app.cli.timer_changes  # noqa: F401  (its commands join timers_cli)
from app.cli.common import (
    CONFIG_ERROR,
    READER_GONE,
    Bootstrap,
    Json,
    LogFormatOption,
    LogLevelOption,
    RootOptions,
    ServiceSpec,
    a_path,
    begin_invocation,
    checked,
    command_settings,
    fail,
    json_line,
    load_service,
    quiet_client_library,
)
from app.cli.dead_letters import dead_letters_cli
from app.cli.jobs import jobs_cli
from app.cli.root_group import TickwheelGroup
from app.cli.rules import rules_cli
from app.cli.text import printable
from app.cli.timers import _type, timers_cli
from app.cli.worker import worker
from app.errors import TickwheelError
from app.protocol.schemas import default_dir, stale_schemas, write_schemas

__all__ = ["READER_GONE", "cli", "main", "version_line"]

_HELP = (
    "Tickwheel: durable, Kafka-native timers and scheduled jobs.\n\n"
    "Exit codes: 0 done; 1 the command ran and failed (the broker, a topic, what it was "
    "asked about); 2 a bad command line or configuration (TICKWHEEL_* variables, .env, "
    "*_FILE)."
)

cli = typer.Typer(add_completion=False, no_args_is_help=True, help=_HELP, cls=TickwheelGroup)
cli.add_typer(timers_cli, name="timers")
cli.add_typer(jobs_cli, name="jobs")
cli.add_typer(rules_cli, name="rules")
cli.add_typer(dead_letters_cli, name="dead-letters")
cli.command()(worker)


def version_line() -> str:
    try:
        return f"tickwheel {importlib.metadata.version('tickwheel')}"
    except importlib.metadata.PackageNotFoundError:
        return "tickwheel (version unknown: the package is not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@cli.callback()
def _tickwheel(
    ctx: typer.Context,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    # Settings are each command's to read (with its overrides); these options go with them.
    ctx.call_on_close(begin_invocation(RootOptions(log_level=log_level, log_format=log_format)))


@cli.command()
def demo(
    bootstrap: Bootstrap = None,
    orders: Annotated[int, typer.Option(min=1, max=100)] = 3,
    # Bounded: `inf` (or 1e309) ran the demo for ever.
    seconds: Annotated[float, typer.Option(min=0.0, max=86_400.0)] = 20.0,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="the orders' timers at the end as JSON lines (the story on stderr)"
        ),
    ] = False,
) -> None:
    """Places a few orders (their timers fire on the workers) and prints what happens."""
    from app.demo import run_demo
    from app.kafka import KafkaClients

    settings = command_settings(bootstrap_servers=bootstrap)
    # Made here, the demo's edge; no replication given, as the demo always asked: its
    # topics get one replica (`clients_for` would ask TICKWHEEL_REPLICATION_FACTOR's).
    clients = KafkaClients(settings.kafka)

    def show(line: str) -> None:
        typer.echo(line, err=as_json)

    # Topics just created have no leader for a moment: aiokafka logs each retry of it
    # (NotLeaderForPartitionError), which is nothing to worry about; real failures end
    # the demo with an error.
    try:
        with quiet_client_library():
            rows = asyncio.run(
                checked(
                    settings.kafka,
                    run_demo(
                        clients,
                        settings.partitions,
                        count=orders,
                        seconds=seconds,
                        show=show,
                    ),
                )
            )
    except TickwheelError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        for t in sorted(rows.values(), key=lambda t: (t.owner.id, t.key)):
            json_line(t.model_dump(mode="json"))


@cli.command()
def rebuild(
    types: Annotated[
        list[str] | None,
        typer.Option(
            "--type",
            help="aggregate type (ctx.agg); if none, every type a worker keeps (the "
            "service's and TICKWHEEL_AGGREGATE_TYPES')",
        ),
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
    as_json: Annotated[
        bool,
        typer.Option("--json", help="the plan and the outcome as one JSON object on stdout"),
    ] = False,
    new_group: Annotated[
        bool,
        typer.Option(
            "--new-group",
            help="rebuild although the group (TICKWHEEL_GROUP_ID) has no offset on a "
            "type's log: it never ran there (refused otherwise: a wrong group empties the "
            "tables and replays nothing)",
        ),
    ] = False,
) -> None:
    """Rebuilds the timer tables from the log (stop the workers first), then follows the
    workers' replay of the log to its end."""
    from rich.console import Console

    from app.cli.rebuild import Ended, plan_json, plan_lines, progress_line, run_rebuild
    from app.ops.rebuild import NotTheGroup, not_the_group
    from app.protocol.topics import parse_aggregate_type

    settings = command_settings(bootstrap_servers=bootstrap)
    # Said with a refusal of the group (`not_the_group`): the likeliest cause.
    unset = (
        ""
        if "group_id" in settings.model_fields_set
        else f" (TICKWHEEL_GROUP_ID is not set here: {settings.group_id!r} is the default)"
    )
    # With --json what the rebuild says as it goes (and its progress) is for stderr.
    out = Console(highlight=False, soft_wrap=True, stderr=as_json)
    try:
        # A --type that names no type is a bad option (exit code 2), as for `timers`.
        if types:
            names = [_type(n) for n in types]
        else:
            # Every type a worker keeps timers of: the service's and TICKWHEEL_AGGREGATE_TYPES.
            names = [a.type_name for a in load_service(service).all_aggregates(settings.partitions)]
            names += [n for n in settings.aggregate_types if n not in names]
        topics = [parse_aggregate_type(n) for n in names]
        with quiet_client_library():
            run = asyncio.run(
                checked(
                    settings.kafka,
                    run_rebuild(
                        settings.kafka,
                        settings.group_id,
                        topics,
                        dry_run=dry_run,
                        wait=wait,
                        out=out,
                        err=sys.stderr,
                        new_group=new_group,
                    ),
                )
            )
    except NotTheGroup as exc:
        raise fail(f"{exc}{unset}", CONFIG_ERROR) from exc
    except TickwheelError as exc:
        raise fail(str(exc)) from exc
    plan, last = run.plan, run.last
    wrong = None if new_group else not_the_group(plan)
    replayed = sum(s.size for s in plan.spans().values())
    if as_json:
        outcome = "dry run" if dry_run else run.ended.value
        json_line(
            {
                "outcome": outcome,
                "plan": plan_json(plan),
                "replay": None if last is None else {"done": last.done, "total": last.total},
                **({"may_run": plan.members == 0 and wrong is None} if dry_run else {}),
            }
        )
    if dry_run:
        if not as_json:
            typer.echo("dry run: nothing was changed; a rebuild would")
            for line in plan_lines(plan, done=False):
                typer.echo(line)
        if plan.members:
            raise fail(
                f"group {plan.group_id} has {plan.members} running worker(s): "
                "the rebuild would refuse; stop them first"
            )
        if wrong is not None:
            raise fail(f"the rebuild would refuse: {wrong}{unset}", CONFIG_ERROR)
        if not as_json:
            typer.echo(
                f"group {printable(plan.group_id)} has no running worker: the rebuild may run"
            )
    elif run.ended is Ended.INTERRUPTED:
        where = f" at {progress_line(last)}" if last is not None else ""
        typer.echo(
            f"stopped following the replay{where}; the rebuild is done and the workers replay on",
            err=True,
        )
        raise typer.Exit(130)
    elif as_json:
        return
    elif run.ended is Ended.NOT_FOLLOWED:
        typer.echo("timer tables emptied; the workers replay the log when they start")
    else:
        typer.echo(f"replay complete: {replayed:,} log offsets; the timer tables are rebuilt")


@cli.command()
def schemas(
    check: Annotated[
        bool, typer.Option(help="compare the directory's schemas with the models; write nothing")
    ] = False,
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            "--directory",
            parser=a_path,
            metavar="<path>",
            help="where the schema files are (default: ./docs/schemas when the working "
            "directory has one, else the working directory)",
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """Writes the JSON Schemas of the wire envelopes into a directory (or checks them)."""
    command_settings()  # no setting is used; a bad configuration is still an error
    where = default_dir() if directory is None else directory
    try:
        is_dir = where.is_dir()
        a_file = not is_dir and where.exists()
    except OSError as exc:  # a name too long, a parent not searchable
        raise fail(f"--dir {where}: {exc.strerror or exc}", CONFIG_ERROR) from exc
    if a_file:
        raise fail(f"{where} is not a directory", CONFIG_ERROR)
    if check and not is_dir:
        raise fail(f"no directory {where}: nothing to check", CONFIG_ERROR)
    try:
        stale = stale_schemas(where) if check else None
        written = [] if check else write_schemas(where)
    except OSError as exc:  # a file in the way, a read-only or full file system
        doing = "read" if check else "write"
        raise fail(f"cannot {doing} the schemas in {where}: {exc.strerror or exc}") from exc
    if stale is not None:
        if as_json:
            json_line({"directory": str(where), "stale": stale})
        if stale:
            raise fail(f"stale schemas in {where}: {', '.join(stale)}")
        if not as_json:
            typer.echo(f"schemas are up to date in {where}")
        return
    for path in written:
        if as_json:
            json_line({"written": str(path)})
        else:
            typer.echo(str(path))


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
