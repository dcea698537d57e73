"""The options every `tickwheel jobs` command that sends takes (`app.cli.jobs`,
`app.cli.job_runs`), and their one way to send: the commands, then the results waited for."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.common import checked, run
from app.cli.job_actions import send_and_wait
from app.node.settings import Settings
from app.protocol.wire import CommandEnvelope, CommandResult

__all__ = ["Context", "JobName", "Partition", "Tenants", "Wait", "send_all"]

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
Wait = Annotated[
    float,
    typer.Option(min=0.0, help="seconds to wait for the workers' results; 0: do not wait"),
]


def send_all(
    settings: Settings, commands: list[CommandEnvelope], wait: float
) -> dict[str, CommandResult]:
    """Sends `commands` (once the cluster lets this client in) and waits up to `wait` s for
    their results, by request id."""
    return run(
        checked(settings.kafka, send_and_wait(settings.kafka, settings.partitions, commands, wait))
    )
