"""`tickwheel rules …`: what a schedule rule does, computed offline (no broker).

`tickwheel rules next EXPR [--zone Z] [--from INSTANT] [-n N] [--until INSTANT]
[--count C] [--json]` prints the rule's next N slots at or after an instant (default:
now), each with its UTC time and its local time and offset in the zone (a daylight-saving
change shows as the offset moving), computed by the runner's own slot functions
(`tables.slots`). EXPR and INSTANT are described in `app.cli.rule_expr`. A bad EXPR,
zone or instant exits 2 with one line saying what is wrong.
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


def now_ms() -> int:
    """The wall clock, epoch ms: `--from`'s default."""
    return time.time_ns() // 1_000_000


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
    slots: Annotated[
        int, typer.Option("-n", "--slots", min=1, max=10_000, help="how many slots to print")
    ] = 10,
    until: Annotated[
        str | None,
        typer.Option(help="the rule's until: no slot after it (ISO 8601 with offset, or epoch ms)"),
    ] = None,
    count: Annotated[
        int | None, typer.Option(min=1, help="the rule's count: how many slots it has at most")
    ] = None,
    as_json: Json = False,
) -> None:
    """Prints a rule's next slots, as the runner would fire a timer of it set then."""
    command_settings()  # no setting is used; a bad configuration is still an error
    try:
        shown = check_zone(zone) if zone is not None else None
        start = now_ms() if from_ is None else parse_instant(from_, "--from")
        end = None if until is None else parse_instant(until, "--until")
        rule = parse_expr(expr, zone, start, until=end, count=count)
    except BadExpression as exc:
        raise fail(str(exc), CONFIG_ERROR) from exc
    if shown is None:
        shown = rule.tz if isinstance(rule, CronRule) else check_zone("UTC")
    found = next_slots(rule, start, slots)
    for slot in found:
        line = slot_line(slot, shown)
        if as_json:
            json_line(line.model_dump(mode="json"))
        else:
            typer.echo(f"{line.index}\t{line.utc}\t{line.local}\t{line.offset}")
    if not as_json and len(found) < slots:
        typer.echo(f"{len(found)} slot(s): the rule has no more", err=True)
