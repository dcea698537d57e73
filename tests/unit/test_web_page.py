"""The operator page over HTTP: what it shows, its escaping, its forms and their 400s.

A fake node (memory timer store, memory ledger, a real `NodeMetrics`, a fixed clock)
behind the real `WebServer` on a loopback port; the Kafka requests of Retry and Skip are
replaced by a recorder, so the tests see exactly what would have been sent.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from fakes import GOOD, NODE, PAGE_PARTITIONS, T0, TYPE, FakeNode, Kept, Recorder, asking, ref
from yarl import URL

import tables.ledger
from app.errors import KafkaUnavailable
from app.ops.forms import local_path
from app.ops.page import CHART_SECONDS, OperatorPage
from app.ops.page_owner import OWNER_LIMIT
from app.ops.web import WebServer
from app.protocol.wire import (
    TimerAction,
)
from tables import AggregateRef, CommandSpec, OnceRule, Timer, TimerChange, TimerStatus
from tables.memory_store import MemoryTimerStore
from tables.partitioner import partition_of

P = PAGE_PARTITIONS


@dataclass
class Site:
    node: FakeNode
    url: URL
    http: aiohttp.ClientSession
    retry: Recorder
    skip: Recorder

    async def get(self, path: str = "/", **query: str) -> tuple[int, str]:
        async with self.http.get(self.url.with_path(path).with_query(query)) as r:
            return r.status, await r.text()

    async def post(
        self, action: str, data: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, str, str | None]:
        async with self.http.post(
            self.url / "timers" / action, data=data, headers=headers, allow_redirects=False
        ) as r:
            return r.status, await r.text(), r.headers.get("Location")

    @property
    def sent(self) -> int:
        return len(self.retry.calls) + len(self.skip.calls)


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    node = FakeNode()
    server = WebServer(node, 0)  # type: ignore[arg-type]
    await server.start()
    retry, skip = Recorder(TimerAction.RETRY), Recorder(TimerAction.SKIP)
    server.page = OperatorPage(node, NODE, ask=asking(retry, skip))
    try:
        async with aiohttp.ClientSession() as http:
            yield Site(node, URL(f"http://127.0.0.1:{server.port}"), http, retry, skip)
    finally:
        await server.stop()


def owner_in(partition: int, prefix: str = "o") -> str:
    n = 0
    while partition_of(f"{prefix}{n}", P) != partition:
        n += 1
    return f"{prefix}{n}"


async def put(
    store: MemoryTimerStore,
    owner: str,
    key: str,
    due: int,
    status: TimerStatus = TimerStatus.PENDING,
    target: AggregateRef | None = None,
) -> Timer:
    t = Timer(
        id=f"{owner}/{key}",
        owner=ref(owner),
        key=key,
        version=1,
        partition=partition_of(owner, P),
        rule=OnceRule(at=due),
        target=target or ref(owner),
        command=CommandSpec(type="Remind"),
        slot_due_at=due,
        due_at=due,
    )
    assert await store.put(t)
    if status is not TimerStatus.PENDING:
        moved = t.model_copy(update={"status": status, "attempts": 3})
        assert await store.settle([TimerChange(loaded=t, next=moved)]) == 1
        return moved
    return t


def cells(html: str, table: str) -> list[list[str]]:
    """The text of each data row of the table with `id`, tags dropped."""
    body = html.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0]
    rows = []
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)[1:]:
        texts = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        rows.append([re.sub(r"<[^>]+>", "", t).strip() for t in texts])
    return rows


# --- what the page shows ------------------------------------------------------------------


async def test_partitions_show_their_state_and_node(site: Site) -> None:
    site.node.owned = [0, 1]
    site.node.restoring = [2]
    site.node.stalled = {"1": "shop.order: timer rounds failing"}
    status, html = await site.get()
    assert status == 200
    assert cells(html, "partitions") == [
        ["0", "running", NODE, ""],
        ["1", "stalled", NODE, "shop.order: timer rounds failing"],
        ["2", "restoring", NODE, ""],
        ["3", "elsewhere", "another node of the group", ""],
    ]


async def test_timers_are_counted_per_type_and_owned_partition(site: Site) -> None:
    store = site.node.store
    o0, o1, o3 = owner_in(0), owner_in(1), owner_in(3)
    await put(store, o0, "late", T0 - 5_000)
    await put(store, o0, "soon", T0 + 2_000)
    await put(store, o0, "busy", T0 - 1_000, TimerStatus.FIRING)
    await put(store, o0, "stuck", T0 - 60_000, TimerStatus.PARKED, target=ref("dead"))
    await put(store, o1, "x", T0 + 90_000)
    await put(store, o3, "not-mine", T0 - 1)  # partition 3 is another node's
    _, html = await site.get()
    rows = cells(html, "timers")
    assert [r[:6] for r in rows] == [
        [TYPE, "0", "2", "1", "1", "0"],
        [TYPE, "1", "1", "0", "0", "0"],
    ]
    assert rows[0][6].endswith("(5.0 s ago)") and rows[0][7].endswith("(in 2.0 s)")
    assert rows[1][6] == "—" and rows[1][7].endswith("(in 1.5 min)")
    [parked] = cells(html, "parked")
    assert parked[:6] == [TYPE, "0", str(ref(o0)), "stuck", str(ref("dead")), "Remind"]
    assert parked[7:9] == ["3", "—"]


async def test_parked_rows_carry_forms_for_their_target(site: Site) -> None:
    await put(site.node.store, owner_in(0), "k", T0, TimerStatus.PARKED, target=ref("t-1"))
    _, html = await site.get("/", owner="someone")
    form = html.split('<tr class="parked-timer">', 1)[1].split("</form>", 1)[0]
    hidden = dict(re.findall(r'name="(\w+)" value="([^"]*)"', form))
    # The form's own request id, new at each rendering: submitted twice, one request.
    assert re.fullmatch(r"[0-9a-f]{32}", hidden.pop("request_id"))
    # A box, unticked: a Retry leaves a slot past the request-id window parked.
    assert hidden.pop("past_window") == "true"
    assert '<input type="checkbox" name="past_window" value="true">' in form
    assert hidden == {
        "type": TYPE,
        "target_type": TYPE,
        "target_tenant": "(0)",
        "target_id": "t-1",
        "back": "/?owner=someone",
    }
    assert 'formaction="/timers/retry"' in form and 'formaction="/timers/skip"' in form


async def test_the_ledger_lists_every_entry_with_a_type_to_pick(site: Site) -> None:
    site.node.types["shop.cart"] = Kept(MemoryTimerStore(P))
    t = await put(site.node.store, owner_in(2), "k", T0, target=ref("elsewhere"))
    await site.node.ledger.record("tickwheel.timers", ref("elsewhere"), [t])
    _, html = await site.get()
    [row] = cells(html, "ledger")
    assert row[:3] == ["tickwheel.timers", str(ref("elsewhere")), t.request_id]
    options = re.findall(r'<option value="([^"]+)"( selected)?>', html)
    assert options == [("shop.cart", ""), (TYPE, " selected")]


async def test_an_entry_that_names_not_every_timer_says_so(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tables.ledger, "MAX_NAMED", 1)
    t = await put(site.node.store, owner_in(2), "k", T0, target=ref("z"))
    u = await put(site.node.store, owner_in(2), "l", T0, target=ref("z"))
    await site.node.ledger.record("tickwheel.timers", ref("z"), [t, u])
    _, html = await site.get()
    [row] = cells(html, "ledger")
    assert row[2] == f"{t.request_id}, and more"


async def test_a_ledger_entry_is_shown_by_a_node_of_no_type(site: Site) -> None:
    t = await put(site.node.store, owner_in(2), "k", T0, target=ref("z"))
    site.node.types = {}
    await site.node.ledger.record("tickwheel.timers", ref("z"), [t])
    status, html = await site.get()
    assert status == 200
    [row] = cells(html, "ledger")
    assert row[1] == str(ref("z"))
    assert "<option" not in html


async def test_an_empty_node_says_so(site: Site) -> None:
    site.node.owned = []
    _, html = await site.get()
    assert "This node owns no partition now." in html
    assert "No parked timers" in html
    assert "The ledger is empty" in html
    assert 'id="lateness-empty"' in html and "<svg" not in html


async def test_the_lateness_chart_draws_the_recent_seconds(site: Site) -> None:
    window = site.node.metrics.recent_lateness
    now_s = T0 / 1000
    window.observe_many([0.010, 0.020, 0.200], now_s - 30)
    window.observe_many([0.005], now_s - 10)
    window.observe_many([5.0], now_s - CHART_SECONDS - 5)  # before the chart's span
    _, html = await site.get()
    svg = html.split('<svg id="lateness"', 1)[1].split("</svg>", 1)[0]
    lines = re.findall(r'<polyline points="([^"]+)"', svg)
    assert len(lines) == 2 and all(len(line.split()) == 2 for line in lines)
    assert len(re.findall(r'<circle [^>]*fill="#888"', svg)) == 2  # max
    assert len(re.findall(r'<circle [^>]*fill="#d62"', svg)) == 2  # p99
    assert "200.0 ms" in svg  # the top of the scale: the worst of the span
    assert "4 timers fired in" in html and "2 seconds" in html
    # The points are in time order, left to right, inside the plot.
    xs = [float(p.split(",")[0]) for p in lines[0].split()]
    assert xs == sorted(xs) and 64 <= xs[0] < xs[1] <= 712


async def test_a_parked_timers_last_error_is_shown_with_it_and_its_ledger_entry(
    site: Site,
) -> None:
    """#22: why it did not fire, in the owner search, the parked list and the ledger."""
    owner = owner_in(0)
    parked = await put(site.node.store, owner, "k", T0, TimerStatus.PARKED, target=ref("d"))
    failed = parked.model_copy(
        update={"error_code": "ERROR", "error_text": "ValueError: <out> of stock"}
    )
    assert await site.node.store.settle([TimerChange(loaded=parked, next=failed)]) == 1
    await site.node.ledger.record("tickwheel.timers", ref("d"), [failed])
    _, html = await site.get("/", owner=owner)
    shown = "ERROR ValueError: &lt;out&gt; of stock"
    [row] = cells(html, "owner-timers")
    assert row[9] == shown
    [row] = cells(html, "parked")
    assert row[9] == shown
    [row] = cells(html, "ledger")
    assert row[3] == shown


# --- escaping -----------------------------------------------------------------------------


async def test_every_text_from_the_data_is_escaped(site: Site) -> None:
    evil = '<script>alert("x")</script>'
    owner = owner_in(0, prefix=evil)
    target = ref('t"><img src=x onerror=alert(1)>', tenant="<b>tenant</b>")
    t = await put(site.node.store, owner, "<i>key</i>", T0, TimerStatus.PARKED, target=target)
    await site.node.ledger.record("sub<u>", target, [t])
    site.node.stalled = {"0": "<em>why</em>"}
    _, html = await site.get("/", owner=owner)
    for raw in ("<script>", "<img", "<b>", "<i>", "<u>", "<em>"):
        assert raw not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    assert "&lt;i&gt;key&lt;/i&gt;" in html
    assert "sub&lt;u&gt;" in html and "&lt;em&gt;why&lt;/em&gt;" in html
    assert 'value="t&#34;&gt;&lt;img src=x onerror=alert(1)&gt;"' in html


# --- owner search -------------------------------------------------------------------------


async def test_an_owners_timers_are_found_in_its_partition(site: Site) -> None:
    owner = owner_in(1)
    await put(site.node.store, owner, "a", T0 + 1_000)
    await put(site.node.store, owner, "b", T0 - 1_000, TimerStatus.PARKED, target=ref("z"))
    await put(site.node.store, owner_in(1, prefix="other"), "a", T0)
    _, html = await site.get("/", owner=owner)
    rows = cells(html, "owner-timers")
    assert [r[:5] for r in rows] == [
        [TYPE, "1", NODE, "a", "PENDING"],
        [TYPE, "1", NODE, "b", "PARKED"],
    ]
    assert rows[1][9:] == ["—", str(ref("z"))]  # no error kept: a dash
    _, html = await site.get("/", owner=owner, tenant="t-2")  # another tenant: none
    assert cells(html, "owner-timers") == [[TYPE, "1", NODE, "no timers of " + owner]]


async def test_an_owner_of_many_timers_is_listed_bounded_live_ones_first(site: Site) -> None:
    """F2: the search is open without the token and an owner may keep any number of rows:
    at most `OWNER_LIMIT` are listed, the live ones first, and how many there are."""
    owner = owner_in(1)
    finished = OWNER_LIMIT + 20
    for i in range(finished):  # keys first in order: they would come first by key
        await put(site.node.store, owner, f"a{i:03}", T0, TimerStatus.FIRED)
    for i in range(5):
        await put(site.node.store, owner, f"b{i}", T0 + 1_000)
    _, html = await site.get("/", owner=owner)
    rows = cells(html, "owner-timers")
    listed = rows[:-1]
    assert len(listed) == OWNER_LIMIT == html.count('class="owner-timer"')
    assert [r[4] for r in listed[:5]] == ["PENDING"] * 5
    assert {r[4] for r in listed[5:]} == {"FIRED"}
    more = rows[-1][2]
    assert f"{OWNER_LIMIT} of {finished + 5} timers of {owner}" in " ".join(more.split())
    assert f"tickwheel timers show --type {TYPE} --owner {owner}" in more


async def test_an_owner_in_another_nodes_partition_is_named_so(site: Site) -> None:
    owner = owner_in(3)
    _, html = await site.get("/", owner=owner)
    assert cells(html, "owner-timers") == [[TYPE, "3", "another node of group g1 (not this one)"]]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"owner": "x" * 501}, "bad owner: id: String should have at most 500 characters"),
        ({"owner": "o", "tenant": "t" * 201}, "bad owner: tenant: String should have at most"),
    ],
)
async def test_a_bad_owner_search_is_a_400_page(
    site: Site, query: dict[str, str], message: str
) -> None:
    status, html = await site.get("/", **query)
    assert status == 400
    assert message in html


async def test_an_owner_given_twice_is_a_400_page(site: Site) -> None:
    async with site.http.get(site.url.with_query([("owner", "a"), ("owner", "b")])) as r:
        assert r.status == 400
        assert "owner given more than once" in await r.text()


# --- Retry and Skip -----------------------------------------------------------------------


@pytest.mark.parametrize("action", ["retry", "skip"])
async def test_a_good_form_is_sent_and_redirects_back_with_a_confirmation(
    site: Site, action: str
) -> None:
    status, _, location = await site.post(action, {**GOOD, "back": "/?owner=o1"})
    assert status == 303
    recorder = site.retry if action == "retry" else site.skip
    assert recorder.calls == [("b:1", TYPE, ref("t-1"), P)]
    assert site.sent == 1
    assert location is not None
    url = URL(location)
    assert url.path == "/" and url.query["owner"] == "o1"
    status, html = await site.get("/", **url.query)
    assert status == 200
    notice = html.split('id="notice">', 1)[1].split("</div>", 1)[0]
    done = "Retried" if action == "retry" else "Skipped"
    assert notice.startswith(f"{done} 0 timers of {TYPE} parked on {ref('t-1')} in 0 of {P} ")
    assert url.query["done"] in notice


async def test_the_browser_is_only_sent_back_to_this_server(site: Site) -> None:
    for back in ("https://elsewhere.example/", "//elsewhere.example/x", "relative"):
        status, _, location = await site.post("retry", {**GOOD, "back": back})
        assert status == 303
        assert location is not None and URL(location).path == "/"
        assert URL(location).host is None


async def test_an_empty_tenant_is_the_default_tenant(site: Site) -> None:
    status, _, _ = await site.post("skip", {**GOOD, "target_tenant": " "})
    assert status == 303
    assert site.skip.calls[0][2] == ref("t-1")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"type": "shop.nothing"},
            "unknown type &#39;shop.nothing&#39;: this node keeps timers of",
        ),
        ({"type": ""}, "bad form: type: String should have at least 1 character"),
        ({"target_id": None}, "bad form: target_id: Field required"),
        ({"target_id": "  "}, "bad form: target_id: String should have at least 1 character"),
        ({"type": None}, "bad form: type: Field required"),
        ({"target_type": "no-dot"}, "bad target_type: aggregate type &#39;no-dot&#39; must be"),
        ({"target_type": "a.b.c"}, "bad target_type"),
        ({"target_tenant": "x" * 201}, "bad target: tenant: String should have at most 200"),
        ({"target_id": "x" * 501}, "bad target: id: String should have at most 500"),
        ({"extra": "1"}, "bad form: extra: Extra inputs are not permitted"),
        # A request id the CLI, the JSON routes and the page's buttons refuse too.
        ({"request_id": "a\x01b"}, "bad form: request_id: Value error, &#39;a\\x01b&#39;: give"),
        ({"request_id": "a\x7f"}, "no surrounding spaces or control characters"),
    ],
)
async def test_a_bad_form_is_a_400_page_and_sends_nothing(
    site: Site, change: dict[str, str | None], message: str
) -> None:
    data = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    for action in ("retry", "skip"):
        status, html, location = await site.post(action, data)
        assert (status, location) == (400, None)
        assert message in html, html
        assert "Nothing was changed." in html
    assert site.sent == 0


async def test_a_field_given_twice_is_a_400_page(site: Site) -> None:
    data = [*GOOD.items(), ("target_id", "t-2")]
    status, html, _ = await site.post("retry", data)
    assert status == 400
    assert "form field &#39;target_id&#39; given more than once" in html
    assert site.sent == 0


async def test_a_form_from_another_site_is_refused(site: Site) -> None:
    for headers in (
        {"Origin": "http://elsewhere.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://["},  # no URL: refused as another site's, not a 500
        {"Origin": "http://127.0.0.1:99999"},
    ):
        status, html, _ = await site.post("retry", GOOD, headers)
        assert status == 403
        assert "posted from another site" in html
    status, _, _ = await site.post("retry", GOOD, {"Origin": str(site.url)})
    assert status == 303
    assert site.sent == 1


async def test_a_request_kafka_does_not_take_is_a_503_page(site: Site) -> None:
    site.retry.fail = KafkaUnavailable("no broker at b:1")
    status, html, _ = await site.post("retry", GOOD)
    assert status == 503
    assert "retry not sent, or sent and not answered: no broker at b:1" in html
    assert "Sending the same form again is safe" in html


async def test_a_get_of_a_form_url_is_a_405(site: Site) -> None:
    status, _ = await site.get("/timers/retry")
    assert status == 405


@pytest.mark.parametrize("back", ["http://[", "//[", "http://a:99999/"])
async def test_a_back_that_is_no_url_goes_back_to_the_page(site: Site, back: str) -> None:
    """A form's `back` that no URL parser reads: the action is carried out and answered
    with a 303 to the page, not a 500 after it was carried out."""
    status, _, location = await site.post("retry", {**GOOD, "back": back})
    assert status == 303 and location is not None and location.startswith("/?done="), location
    assert site.sent == 1


def _part(headers: bytes) -> bytes:
    """A multipart body (boundary `b`) of one field, `type`, with `headers` added."""
    head = b'Content-Disposition: form-data; name="type"\r\n' + headers
    return b"--b\r\n" + head + b"\r\n\r\nshop.order\r\n--b--\r\n"


_FILE = (
    b'--b\r\nContent-Disposition: form-data; name="f"; filename="a.txt"\r\n\r\n'
    + b"x" * 70_000
    + b"\r\n"
)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data", b"x=1"),  # no boundary
        ("multipart/form-data; boundary=zz", b"--nope\r\n\r\n"),
        ("application/x-www-form-urlencoded; charset=nope", b"a=1"),
        ("application/x-www-form-urlencoded", b"\xff\xfe=1"),
        # a part's transfer encoding no one knows (aiohttp: RuntimeError), its headers
        # malformed or too many (an HttpProcessingError): each was a 500
        ("multipart/form-data; boundary=b", _part(b"Content-Transfer-Encoding: x-odd")),
        ("multipart/form-data; boundary=b", _part(b"Bad Header: 1")),
        ("multipart/form-data; boundary=b", _part(b"X: " + b"y" * 9000)),
        ("multipart/form-data; boundary=b", _part(b"\r\n".join([b"X: 1"] * 200))),
        # a file part (no form takes one), alone or before a part that does not read: it
        # was spooled to a temporary file, left unclosed when the next part failed
        ("multipart/form-data; boundary=b", _FILE + b"--b--\r\n"),
        ("multipart/form-data; boundary=b", _FILE + _part(b"Bad Header: 1")),
    ],
)
async def test_a_form_body_no_parser_reads_is_a_400(
    site: Site, content_type: str, body: bytes
) -> None:
    async with site.http.post(
        site.url / "timers" / "retry", data=body, headers={"Content-Type": content_type}
    ) as r:
        assert r.status == 400, await r.text()
        assert "the form cannot be read" in (await r.json())["error"]
    assert site.sent == 0


@pytest.mark.parametrize("back", ["/\\elsewhere.example/", "/\t/elsewhere.example/", "/\n/x"])
def test_a_back_a_browser_reads_as_another_site_is_the_page(back: str) -> None:
    # The 303 is encoded safe by yarl; the outcome page's link is the path as it is.
    assert local_path(back) == "/"
    assert local_path("/?owner=o\\1") == "/"
    assert local_path("/?owner=o-1") == "/?owner=o-1"
