"""The options every `tickwheel jobs` command that sends takes (`app.cli.jobs`,
`app.cli.job_runs`), their one way to send (the commands, then the results waited for) and
to report what came of it."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.common import (
    CONFIG_ERROR,
    FAILED,
    checked,
    fail,
    json_line,
    request_id_check,
    run,
)
from app.cli.job_actions import FAILED_CODES, send_and_wait
from app.cli.text import printable
from app.errors import JobsCliError
from app.node.settings import Settings
from app.protocol.wire import CommandEnvelope, CommandResult

__all__ = [
    "Context",
    "JobName",
    "Partition",
    "RequestId",
    "Tenants",
    "Wait",
    "input_exit_code",
    "refused_input",
    "report",
    "send_all",
]

Context = Annotated[str, typer.Option(help="the context the job is declared in")]
JobName = Annotated[str, typer.Option("--job", help="the job's name")]
Tenants = Annotated[
    list[str] | None,
    typer.Option("--tenant", help="a TENANT job's tenant (repeatable); default: the default one"),
]
Partition = Annotated[
    int | None,
    typer.Option(min=0, help="a SHARDED job's log partition; default: every partition"),
]
RequestId = Annotated[
    str | None,
    typer.Option(
        callback=request_id_check(200),
        help="the change's own id (1-200 characters; one an answer named, begun with "
        "<action>:, up to 300), sent as <action>:<id>: sent again, it changes nothing more; "
        "default: a fresh one",
    ),
]
Wait = Annotated[
    float,
    typer.Option(
        min=0.0, max=600.0, help="seconds to wait for the workers' results; 0: do not wait"
    ),
]


_NOT_DECLARED = frozenset({"context", "job"})


def input_exit_code(exc: JobsCliError) -> int:
    """The exit code of a `tickwheel jobs` command refusing its input, as every command's
    (`app.cli.common`): 1 when it names a context or job the service does not declare
    (what it was asked about does not exist), 2 for an option's value it cannot take (a
    `--rule`, `--tenant`, `--partition`, `--request-id` or range the job cannot have)."""
    return FAILED if getattr(exc, "field", None) in _NOT_DECLARED else CONFIG_ERROR


def refused_input(exc: JobsCliError) -> typer.Exit:
    """`exc` as one `error:` line and `input_exit_code`'s exit."""
    return fail(str(exc), input_exit_code(exc))


def send_all(
    settings: Settings, commands: list[CommandEnvelope], wait: float
) -> dict[str, CommandResult]:
    """Sends `commands` (once the cluster lets this client in) and waits up to `wait` s for
    their results, by request id."""
    return run(
        checked(
            settings.kafka,
            send_and_wait(
                settings.kafka, settings.partitions, commands, wait, settings.replication
            ),
        )
    )


def report(
    action: str,
    commands: list[CommandEnvelope],
    results: dict[str, CommandResult],
    wait: float,
    as_json: bool,
    *,
    runs: bool,
) -> None:
    """Prints each command's outcome; fails (exit 1) when one was refused or failed, or
    when results are missing after a wait. `runs`: the commands are runs (trigger,
    backfill), each named by its request id; else changes of the instances' schedules."""
    what = "run(s)" if runs else "instance(s)"
    failed = False
    for c in commands:
        result = results.get(c.request_id)
        failed = failed or (result is not None and result.code in FAILED_CODES)
        if as_json:
            slot: dict[str, object] = {k: c.body[k] for k in ("slot", "due_at") if k in c.body}
            json_line(
                {
                    "action": action,
                    "instance": c.aggregate.model_dump(mode="json"),
                    "request_id": c.request_id,
                    **slot,
                    "code": None if result is None else result.code.value,
                    "message": None if result is None else result.reason,
                }
            )
            continue
        if result is None:
            outcome = "sent" if wait == 0 else f"sent; no result within {wait:g} s"
        else:
            outcome = result.code.value + (f": {result.reason}" if result.reason else "")
        named = f"{c.aggregate} {c.request_id}" if runs else str(c.aggregate)
        # The message is the worker's (or another writer's) and a request id a backfill's
        # log's: their control characters would forge a line or act on the terminal.
        typer.echo(f"{action} {printable(named)}: {printable(outcome)}")
    if runs and not commands and not as_json:
        typer.echo(f"{action}: no slot in the range", err=True)
    if failed:
        refused = "refused or failed for some runs" if runs else "refused for some instances"
        raise fail(f"{action} was {refused} (see above)")
    if wait > 0 and len(results) < len(commands):
        raise fail(
            f"no result within {wait:g} s for {len(commands) - len(results)} {what}: "
            "is a worker of the service running? The commands stay queued for it."
        )
