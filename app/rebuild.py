"""Rebuilding the timer table from the log: the view is thrown away and replayed.

With every worker of the group stopped: the table's changelog is emptied (its records
deleted up to now) and the timers subscription's offsets on the log are set back to the
start. The next worker to own a partition finds its local copy older than the changelog,
drops it, and replays the log into an empty table. Timers that had fired are sent again
under the same request ids and their targets answer DUPLICATE: nothing is applied twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.exceptions import TickwheelError
from app.kafka import delete_before_end, group_members, reset_group_offsets
from app.topics import AggregateTopics

__all__ = ["GroupBusy", "RebuildReport", "rebuild"]

logger = logging.getLogger(__name__)


class GroupBusy(TickwheelError):
    """Workers of the group are running: a rebuild under them would race their writes."""


@dataclass(frozen=True)
class RebuildReport:
    type_name: str
    changelog_start: dict[int, int]


async def rebuild(
    bootstrap: str, group_id: str, types: list[AggregateTopics], partitions: int
) -> list[RebuildReport]:
    members = await group_members(bootstrap, group_id)
    if members:
        raise GroupBusy(
            f"group {group_id!r} has {members} running worker(s): stop them, then rebuild"
        )
    reports = []
    for t in types:
        start = await delete_before_end(bootstrap, t.timers_changelog, partitions)
        await reset_group_offsets(bootstrap, group_id, t.events, partitions, 0)
        logger.info("%s: changelog emptied, log offsets reset", t.type_name)
        reports.append(RebuildReport(t.type_name, start))
    return reports
