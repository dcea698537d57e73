"""A worker's start refused while a node of another group owns partitions of its types
(`TICKWHEEL_GROUP_ID` changed in one pod of a rolling deploy): the two groups fence none
of each other's transactional producers, both own every partition, and every timer fired
twice. Read from the nodes' reports on `<context>.nodes`, before the worker joins its
group; a stale report (its node died without its tombstone), another group's report of
other types, and this group's own, do not count."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import RunningNode, running, wait_until
from test_node_memory import PARTITIONS, SERVICE, TOPICS

from app.kafka.memory import MemoryLog
from app.ops.cluster_status import ClusterStatus
from app.ops.node_report import NodeReport, PartitionReport
from app.ops.other_groups import OtherGroupRunning, check_other_groups, running_elsewhere
from app.ops.status_for_node import for_node
from app.protocol.topics import AggregateTopics

T0 = 1_800_000_000_000
INTERVAL = 3_000


def report(group: str, at: int, *types: str, node: str = "n1") -> NodeReport:
    rows = tuple(PartitionReport(type=t, partition=0, state="running") for t in types)
    return NodeReport(node=node, group=group, at=at, interval_ms=INTERVAL, partitions=rows)


def test_a_fresh_report_of_another_group_on_a_kept_type_is_found() -> None:
    found = running_elsewhere(
        [report("old", T0 - 1_000, "shop.order", "shop.cart")], "new", ["shop.order"], T0
    )
    assert found is not None and found[1] == ["shop.order"]


@pytest.mark.parametrize(
    "seen",
    [
        report("new", T0, "shop.order"),  # its own group
        report("old", T0 - 3 * INTERVAL - 1, "shop.order"),  # stale: died without a tombstone
        report("billing", T0, "shop.invoice"),  # another service of the context
        report("old", T0),  # owns nothing: no type to tell
        report("old", T0 + 86_400_000, "shop.order"),  # dated a day ahead: a clock, a forgery
    ],
    ids=["own-group", "stale", "other-types", "owns-nothing", "from-the-future"],
)
def test_what_does_not_count(seen: NodeReport) -> None:
    assert running_elsewhere([seen], "new", ["shop.order"], T0) is None


async def test_a_worker_of_another_group_is_refused_while_the_group_runs(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    async with running(RunningNode(log, tmp_path, "a", SERVICE, PARTITIONS)) as a:
        await wait_until(a.runs)
        cluster: ClusterStatus = for_node(a.node, "node-a", 0)
        await cluster.start()  # its first report published
        try:
            now = a.node.clock.now()
            topics = [TOPICS]
            with pytest.raises(OtherGroupRunning, match="node node-a of group 'g' owns"):
                await check_other_groups(log, topics, "g2", now)
            await check_other_groups(log, topics, "g", now)  # its own group: fine
            other = [AggregateTopics(TOPICS.context, "elsewhere")]
            await check_other_groups(log, other, "g2", now)  # not a type it keeps
        finally:
            await cluster.stop()  # its tombstone
        await check_other_groups(log, [TOPICS], "g2", a.node.clock.now())


async def test_no_nodes_topic_is_no_node(tmp_path: Path) -> None:
    log = MemoryLog()
    await check_other_groups(log, [TOPICS], "g", T0)
    assert TOPICS.context + ".nodes" not in log.topic_names()  # read only: nothing made
