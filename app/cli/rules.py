"""`tickwheel rules …`: what a schedule rule does, computed offline (no broker).

`tickwheel rules next EXPR [--zone Z] [--from INSTANT] [-n N] [--until INSTANT]
[--count C] [--jitter D [--timer-id ID]] [--json]` prints the rule's next N slots at or
after an instant (default: now), each with its UTC time and its local time and offset in
the zone (a daylight-saving change shows as the offset moving), computed by the runner's
own slot functions (`tables.slots`). A jittered rule's slots fire later, each timer's at
its own offset: with `--timer-id`, when that timer fires each (`fires`). EXPR and INSTANT
are described in `app.cli.rule_expr`. A bad EXPR, zone or instant exits 2 with one line
saying what is wrong.
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
    parse_duration,
    parse_expr,
    parse_instant,
    slot_line,
    utc_text,
)
from tables.rules import CronRule
from tables.slots import jittered_due

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
            # `\\[`: typer renders help as rich markup, where `[@<start>]` is a tag.
            help="cron:<expression>, interval:<every>\\[@<start>], once:<instant>, or the "
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
    jitter: Annotated[
        str | None,
        typer.Option(help="the rule's jitter: each slot fires up to this much later (30s, ms)"),
    ] = None,
    timer_id: Annotated[
        str | None,
        typer.Option(help="a timer's id (`timers show`): when its jittered slots fire"),
    ] = None,
    as_json: Json = False,
) -> None:
    """Prints a rule's next slots, as the runner would fire a timer of it set then."""
    command_settings()  # no setting is used; a bad configuration is still an error
    try:
        shown = check_zone(zone) if zone is not None else None
        start = now_ms() if from_ is None else parse_instant(from_, "--from")
        end = None if until is None else parse_instant(until, "--until")
        spread = None if jitter is None else parse_duration(jitter, "--jitter")
        rule = parse_expr(expr, zone, start, until=end, count=count, jitter=spread)
    except BadExpression as exc:
        raise fail(str(exc), CONFIG_ERROR) from exc
    if shown is None:
        shown = rule.tz if isinstance(rule, CronRule) else check_zone("UTC")
    found = next_slots(rule, start, slots)
    for slot in found:
        fires = None if timer_id is None else jittered_due(rule, timer_id, slot)
        line = slot_line(slot, shown, fires)
        if as_json:
            json_line(line.model_dump(mode="json"))
        else:
            text = f"{line.index}\t{line.utc}\t{line.local}\t{line.offset}"
            typer.echo(text if fires is None else f"{text}\tfires {utc_text(fires)}")
    if rule.jitter is not None and timer_id is None:
        typer.echo(
            f"jitter {rule.jitter} ms: each timer fires each slot at its own offset in "
            f"[0, {rule.jitter}) ms after it (--timer-id shows one timer's)",
            err=True,
        )
    if not as_json and len(found) < slots:
        typer.echo(f"{len(found)} slot(s): the rule has no more", err=True)
