"""`tickwheel rules …`: what a schedule rule does, computed offline (no broker).

`tickwheel rules next EXPR [--zone Z] [--from INSTANT] [-n N] [--json]` prints the rule's
next N slots at or after an instant (default: now), each with its UTC time and its local
time and offset in the zone (a daylight-saving change shows as the offset moving), computed
by the runner's own slot functions (`tables.slots`). EXPR and INSTANT are described in
`app.cli.rule_expr`. A bad EXPR, zone or instant exits 2 with one line saying what is wrong.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer

from app.cli.common import CONFIG_ERROR, Json, command_settings, fail, json_line
from app.cli.rule_expr import (
    BadExpression,
    check_zone,
    next_slots,
    parse_expr,
    parse_instant,
    slot_line,
)
from tables.rules import CronRule

__all__ = ["rules_cli"]

rules_cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


@rules_cli.command("next")
def next_(
    expr: Annotated[
        str,
        typer.Argument(
            metavar="EXPR",
            help="cron:<expression>, interval:<every>[@<start>], once:<instant>, or the "
            "rule's JSON object as the wire format has it",
        ),
    ],
    zone: Annotated[
        str | None,
        typer.Option(help="IANA zone: a cron rule's zone, and the local times shown (UTC)"),
    ] = None,
    from_: Annotated[
        str | None,
        typer.Option(
            "--from", help="ISO 8601 with offset, or epoch ms: slots at or after it (now)"
        ),
    ] = None,
    count: Annotated[int, typer.Option("-n", "--count", min=1, max=10_000)] = 10,
    as_json: Json = False,
) -> None:
    """Prints a rule's next slots, as the runner would fire a timer of it set then."""
    command_settings()  # no setting is used; a bad configuration is still an error
    try:
        shown = check_zone(zone) if zone is not None else None
        start = time.time_ns() // 1_000_000 if from_ is None else parse_instant(from_, "--from")
        rule = parse_expr(expr, zone, start)
    except BadExpression as exc:
        raise fail(str(exc), CONFIG_ERROR) from exc
    if shown is None:
        shown = rule.tz if isinstance(rule, CronRule) else check_zone("UTC")
    slots = next_slots(rule, start, count)
    for slot in slots:
        line = slot_line(slot, shown)
        if as_json:
            json_line(line.model_dump(mode="json"))
        else:
            typer.echo(f"{line.index}\t{line.utc}\t{line.local}\t{line.offset}")
    if not as_json and len(slots) < count:
        typer.echo(f"{len(slots)} slot(s): the rule has no more", err=True)
