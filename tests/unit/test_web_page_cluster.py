"""The operator page of one node showing the whole group (#22), over HTTP: the other
nodes' partitions, counts, parked timers (with Retry and Skip) and upcoming fires from
their reports on `<context>.nodes` (the in-memory log), a stale node, an unowned
partition, an owner search read from the changelog of another node's partition, and a
Retry of another node's parked timer, sent as any Retry is (through Kafka, to whichever
node owns the partition).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import orjson
import pytest
from fakes import GOOD, NODE, PAGE_PARTITIONS, T0, TYPE, FakeNode, Kept, Recorder, asking, ref
from test_cluster_status import owner_in, timer
from test_web_page import cells
from yarl import URL

from app.kafka.memory import MemoryLog
from app.kafka.records import Record
from app.node.kept import node_topics
from app.ops.cluster_page import cluster_view, link
from app.ops.cluster_status import ClusterStatus
from app.ops.node_report import (
    PARKED_IN_REPORT,
    STALE_INTERVALS,
    NodeReport,
    PartitionReport,
    encode_report,
)
from app.ops.page import LETTERS_LIMIT, OperatorPage
from app.ops.web import WebServer
from app.protocol.dead_letters import Stage, dead_letter
from app.protocol.topics import ContextTopics, parse_aggregate_type
from app.protocol.wire import TimerAction
from tables import AggregateRef, IntervalRule, TimerChange, TimerStatus
from tables.keys import row_key
from tables.memory_store import MemoryTimerStore
from tables.partitioner import partition_of

OTHER = "node-b:8081 (pid 2)"
INTERVAL = 1_000


@dataclass
class Site:
    node: FakeNode
    log: MemoryLog
    cluster: ClusterStatus
    url: URL
    http: aiohttp.ClientSession
    retry: Recorder

    async def get(self, **query: str) -> str:
        async with self.http.get(self.url.with_query(query)) as r:
            assert r.status == 200, await r.text()
            return await r.text()

    async def other_reports(self, report: NodeReport) -> None:
        """node-b's report, written to the topic and read by this node."""
        topic = ContextTopics("shop").nodes
        await self.log.publisher().send(topic, report.node.encode(), encode_report(report), 0)
        for r in await self.cluster._contexts["shop"].follower.poll(timeout_ms=10):
            self.cluster.view.apply(r.topic, r.key, r.offset, r.value)


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    node = FakeNode(owned=[0, 1])
    log = MemoryLog(node_topics([parse_aggregate_type(TYPE)], PAGE_PARTITIONS))
    cluster = ClusterStatus(log, log.publisher(), node, NODE, interval_ms=INTERVAL)
    await cluster.start()
    server = WebServer(node, 0)  # type: ignore[arg-type]
    await server.start()
    retry = Recorder(TimerAction.RETRY)
    server.page = OperatorPage(node, NODE, ask=asking(retry, Recorder(TimerAction.SKIP)))
    server.page.cluster = cluster
    try:
        async with aiohttp.ClientSession() as http:
            yield Site(node, log, cluster, URL(f"http://127.0.0.1:{server.port}/"), http, retry)
    finally:
        await server.stop()
        await cluster.stop()


def b_report(at: int = T0, partitions: tuple[int, ...] = (2,)) -> NodeReport:
    parked = timer(owner_in(2), "stuck", T0 - 60_000, target=ref("t-1")).model_copy(
        update={"status": TimerStatus.PARKED, "attempts": 3}
    )
    soon = timer(owner_in(2), "soon", T0 + 4_000)
    return NodeReport(
        node=OTHER,
        group="g1",
        web="http://10.0.0.2:8081",
        at=at,
        interval_ms=INTERVAL,
        lateness_p99_ms=12.5,
        partitions=tuple(
            PartitionReport(
                type=TYPE,
                partition=p,
                state="running",
                pending=7,
                parked=1,
                paused=3,
                oldest_overdue=T0 - 2_000,
                next_due=T0 + 4_000,
            )
            for p in partitions
        ),
        parked=(parked,),
        upcoming=(soon,),
    )


async def test_every_partition_of_the_group_is_shown_with_its_node(site: Site) -> None:
    await site.other_reports(b_report())
    html = await site.get()
    assert cells(html, "partitions") == [
        ["0", "running", NODE, ""],
        ["1", "running", NODE, ""],
        ["2", "running", OTHER, ""],
        ["3", "unowned", "no node reports it", ""],
    ]
    assert '<a href="http://10.0.0.2:8081/">node-b:8081 (pid 2)</a>' in html
    timers = cells(html, "timers")
    assert [r[:6] + r[8:] for r in timers] == [
        [TYPE, "0", "0", "0", "0", "0", NODE],
        [TYPE, "1", "0", "0", "0", "0", NODE],
        [TYPE, "2", "7", "0", "1", "3", OTHER],
    ]
    assert timers[2][6].endswith("(2.0 s ago)") and timers[2][7].endswith("(in 4.0 s)")
    [upcoming] = cells(html, "upcoming")
    assert upcoming[3] == "soon" and upcoming[4].endswith("(in 4.0 s)")
    assert upcoming[-1] == OTHER
    nodes = cells(html, "nodes")
    assert [n[0] for n in nodes] == [NODE, OTHER]
    assert nodes[1][1:] == ["2", nodes[1][2], "12.5 ms", "reporting"]


async def test_another_nodes_parked_timer_is_retried_from_this_page(site: Site) -> None:
    await site.other_reports(b_report())
    html = await site.get()
    [parked] = cells(html, "parked")
    assert parked[3] == "stuck" and parked[-2] == OTHER
    form = html.split('<tr class="parked-timer">', 1)[1].split("</form>", 1)[0]
    hidden = dict(re.findall(r'name="(\w+)" value="([^"]*)"', form))
    assert hidden["target_id"] == "t-1" and hidden["type"] == TYPE
    async with site.http.post(
        site.url / "timers" / "retry", data={**GOOD, "back": "/"}, allow_redirects=False
    ) as r:
        assert r.status == 303
    # The request goes to Kafka for every partition: partition 2's owner, node-b, takes it.
    assert site.retry.calls == [("b:1", TYPE, ref("t-1"), PAGE_PARTITIONS)]


async def test_a_silent_node_is_marked_stale_until_another_reports_its_partition(
    site: Site,
) -> None:
    await site.other_reports(b_report())
    site.node.clock.t = T0 + STALE_INTERVALS * INTERVAL + 1
    html = await site.get()
    row = cells(html, "partitions")[2]
    assert row[:3] == ["2", "running", OTHER]
    assert row[3] == "stale: last report 3.0 s ago"
    assert '<tr class="stale"><td class="n">2</td>' in html
    site.node.owned = [0, 1, 2]
    html = await site.get()
    assert cells(html, "partitions")[2] == ["2", "running", NODE, ""]
    assert [r[-1] for r in cells(html, "timers")] == [NODE, NODE, NODE]


async def test_an_owner_elsewhere_is_read_from_its_partitions_changelog(site: Site) -> None:
    await site.other_reports(b_report())
    owner = owner_in(2)
    t = timer(owner, "k1", T0 + 1_000)
    changelog = parse_aggregate_type(TYPE).timers_changelog
    await site.log.publisher().send(
        changelog, row_key(t.owner, t.key), orjson.dumps(t.model_dump(mode="json")), 2
    )
    html = await site.get(owner=owner)
    [row] = cells(html, "owner-timers")
    assert row[:5] == [TYPE, "2", f"{OTHER} (read from its changelog)", "k1", "PENDING"]
    html = await site.get(owner=owner_in(3))
    assert cells(html, "owner-timers") == [
        [TYPE, "3", "no node reports it (read from its changelog)", f"no timers of {owner_in(3)}"]
    ]


async def test_what_another_node_reports_is_escaped_and_bad_records_are_counted(
    site: Site,
) -> None:
    evil = b_report().model_copy(update={"node": "<script>x()</script>", "web": None})
    await site.other_reports(evil)
    await site.log.publisher().send(ContextTopics("shop").nodes, b"x", b"{", 0)
    await site.other_reports(b_report(at=T0 + 1))
    html = await site.get()
    assert "<script>" not in html and "&lt;script&gt;x()&lt;/script&gt;" in html
    assert "1 record(s) of the\nstatus topic were no node's report" in html


async def test_the_latest_dead_letters_of_the_context_are_listed(site: Site) -> None:
    html = await site.get()
    assert "No dead letter." in html
    publisher = site.log.publisher()
    for offset in range(LETTERS_LIMIT + 3):
        bad = Record("shop.order.events", 1, offset, b"k", b"<not json>", T0)
        await publisher.send_many([dead_letter(bad, f"not JSON {offset}", Stage.READ, T0)])
    await publisher.send(ContextTopics("shop").dead_letters, b"x", b"not a letter", 0)
    html = await site.get()
    rows = cells(html, "dead-letters")
    # The last records only, newest first (the unreadable record is one of them).
    assert len(rows) == LETTERS_LIMIT - 1
    assert rows[0][2:4] == [f"shop.order.events[1]@{LETTERS_LIMIT + 2}", "read"]
    assert rows[0][4] == f"BadRecord not JSON {LETTERS_LIMIT + 2}"
    assert rows[-1][2] == "shop.order.events[1]@4"
    site.log.down = True
    html = await site.get()
    assert "the dead letters were not read" in html
    site.log.down = False


async def test_the_jobs_timers_of_every_node_are_listed(site: Site) -> None:
    nightly = AggregateRef(context="shop", aggregate="schedule", id="nightly")
    p = partition_of("nightly", PAGE_PARTITIONS)
    tick = timer("x", "tick", T0 + 60_000).model_copy(
        update={
            "id": "nightly/tick",
            "owner": nightly,
            "target": nightly,
            "partition": p,
            "rule": IntervalRule(start=T0, every=60_000),
        }
    )
    site.node.owned = [q for q in range(PAGE_PARTITIONS) if q != p]  # another node's job
    await site.other_reports(b_report(partitions=(p,)).model_copy(update={"jobs": (tick,)}))
    html = await site.get()
    [row] = cells(html, "jobs")
    assert row[:5] == ["shop", "nightly", "(0)", "tick", "PENDING"]
    assert row[5].endswith("(in 1.0 min)")
    assert "&#34;every&#34;:60000" in row[6] or '"every":60000' in row[6]
    assert row[-1] == OTHER
    # A node's own schedule type: its jobs' timers are in its own report.
    store = MemoryTimerStore(PAGE_PARTITIONS)
    site.node.types["shop.schedule"] = Kept(store)
    site.node.owned = list(range(PAGE_PARTITIONS))
    assert await store.put(tick)
    [row] = cells(await site.get(), "jobs")
    assert row[1] == "nightly" and row[-1] == NODE


async def test_this_nodes_page_lists_more_parked_timers_than_a_report_carries(
    site: Site,
) -> None:
    site.node.owned = [0, 1, 2, 3]
    per_partition = PARKED_IN_REPORT // 4 + 5
    for p in range(PAGE_PARTITIONS):
        for n in range(per_partition):
            owner = next(
                f"p{n}~{k}" for k in range(999) if partition_of(f"p{n}~{k}", PAGE_PARTITIONS) == p
            )
            t = timer(owner, "k", T0 - 1_000, target=ref(f"t-{p}-{n}"))
            assert await site.node.store.put(t)
            stuck = t.model_copy(update={"status": TimerStatus.PARKED, "attempts": 3})
            assert await site.node.store.settle([TimerChange(loaded=t, next=stuck)]) == 1
    html = await site.get()
    assert len(cells(html, "parked")) == PAGE_PARTITIONS * per_partition
    # What this node publishes is bounded.
    assert await site.cluster.publish()
    [report] = site.cluster.reports()
    assert len(report.parked) == PARKED_IN_REPORT


async def test_a_report_whose_page_is_not_http_is_refused_and_never_linked(site: Site) -> None:
    """Another producer's `javascript:` address would run on this page's origin, where
    its forms act: such a record is no report, and the page forbids script anyway."""
    raw = orjson.loads(encode_report(b_report()))
    for web in ("javascript:alert(document.cookie)", 'http://x"onmouseover="y', "data:,x"):
        forged = orjson.dumps(raw | {"web": web})
        await site.log.publisher().send(ContextTopics("shop").nodes, OTHER.encode(), forged, 0)
    await site.other_reports(b_report(at=T0 + 1).model_copy(update={"web": None}))
    assert site.cluster.bad_reports == 3
    async with site.http.get(site.url) as r:
        html = await r.text()
        policy = r.headers["Content-Security-Policy"]
    assert "javascript:" not in html and "data:," not in html and OTHER in html
    assert "default-src 'none'" in policy and "script-src" not in policy
    assert "form-action 'self'" in policy and "frame-ancestors 'none'" in policy
    async with site.http.get(site.url, params={"owner": "x" * 501}) as r:  # a 400 page
        assert r.status == 400 and r.headers["Content-Security-Policy"] == policy


def test_only_an_http_page_is_linked_however_a_report_was_made() -> None:
    own = b_report().model_copy(update={"node": NODE, "partitions": ()})
    other = NodeReport.model_construct(**(b_report().__dict__ | {"web": "javascript:x()"}))
    view = cluster_view(own, [other], PAGE_PARTITIONS, T0)
    assert [n.web for n in view.nodes] == ["http://10.0.0.2:8081", None]
    assert {r.web for r in view.partitions if r.node == OTHER} == {None}
    assert link("https://tw-1.example") == "https://tw-1.example"


async def test_one_changelog_read_at_a_time_others_are_answered_busy(site: Site) -> None:
    """A search of an owner elsewhere reads a whole changelog partition: no token limits
    who asks, so a node reads one at a time and answers a search that waits too long 503."""
    await site.other_reports(b_report())
    reads = site.cluster._changelog_reads
    await reads.acquire()  # a search reading now
    site.cluster.changelog_wait_s = 0  # the fake search waits no time
    async with site.http.get(site.url, params={"owner": owner_in(2)}) as r:
        assert r.status == 503
        assert "another search is reading a changelog on this node" in await r.text()
    reads.release()
    html = await site.get(owner=owner_in(2))
    assert cells(html, "owner-timers") == [
        [TYPE, "2", f"{OTHER} (read from its changelog)", f"no timers of {owner_in(2)}"]
    ]
    assert not reads.locked()  # released after the read
