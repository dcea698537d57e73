"""Which events of an aggregate's log fold into its state: one rule for the live follow
(`CommandProcessor.follow`, another writer's events read after this node decided) and the
restore (`app.commands.restore`, the log folded again into a fresh or older copy). Two
rules would give an aggregate two states, the one of the node that followed the log live
and the one of a node that took its partition and folded it again.

The rule is a function of the log alone, in order: an event folds when it is ahead of the
aggregate (a decision after those folded), or when it is the next event of the request
folded last (one decision's events share its version and request id). An event at or
behind the aggregate's version, of a request folded before, changes nothing: this node's
own events read back, or another writer's stale append (a late `wow.AggregateDeleted`
included). Nothing marks such an event's request id applied. Nor is an event the next of
the request folded last when its id is among that request's events folded (`Mark`): a
writer's producer that sends a record again after a lost acknowledgement appends the
same event twice, adjacent, and folded twice it counted twice.

One case the log cannot tell: this node's own decision sets no "request folded last" live
(the next event under its request id is not folded), the restore cannot tell its events
from another writer's and takes its request as the one folded last. The two differ only
for another writer's event under the request id of this node's last decision on the
aggregate, at its version or ahead: a writer deciding this node's own commands. Nor can
any rule make one state of a writer racing this node (its event at the version this node
decides next, appended before the decision and read after it): live keeps the decision,
a restore the first in the log."""

from __future__ import annotations

from collections import OrderedDict
from typing import Final, NamedTuple

from app.errors import BadRecord

__all__ = [
    "EVENTS_MAX",
    "FOLLOWED_VERSION_MAX",
    "FOLLOWING_MAX",
    "Mark",
    "check_followed_version",
    "continues",
    "folds",
    "marked",
    "remember",
]

FOLLOWED_VERSION_MAX: Final = 2**53 - 1
"""The highest version an event of the log may lift its aggregate to in one step (the
largest integer a JSON reader of any language holds exactly); past it, only to the next
version. Another writer's event that jumps further is refused (the live follow
dead-letters it, a restore passes it over): folded, it would leave its aggregate too few
versions (none at 2^63 - 1) for this node's own decisions, each one past the last, and
every later command would be answered ERROR. This node's decisions, one version each, go
on past it (a restore cannot tell them from another writer's)."""

FOLLOWING_MAX: Final = 10_000
"""Aggregates whose request folded last is remembered, by the live follow and by a restore
alike (a decision's events are adjacent in the log)."""

EVENTS_MAX: Final = 16
"""Event ids a `Mark` keeps of its request, the latest: a decision's events are few, and
a record sent again follows its first append closely. An event sent again after more
than these of its request were folded since is folded again."""


class Mark(NamedTuple):
    """The request folded last into an aggregate: its id, the offset of its last event
    folded, the ids of its events folded (the latest `EVENTS_MAX`) and their version (one
    decision's events share it)."""

    request_id: str
    offset: int
    events: tuple[str, ...]
    version: int


def check_followed_version(version: int, at: int) -> None:
    """Refuses (`BadRecord`) an event of the log at `version` that would lift its aggregate
    at version `at` past `FOLLOWED_VERSION_MAX` further than the next version, before it
    folds."""
    if version > FOLLOWED_VERSION_MAX and version > at + 1:
        raise BadRecord(
            f"version {version} jumps from {at} past {FOLLOWED_VERSION_MAX}, the highest "
            "version an event may lift its aggregate to"
        )


def marked(last: Mark | None, request_id: str, offset: int, event_id: str, version: int) -> Mark:
    """The mark once the event `event_id` of `request_id` at `offset` and `version` folded
    into an aggregate whose mark was `last`: its decision's events folded added to the
    mark's when it is the same decision (request and version), else the first of them."""
    same = last is not None and (last.request_id, last.version) == (request_id, version)
    kept = last.events if same and last is not None else ()
    return Mark(request_id, offset, (*kept, event_id)[-EVENTS_MAX:], version)


def remember(marks: OrderedDict[str, Mark], aggregate_id: str, mark: Mark | None) -> None:
    """Notes `mark` as the request folded last into the aggregate (None: none any more,
    forgotten); kept last, so that past `FOLLOWING_MAX` the oldest go first."""
    marks.pop(aggregate_id, None)
    if mark is not None:
        marks[aggregate_id] = mark
        if len(marks) > FOLLOWING_MAX:
            marks.popitem(last=False)


def continues(
    following: Mark | None, request_id: str, offset: int, event_id: str, version: int
) -> bool:
    """Whether the event `event_id` of `request_id` at `offset` and `version` is the next
    of the request folded last into its aggregate: `following` is that request's mark
    (None: none, or this node decided for the aggregate since). Not when that event was
    folded already in the same decision (appended again, at its version: a producer's
    retry); an event of the same id at another version is a decision of the request again
    (its ids are the request's: sent again once the window forgot it)."""
    return (
        following is not None
        and following.request_id == request_id
        and offset > following.offset
        and (event_id not in following.events or version != following.version)
    )


def folds(version: int, at: int, *, folded: bool, continues: bool) -> bool:
    """Whether an event of the log at `version` folds into its aggregate at version `at`.
    `folded`: its request id was folded into the aggregate before (or decided for it
    here); `continues`: it is the next event of the request folded last (`continues`).

    Ahead of the aggregate, an event of a request not folded yet is a decision after those
    folded; at the aggregate's version, only the next event of the request folded last
    (one decision's events share one version). Never when `folded` and not `continues`,
    whatever the versions: a caller may spare reading the aggregate then."""
    if folded and not continues:
        return False
    return version > at or (version == at and folded)
