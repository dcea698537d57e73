"""What `tickwheel timers retry|skip` says of the owners' answers to its request
(`app.ops.op_answers`): a line per partition where timers were retried or skipped, or the
request failed; a total line; and, exit code 1, the partitions that failed or did not
answer within `--wait` (the request may still be carried out there: sent again under its
request id, each partition carries it out at most once and answers DUPLICATE), and the
timers a retry refused (their slot past the request-id window, no `--past-window`). With
`--wait 0` nothing is waited for, and it says the request was sent.

What the answers hold (the target, the request id, a failure's error) is printed
`printable`: another writer may have put anything in them.
"""

from __future__ import annotations

import shlex

import typer

from app.cli.common import fail, json_line
from app.cli.text import printable
from app.ops.op_answers import DONE_WORDS, Answered, changed, partitions_named, timers
from app.protocol.wire import OpOutcome

__all__ = ["say_answered"]


def say_answered(type_name: str, answered: Answered, wait_s: float, as_json: bool) -> None:
    """Prints what came of the request; `typer.Exit(1)` (after the error line) when a
    partition failed it or did not answer, or a retry was refused."""
    op = answered.op
    if as_json:
        line: dict[str, object] = {
            **op.model_dump(mode="json"),
            "type": type_name,
            "partitions": answered.partitions,
        }
        if answered.waited:
            line["answers"] = [a.model_dump(mode="json") for a in answered.in_order]
            line["unanswered"] = answered.missing
        json_line(line)
    # The target and request id as given: a control character in them is not refused.
    target, request = printable(str(op.target)), printable(op.request_id)
    if not answered.waited:
        if not as_json:
            typer.echo(
                f"{op.action} of the timers of {type_name} parked on {target} requested "
                f"(request {request}, {answered.partitions} partition(s)); "
                "the owner of each partition carries it out"
            )
        return
    if not as_json:
        _say_lines(type_name, answered, target, request)
    problems = []
    if failed := answered.failed:
        problems.append(
            f"failed in {partitions_named(failed)} (dead-lettered, perhaps carried out in part; "
            "its request id is used: to try again, send it under a new --request-id)"
        )
    if refused := answered.refused:
        problems.append(
            f"{timers(refused)} not retried, left parked: their slot was due longer ago than "
            "the workers' TICKWHEEL_REQUEST_ID_WINDOW_MS less expires_after (at most a day), "
            "so their target may have applied it and forgotten its request id, and would "
            "apply it again; to send them all the same, run it again with --past-window (and "
            "no --request-id, or a new one)"
        )
    if missing := answered.missing:
        why = f" ({answered.unread})" if answered.unread is not None else ""
        problems.append(
            f"no answer within {wait_s:g} s from {partitions_named(missing)} of "
            f"{answered.partitions}{why}: the request may still be carried out there; send it "
            f"again with --request-id {shlex.quote(op.request_id)} to learn it (each "
            "partition carries it out at most once: a copy it carried out answers DUPLICATE)"
        )
    if problems:
        raise fail("; ".join(problems))


def _say_lines(type_name: str, answered: Answered, target: str, request: str) -> None:
    """A line per partition that changed timers or failed, then the total."""
    done = DONE_WORDS[answered.op.action]
    for a in answered.in_order:
        if a.outcome is OpOutcome.FAILED:
            typer.echo(f"partition {a.partition}: FAILED: {printable(a.message)}")
        elif a.outcome is OpOutcome.DONE and (changed(a) or a.refused):
            left = f", {timers(a.refused)} left parked (past the window)" if a.refused else ""
            typer.echo(f"partition {a.partition}: {done} {timers(changed(a))}{left}")
    typer.echo(answered.summary(type_name, target, request))
