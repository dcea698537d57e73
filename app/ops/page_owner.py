"""The operator page's search of an owner's timers (`GET /?owner=<id>&tenant=<tenant>`).

Each type's timers of the owner: from the store when this node owns the owner's
partition, else from the partition's changelog (`ClusterSource.changelog_timers`). The
search is open without the web token and an owner may keep any number of rows, so at most
`OWNER_LIMIT` of each type are held and listed, the live ones first (`tables.owner_pick`),
with how many it keeps; a store reads at most `OWNER_SCAN_LIMIT` of its rows, a chunk at a
time with the event loop's turn between (`tables.partitioned_reads.OWNER_CHUNK`): a
partition let go meanwhile is `StoreClosed`, and its changelog is read instead.
`tickwheel timers show --type <type> --owner <id>` prints them all.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from pydantic import ValidationError

from app.errors import BadInput, KafkaUnavailable
from app.ops.cluster_page import ClusterView, when
from app.ops.forms import problems
from app.protocol.topics import parse_aggregate_type
from tables import DEFAULT_TENANT, AggregateRef, StoreClosed, Timer
from tables.owner_pick import OwnerTimers
from tables.partitioner import partition_of

if TYPE_CHECKING:
    from app.ops.page import ClusterSource, PageNode

__all__ = ["OWNER_LIMIT", "OWNER_SCAN_LIMIT", "OwnerPart", "owner_parts"]

OWNER_LIMIT: Final = 50
"""An owner's timers listed per type (all of them are counted)."""

OWNER_SCAN_LIMIT: Final = 10_000
"""Rows of an owner a store reads for the page (as the page's `SCAN_LIMIT`): past it, the
list says the owner keeps more."""


@dataclass(frozen=True)
class OwnerPart:
    type_name: str
    partition: int
    here: bool
    timers: list[tuple[Timer, str]]
    node: str
    """Who owns the partition (when it is not this node): the changelog was read."""
    found: OwnerTimers
    """What was read: how many the owner keeps (`total`), whether the read stopped at
    `OWNER_SCAN_LIMIT` rows with more left (`complete`), whether some are not listed
    (`cut`)."""
    show_all: str = ""
    """The command that prints all of them (when some are not listed)."""


async def owner_parts(
    node: PageNode, cluster: ClusterSource | None, owner: tuple[str, str], view: ClusterView
) -> list[OwnerPart]:
    """The owner's timers of each type (`BadInput` for a bad owner or a changelog not
    read; `ChangelogBusy` passes through)."""
    owner_id, tenant = owner
    now = node.clock.now()
    parts = []
    for type_name, kept in sorted(node.types.items()):
        topics = parse_aggregate_type(type_name)
        try:
            ref = AggregateRef(
                context=topics.context, aggregate=topics.aggregate, tenant=tenant, id=owner_id
            )
        except ValidationError as exc:
            raise BadInput(f"bad owner: {problems(exc)}") from exc
        p = partition_of(owner_id, node.settings.partitions)
        here = node.owns(type_name, p)
        found = OwnerTimers([], 0)
        if here:
            try:
                found = await kept.store.owner_timers(
                    ref, limit=OWNER_LIMIT, scan_limit=OWNER_SCAN_LIMIT
                )
            except StoreClosed:
                here = False
        elsewhere = ""
        if not here and cluster is not None:
            holder = view.owners.get(p)
            elsewhere = holder.node if holder is not None else "no node reports it"
            try:
                found = await cluster.changelog_timers(type_name, p, ref, OWNER_LIMIT)
            except KafkaUnavailable as exc:
                raise BadInput(f"the changelog of {type_name} was not read: {exc}") from exc
        dues = [(t, when(t.slot_due_at, now)) for t in found.timers]
        show_all = shlex.join(["tickwheel", "timers", "show", "--type", type_name, "--owner"])
        show_all += f" {shlex.quote(owner_id)}"
        if tenant != DEFAULT_TENANT:
            show_all += f" --tenant {shlex.quote(tenant)}"
        parts.append(OwnerPart(type_name, p, here, dues, elsewhere, found, show_all))
    return parts
