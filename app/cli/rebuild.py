"""`tickwheel rebuild`: plan, reset, and follow the workers' replay with a progress bar.

On a terminal the progress is a rich bar (log offsets replayed of the replay's end,
rate, ETA); anywhere else (CI, a pipe, a test) it is a plain line every few seconds and
one at the end, without control codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from app.cli.text import printable
from app.kafka import GroupOffsets, KafkaClients
from app.kafka.connection import Connectable
from app.ops import rebuild as rb
from app.protocol.topics import AggregateTopics

__all__ = [
    "Ended",
    "RebuildRun",
    "ReplayView",
    "format_eta",
    "format_rate",
    "plan_json",
    "plan_lines",
    "progress_line",
    "run_rebuild",
    "type_lines",
]


def format_rate(rate: float | None) -> str:
    return "-/s" if rate is None else f"{rate:,.0f}/s"


def format_eta(eta: float | None) -> str:
    if eta is None:
        return "?"
    seconds = round(eta)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def progress_line(p: rb.Progress) -> str:
    share = 100 if p.total == 0 else p.done * 100 // p.total
    return (
        f"replayed {p.done:,} of {p.total:,} log offsets ({share}%), "
        f"{format_rate(p.rate)}, ETA {format_eta(p.eta)}"
    )


def plan_lines(plan: rb.RebuildPlan, *, done: bool) -> list[str]:
    """What the rebuild does (`done`: did) to each topic, partition and offset."""
    return [line for t in plan.types for line in type_lines(plan.group_id, t, done=done)]


def type_lines(group_id: str, t: rb.TypePlan, *, done: bool) -> list[str]:
    """What the rebuild does (`done`: did) to one type's topics; done, a last line saying
    the type is rebuilt."""
    delete = "deleted the records" if done else "delete the records"
    # Names the command did not check (an embedding caller's, a `--type` with a trailing
    # newline) are shown escaped: one line each, nothing the terminal acts on.
    group = printable(group_id)
    type_name = printable(t.topics.type_name)
    changelog, events = printable(t.topics.timers_changelog), printable(t.topics.events)
    lines = [f"{type_name}: changelog {changelog}"]
    for p in t.partitions:
        held = (
            "none held"
            if p.changelog_end <= p.changelog_start
            else f"held {p.changelog_start}..{p.changelog_end - 1}"
        )
        lines.append(
            f"  {changelog}[{p.partition}]: {delete} before offset {p.changelog_end} ({held})"
        )
    lines.append(f"{type_name}: group {group} on {events}")
    for p in t.partitions:
        committed = "none" if p.committed is None else str(p.committed)
        reset = (
            f"committed offset {committed} set to 0"
            if done
            else f"set the committed offset {committed} to 0"
        )
        lines.append(
            f"  {events}[{p.partition}]: {reset}; the replay ends when the group "
            f"commits offset {p.replay.end} ({p.replay.size:,} to replay)"
        )
    if done:
        lines.append(f"{type_name}: done (log offsets reset, changelog emptied)")
    return lines


def plan_json(plan: rb.RebuildPlan) -> dict[str, Any]:
    """The plan as `rebuild --json` prints it: per type, its changelog and log, and per
    partition the changelog's offsets deleted before, the group's committed offset (set
    to 0) and the span the replay reads."""
    return {
        "group": plan.group_id,
        "members": plan.members,
        "types": [
            {
                "type": t.topics.type_name,
                "changelog": t.topics.timers_changelog,
                "log": t.topics.events,
                "partitions": [
                    {
                        "partition": p.partition,
                        "changelog_start": p.changelog_start,
                        "changelog_end": p.changelog_end,
                        "committed": p.committed,
                        "replay_start": p.replay.start,
                        "replay_end": p.replay.end,
                    }
                    for p in t.partitions
                ],
            }
            for t in plan.types
        ],
    }


class Ended(StrEnum):
    COMPLETE = "complete"
    INTERRUPTED = "interrupted"
    NOT_FOLLOWED = "not followed"


@dataclass(frozen=True, slots=True)
class RebuildRun:
    plan: rb.RebuildPlan
    ended: Ended
    last: rb.Progress | None = None
    """The replay's last progress seen, when it was followed."""


class ReplayView:
    """Shows the replay's progress: a rich bar on a terminal, else a line every
    `line_every` seconds (by `clock`) and the last one."""

    def __init__(
        self,
        console: Console,
        *,
        clock: Callable[[], float] = time.monotonic,
        line_every: float = 5.0,
    ) -> None:
        self.console = console
        self.last: rb.Progress | None = None
        self._clock = clock
        self._line_every = line_every
        self._printed_at: float | None = None
        self._printed: rb.Progress | None = None
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        if console.is_terminal:
            self._bar = Progress(
                TextColumn("replay"),
                BarColumn(),
                TextColumn("{task.completed:,.0f}/{task.total:,.0f} log offsets"),
                TextColumn("{task.fields[rate]}"),
                TextColumn("ETA {task.fields[eta]}"),
                console=console,
            )

    def __enter__(self) -> ReplayView:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.last is not None and self._printed_at is not None:
            self._line(self.last, force=True)

    def __call__(self, p: rb.Progress) -> None:
        self.last = p
        if self._bar is not None:
            rate, eta = format_rate(p.rate), format_eta(p.eta)
            if self._task is None:
                self._task = self._bar.add_task("replay", total=p.total, rate=rate, eta=eta)
            self._bar.update(self._task, completed=p.done, total=p.total, rate=rate, eta=eta)
            return
        self._line(p, force=p.complete)

    def _line(self, p: rb.Progress, *, force: bool) -> None:
        now = self._clock()
        due = self._printed_at is None or now - self._printed_at >= self._line_every
        if (force or due) and self._printed != p:
            self.console.print(progress_line(p), highlight=False, soft_wrap=True, markup=False)
            self._printed = p
            self._printed_at = now


async def run_rebuild(
    bootstrap: Connectable,
    group_id: str,
    types: Sequence[AggregateTopics],
    *,
    dry_run: bool,
    wait: bool,
    out: Console,
    err: IO[str],
    interval: float = 0.5,
    new_group: bool = False,
) -> RebuildRun:
    """The `rebuild` command's work; raises the project's errors (`GroupBusy`, …). A dry
    run returns the plan even when the rebuild would refuse it (`rb.not_the_group`);
    `new_group`: rebuild for a group with no offset on a log (`rb.apply_plan`).

    Each type's lines are printed as it is rebuilt. Ctrl-C while the reset runs lets it
    finish (stopped half-way, a rebuild must be run again) and then ends; while
    following, it ends the following only: the workers replay on.
    """
    clients = KafkaClients(bootstrap)
    plan = await rb.plan_rebuild(clients, group_id, types)
    if dry_run:
        return RebuildRun(plan, Ended.NOT_FOLLOWED)
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    resetting = True

    def on_sigint() -> None:
        interrupted.set()
        if resetting:
            err.write("interrupted: finishing the reset first\n")

    handled = True
    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (RuntimeError, ValueError, NotImplementedError):
        handled = False  # not the main thread (an embedding caller): Ctrl-C is theirs

    reader_gone = False

    def rebuilt(t: rb.TypePlan) -> None:
        # As each type is done: a rebuild failing on a later one has said these were.
        nonlocal reader_gone
        if reader_gone:
            return
        try:
            for line in type_lines(group_id, t, done=True):
                out.print(line, highlight=False, soft_wrap=True, markup=False)
        except (BrokenPipeError, SystemExit) as exc:
            # stdout's reader gone (`| head`; rich's own end for it is SystemExit(1)): the
            # rebuild goes on to its last type, stopped between two it would leave the
            # later ones not begun and say so nowhere. Its end is the reader's then.
            if isinstance(exc, SystemExit) and not isinstance(exc.__context__, BrokenPipeError):
                raise
            reader_gone = True

    try:
        await rb.apply_plan(clients, plan, new_group=new_group, done=rebuilt)
        resetting = False
        if reader_gone:
            raise BrokenPipeError("stdout's reader went away during the rebuild (it finished)")
        if interrupted.is_set():
            return RebuildRun(plan, Ended.INTERRUPTED)
        if not wait:
            return RebuildRun(plan, Ended.NOT_FOLLOWED)
        out.print(
            f"following the replay of group {printable(group_id)}: start the workers "
            "(Ctrl-C stops following; the workers replay on)",
            highlight=False,
            soft_wrap=True,
            markup=False,  # a group id may hold "[/x]", which rich takes for a tag
        )
        spans = plan.spans()
        async with GroupOffsets(bootstrap, group_id) as offsets:
            with ReplayView(out) as view:
                follower = asyncio.create_task(
                    rb.follow_replay(lambda: offsets.fetch(spans), spans, view, interval=interval)
                )
                stopper = asyncio.create_task(interrupted.wait())
                await asyncio.wait({follower, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if follower.done():
                    stopper.cancel()
                    return RebuildRun(plan, Ended.COMPLETE, follower.result())
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)
                return RebuildRun(plan, Ended.INTERRUPTED, view.last)
    finally:
        if handled:
            with contextlib.suppress(RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGINT)
